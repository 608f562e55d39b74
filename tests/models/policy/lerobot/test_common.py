import json
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import longboat.models  # noqa: F401  (registers the architectures)
from longboat.data.robot.transforms import pipeline_from_assets
from longboat.errors import LongboatError
from longboat.models import get_model
from longboat.models.policy.lerobot import is_lerobot_dir, read_lerobot
from longboat.models.policy.manifest import read_policy_manifest
from longboat.recipes.artifact import open_artifact
from longboat.serving.policy_bundle import open_policy

from .conftest import TYPES, lerobot_noise, reference, seeds


def _act(policy, obs, seed):
    """The chunk in robot units; a diffusion policy denoises the fixture's noise (LeRobot's draws)."""
    spec = get_model(policy.arch)
    cfg = spec.config(**policy.model_config)
    model = spec.build(cfg).eval()
    model.load_state_dict(policy.state_dict, strict=True)
    pipeline = pipeline_from_assets(policy.assets["transforms.json"], policy.assets["transforms.safetensors"], "t")
    x = pipeline.apply(obs)
    if policy.arch == "diffusion":
        n_actions = read_policy_manifest(policy.assets["policy.json"], "policy.json")["n_action_steps"]
        initial, step_noise = lerobot_noise(seed, [1, cfg.horizon, cfg.action_dim])
        chunk = model.denoise(model.encoder(x), initial, step_noise)[:, cfg.first_action:cfg.first_action + n_actions]
    else:
        chunk = model.predict(x)
    return pipeline.unapply({**x, "action": chunk})["action"][0]


@pytest.mark.parametrize("name", TYPES)
def test_imported_policy_acts_as_lerobot(lerobot_dirs, name):
    policy = read_lerobot(lerobot_dirs[name])
    observations, chunks = reference(lerobot_dirs[name])
    for obs, seed, expected in zip(observations, seeds(lerobot_dirs[name]), chunks):
        torch.testing.assert_close(_act(policy, obs, seed), expected, rtol=0, atol=1e-5)
    assert not torch.allclose(chunks[0], chunks[1])  # the observations matter


def test_manifest_carries_lerobot_execution_settings(lerobot_dirs):
    spec = read_policy_manifest(read_lerobot(lerobot_dirs["act_prenorm"]).assets["policy.json"], "policy.json")
    assert (spec["horizon"], spec["n_action_steps"], spec["temporal_ensemble_coeff"]) == (8, 1, 0.01)
    assert spec["wire_keys"] == {"observation.images.cam": "observation.images.cam",
                                 "observation.state": "observation.state"}


def test_detects_lerobot_directories_only(lerobot_dirs, tmp_path):
    assert is_lerobot_dir(lerobot_dirs["act"])
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert not is_lerobot_dir(tmp_path)


def _copy(lerobot_dirs, tmp_path, name="act"):
    target = tmp_path / name
    shutil.copytree(lerobot_dirs[name], target)
    return target


def _edit_config(directory, **changes):
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))


def _one_line_error(directory) -> str:
    with pytest.raises(LongboatError) as info:
        read_lerobot(directory)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_unknown_type_is_one_line(lerobot_dirs, tmp_path):
    directory = _copy(lerobot_dirs, tmp_path)
    _edit_config(directory, type="vqbet")
    message = _one_line_error(directory)
    assert "config.json" in message and "'vqbet'" in message and "act" in message


def test_missing_processor_file_is_one_line(lerobot_dirs, tmp_path):
    directory = _copy(lerobot_dirs, tmp_path)
    (directory / "policy_postprocessor.json").unlink()
    assert "policy_postprocessor.json: missing" in _one_line_error(directory)
    (directory / "policy_preprocessor_step_3_normalizer_processor.safetensors").unlink()
    shutil.copy(lerobot_dirs["act"] / "policy_postprocessor.json", directory)
    assert "policy_preprocessor_step_3_normalizer_processor.safetensors: missing" in _one_line_error(directory)


@pytest.mark.parametrize("key, value", [("feedforward_activation", "glu"), ("replace_final_stride_with_dilation", True),
                                        ("vision_backbone", "resnet50")])
def test_unrepresentable_option_is_one_line(lerobot_dirs, tmp_path, key, value):
    directory = _copy(lerobot_dirs, tmp_path)
    _edit_config(directory, **{key: value})
    assert key in _one_line_error(directory)


@pytest.mark.parametrize("key, value", [("resize_shape", [32, 32]), ("noise_scheduler_type", "DPMSolver"),
                                        ("beta_schedule", "scaled_linear")])
def test_unrepresentable_diffusion_option_is_one_line(lerobot_dirs, tmp_path, key, value):
    directory = _copy(lerobot_dirs, tmp_path, "diffusion")
    _edit_config(directory, **{key: value})
    assert key in _one_line_error(directory)


def test_convert_refuses_what_is_not_a_lerobot_directory(tmp_path):
    from longboat.recipes.convert import lerobot_to_longboat

    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(LongboatError, match="not a LeRobot policy directory") as info:
        lerobot_to_longboat(tmp_path / "hf", tmp_path / "out")
    assert "\n" not in str(info.value)


def test_unrepresentable_processor_step_is_one_line(lerobot_dirs, tmp_path):
    directory = _copy(lerobot_dirs, tmp_path)
    pre = json.loads((directory / "policy_preprocessor.json").read_text())
    pre["steps"].append({"registry_name": "image_crop_resize_processor", "config": {}})
    (directory / "policy_preprocessor.json").write_text(json.dumps(pre))
    assert "image_crop_resize_processor" in _one_line_error(directory)


@pytest.mark.slow  # a child process imports longboat and torch (about 10 s)
@pytest.mark.parametrize("name", ["act", "diffusion"])
def test_longboat_serve_answers_lerobots_actions(lerobot_dirs, tmp_path, name):
    """``longboat serve DIR`` on the LeRobot directory as it is, in a child process, asked by openpi's client. ACT
    answers LeRobot's chunks; a diffusion policy draws its noise from the request's seed, so it answers what the
    imported model (whose chunks equal LeRobot's for equal noise, above) gives for that seed."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    log = tmp_path / "server.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "longboat", "serve", str(lerobot_dirs[name]), "--port", "0",
                                 "--deterministic", "--threads", "1", "--exit-with-stdin"],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline, up = time.monotonic() + 120, None
        while up is None and time.monotonic() < deadline and proc.poll() is None:
            up = re.search(r"serving on ws://127\.0\.0\.1:(\d+)", log.read_text())
            time.sleep(0.1)
        assert up, f"the server did not come up: {log.read_text()}"
        client = WebsocketClientPolicy("127.0.0.1", int(up[1]))
        assert client.get_server_metadata()["n_action_steps"] == (8 if name == "act" else 4)
        observations, chunks = reference(lerobot_dirs[name])
        bundle = open_policy(open_artifact(lerobot_dirs[name]))
        for seed, (obs, expected) in enumerate(zip(observations, chunks)):
            if name == "act":
                wire = {k: v[0, 0].numpy() for k, v in obs.items()}
            else:  # the observation window on the wire: [n_obs_steps, ...]
                wire = {k: v[0].numpy() for k, v in obs.items()}
                expected = bundle.act(obs, noise_key=torch.tensor([seed]))[0]
            actions = client.infer({**wire, "seed": seed})["actions"]
            np.testing.assert_allclose(actions, expected.numpy(), rtol=0, atol=1e-5)
    finally:
        proc.kill()
        proc.wait(10)


def test_eval_renders_what_the_lerobot_policy_reads(lerobot_dirs, tmp_path):
    from longboat.eval.config import EvalConfig
    from longboat.eval.orchestrator import policy_info

    cfg = EvalConfig(benchmark="metaworld", tasks=["reach-v3"], policy=str(lerobot_dirs["act"]),
                     output_dir=str(tmp_path))
    info = policy_info(cfg)
    assert (info.spec.cameras, info.spec.image_size, info.spec.state_dim, info.horizon) == ({"cam": "cam"}, 48, 4, 8)
