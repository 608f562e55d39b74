"""The policy task's samples: dataset windows, transformed, keyed, and with the prompt tokenized when asked.

A sample at row ``t`` holds the observation window t-n_obs+1..t (cameras [T, C, H, W], state [T, S]) and the action
window t..t+horizon-1 ([H, A] with ``action_is_pad``), clamped at the episode's edges as LeRobot clamps them. The
loader hands each sample its position in the job's sample stream: the training pipeline's random draws (crops,
colour jitter) and the policy's ``noise_key`` are functions of (seed, position), so they do not depend on loader
workers, data-parallel layout or resumes.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from longboat.data.robot import RobotDataset
from longboat.data.robot.prompts import PromptTokens
from longboat.data.robot.transforms import Pipeline
from longboat.models.policy.base import PolicyConfig, observation_keys
from longboat.models.generative.keyed_random import noise_key

_INT63 = (1 << 63) - 1


def delta_timestamps(cfg: PolicyConfig, fps: float) -> dict[str, list[float]]:
    """Observation windows ending at the sample's frame, and the action chunk starting there, or ``first_action``
    frames earlier for a policy whose chunk starts in the past (LeRobot's Diffusion Policy: at the first observed
    frame, its ``predict`` returning the chunk from the current frame on)."""
    past = [(i - cfg.n_obs_steps + 1) / fps for i in range(cfg.n_obs_steps)]
    first = getattr(cfg, "first_action", 0)
    return {**{key: past for key in observation_keys(cfg)},
            cfg.action_feature: [(i - first) / fps for i in range(cfg.horizon)]}


def _row(index: int | tuple[int, int]) -> int:
    return index[0] if isinstance(index, tuple) else index


class PolicyWindows(Dataset):
    """Transformed windows of ``frames`` holding only what the policy reads (plus ``task`` and ``noise_key``)."""

    positioned = True  # the loader calls __getitem__((row, position in the job's sample stream))

    def __init__(self, frames: RobotDataset, pipeline: Pipeline, cfg: PolicyConfig, seed: int,
                 prompts: PromptTokens | None = None):
        self.frames, self.pipeline, self.seed, self.prompts = frames, pipeline, seed, prompts
        self.action_key = cfg.action_feature
        self.keys = [*observation_keys(cfg), cfg.action_feature]

    def __len__(self) -> int:
        return len(self.frames)

    @property
    def epoch_run(self) -> int:
        """Neighbouring rows the loader's shuffled epochs keep together (the dataset's ``epoch_run``)."""
        return self.frames.epoch_run

    def __getitems__(self, indices: list) -> list[dict]:
        """A loader's batch, read in row order so the video decoder runs forward through neighbouring windows."""
        items: list = [None] * len(indices)
        for i in sorted(range(len(indices)), key=lambda i: _row(indices[i])):
            items[i] = self[indices[i]]
        return items

    def __getitem__(self, index: int | tuple[int, int]) -> dict:
        row, position = index if isinstance(index, tuple) else (index, index)
        item = self.frames[row]
        raw = {key: item[key] for key in self.keys}
        raw[f"{self.action_key}_is_pad"] = item[f"{self.action_key}_is_pad"]
        key = noise_key(self.seed, position)
        out = self.pipeline.apply(raw, torch.Generator().manual_seed(key & _INT63))
        sample = {k: out[k] for k in self.keys}
        sample["action_is_pad"] = out[f"{self.action_key}_is_pad"]
        sample["noise_key"] = torch.tensor(key, dtype=torch.int64)
        sample["task"] = item["task"]
        if self.prompts is not None:
            sample["prompt_tokens"], sample["prompt_mask"] = self.prompts(item["task"])
        return sample
