"""``train.param_groups``: per-component learning-rate scales and freezing, by glob over parameter names.

Applied once, on top of the groups the task (and LoRA) declare, so every task honours them.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from pydantic import Field
from torch import nn

from longboat.config.base import ConfigError, StrictModel
from longboat.distributed.names import plain_name
from longboat.trainer.optim import ParamGroup


class ParamRule(StrictModel):
    match: str = Field(min_length=1, description="glob over the plain model's parameter names, e.g. layers.0.*")
    lr_scale: float = Field(ge=0, description="multiplies the learning rate of the parameters it matches; 0 freezes")


def apply_param_rules(model: nn.Module, groups: list[ParamGroup] | None,
                      rules: list[ParamRule]) -> list[ParamGroup] | None:
    """The task's groups (``None``: one of every trainable parameter) with each rule's scale applied to the
    parameters it matches, first matching rule first; a rule at 0 drops them, so ``freeze_outside`` freezes them.

    The scale multiplies the task's own (a VLA backbone at 0.1 under a rule at 0.5 learns at 0.05); a parameter
    the task or LoRA leaves frozen stays frozen. A rule that matches no parameter of the model is an error.
    """
    if not rules:
        return groups
    names = [plain_name(n) for n, _ in model.named_parameters()]
    for i, rule in enumerate(rules):
        if not any(fnmatchcase(n, rule.match) for n in names):
            raise ConfigError(f"train.param_groups[{i}].match: {rule.match!r} selects no parameter; the model's "
                              f"parameters are named like {', '.join(_examples(names))}")
    if groups is None:
        groups = [ParamGroup([plain_name(n) for n, p in model.named_parameters() if p.requires_grad])]
    out: list[ParamGroup] = []
    for group in groups:
        split: dict[int, list[str]] = {}  # rule index (len(rules): none) -> the group's names it takes
        for name in group.names:
            index = next((i for i, r in enumerate(rules) if fnmatchcase(name, r.match)), len(rules))
            split.setdefault(index, []).append(name)
        for index, members in split.items():  # in the order the task names them
            scale = rules[index].lr_scale if index < len(rules) else 1.0
            if scale > 0:
                out.append(ParamGroup(members, group.lr_scale * scale, group.weight_decay))
    if not out:
        raise ConfigError("train.param_groups: every trainable parameter is frozen (lr_scale 0), so nothing would "
                          "train")
    return out


def _examples(names: list[str], n: int = 6) -> list[str]:
    """A few names, one per distinct top-level component first, so the message shows the model's layout."""
    firsts: dict[str, str] = {}
    for name in names:
        firsts.setdefault(name.split(".")[0], name)
    picked = list(firsts.values())[:n]
    return picked + [m for m in names if m not in picked][: n - len(picked)]
