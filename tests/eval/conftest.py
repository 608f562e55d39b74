"""Shared by the evaluation tests: one episode's record as results.jsonl holds it."""


def episode(task, seed, success, latency=(10.0,)):
    return {"task": task, "seed": seed, "success": success, "reward": 1.0 * success, "length": 10 + seed,
            "failure": None if success else "time_limit", "latency_ms": list(latency), "infer_ms": [1.0],
            "wall_s": 0.1, "video": None}

