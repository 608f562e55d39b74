"""The vision-language model on two ranks: tensor parallel (the decoder's plan around the embeddings it is given)
and FSDP2 follow one process's loss over the same global batches, with micro-batches that hold no image beside
ones that do (the tower runs on a blank image there, so no rank waits for another's gradients)."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch

from longboat.trainer.metrics import read_metrics
from tests.conftest import REPO
from tests.distributed.conftest import finish, start

pytestmark = pytest.mark.slow


def test_tensor_parallel_and_fsdp_match_one_process(tmp_path):
    data = tmp_path / "data"
    shutil.copytree(REPO / "tests" / "fixtures" / "vlm", data, ignore=shutil.ignore_patterns("generate.py"))
    images = (data / "shapes.jsonl").read_text().splitlines()[:6]
    text = [json.dumps({"messages": [{"role": "user", "content": "What shape is this?"},
                                     {"role": "assistant", "content": "circle" if i % 2 else "square"}]})
            for i in range(10)]
    (data / "mixed.jsonl").write_text("\n".join(images + text) + "\n")
    common = ["configs/vlm/tiny.yaml", f"data.tokenizer={data / 'tokenizer'}", f"data.sources=[{data / 'mixed.jsonl'}]",
              "data.valid_fraction=0", "data.packing=false", "train.micro_batch_size=2", "train.steps=4",
              "train.log_every=1", "train.eval_every=0", "train.threads=1", "train.tensorboard=false",
              "checkpoint.export=false"]
    layouts = {  # 4 samples per step in each: micro-batches of 2, over two ranks or two accumulation steps
        "single": ([], ["train.grad_accum=2"]),
        "fsdp": (["--nproc", "2"], []),
        "tp": (["--nproc", "2"], ["parallel.tp=2", "train.grad_accum=2"]),
    }
    procs = {name: start([sys.executable, "-m", "longboat", "train", *launch, *common, f"run_dir={tmp_path / name}",
                          *extra], tmp_path / f"{name}.log") for name, (launch, extra) in layouts.items()}
    logs = {name: finish(proc, tmp_path / f"{name}.log", timeout=300) for name, proc in procs.items()}
    for name, proc in procs.items():
        assert proc.returncode == 0, logs[name][-6000:]
    assert "tp 2" in logs["tp"] and "dp_shard 2" in logs["fsdp"]
    curves = {name: [r["loss"] for r in read_metrics(tmp_path / name)] for name in layouts}
    assert len(curves["single"]) == 4
    for name in ("fsdp", "tp"):
        torch.testing.assert_close(curves[name], curves["single"], atol=1e-5, rtol=1e-5, msg=name)


def test_deepstack_under_tensor_parallel_is_refused_in_one_line():
    from longboat.config.base import ConfigError
    from longboat.models.vlm.parallel_plan import vlm_tensor_parallel_plan
    from tests.models.vlm.conftest import vlm_config

    qwen3 = {"arch": "qwen3_vl_vision", "d_model": 32, "n_layers": 2, "n_heads": 2, "ffn_dim": 48, "patch_size": 4,
             "num_position_embeddings": 16, "deepstack_layers": [0]}
    cfg = vlm_config(qwen3, {"kind": "identity"}, mrope_section=(2, 3, 3))
    with pytest.raises(ConfigError, match="deepstack_layers") as e:
        vlm_tensor_parallel_plan(cfg, 2)
    assert "\n" not in str(e.value)


def test_experts_routed_by_token_type_under_tensor_parallel_are_refused_in_one_line():
    from longboat.config.base import ConfigError
    from longboat.models.vlm.parallel_plan import vlm_tensor_parallel_plan
    from tests.models.vlm.conftest import vlm_config

    moe = {"d_model": 32, "n_experts": 4, "top_k": 2, "expert_ffn_dim": 16}
    cfg = vlm_config(moe=moe, vision_moe=moe)
    with pytest.raises(ConfigError, match="vision_moe") as e:
        vlm_tensor_parallel_plan(cfg, 2)
    assert "\n" not in str(e.value)
