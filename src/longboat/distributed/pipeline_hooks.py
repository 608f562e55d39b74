"""What longboat runs around each pipeline stage's forward: which micro-batch it is, the auxiliary losses of the
stage's layers, and undoing torch's shape-inference forward.

A model whose layers add auxiliary losses (MoE routers; the spec's ``ModelHooks.aux`` returns those of its last forward)
adds them to the training loss in one process. Under pipeline parallel each stage adds its own layers' part,
weighted by the task's ``aux_loss`` as one process weights the whole: the stage's output passes through
``_AddAuxLoss``, whose backward gives the part the gradient 1. The part's gradient so reaches the stage's
parameters, and the earlier stages' through the input gradient, as if it had been added to the loss, and no tensor
but the activations crosses stages. The detached parts are kept per stage and micro-batch for the logged loss and
metrics.

``torch.distributed.pipelining`` infers the shapes it sends by running micro-batch 0 through each stage once more
before the first step (and after each switch between training and evaluation). That forward must leave no trace
(an MoE layer counts the expert loads of every training forward for its bias update): the stage's buffers are
restored after it.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from longboat.distributed.loss import StagedLoss
from longboat.models.registry import hooks_of

MICROBATCH = "pipeline_microbatch"  # the keyword argument that tells a stage which micro-batch it runs


class _AddAuxLoss(torch.autograd.Function):
    """The stage's output unchanged; its backward also gives ``aux`` (a scalar) the gradient 1."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        ctx.aux_dtype, ctx.aux_device = aux.dtype, aux.device
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, torch.ones((), dtype=ctx.aux_dtype, device=ctx.aux_device)


def combine_aux(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One forward's aux of the whole model from its stages' (in stage order): scalars (summed over a stage's layers)
    add, per-layer rows concatenate."""
    return {k: sum(p[k] for p in parts) if parts[0][k].dim() == 0 else torch.cat([p[k] for p in parts])
            for k in parts[0]}


class StageHooks:
    """The forward hooks of one rank's stages (``attach`` each stage's module), reset by ``start`` for every run of
    the schedule and checked by ``finish``."""

    def __init__(self, loss: StagedLoss, n_microbatches: int):
        self.loss, self.n_microbatches = loss, n_microbatches
        self.batches: list[dict] = []
        self.train = False
        self.aux: dict[int, dict[int, dict[str, torch.Tensor]]] = {}  # stage -> micro-batch -> detached aux
        self._calls: dict[int, list[int]] = {}  # stage -> micro-batches it ran, in order
        self._snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self._inferring = True  # whether torch may run its shape inference in this run

    def attach(self, module: nn.Module, stage: int) -> None:
        # First in line, so that FSDP's own hooks never see the micro-batch index.
        module.register_forward_pre_hook(partial(self._before, stage), prepend=True, with_kwargs=True)
        module.register_forward_hook(partial(self._after, stage), with_kwargs=True)
        self._calls[stage] = []

    def start(self, batches: list[dict], train: bool) -> None:
        # torch infers the shapes on its first run and again when the run switches between training and evaluation.
        self._inferring = self._inferring or train != self.train
        self.batches, self.train, self.aux = batches, train, {}
        self._calls = {stage: [] for stage in self._calls}

    def finish(self) -> None:
        expected = list(range(self.n_microbatches))
        for stage, calls in self._calls.items():
            if calls != expected:
                raise RuntimeError(f"pipeline stage {stage} ran micro-batches {calls}, expected {expected} (once each, "
                                   "after torch's shape inference): this torch's pipelining schedules differ from "
                                   "those longboat was built for")
        self._inferring, self._snapshots = False, {}

    def _before(self, stage: int, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        kwargs = dict(kwargs)
        i = int(kwargs.pop(MICROBATCH))
        calls = self._calls[stage]
        if i == 0 and calls == [0] and stage in self._snapshots:  # the first call was torch's shape inference
            with torch.no_grad():
                for name, buffer in module.named_buffers():
                    # Only those it changed: a shared buffer (RoPE tables) may be saved for another stage's backward.
                    if not torch.equal(buffer, self._snapshots[stage][name]):
                        buffer.copy_(self._snapshots[stage][name])
            calls.clear()
        elif i == 0 and not calls and self._inferring:
            self._snapshots[stage] = {name: b.detach().clone() for name, b in module.named_buffers()}
        calls.append(i)
        return args, kwargs

    def _after(self, stage: int, module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor:
        aux_of = hooks_of(module).aux
        aux = aux_of(module) if aux_of is not None and self.train else None
        if aux is None:
            return output
        i = self._calls[stage][-1]
        self.aux.setdefault(stage, {})[i] = {k: v.detach() for k, v in aux.items()}
        return _AddAuxLoss.apply(output, self.loss.aux_loss(aux, self.batches[i]).loss_sum)
