"""Policy serving: round-trip latency against a bare websockets server, and throughput with many clients.

Latency: one client sends an openpi-style observation (two 224×224×3 uint8 images and an 8-dim state) to
  (a) ``PolicyServer``, the server ``longboat serve`` runs, with a trivial policy (zero actions), and
  (b) a bare websockets server that decodes the msgpack-numpy message and encodes a reply of the same shape,
in the same run, requests alternating between the two so machine noise hits both; p50/p99 of each and their ratio
(goal ≤ 1.2×), and each server's CPU time per request, which a loaded machine does not inflate.

Throughput: 1, 4, 16 and 32 client processes, each sending requests back to back for a few seconds, against
``longboat serve`` with batching on (a window of 2 ms) and off; requests per second and the mean batch. The policy:
``--policy mlp`` (default), the ``mlp`` architecture's default preset, randomly initialised, exported with a
transform pipeline (two 224×224 cameras resized to 96×96, normalised state and actions) and served from that
export; ``--policy random``, the untrained stand-in (``--random-policy``), with ``--delay-ms`` per forward pass to
stand in for a model whose time does not grow with the batch, as on a GPU; or ``--export DIR``, any policy export.
Clients build their observations from the shapes in the server's metadata.

    python -P bench/serve_latency.py [--requests 2000] [--seconds 5] [--policy mlp|random] [--export DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from longboat.serving.client import PolicyClient
from longboat.serving.server_manager import ServerManager, free_port

HORIZON, ACTION_DIM = 10, 7


def observation(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/state": rng.standard_normal(8).astype(np.float32), "prompt": "put the bowl on the plate"}


class ZeroPolicy:
    """The trivial policy: accepts any observation, answers zero actions."""

    metadata: dict = {"policy": "zero"}

    def check(self, obs: dict) -> None:
        pass

    def infer(self, observations: list[dict], seeds: list[int]) -> list[dict]:
        return [{"actions": np.zeros((HORIZON, ACTION_DIM), np.float32)} for _ in observations]


def serve_ours(port: int) -> None:
    from longboat.serving.server import PolicyServer, ServerConfig

    PolicyServer(ZeroPolicy(), ServerConfig(port=port)).run()


def serve_bare(port: int) -> None:
    """The floor: openpi's server loop with no policy, no checks and no batching."""
    from websockets.asyncio.server import serve

    from longboat.serving.protocol import Packer, unpackb

    async def handle(ws):
        packer = Packer()
        await ws.send(packer.pack({}))
        async for message in ws:
            start = time.monotonic()
            unpackb(message)
            reply = {"actions": np.zeros((HORIZON, ACTION_DIM), np.float32), "seed": 0,
                     "policy_timing": {"infer_ms": 0.0}, "server_timing": {"infer_ms": (time.monotonic() - start)}}
            await ws.send(packer.pack(reply))

    async def main():
        async with serve(handle, "127.0.0.1", port, compression=None, max_size=None):
            await asyncio.Future()

    asyncio.run(main())


def _server(role: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-P", __file__, "--serve", role, "--port", str(port)],
                            stderr=subprocess.DEVNULL)
    return proc, port


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its threads so far (Linux), which machine load does not inflate."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def latency(requests: int) -> None:
    servers = {role: _server(role) for role in ("longboat", "bare")}
    try:
        clients = {role: PolicyClient(port=port, connect_timeout_s=120) for role, (_, port) in servers.items()}
        obs = observation()
        times: dict[str, list[float]] = {role: [] for role in servers}
        for role, client in clients.items():  # warm-up
            for _ in range(20):
                client.infer(obs, seed=0)
        cpu = {role: _cpu_seconds(proc.pid) for role, (proc, _) in servers.items()}
        for _ in range(requests):  # alternating request by request, so both see the same machine
            for role, client in clients.items():
                start = time.perf_counter()
                client.infer(obs, seed=0)
                times[role].append((time.perf_counter() - start) * 1000)
        cpu = {role: (_cpu_seconds(proc.pid) - cpu[role]) / requests * 1e6 for role, (proc, _) in servers.items()}
        stats = {role: (statistics.median(t), float(np.percentile(t, 99))) for role, t in times.items()}
        print(f"round trip, two 224x224x3 images + state, {requests} requests each:")
        for role, (p50, p99) in stats.items():
            print(f"  {role:9s} p50 {p50:6.3f} ms   p99 {p99:6.3f} ms   server CPU {cpu[role]:5.0f} us/request")
        print(f"  ratio     p50 {stats['longboat'][0] / stats['bare'][0]:.2f}x    "
              f"p99 {stats['longboat'][1] / stats['bare'][1]:.2f}x    "
              f"server CPU {cpu['longboat'] / cpu['bare']:.2f}x")
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait()


def from_shapes(shapes: dict[str, list[int]], seed: int) -> dict:
    """An observation of the shapes a server asks for: uint8 images [H, W, C], float32 vectors."""
    rng = np.random.default_rng(seed)
    return {key: rng.integers(0, 256, shape, dtype=np.uint8) if len(shape) == 3
            else rng.standard_normal(shape).astype(np.float32) for key, shape in shapes.items()}


def mlp_export(directory: str) -> str:
    """A randomly initialised ``mlp`` (default preset) exported as the policy task exports: weights, config,
    transforms and policy.json, LIBERO's wire keys mapped to two cameras and the state."""
    import torch

    from longboat.checkpoint.export import save_export
    from longboat.data.robot.transforms import Pipeline, pipeline_assets
    from longboat.models import get_model

    spec = get_model("mlp")
    cams = {"observation/image": "observation.images.image", "observation/wrist_image": "observation.images.wrist"}
    cfg = spec.config(**{**spec.load_preset("default"), "image_features": {c: [3, 96, 96] for c in cams.values()},
                         "state_dim": 8, "action_dim": ACTION_DIM})
    torch.manual_seed(0)
    model = spec.build(cfg)
    state, action = "observation.state", "action"
    stats = {state: {"mean": torch.zeros(8), "std": torch.ones(8)},
             action: {"mean": torch.zeros(ACTION_DIM), "std": torch.ones(ACTION_DIM)}}
    pipeline = Pipeline.from_config([{"type": "resize_pad", "keys": list(cams.values()), "size": [96, 96]},
                                     {"type": "normalize", "features": {state: "mean_std", action: "mean_std"}}], stats)
    inputs = {**{c: {"shape": [224, 224, 3]} for c in cams.values()}, state: {"shape": [8]}}
    policy_json = {"format_version": 1, "horizon": cfg.horizon, "n_obs_steps": 1, "input_features": inputs,
                   "wire_keys": {**cams, "observation/state": state}, "prompt": None}
    assets = {**pipeline_assets(pipeline), "policy.json": json.dumps(policy_json).encode()}
    save_export(directory, model, "mlp", cfg.model_dump(mode="json"), assets, extra={"task": "policy"},
                overwrite=True)
    return directory


def _client_loop(port: int, seconds: float, start_at: float, seed: int, counts) -> None:
    client = PolicyClient(port=port, connect_timeout_s=120)
    obs = from_shapes(client.metadata["observation_shapes"], seed)
    while time.time() < start_at:
        time.sleep(0.001)
    done, stop = 0, start_at + seconds
    while time.time() < stop:
        client.infer(obs, seed=seed)
        done += 1
    counts[seed] = done


def throughput(serve_args: list[str], clients: list[int], seconds: float) -> None:
    print(f"throughput, {seconds:g} s per point, `longboat serve {' '.join(serve_args)}`:")
    print("  clients  batching   req/s   mean batch")
    for window in (2.0, 0.0):
        for n in clients:
            log = f"/tmp/longboat_serve_bench_{n}_{window}.log"
            open(log, "w").close()
            with ServerManager([*serve_args, "--batch-window-ms", str(window), "--max-batch", "32"], log,
                               startup_timeout_s=300) as manager:
                counts = mp.Manager().dict()
                start_at = time.time() + 3 + 0.1 * n  # every client connected before the clock starts
                procs = [mp.Process(target=_client_loop, args=(manager.port, seconds, start_at, i, counts))
                         for i in range(n)]
                for p in procs:
                    p.start()
                for p in procs:
                    p.join()
            served = re.search(r"stopped after (\d+) requests in (\d+) forward passes", open(log).read())
            batch = int(served[1]) / max(int(served[2]), 1) if served else float("nan")
            print(f"  {n:7d}  {'on ' if window else 'off'}      {sum(counts.values()) / seconds:7.1f}   {batch:6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", choices=["longboat", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", default="1,4,16,32")
    parser.add_argument("--policy", choices=["mlp", "random"], default="mlp", help="what the throughput runs serve")
    parser.add_argument("--export", default=None, help="serve this policy export instead")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="--policy random: extra time per forward pass")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args()
    if args.serve:
        (serve_ours if args.serve == "longboat" else serve_bare)(args.port)
        return
    if not args.skip_latency:
        latency(args.requests)
    if not args.skip_throughput:
        with tempfile.TemporaryDirectory(prefix="longboat-serve-bench-") as scratch:
            if args.export:
                serve_args = [args.export]
            elif args.policy == "mlp":
                serve_args = [mlp_export(f"{scratch}/mlp")]
            else:
                serve_args = ["--random-policy", json.dumps({"delay_ms": args.delay_ms})]
            throughput(serve_args, [int(c) for c in args.clients.split(",")], args.seconds)


if __name__ == "__main__":
    main()
