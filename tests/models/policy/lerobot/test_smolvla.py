"""LeRobot's SmolVLA imported: actions equal to LeRobot's for its recorded observations, prompt and noise (three
attention layouts), served through ``longboat serve`` to openpi's client, written back byte for byte, and what
longboat cannot represent refused in one line naming the key."""

import json
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import longboat.models  # noqa: F401  (registers the architectures)
from longboat.cli.main import main
from longboat.errors import LongboatError
from longboat.models.policy.lerobot import read_lerobot
from longboat.recipes.artifact import open_artifact
from longboat.serving.policy_bundle import open_policy

from .conftest import SMOLVLA_TYPES, noise, reference, seeds


def _reference(directory):
    ref = json.loads((directory / "reference.json").read_text())
    return ref["task"], ref["prompt_tokens"]


@pytest.mark.parametrize("name", SMOLVLA_TYPES)
def test_imported_smolvla_acts_as_lerobot(lerobot_dirs, name):
    directory = lerobot_dirs[name]
    bundle = open_policy(open_artifact(directory))
    model, cfg = bundle.policy, bundle.config
    task, lerobot_tokens = _reference(directory)
    tokens, mask = bundle.prompts.batch([task])
    assert tokens[0][mask[0]].tolist() == lerobot_tokens  # the newline appended, truncated as LeRobot's tokenizer
    observations, chunks = reference(directory)
    for obs, seed, expected in zip(observations, seeds(directory), chunks):
        x = {**bundle.pipeline.apply(obs), "prompt_tokens": tokens, "prompt_mask": mask}
        initial = torch.from_numpy(noise(seed, [1, cfg.horizon, cfg.max_action_dim]))
        chunk = bundle.pipeline.unapply({**x, "action": model.predict(x, noise=initial)})["action"][0]
        torch.testing.assert_close(chunk, expected, rtol=0, atol=1e-5)
    assert not torch.allclose(chunks[0], chunks[1])  # the observations matter


def test_layouts_become_our_options(lerobot_dirs):
    configs = {name: read_lerobot(lerobot_dirs[name]).model_config for name in SMOLVLA_TYPES}
    expert = {name: (c["vlm"]["language"]["n_layers"], c["expert"]["n_layers"], c["expert"]["d_model"],
                     c["expert"]["ffn_dim"], c["expert"]["attention"], c["expert"]["self_attn_every"])
              for name, c in configs.items()}
    assert expert == {"smolvla": (3, 3, 48, 256, "cross", 2), "smolvla_self": (4, 4, 32, 256, "self", 2),
                      "smolvla_sparse": (4, 2, 48, 256, "cross", 4)}
    assert configs["smolvla"]["vlm"]["language"]["rope_theta"] == 10000.0  # LeRobot's rotary base, not the VLM's
    assert configs["smolvla"]["resize_pad"] == [32, 32]


def test_convert_both_ways_keeps_every_byte(lerobot_dirs, tmp_path):
    source = lerobot_dirs["smolvla"]
    assert main(["convert", "lerobot-to-longboat", str(source), str(tmp_path / "export")]) == 0
    assert main(["convert", "longboat-to-lerobot", str(tmp_path / "export"), str(tmp_path / "back")]) == 0
    original = load_file(str(source / "model.safetensors"))
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert sorted(back) == sorted(original)
    for key, value in original.items():
        assert back[key].numpy().tobytes() == value.numpy().tobytes(), key
    for name in ("config.json", "policy_preprocessor.json", "policy_postprocessor.json"):
        assert json.loads((tmp_path / "back" / name).read_text()) == json.loads((source / name).read_text()), name
    shutil.copytree(source / "vlm", tmp_path / "back" / "vlm")  # vlm_model_name names it, as in the original
    back_config, config = read_lerobot(tmp_path / "back").model_config, read_lerobot(source).model_config
    assert back_config.pop("tokenizer") == str((tmp_path / "back" / "vlm").resolve())  # the directory beside it
    assert config.pop("tokenizer") == str((source / "vlm").resolve())
    assert back_config == config


def _copy(lerobot_dirs, tmp_path, name="smolvla"):
    target = tmp_path / name
    shutil.copytree(lerobot_dirs[name], target)
    return target


def _one_line_error(directory) -> str:
    with pytest.raises(LongboatError) as info:
        read_lerobot(directory)
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.mark.parametrize("changes, named", [
    ({"adapt_to_pi_aloha": True}, "adapt_to_pi_aloha"),
    ({"add_image_special_tokens": True}, "add_image_special_tokens"),
    ({"empty_cameras": 1}, "empty_cameras"),
    ({"num_vlm_layers": 9}, "num_vlm_layers"),
    ({"vlm_model_name": "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"}, "vlm_model_name"),
    ({"num_expert_layers": 2}, "num_expert_layers"),
    ({"num_vlm_layers": 4, "attention_mode": "self_attn", "num_expert_layers": 2}, "self-attention"),
    ({"resize_imgs_with_padding": [64, 64]}, "resize_imgs_with_padding"),
])
def test_unrepresentable_option_is_one_line(lerobot_dirs, tmp_path, changes, named):
    directory = _copy(lerobot_dirs, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **changes}))
    assert named in _one_line_error(directory)


def test_missing_tokenizer_step_is_one_line(lerobot_dirs, tmp_path):
    directory = _copy(lerobot_dirs, tmp_path)
    pre = json.loads((directory / "policy_preprocessor.json").read_text())
    pre["steps"] = [s for s in pre["steps"] if s["registry_name"] != "tokenizer_processor"]
    (directory / "policy_preprocessor.json").write_text(json.dumps(pre))
    assert "tokenizer_processor" in _one_line_error(directory)


@pytest.mark.slow  # a child process imports longboat and torch (about 10 s)
def test_longboat_serve_answers_with_the_prompt(lerobot_dirs, tmp_path):
    """``longboat serve DIR`` on the LeRobot SmolVLA directory, asked by openpi's client with a prompt: it answers
    what the imported model (whose chunks equal LeRobot's for equal noise, above) gives for the request's seed."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    directory = lerobot_dirs["smolvla"]
    log = tmp_path / "server.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "longboat", "serve", str(directory), "--port", "0",
                                 "--deterministic", "--threads", "1", "--exit-with-stdin"],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline, up = time.monotonic() + 120, None
        while up is None and time.monotonic() < deadline and proc.poll() is None:
            up = re.search(r"serving on ws://127\.0\.0\.1:(\d+)", log.read_text())
            time.sleep(0.1)
        assert up, f"the server did not come up: {log.read_text()}"
        client = WebsocketClientPolicy("127.0.0.1", int(up[1]))
        assert client.get_server_metadata()["n_action_steps"] == 4
        task, _ = _reference(directory)
        bundle = open_policy(open_artifact(directory))
        observations, _ = reference(directory)
        answers = []
        for seed, obs in enumerate(observations):
            wire = {k: v[0, 0].numpy() for k, v in obs.items()}
            actions = client.infer({**wire, "prompt": task, "seed": seed})["actions"]
            expected = bundle.act({**obs, "task": [task]}, noise_key=torch.tensor([seed]))[0]
            np.testing.assert_allclose(actions, expected.numpy(), rtol=0, atol=1e-5)
            answers.append(actions)
        other = client.infer({**{k: v[0, 0].numpy() for k, v in observations[0].items()}, "prompt": "push the blue",
                              "seed": 0})["actions"]
        assert not np.allclose(other, answers[0])  # the prompt matters
    finally:
        proc.kill()
        proc.wait(10)


def test_eval_renders_what_smolvla_reads(lerobot_dirs, tmp_path):
    from longboat.eval.config import EvalConfig
    from longboat.eval.orchestrator import policy_info

    cfg = EvalConfig(benchmark="metaworld", tasks=["reach-v3"], policy=str(lerobot_dirs["smolvla"]),
                     output_dir=str(tmp_path))
    info = policy_info(cfg)
    assert (info.spec.cameras, info.spec.image_size, info.spec.state_dim, info.horizon) == ({"cam": "cam"}, 48, 4, 8)
