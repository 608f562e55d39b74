"""The policy task's samples: dataset windows, transformed, keyed, and with the prompt tokenized when asked.

A sample at row ``t`` holds the observation window t-n_obs+1..t (cameras [T, C, H, W], state [T, S]) and the action
window t..t+horizon-1 ([H, A] with ``action_is_pad``), clamped at the episode's edges as LeRobot clamps them. The
loader hands each sample its position in the job's sample stream: the training pipeline's random draws (crops,
colour jitter) and the policy's ``noise_key`` are functions of (seed, position), so they do not depend on loader
workers, data-parallel layout or resumes.

Where the transforms run (``data.transforms_on``): in the loader workers (each sample transformed as it is read),
or on the training device: samples leave the workers untransformed with their cameras uint8 (a quarter of the
bytes to move), and ``BatchTransforms`` converts the collated batch to float and runs the pipeline on it there,
each sample drawing from its own keyed generator in the order the workers' path draws, so both give one batch.
"""

from __future__ import annotations

from typing import Callable

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


def keyed_generator(key: int) -> torch.Generator:
    """The generator of the transforms' draws for the sample whose noise key is ``key``."""
    return torch.Generator().manual_seed(key & _INT63)


def _row(index: int | tuple[int, int]) -> int:
    return index[0] if isinstance(index, tuple) else index


class PolicyWindows(Dataset):
    """Transformed windows of ``frames`` holding only what the policy reads (plus ``task`` and ``noise_key``);
    with ``transform=False``, untransformed windows (cameras as ``frames`` gives them) for ``BatchTransforms``."""

    positioned = True  # the loader calls __getitem__((row, position in the job's sample stream))

    def __init__(self, frames: RobotDataset, pipeline: Pipeline, cfg: PolicyConfig, seed: int,
                 prompts: PromptTokens | None = None, transform: bool = True):
        self.frames, self.pipeline, self.seed, self.prompts = frames, pipeline, seed, prompts
        self.transform = transform
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
        pad_key = f"{self.action_key}_is_pad"
        raw = {key: item[key] for key in [*self.keys, pad_key]}
        key = noise_key(self.seed, position)
        extra = {"noise_key": torch.tensor(key, dtype=torch.int64), "task": item["task"]}
        if self.prompts is not None:
            extra["prompt_tokens"], extra["prompt_mask"] = self.prompts(item["task"])
        if not self.transform:
            return {**raw, **extra}
        return policy_sample(self.pipeline.apply(raw, keyed_generator(key)), self.keys, pad_key, extra)


def policy_sample(out: dict, keys: list[str], pad_key: str, extra: dict) -> dict:
    """What the policy reads of a transformed item: its features, ``action_is_pad`` and ``extra``."""
    return {**{k: out[k] for k in keys}, "action_is_pad": out[pad_key], **extra}


class BatchTransforms:
    """A collated batch of untransformed windows (``PolicyWindows(transform=False)``) transformed where it is:
    cameras to float32 in [0, 1] (``to_float``), then the pipeline, sample i drawing from its ``noise_key``'s
    generator. Equal to the batch of the samples ``PolicyWindows`` transforms in the workers."""

    def __init__(self, pipeline: Pipeline, cfg: PolicyConfig, to_float: Callable[[dict], dict]):
        self.pipeline, self.to_float = pipeline, to_float
        self.action_key = cfg.action_feature
        self.keys = [*observation_keys(cfg), cfg.action_feature]

    def __call__(self, batch: dict) -> dict:
        pad_key = f"{self.action_key}_is_pad"
        raw = self.to_float({key: batch[key] for key in [*self.keys, pad_key]})
        generators = [keyed_generator(key) for key in batch["noise_key"].tolist()]
        extra = {k: v for k, v in batch.items() if k not in raw}
        return policy_sample(self.pipeline.apply_batch(raw, generators), self.keys, pad_key, extra)
