"""Does the trained VLA act on its prompt? On held-out episodes, the action error (robot units, mean absolute over
the chunk's real steps) with the episode's own task string against the same observations with each other task's.

    python examples/vla_prompts/measure.py runs/vla_prompts data/metaworld4 --episodes 20 21 ... --every 4
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch

from longboat.data.robot import RobotDataset
from longboat.recipes.artifact import open_artifact
from longboat.serving.policy_bundle import open_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run directory or export of the flow VLA")
    parser.add_argument("dataset", help="the LeRobot dataset it was trained on")
    parser.add_argument("--episodes", type=int, nargs="+", required=True, help="held-out episodes")
    parser.add_argument("--every", type=int, default=4, help="score every N-th frame (default 4)")
    args = parser.parse_args()

    bundle = open_policy(open_artifact(args.run))
    cfg, fps = bundle.config, bundle.spec["fps"]
    tasks = list(bundle.spec["tasks"])
    windows = {key: [0.0] for key in [*cfg.image_features, cfg.state_feature] if key is not None}
    windows[cfg.action_feature] = [i / fps for i in range(cfg.horizon)]
    frames = RobotDataset(args.dataset, windows, episodes=args.episodes, cameras=list(cfg.image_features))
    own, other = defaultdict(list), defaultdict(list)
    for start in range(0, len(frames), 64):
        items = [frames[i] for i in range(start, min(start + 64, len(frames)), args.every)]
        if not items:
            continue
        obs = {key: torch.stack([item[key] for item in items]) for key in windows if key != cfg.action_feature}
        target = torch.stack([item[cfg.action_feature] for item in items])
        real = (~torch.stack([item[f"{cfg.action_feature}_is_pad"] for item in items])).float()[..., None]
        keys = torch.arange(start, start + len(items))
        for prompt in tasks:
            acts = bundle.act({**obs, "task": [prompt] * len(items)}, noise_key=keys)
            error = ((acts - target).abs() * real).sum((1, 2)) / (real.sum((1, 2)) * target.shape[-1])
            for item, e in zip(items, error.tolist()):
                (own if item["task"] == prompt else other)[item["task"]].append(e)
    print(f"{'task':45s} {'own prompt':>11s} {'other prompts':>14s}")
    for task in tasks:
        if own[task]:
            print(f"{task:45s} {sum(own[task]) / len(own[task]):11.4f} {sum(other[task]) / len(other[task]):14.4f}")
    all_own = [e for v in own.values() for e in v]
    all_other = [e for v in other.values() for e in v]
    print(f"{'all':45s} {sum(all_own) / len(all_own):11.4f} {sum(all_other) / len(all_other):14.4f}")


if __name__ == "__main__":
    main()
