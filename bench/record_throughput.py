"""Recording speed: frames written per second by ``longboat data record`` for each simulator.

Each simulator records through ``record`` (the path the command runs): one camera at the given size, AV1 video,
into a fresh dataset; and once more without cameras, which isolates simulation and the scripted expert. The
renderer's two settings are timed on the same scene: longboat's (no shadows, reflections or multisampling)
against MuJoCo's defaults.

    pip install -e '.[sim]'
    MUJOCO_GL=egl python -P bench/record_throughput.py [--episodes 4] [--size 128]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from pathlib import Path

from longboat.sim import make_env, record

ENVS = ("metaworld:reach-v3", "metaworld:pick-place-v3", "fetch:push", "fetch:pick_and_place", "pusht:push_t")


def render_fps(name: str, size: int, fast: bool, frames: int = 40) -> float:
    env = make_env(name)
    env.reset(0)
    model, data = env.physics()
    if fast:
        env.render(env.cameras[0], size)  # longboat's renderer
        render = lambda: env.render(env.cameras[0], size)  # noqa: E731
    else:
        import mujoco  # after longboat's renderer chose the headless GL

        renderer = mujoco.Renderer(model, size, size)
        render = lambda: (renderer.update_scene(data, camera=env.cameras[0]), renderer.render())  # noqa: E731
    render()
    start = time.perf_counter()
    for _ in range(frames):
        render()
    env.close()
    return frames / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--size", type=int, default=128)
    args = ap.parse_args()
    print(f"{'env':26s} {'frames/s (camera)':>18s} {'frames/s (no camera)':>21s} {'success':>8s}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in ENVS:
            rates = []
            for cams in (None, ()):
                with contextlib.redirect_stderr(io.StringIO()):
                    res = record([name], args.episodes, Path(tmp) / f"{name}-{cams}".replace(":", "_"),
                                 cameras=cams, image_size=args.size, progress=False)
                rates.append(res.frames_per_second)
            print(f"{name:26s} {rates[0]:18.1f} {rates[1]:21.1f} {res.envs[0].successes:>4d}/{args.episodes}")
    for name in (ENVS[0], ENVS[2]):
        fast, default = render_fps(name, args.size, True), render_fps(name, args.size, False, frames=10)
        print(f"render {name} {args.size}²: {fast:.1f} fps vs MuJoCo defaults {default:.1f} fps "
              f"({fast / default:.1f}×)")


if __name__ == "__main__":
    main()
