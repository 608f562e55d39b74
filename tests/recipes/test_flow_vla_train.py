"""The tiny flow VLA trained end to end by ``longboat train`` (task: policy), its backbone starting from (and, frozen,
keeping) a Hugging Face checkpoint's weights and its prompts from the dataset's task strings; then served to
openpi-client with prompts and seeds, and measured by the prompt experiment's script."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from safetensors.torch import load_file

from longboat.data.robot import RobotDataset
from longboat.models import get_model
from longboat.models.llm import Decoder, DecoderConfig
from longboat.models.llm.hf import save_hf_model
from longboat.recipes.artifact import open_artifact
from longboat.recipes.serve import open_served_policy
from longboat.serving.policy_bundle import open_policy
from longboat.serving.server import PolicyServer, ServerConfig, serving_in_thread
from longboat.trainer.metrics import read_metrics
from tests.conftest import run_longboat
from tests.tasks.policy_dataset import TASKS, write_policy_dataset

pytestmark = pytest.mark.slow
CAMERA = "observation.images.top"


def test_tiny_flow_vla_trains_from_a_frozen_hf_backbone(tmp_path):
    dataset = write_policy_dataset(tmp_path / "ds")
    backbone = DecoderConfig(**get_model("flow_vla").load_preset("tiny")["backbone"])
    torch.manual_seed(3)
    hf_dir = save_hf_model(Decoder(backbone), "llama", tmp_path / "backbone", cfg=backbone,
                           tokenizer_dir="tests/fixtures/sft/tokenizer")
    run_dir = tmp_path / "run"
    proc = run_longboat("train", "configs/policy/flow_vla_tiny.yaml", f"data.path={dataset}", f"run_dir={run_dir}",
                        "model.backbone=null", f"model.backbone_hf={hf_dir}", "model.tokenizer=null",
                        "model.backbone_lr_scale=0", "train.steps=120", "train.eval_every=120", "train.threads=1",
                        "train.tensorboard=false", check=True)
    assert f"initial weights from {hf_dir}" in proc.stdout
    train, valid = read_metrics(run_dir), read_metrics(run_dir, "valid")
    # Measured: 1.46 over the first 20 steps, 0.25 over the last 20; held-out action error about 0.25 (actions
    # span ±2).
    assert train[0]["loss"] > 1.0 and train[-1]["loss"] < 0.45, (train[0]["loss"], train[-1]["loss"])
    assert valid[-1]["action_mae"] < 0.5 and "action_mae/dx" in valid[-1], valid[-1]
    # The export's backbone is the checkpoint's, untouched by training; the prompt's tokenizer rides along.
    export = run_dir / "export"
    weights, hf = load_file(export / "model.safetensors"), load_file(hf_dir / "model.safetensors")
    torch.testing.assert_close(weights["backbone.layers.0.attention.wq.weight"],
                               hf["model.layers.0.self_attn.q_proj.weight"], rtol=0, atol=0)
    torch.testing.assert_close(weights["backbone.tok_embeddings.weight"], hf["model.embed_tokens.weight"],
                               rtol=0, atol=0)
    assert (export / "tokenizer.json").is_file()
    # Served to openpi-client: the request's seed is the noise key, its prompt reaches the backbone.
    frames = RobotDataset(dataset, {CAMERA: [0.0], "observation.state": [0.0]}, episodes=[0])
    item = frames[7]
    bundle = open_policy(open_artifact(run_dir))
    wire = {"observation.images.top": (item[CAMERA][0].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy(),
            "observation.state": item["observation.state"][0].numpy()}
    with serving_in_thread(PolicyServer(open_served_policy(run_dir), ServerConfig(port=0))) as port:
        client = WebsocketClientPolicy("127.0.0.1", port)
        replies = {(prompt, seed): client.infer({**wire, "prompt": prompt, "seed": seed})["actions"]
                   for prompt in ("reach the target", "push the block") for seed in (5, 6)}
    for (prompt, seed), actions in replies.items():
        expected = bundle.act({CAMERA: item[CAMERA][None], "observation.state": item["observation.state"][None],
                               "task": [prompt]}, noise_key=torch.tensor([seed]))
        np.testing.assert_allclose(actions, expected[0].numpy(), atol=1e-5, rtol=0)
    assert not np.array_equal(replies["push the block", 5], replies["push the block", 6])
    assert not np.array_equal(replies["reach the target", 5], replies["push the block", 5])
    # The prompt experiment's measurement runs on the export (here on two episodes, one of each task).
    table = subprocess.run([sys.executable, "examples/vla_prompts/measure.py", str(run_dir), str(dataset),
                            "--episodes", "0", "1", "--every", "5"], check=True, capture_output=True, text=True).stdout
    rows = {line[:45].strip(): line[45:].split() for line in table.splitlines()[1:]}
    assert set(rows) == {*TASKS, "all"} and all(float(v) > 0 for r in rows.values() for v in r), table
