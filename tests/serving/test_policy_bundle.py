"""The tiny MLP policy trained end to end by ``longboat train`` (task: policy) on a tiny dataset with a camera, then
served back by ``open_policy`` from its export and from its checkpoint, and by the policy server to openpi-client:
the same actions, in robot units, as the model and the dataset's own pipeline give in process."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from longboat.checkpoint.dcp import CheckpointManager, load_model_weights
from longboat.recipes.artifact import open_artifact
from longboat.recipes.config import load_run_dir_config
from longboat.recipes.serve import open_served_policy
from longboat.serving.policy_bundle import ObservationError, open_policy
from longboat.serving.server import PolicyServer, ServerConfig, serving_in_thread
from longboat.trainer.metrics import read_metrics
from tests.conftest import run_longboat
from tests.tasks.policy_dataset import ACTION, FPS, TASKS, write_policy_dataset

pytestmark = pytest.mark.slow

CAMERA = "observation.images.top"
TRANSFORMS = ("[{type: normalize, features: {observation.state: mean_std, action: mean_std}}, "
              "{type: random_crop, keys: [observation.images.top], size: [10, 14]}]")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("policy_run")
    dataset = write_policy_dataset(tmp / "ds")
    run_dir = tmp / "run"
    run_longboat("train", "configs/policy/mlp_tiny.yaml", f"data.path={dataset}", f"run_dir={run_dir}",
                 "data.cameras=null", f"data.transforms={TRANSFORMS}", "data.wire_keys={top: observation.images.top, "
                 "joints: observation.state}", "train.threads=1", "train.tensorboard=false", check=True)
    return dataset, run_dir


def test_tiny_mlp_trains_to_a_low_loss(trained):
    _, run_dir = trained
    train, valid = read_metrics(run_dir), read_metrics(run_dir, "valid")
    assert train[0]["loss"] > 0.2 and train[-1]["loss"] < 0.05, (train[0]["loss"], train[-1]["loss"])
    # Held-out episodes, in the dataset's units (actions span about [-2, 2]).
    assert valid[-1]["action_mae"] < 0.15 and set(valid[-1]) >= {"action_mae/dx", "action_mae/dy"}, valid[-1]


def raw_observations(dataset, rows: list[int]) -> dict:
    from longboat.data.robot import RobotDataset

    frames = RobotDataset(dataset, {CAMERA: [0.0], "observation.state": [0.0]}, episodes=[0])
    items = [frames[r] for r in rows]
    return {CAMERA: torch.stack([i[CAMERA] for i in items]),
            "observation.state": torch.stack([i["observation.state"] for i in items]),
            "task": [i["task"] for i in items]}


def test_export_and_checkpoint_serve_the_in_process_actions(trained):
    dataset, run_dir = trained
    obs = raw_observations(dataset, [0, 7, 19])
    # In process: the run's model with its checkpoint's weights, and the pipeline built from the dataset.
    resolved = load_run_dir_config(run_dir)
    model = resolved.spec.build(resolved.model).eval()
    load_model_weights(CheckpointManager(run_dir / "checkpoints").latest(), model)
    pipeline = resolved.task.pipeline(train=False)
    applied = pipeline.apply({k: obs[k] for k in (CAMERA, "observation.state")})
    chunk = pipeline.unapply({"observation.state": applied["observation.state"], "action": model.predict(applied)})
    expected = chunk["action"]
    assert expected.shape == (3, resolved.model.horizon, ACTION)

    served = open_policy(open_artifact(run_dir))  # the run's export
    assert served.source == run_dir / "export"
    torch.testing.assert_close(served.act(obs), expected)
    assert served.spec["fps"] == FPS and served.spec["tasks"] == list(TASKS)
    wire = {"top": obs[CAMERA], "joints": obs["observation.state"], "task": obs["task"], "extra": 1}
    torch.testing.assert_close(served.act(served.from_wire(wire)), expected)
    with pytest.raises(ObservationError, match=r"the observation lacks \['joints'\]"):
        served.from_wire({"top": obs[CAMERA]})
    with pytest.raises(ObservationError, match=r"the observation lacks \['observation.state'\]"):
        served.act({CAMERA: obs[CAMERA]})
    from_checkpoint = open_policy(open_artifact(CheckpointManager(run_dir / "checkpoints").latest()))
    torch.testing.assert_close(from_checkpoint.act(obs), expected)
    # The export's actions are the dataset's: near the recorded ones where the policy fits well.
    recorded = torch.stack([raw_observations(dataset, [r])["observation.state"][0, 0, :ACTION] for r in (1, 8)])
    assert (expected[:2, 0] - recorded).abs().max() < 0.3


def test_longboat_serve_gives_openpi_client_the_bundle_actions(trained):
    """The trained export behind the real server, queried by the real openpi-client with uint8 images."""
    dataset, run_dir = trained
    obs = raw_observations(dataset, [0, 7, 19])
    expected = open_policy(open_artifact(run_dir)).act(obs)
    with serving_in_thread(PolicyServer(open_served_policy(run_dir), ServerConfig(port=0))) as port:
        client = WebsocketClientPolicy("127.0.0.1", port)
        assert client.get_server_metadata()["observation_keys"] == ["top", "joints"]
        for i in range(3):
            image = (obs[CAMERA][i, 0].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
            reply = client.infer({"top": image, "joints": obs["observation.state"][i, 0].numpy(),
                                  "prompt": obs["task"][i]})
            np.testing.assert_allclose(reply["actions"], expected[i].numpy(), atol=1e-5, rtol=0)
