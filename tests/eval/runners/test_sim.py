"""The runners' vector envs observe what ``longboat data record`` records, reset per env with a seed, and report
success; the PushT runner is driven by a scripted policy."""

import numpy as np
import pytest

from longboat.config.base import ConfigError
from longboat.eval.runners import ObservationSpec, make_runner
from longboat.eval.runners.base import FRAME_INFO, RunnerSetupError
from longboat.sim import make_env

pytestmark = pytest.mark.slow

CORNER = "observation.images.corner"


def test_metaworld_envs_observe_as_recorded_share_one_benchmark_and_reset_one_env_alone():
    spec = ObservationSpec(wire_keys={"state": "observation.state", "image": CORNER}, cameras={"corner": "corner"},
                           image_size=32, state_dim=40, video_camera="topview", video_size=16)
    runner = make_runner("metaworld", spec)
    vec = runner.make_vector_env("reach-v3", 2, "sync")
    recorded = make_env("metaworld:reach-v3")
    try:
        obs, info = vec.reset(seed=[3, 4], options={"video_seeds": [4]})
        for i, seed in enumerate((3, 4)):
            state = recorded.reset(seed)
            np.testing.assert_array_equal(obs["observation.state"][i], np.append(state, 0))  # padded to 40
            np.testing.assert_array_equal(obs[CORNER][i], recorded.render("corner", 32))
        assert list(info["_" + FRAME_INFO]) == [False, True] and info[FRAME_INFO].shape == (2, 16, 16, 3)
        request = runner.request({k: v[0] for k, v in obs.items()}, "reach")
        assert set(request) == {"state", "image", "prompt"} and request["image"].shape == (32, 32, 3)
        action = np.array([[0.5, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
        obs, reward, success, _, info = vec.step(action)
        recorded.reset(3)
        state, recorded_reward, _ = recorded.step(action[0])
        np.testing.assert_array_equal(obs["observation.state"][0], np.append(state, 0))
        assert reward[0] == pytest.approx(recorded_reward) and not success.any() and info["_success"].all()
        # Resetting env 1 alone leaves env 0 where it is.
        before = obs["observation.state"][0].copy()
        obs, _ = vec.reset(seed=[None, 9], options={"reset_mask": np.array([False, True])})
        np.testing.assert_array_equal(obs["observation.state"][0], before)
        np.testing.assert_array_equal(obs["observation.state"][1], np.append(recorded.reset(9), 0))
        assert vec.get_attr("max_steps") == (500, 500) and vec.get_attr("prompt")[0] == "reach the goal position"
        # The three envs placed their six episodes' objects from one Meta-World benchmark.
        assert vec.envs[0].sim._benchmark is vec.envs[1].sim._benchmark is recorded._benchmark
    finally:
        vec.close()
        recorded.close()


def test_async_metaworld_envs_place_objects_as_a_sync_env_does():
    # Async workers are forked from a fork server and take the benchmark built here: the same episodes.
    runner = make_runner("metaworld", ObservationSpec(wire_keys={"state": "observation.state"}))
    sync, forked = runner.make_vector_env("reach-v3", 2, "sync"), runner.make_vector_env("reach-v3", 2, "async")
    try:
        expected, _ = sync.reset(seed=[5, 6])
        obs, _ = forked.reset(seed=[5, 6])
        np.testing.assert_array_equal(obs["observation.state"], expected["observation.state"])
        action = np.full((2, 4), 0.5, np.float32)
        np.testing.assert_array_equal(forked.step(action)[0]["observation.state"],
                                      sync.step(action)[0]["observation.state"])
    finally:
        sync.close()
        forked.close()


def test_actions_are_fitted_to_the_env_and_unknown_names_are_listed():
    runner = make_runner("fetch", ObservationSpec(wire_keys={"observation.state": "observation.state"}))
    vec = runner.make_vector_env("reach", 1, "sync")
    try:
        row = np.array([2.0, -0.5, 0.1, 0.0, 7.0], np.float32)  # a wider policy's action, out of range
        np.testing.assert_allclose(runner.action(row, vec.single_action_space), [1.0, -0.5, 0.1, 0.0])
        obs, _ = vec.reset(seed=[0])
        assert obs["observation.state"].shape == (1, 13)  # FetchReach: 10 of observation, 3 of goal
    finally:
        vec.close()
    with pytest.raises(ConfigError, match="known: .*metaworld"):
        make_runner("mujoco", runner.spec)


def test_pusht_runner_observes_as_recorded_and_steps_async():
    pytest.importorskip("gym_pusht", reason="Push-T needs gym-pusht (pip install 'longboat[sim]')")
    spec = ObservationSpec(wire_keys={"image": "observation.images.top", "state": "observation.state"},
                           cameras={"top": "top"}, image_size=48)
    runner = make_runner("pusht", spec)
    assert runner.tasks() == ["push_t"] and runner.renders()
    vec = runner.make_vector_env("push_t", 2, "async")
    recorded = make_env("pusht:push_t")
    try:
        obs, _ = vec.reset(seed=[0, 1], options={"video_seeds": [0]})
        for i in range(2):
            np.testing.assert_array_equal(obs["observation.state"][i], recorded.reset(i))
            np.testing.assert_array_equal(obs["observation.images.top"][i], recorded.render("top", 48))
        request = runner.request({k: v[1] for k, v in obs.items()}, "push")
        assert set(request) == {"image", "state", "prompt"}
        # The recorder's expert drives env 0 as it drives the recording env; the video frames come from env 0 only.
        recorded.reset(0)
        for _ in range(5):
            action = recorded.expert_action()
            obs, reward, success, _, info = vec.step(np.stack([action, obs["observation.state"][1, :2]]))
            state, recorded_reward, _ = recorded.step(action)
            np.testing.assert_allclose(obs["observation.state"][0], state, rtol=1e-6)
        assert not success.any() and list(info["_" + FRAME_INFO]) == [True, False]
        far = runner.action(np.array([900.0, -5.0]), vec.single_action_space)
        np.testing.assert_array_equal(far, [512.0, 0.0])
    finally:
        vec.close()
        recorded.close()


@pytest.mark.parametrize("benchmark", ["metaworld", "pusht", "fetch"])
def test_sizes_known_before_an_env_are_the_envs(benchmark):
    """What ``longboat eval`` checks the policy against before the first episode is what the envs give and take."""
    runner = make_runner(benchmark, ObservationSpec(wire_keys={}))
    for task in runner.tasks()[:3]:
        env = make_env(f"{benchmark}:{task}")
        try:
            assert runner.sizes(task) == (env.state_dim, env.action_dim), task
        finally:
            env.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_camera_the_simulator_lacks_is_one_error(mode):
    """A setup the envs refuse reaches ``longboat eval`` as its own error, from a worker process too."""
    spec = ObservationSpec(wire_keys={}, cameras={"top": "nope"}, image_size=16, video_camera="nope")
    with pytest.raises(RunnerSetupError, match=r"^metaworld:reach-v3 has no camera nope; its cameras: corner, "):
        make_runner("metaworld", spec).make_vector_env("reach-v3", 2, mode).close()
