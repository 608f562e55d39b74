"""A toy visuomotor policy, registered from outside the package through a run config's ``plugins:``.

A small convolutional network maps a 32×32 image and a state vector to a normalised action. The task reads a
safetensors file (``image`` uint8 [N, 3, H, W], ``state`` [N, S], ``action`` [N, A]), takes the model's sizes
from it, normalises state and action with statistics of its training split (checkpoint state and export asset),
freezes the image stem and reports the action error in the data's own units.
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F
from pydantic import Field
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import Dataset

from longboat.config.base import ConfigError, StrictModel
from longboat.models import ModelSpec, register_model
from longboat.tasks import Task, TaskData, fill_from_data, register_task
from longboat.trainer.optim import ParamGroup
from longboat.trainer.trainer import LossOutput


class ToyPolicyConfig(StrictModel):
    image_size: int = Field(gt=0)
    state_dim: int = Field(gt=0)
    action_dim: int = Field(gt=0)
    channels: int = Field(default=8, gt=0)
    hidden: int = Field(default=64, gt=0)


class ToyPolicy(nn.Module):
    def __init__(self, cfg: ToyPolicyConfig):
        super().__init__()
        self.cfg = cfg
        c = cfg.channels
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, stride=2, padding=1), nn.GELU())
        self.encoder = nn.Sequential(nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), nn.GELU(),
                                     nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(2 * c + cfg.state_dim, cfg.hidden), nn.GELU(),
                                  nn.Linear(cfg.hidden, cfg.action_dim))

    def forward(self, image: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.encoder(self.stem(image)), state], dim=-1))

    def init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                m.reset_parameters()


register_model(ModelSpec("toy_policy", ToyPolicyConfig, ToyPolicy, parallel_units=("stem", "encoder", "head")))


class ToyPolicyData(StrictModel):
    path: str
    valid_fraction: float = Field(default=0.1, ge=0, lt=1)
    # Fault injection for the tests: the loss raises at this training step (on this rank only, when set).
    fail_at_step: int | None = None
    fail_on_rank: int | None = None


class Samples(Dataset):
    def __init__(self, image, state, action):
        self.image, self.state, self.action = image, state, action

    def __len__(self) -> int:
        return len(self.image)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"image": self.image[i].float() / 255, "state": self.state[i], "action": self.action[i]}


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


@register_task("toy_policy")
class ToyPolicyTask(Task):
    data_config = ToyPolicyData
    unit = "samples"
    epochs = True

    def __init__(self, data: ToyPolicyData):
        super().__init__(data)
        self.stats: dict[str, torch.Tensor] = {}
        self._train_calls = 0

    def _shapes(self) -> dict[str, list[int]]:
        try:
            with safe_open(self.data.path, framework="pt") as f:
                return {k: f.get_slice(k).get_shape() for k in ("image", "state", "action")}
        except Exception as e:  # missing file, not safetensors, missing key
            raise ConfigError(f"data.path: {self.data.path}: {e}") from None

    def configure_model(self, fields: dict) -> dict:
        shapes = self._shapes()
        found = {"image_size": shapes["image"][-1], "state_dim": shapes["state"][1], "action_dim": shapes["action"][1]}
        return fill_from_data(fields, found, self.data.path)

    def build(self, model_cfg, train_cfg, seed: int, dp_size: int) -> TaskData:
        t = load_file(self.data.path)
        n_valid = int(len(t["image"]) * self.data.valid_fraction)
        n_train = len(t["image"]) - n_valid
        self.stats = {
            "state_mean": t["state"][:n_train].mean(0), "state_std": t["state"][:n_train].std(0) + 1e-6,
            "action_mean": t["action"][:n_train].mean(0), "action_std": t["action"][:n_train].std(0) + 1e-6,
        }
        parts = [Samples(t["image"][s], t["state"][s], t["action"][s])
                 for s in (slice(0, n_train), slice(n_train, None))]
        return TaskData(parts[0], parts[1] if n_valid else None, self.loss,
                        summary={"train_samples": n_train, "valid_samples": n_valid})

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
        if model.training:
            self._train_calls += 1
            if self._train_calls == self.data.fail_at_step and self.data.fail_on_rank in (None, _rank()):
                raise RuntimeError(f"injected failure at step {self._train_calls}")
        s = {k: v.to(batch["state"].device) for k, v in self.stats.items()}
        pred = model(batch["image"], (batch["state"] - s["state_mean"]) / s["state_std"])
        target = (batch["action"] - s["action_mean"]) / s["action_std"]
        n = len(pred)
        loss_sum = F.mse_loss(pred.float(), target, reduction="none").mean(-1).sum()
        metrics = None
        if not model.training:
            error = (pred.float() * s["action_std"] + s["action_mean"] - batch["action"]).abs().mean()
            metrics = {"action_l1": error}
        return LossOutput(loss_sum, n, n, metrics)

    def param_groups(self, model: nn.Module) -> list[ParamGroup]:
        names = [n for n, _ in model.named_parameters()]
        return [ParamGroup([n for n in names if n.startswith("encoder.")]),
                ParamGroup([n for n in names if n.startswith("head.")], lr_scale=0.5)]  # the stem stays frozen

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.stats)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.stats = dict(state)

    def export_assets(self) -> dict[str, bytes]:
        return {"normalization.json": json.dumps({k: v.tolist() for k, v in self.stats.items()}).encode()}
