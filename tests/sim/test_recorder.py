"""``longboat data record``: real Meta-World and Fetch rollouts written, read back and replayed; the Fetch experts'
success rate; Ctrl-C; bad input."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from longboat.cli.main import main
from longboat.data.robot import RobotDataset
from longboat.sim import RecordError, RenderError, SimError, known_envs, make_env, record, register_simulator
from longboat.sim.fetch_env import FetchEnv
from longboat.sim.optional import import_simulator
from longboat.sim.recorder import MAX_IMAGE_SIZE
from longboat.sim.registry import SIMULATORS
from longboat.utils.outputs import OutputError

SIZE = 32


def episodes_of(ds: RobotDataset) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for i in range(len(ds)):
        item = ds[i]
        out.setdefault(int(item["episode_index"]), []).append(item)
    return out


@pytest.mark.slow
def test_metaworld_and_fetch_into_one_dataset(tmp_path):
    out = tmp_path / "demo"
    result = record(["metaworld:reach-v3", "fetch:push"], 2, out, image_size=SIZE, max_steps=80, progress=False)
    ds = RobotDataset(out)
    assert len(ds) == result.frames and ds.meta.fps == 80  # the first environment's control rate
    assert ds.meta.tasks == ["reach the goal position", "push the block to the red target"]
    assert [r.saved for r in result.envs] == [2, 2]
    episodes = episodes_of(ds)
    assert len(episodes) == 4
    for ep, frames in episodes.items():
        tasks = {f["task"] for f in frames}
        assert tasks == {"reach the goal position" if ep < 2 else "push the block to the red target"}
        done = [bool(f["next.done"]) for f in frames]
        success = [bool(f["next.success"]) for f in frames]
        assert done == [False] * (len(frames) - 1) + [True]  # an episode ends at its first success or the limit
        assert not any(success[:-1]) and (success[-1] or len(frames) == 80)
        img = frames[0]["observation.images.main"]
        assert img.shape == (3, SIZE, SIZE) and 0.05 < img.mean() < 0.95  # a rendered scene, not a blank frame
        states = np.stack([f["observation.state"].numpy() for f in frames])
        if ep >= 2:  # Fetch's 28 numbers are padded to Meta-World's 39
            assert np.all(states[:, 28:] == 0) and np.any(states[:, :28] != 0)
    assert sum(r.successes for r in result.envs) >= 3


def test_fetch_replays_exactly(tmp_path):
    """The recorded actions, replayed from the episode's seed, give back the recorded states bit for bit."""
    out = tmp_path / "reach"
    record(["fetch:pick_and_place"], 2, out, cameras=(), seed=5, progress=False)
    env = make_env("fetch:pick_and_place")
    for ep, frames in episodes_of(RobotDataset(out)).items():
        state = env.reset(5 + ep)
        for f in frames:
            np.testing.assert_array_equal(f["observation.state"].numpy(), state)
            state, reward, success = env.step(f["action"].numpy())
            assert float(f["next.reward"]) == reward and bool(f["next.success"]) == success
    env.close()


def test_fetch_experts_succeed(tmp_path):
    results = record(["fetch:reach", "fetch:push", "fetch:pick_and_place"], 10, tmp_path / "fetch", cameras=(),
                     only_success=True, progress=False).envs
    rates = {r.name: r.success_rate for r in results}
    assert all(rate >= 0.9 for rate in rates.values()), rates
    assert all(r.saved == r.successes for r in results)  # only the successful episodes are kept
    ds = RobotDataset(tmp_path / "fetch")
    assert len(ds.meta.episodes.index) == sum(r.successes for r in results)
    last = [bool(ds[int(i) - 1]["next.success"]) for i in np.cumsum(ds.meta.episodes.length)]
    assert all(last)


def _run_cli(out, *extra):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-m", "longboat", "data", "record", "--env", "fetch:pick_and_place",
                             "--episodes", "200", "--size", "16", "--output", str(out), *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_ctrl_c_keeps_the_saved_episodes(tmp_path, ctrl_c):
    out = tmp_path / "demo"
    proc = _run_cli(out)
    deadline = time.time() + 120
    while time.time() < deadline and not list(tmp_path.glob(".demo.partial-*/data/*/*.parquet")):
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted:" in err
    ds = RobotDataset(out)
    assert 1 <= len(ds.meta.episodes.index) < 200 and len(ds) == ds.meta.total_frames
    assert list(tmp_path.iterdir()) == [out]  # no partial directory left behind


class InterruptedFetch(FetchEnv):
    """Fetch reach that gets Ctrl-C at step 2 of episode ``at``."""

    at = 0
    finished_interrupted_step = False

    def reset(self, seed: int):
        self._episode = seed
        self._t = 0
        return super().reset(seed)

    def step(self, action):
        self._t += 1
        if self._episode == self.at and self._t == 2:
            os.kill(os.getpid(), signal.SIGINT)
            out = super().step(action)
            InterruptedFetch.finished_interrupted_step = True
            return out
        return super().step(action)


@pytest.fixture
def interrupted_sim():
    register_simulator("interrupted", lambda: ["reach"])(lambda task: InterruptedFetch(task))
    yield InterruptedFetch
    del SIMULATORS["interrupted"]


@pytest.mark.parametrize("at", [0, 3])
def test_ctrl_c_mid_episode(tmp_path, interrupted_sim, at, ctrl_c):
    """Ctrl-C in episode ``at`` keeps exactly the ``at`` episodes before it, or leaves nothing. It never lands
    inside the simulator, where native code (EGL through ctypes) would turn it into another error."""
    interrupted_sim.at, interrupted_sim.finished_interrupted_step = at, False
    with pytest.raises(KeyboardInterrupt):
        record(["interrupted:reach"], 10, tmp_path / "demo", cameras=(), progress=False)
    assert interrupted_sim.finished_interrupted_step
    if at == 0:
        assert list(tmp_path.iterdir()) == []
    else:
        assert list(tmp_path.iterdir()) == [tmp_path / "demo"]
        assert len(RobotDataset(tmp_path / "demo").meta.episodes.index) == at


def test_bad_input(tmp_path):
    with pytest.raises(SimError, match=r"known fetch tasks: reach, push, pick_and_place"):
        make_env("fetch:slide")
    with pytest.raises(SimError, match=r"simulator one of .*fetch.*metaworld"):
        make_env("gym:push")
    assert "metaworld:pick-place-v3" in known_envs() and "fetch:push" in known_envs()
    with pytest.raises(SimError, match=r"'no_such_simulator' is not installed: pip install 'longboat\[sim\]'"):
        import_simulator("no_such_simulator")
    with pytest.raises(RecordError, match=r"fetch:reach has no camera corner; its cameras: external_camera_0"):
        record(["fetch:reach"], 1, tmp_path / "a", cameras=["corner"])
    with pytest.raises(RecordError, match=r"^expected episodes >= 1, got 0$"):  # only the wrong limit is named
        record(["fetch:reach"], 0, tmp_path / "a")
    with pytest.raises(RecordError, match=r"^expected image size >= 8, got 4$"):
        record(["fetch:reach"], 1, tmp_path / "a", image_size=4)
    with pytest.raises(RecordError, match=r"^expected max steps >= 1, got 0$"):
        record(["fetch:reach"], 1, tmp_path / "a", max_steps=0)
    with pytest.raises(RecordError, match="distinct environments"):
        record(["fetch:reach", "fetch:reach"], 1, tmp_path / "a")
    with pytest.raises(RecordError, match=r"^expected seed >= 0, got -1$"):
        record(["fetch:reach"], 1, tmp_path / "a", seed=-1)
    with pytest.raises(RecordError, match=rf"^expected image size <= {MAX_IMAGE_SIZE}, got 20000$"):
        record(["fetch:reach"], 1, tmp_path / "a", image_size=20000)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(OutputError, match="already exists and is not empty; pass --overwrite"):
        record(["fetch:reach"], 1, tmp_path / "notes")
    with pytest.raises(RecordError, match="not a LeRobot dataset; refusing"):
        record(["fetch:reach"], 1, tmp_path / "notes", overwrite=True)
    assert os.listdir(tmp_path / "notes") == ["todo.txt"] and not (tmp_path / "a").exists()


@pytest.mark.parametrize("output", ["file/demo", "/proc/demo"])
def test_an_output_the_os_refuses_is_one_line(tmp_path, capsys, output):
    """Under a regular file or in /proc: one line naming the place, exit 1 (WorldError), nothing left behind."""
    (tmp_path / "file").write_text("mine")
    output = str(tmp_path / output) if not output.startswith("/") else output
    code = main(["data", "record", "--env", "fetch:reach", "--episodes", "1", "--output", output])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith(f"error: {output}: cannot write here (") and err.count("\n") == 1, err
    assert sorted(os.listdir(tmp_path)) == ["file"] and (tmp_path / "file").read_text() == "mine"


def test_frames_the_renderer_cannot_hold_are_one_error(capsys):
    """A MuJoCo framebuffer beyond the GL limit fails as a RenderError (exit 1), and the environment still renders
    at a size it can hold, with nothing printed at exit."""
    env = make_env("fetch:reach")
    env.reset(0)
    with pytest.raises(RenderError, match=r"cannot render 20000x20000 camera frames here \(.*\); choose a smaller"):
        env.render(env.cameras[0], 20000)
    assert env.render(env.cameras[0], 16).shape == (16, 16, 3)
    env.close()
    assert RenderError.exit_code == 1 and "Exception ignored" not in capsys.readouterr().err


def snapshot(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_overwrite_keeps_the_old_dataset(tmp_path, ctrl_c, signum):
    """Ctrl-C (or SIGTERM) while ``--overwrite`` records over a dataset: the old one is left byte for byte, and
    the partial recording, with the episodes it had saved, is removed."""
    out = tmp_path / "demo"
    record(["fetch:reach"], 1, out, cameras=(), max_steps=3, progress=False)
    before = snapshot(out)
    proc = _run_cli(out, "--overwrite")
    deadline = time.time() + 120
    while time.time() < deadline and not list(tmp_path.glob(".*.partial*/data/*/*.parquet")):
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    assert "interrupted:" in err and f"{out} left as it was" in err and err.strip().endswith("error: interrupted")
    assert snapshot(out) == before
    assert os.listdir(tmp_path) == ["demo"]  # no hidden sibling left


def test_overwrite_replaces_a_dataset(tmp_path):
    out = tmp_path / "d"
    record(["fetch:reach"], 2, out, cameras=(), progress=False)
    record(["fetch:reach"], 3, out, cameras=(), progress=False, overwrite=True)
    assert len(RobotDataset(out).meta.episodes.index) == 3
    with pytest.raises(RecordError, match="no episode succeeded"):  # a failed recording keeps the old dataset
        record(["fetch:reach"], 1, out, cameras=(), max_steps=1, seed=3, only_success=True, overwrite=True,
               progress=False)
    assert len(RobotDataset(out).meta.episodes.index) == 3 and list(tmp_path.iterdir()) == [out]


def test_pusht_records_the_top_view_and_replays_exactly(tmp_path):
    """Push-T (pymunk, drawn with pygame): short episodes written with the pusher's targets as actions; replaying
    them from the episode's seed gives back the recorded states bit for bit."""
    out = tmp_path / "pusht"
    result = record(["pusht:push_t"], 2, out, image_size=SIZE, max_steps=6, seed=3, progress=False)
    ds = RobotDataset(out)
    assert ds.meta.fps == 10 and ds.meta.tasks == ["push the T-shaped block onto the green target"]
    assert result.frames == len(ds) == 12 and ds.meta.info["robot_type"] == "pusht"
    env = make_env("pusht:push_t")
    for ep, frames in episodes_of(ds).items():
        img = frames[0]["observation.images.top"]
        assert img.shape == (3, SIZE, SIZE) and 0.5 < img.mean() < 0.99  # a white arena with the T, goal, pusher
        state = env.reset(3 + ep)
        for f in frames:
            np.testing.assert_array_equal(f["observation.state"].numpy(), state)
            action = f["action"].numpy()
            assert np.all((action >= 0) & (action <= 512))
            state, reward, success = env.step(action)
            assert float(f["next.reward"]) == np.float32(reward) and bool(f["next.success"]) == success
    env.close()


@pytest.mark.slow
def test_pusht_expert_succeeds(tmp_path):
    results = record(["pusht:push_t"], 4, tmp_path / "pusht", cameras=(), progress=False).envs
    assert results[0].successes >= 3, results


def test_a_simulator_from_a_plugin_records(tmp_path, capsys, point_plugin):
    """``--plugin`` imports a file that registers a simulator with its scripted expert; its tasks record like the
    built-in ones, and without the plugin the name is unknown, naming the known simulators."""
    out = tmp_path / "points"
    args = ["data", "record", "--env", "point:reach", "--env", "point:reach_far", "--episodes", "2", "--size", "16",
            "--seed", "1", "--output", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown environment 'point:reach': expected <simulator>:<task> with simulator one "
                          "of fetch, metaworld, pusht (e.g. fetch:push; one of your own registers through --plugin)")
    assert not main([*args, "--plugin", str(point_plugin)]), capsys.readouterr().err  # None: success
    ds = RobotDataset(out)
    assert ds.meta.info["robot_type"] == "point" and len(ds.meta.episodes.index) == 4
    assert ds.meta.tasks == ["move the point to the goal (reach)", "move the point to the goal (reach_far)"]
    for frames in episodes_of(ds).values():
        assert bool(frames[-1]["next.success"]) and frames[0]["observation.images.top"].shape == (3, 16, 16)
