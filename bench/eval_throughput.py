"""Closed-loop evaluation throughput: episodes/s of ``longboat eval`` with 4 parallel envs and batched serving
against 1 env and one request at a time, on the same policy and episodes, and where the time goes; and what the
deterministic server (each request in a forward of its own) costs against batching.

The policy is the untrained stand-in MLP (``longboat serve --random-policy``) reading a Meta-World camera and the
state, with ``--delay-ms`` per forward pass standing in for a model whose time does not grow with the batch; its
actions mean nothing, so every episode runs to the step limit and both setups do the same work. The defaults
are a small real evaluation (48 episodes of 120 steps, about the 50 seeds of the pixel push recipe's), so start-up
weighs what it weighs in one. Per setup: wall
time, episodes/s (overall, and once the envs are up: start-up is importing the simulator, building the task's
benchmark once, and each env building its simulator and GL context), the time stepping envs (rendering included),
waiting for chunks, and, per request, round trip vs server inference (the difference is transport and queueing).
A single env's step is also timed with and without rendering its camera. Parallel envs pay off only on cores
nothing else is using: run it on an otherwise idle machine.

    python -P bench/eval_throughput.py [--episodes 48] [--steps 120] [--size 64] [--delay-ms 20]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

# longboat is imported in the functions: the env workers' fork server imports this script first, as it imports
# the small `longboat` launcher when users run `longboat eval`, and a heavier import here would time a slower start.
TASK, CAMERA, HORIZON = "reach-v3", "corner", 8


def setup(args, root: Path, name: str, num_envs: int, window_ms: float, vector: str,
          deterministic: bool = False) -> dict:
    from longboat.sim import metaworld_env
    from longboat.eval.config import EvalConfig
    from longboat.eval.orchestrator import run_eval
    from longboat.eval.results import read_results
    from longboat.serving.server_manager import ServerManager

    spec = {"observation": {"observation.images.corner": [args.size, args.size, 3], "observation.state": [39]},
            "horizon": HORIZON, "action_dim": 4, "delay_ms": args.delay_ms, "noise": 0.0}
    serve = ["--random-policy", json.dumps(spec), "--threads", "1", "--batch-window-ms", str(window_ms)]
    serve += ["--deterministic"] if deterministic else []
    with ServerManager(serve, root / f"{name}.log") as server:
        cfg = EvalConfig(benchmark="metaworld", tasks=[TASK], episodes=args.episodes, num_envs=num_envs,
                         vector=vector, policy=f"ws://{server.host}:{server.port}", max_steps=args.steps,
                         observation={"cameras": [CAMERA], "image_size": args.size}, videos_per_task=0,
                         output_dir=str(root / name))
        metaworld_env._BENCHMARKS.clear()  # each setup builds the task's benchmark, as a fresh `longboat eval` does
        start = time.perf_counter()
        summary = run_eval(cfg, progress=False)
        wall = time.perf_counter() - start
    episodes = read_results(root / name / "results.jsonl")
    latency = [x for e in episodes for x in e["latency_ms"]]
    infer = [x for e in episodes for x in e["infer_ms"]]
    timing = summary["this_run_timing"]
    loop = timing["env_s"] + timing["request_s"]  # the episodes themselves, without starting envs and clients
    return {"setup": name, "wall_s": wall, "episodes_per_s": len(episodes) / wall, **timing,
            "loop_episodes_per_s": len(episodes) / loop,
            "requests": len(latency), "round_trip_ms": float(np.mean(latency)), "infer_ms": float(np.mean(infer))}


def env_step_ms(size: int, steps: int = 30) -> tuple[float, float]:
    """One env's step without and with rendering its camera (ms)."""
    from longboat.eval.runners import ObservationSpec, make_runner

    out = []
    for cameras in ({}, {CAMERA: CAMERA}):
        runner = make_runner("metaworld", ObservationSpec(wire_keys={}, cameras=cameras, image_size=size))
        vec = runner.make_vector_env(TASK, 1, "sync")
        vec.reset(seed=[0])
        vec.step(np.zeros((1, 4), np.float32))
        start = time.perf_counter()
        for _ in range(steps):
            vec.step(np.zeros((1, 4), np.float32))
        out.append((time.perf_counter() - start) * 1000 / steps)
        vec.close()
    return out[0], out[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=48)
    parser.add_argument("--steps", type=int, default=120, help="steps per episode")
    parser.add_argument("--size", type=int, default=64, help="camera image size")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="time per forward pass")
    args = parser.parse_args()
    bare, rendered = env_step_ms(args.size)
    print(f"one env step: {bare:.2f} ms, {rendered:.2f} ms rendering a {args.size}px camera")
    with tempfile.TemporaryDirectory(prefix="longboat-eval-bench-") as tmp:
        rows = [setup(args, Path(tmp), "1 env, 1 request at a time", 1, 0.0, "sync"),
                setup(args, Path(tmp), "4 envs (sync), batched", 4, 2.0, "sync"),
                setup(args, Path(tmp), "4 envs (async), batched", 4, 2.0, "async"),
                setup(args, Path(tmp), "4 envs (async), deterministic", 4, 2.0, "async", deterministic=True)]
    print(f"{'setup':<31} {'wall s':>7} {'ep/s':>6} {'loop ep/s':>9} {'env s':>6} {'wait s':>7} {'requests':>8} "
          f"{'round trip ms':>13} {'infer ms':>8}")
    for r in rows:
        print(f"{r['setup']:<31} {r['wall_s']:7.1f} {r['episodes_per_s']:6.3f} {r['loop_episodes_per_s']:9.3f} "
              f"{r['env_s']:6.1f} {r['request_s']:7.1f} {r['requests']:8d} {r['round_trip_ms']:13.1f} "
              f"{r['infer_ms']:8.1f}")
    for r in rows[1:]:
        print(f"{r['setup']}: {r['episodes_per_s'] / rows[0]['episodes_per_s']:.2f}x episodes/s overall, "
              f"{r['loop_episodes_per_s'] / rows[0]['loop_episodes_per_s']:.2f}x once the envs are up (goal >= 2x)")
    batched, deterministic = rows[2], rows[3]
    print(f"deterministic serving: {deterministic['loop_episodes_per_s'] / batched['loop_episodes_per_s']:.2f}x the "
          f"batched episodes/s once the envs are up, round trip {deterministic['round_trip_ms']:.1f} ms vs "
          f"{batched['round_trip_ms']:.1f} ms")


if __name__ == "__main__":
    main()
