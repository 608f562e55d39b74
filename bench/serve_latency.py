"""Policy serving: round-trip latency against a bare websockets server, and throughput with many clients.

Latency: one client sends an openpi-style observation (two 224×224×3 uint8 images and an 8-dim state) to
  (a) ``PolicyServer``, the server ``longboat serve`` runs, with a trivial policy (zero actions), and
  (b) a bare websockets server that decodes the msgpack-numpy message and encodes a reply of the same shape,
in the same run, requests alternating between the two so machine noise hits both; p50/p99 of each and their ratio (goal ≤ 1.2×).

Throughput: 1, 4, 16 and 32 client processes, each sending requests back to back for a few seconds, against
``longboat serve`` with batching on (a window of 2 ms) and off; requests per second and the mean batch. The policy
is a policy export (``--export``) or, by default, the untrained stand-in MLP (``--random-policy``), optionally with
``--delay-ms`` per forward pass to stand in for a model whose time does not grow with the batch, as on a GPU.

    python -P bench/serve_latency.py [--requests 2000] [--seconds 5] [--export DIR] [--delay-ms 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import re
import statistics
import subprocess
import sys
import time

import numpy as np

from longboat.eval.client import PolicyClient
from longboat.eval.server_manager import ServerManager, free_port

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
    from longboat.eval.server import PolicyServer, ServerConfig

    PolicyServer(ZeroPolicy(), ServerConfig(port=port)).run()


def serve_bare(port: int) -> None:
    """The floor: openpi's server loop with no policy, no checks and no batching."""
    from websockets.asyncio.server import serve

    from longboat.eval.protocol import Packer, unpackb

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


def latency(requests: int) -> None:
    servers = {role: _server(role) for role in ("longboat", "bare")}
    try:
        clients = {role: PolicyClient(port=port, connect_timeout_s=120) for role, (_, port) in servers.items()}
        obs = observation()
        times: dict[str, list[float]] = {role: [] for role in servers}
        for role, client in clients.items():  # warm-up
            for _ in range(20):
                client.infer(obs, seed=0)
        for _ in range(requests):  # alternating request by request, so both see the same machine
            for role, client in clients.items():
                start = time.perf_counter()
                client.infer(obs, seed=0)
                times[role].append((time.perf_counter() - start) * 1000)
        stats = {role: (statistics.median(t), float(np.percentile(t, 99))) for role, t in times.items()}
        print(f"round trip, two 224x224x3 images + state, {len(times['bare'])} requests each:")
        for role, (p50, p99) in stats.items():
            print(f"  {role:9s} p50 {p50:6.3f} ms   p99 {p99:6.3f} ms")
        print(f"  ratio     p50 {stats['longboat'][0] / stats['bare'][0]:.2f}x    "
              f"p99 {stats['longboat'][1] / stats['bare'][1]:.2f}x")
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait()


def _client_loop(port: int, seconds: float, start_at: float, seed: int, counts) -> None:
    client = PolicyClient(port=port, connect_timeout_s=120)
    obs = observation(seed)
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
    parser.add_argument("--export", default=None, help="a policy export to serve for the throughput runs")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="stand-in MLP: extra time per forward pass")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args()
    if args.serve:
        (serve_ours if args.serve == "longboat" else serve_bare)(args.port)
        return
    if not args.skip_latency:
        latency(args.requests)
    if not args.skip_throughput:
        serve_args = [args.export] if args.export else \
            ["--random-policy", json.dumps({"delay_ms": args.delay_ms}), "--device", "cpu"]
        throughput(serve_args, [int(c) for c in args.clients.split(",")], args.seconds)


if __name__ == "__main__":
    main()
