"""Pipeline parallelism with ``torch.distributed.pipelining``: the model cut into stages of consecutive layers.

Every rank builds the full model and deletes what its stages do not own, as the model spec's ``PipelineSplit``
says: layers outside its stages, the first stage's modules (the embedding) unless it runs the first stage, the
last stage's (final norm, head) unless it runs the last. A tied model's last stage keeps the embedding table its
head reads (``pipeline_tied``). The layers it keeps stay under their full-model
indices, so parameter names are the full model's and DCP checkpoints resume on any other pipeline layout.

Stages are assigned loop-style: rank ``r`` of ``pp`` runs stages ``r, r + pp, ...`` (``pp_virtual_stages`` of
them, as the interleaved schedule expects). The trainer trains, clips and checkpoints the rank's one pruned
model; each stage runs a view of it that holds only that stage's layers. The model's tensor-parallel plan applies
to the rank's layers over its slice's ``tp`` ranks (``pipeline_tp``); each view is an FSDP root over the stage's
data-parallel ranks.
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.distributed.tensor.parallel import ParallelStyle

from longboat.config.base import ConfigError
from longboat.distributed.config import ParallelConfig
from longboat.distributed.expert_parallel import apply_expert_parallel
from longboat.distributed.full_state import full_model_state
from longboat.distributed.layout_checks import (
    check_expert_parallel, check_microbatches, check_split, expert_modules, stage_layer_counts,
)
from longboat.distributed.loss import LossOutput, StagedLoss
from longboat.distributed.mesh import ParallelMesh
from longboat.distributed.parallelize import apply_activation_checkpointing, apply_compile, apply_fsdp, materialize
from longboat.distributed.pipeline_hooks import MICROBATCH, StageHooks, combine_aux
from longboat.distributed.pipeline_tied import TiedWeights
from longboat.distributed.pipeline_tp import apply_output_tensor_parallel, apply_stage_tensor_parallel, check_plan
from longboat.models.registry import PipelineSplit

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B}


class StageLayers(nn.ModuleDict):
    """The layers a rank keeps, keyed by their index in the full model (so names stay ``layers.<i>.…``); it
    iterates over its layers in order, as the ``ModuleList`` it replaces does."""

    def __iter__(self):
        return iter(self.values())


def _stage_ids(cfg: ParallelConfig, pp_rank: int) -> list[int]:
    return [pp_rank + k * cfg.pp for k in range(cfg.pp_virtual_stages)]


def _layer_ranges(counts: list[int]) -> list[range]:
    starts = [sum(counts[:i]) for i in range(len(counts))]
    return [range(s, s + n) for s, n in zip(starts, counts)]


def _keep(model: nn.Module, split: PipelineSplit, layers: dict[str, nn.Module], first: bool, last: bool) -> None:
    """Leave on ``model`` only ``layers`` and, where its stages need them, the first and last stage's children
    (the last stage keeps the first's tied ones)."""
    setattr(model, split.layers, StageLayers(layers))
    dropped = () if first else tuple(n for n in split.first if not (last and n in split.tied))
    for name in dropped + (() if last else split.last):
        setattr(model, name, None)


def _view(model: nn.Module, split: PipelineSplit, layer_ids: range, first: bool, last: bool) -> nn.Module:
    """A module of ``model``'s class that shares its children but holds only one stage's layers."""
    view = copy.copy(model)
    # Tables of its own (children, hooks FSDP adds to the view): the children themselves stay shared.
    for key, value in vars(model).items():
        if isinstance(value, (dict, set)):
            vars(view)[key] = copy.copy(value)
    kept = model.get_submodule(split.layers)
    _keep(view, split, {str(i): kept[str(i)] for i in layer_ids}, first, last)
    return view


class Pipeline:
    """Runs a step's micro-batches through this rank's stages with the schedule; see ``build_pipeline``.

    The loss is the task's summed loss per micro-batch (``scale_grads=False``), so gradients accumulate as the
    trainer's own micro-batch loop accumulates them; the trainer still divides by the global batch's count. In
    training each stage adds its own layers' auxiliary losses (``pipeline_hooks``). Every rank of the pipeline gets
    the step's totals: the last stage's loss and the whole model's auxiliary losses, as one process logs them.
    """

    def __init__(self, model: nn.Module, stages: list[PipelineStage], cfg: ParallelConfig, mesh: ParallelMesh,
                 loss: StagedLoss, n_microbatches: int, tied: TiedWeights):
        self.model, self.stages, self.loss, self.tied = model, stages, loss, tied
        self.group = mesh.pp.get_group()
        self.last_rank = cfg.pp - 1  # loop-style assignment puts the last stage on the last rank
        self.has_first = any(stage.is_first for stage in stages)
        self.has_last = any(stage.is_last for stage in stages)
        schedule = SCHEDULES[cfg.pp_schedule]
        owned = stages if cfg.pp_schedule == "interleaved_1f1b" else stages[0]
        self.schedule = schedule(owned, n_microbatches, loss_fn=self._stage_loss, scale_grads=False)
        self.n_microbatches = n_microbatches
        self.hooks = StageHooks(loss, n_microbatches)
        for stage in stages:
            self.hooks.attach(stage.submod, stage.stage_index)
        self._device = stages[0].device
        self._batches: list[dict] = []
        self._outputs: dict[int, LossOutput] = {}

    def _stage_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # The target is the micro-batch's index; the schedule also calls this once to infer gradient shapes,
        # which a later call for the same index overwrites.
        i = int(target)
        out = self.loss.output_loss(output, self._batches[i])
        self._outputs[i] = out
        return out.loss_sum

    def _run(self, batches: list[dict], train: bool) -> LossOutput:
        if len(batches) != self.n_microbatches:
            raise ValueError(f"the pipeline runs {self.n_microbatches} micro-batches at a time, got {len(batches)}")
        self._batches, self._outputs = batches, {}
        inputs = [self.loss.model_inputs(batch) for batch in batches]
        # The schedule cuts the concatenated batch back into the same micro-batches.
        args = tuple(torch.cat(parts) for parts in zip(*(a for a, _ in inputs))) if self.has_first else ()
        kwargs = {k: torch.cat([kw[k] for _, kw in inputs]) for k in inputs[0][1]}
        kwargs[MICROBATCH] = torch.arange(len(batches))  # cut into one index per micro-batch, as the target
        target = torch.arange(len(batches)) if self.has_last else None
        run = self.schedule.step if train else self.schedule.eval
        self.hooks.start(batches, train)
        run(*args, target=target, return_outputs=False, **kwargs)
        self.hooks.finish()
        return self._totals()

    def _totals(self) -> LossOutput:
        """The step's totals on every rank, from the last stage's losses and every stage's auxiliary losses."""
        outs = [_floats(self._outputs[i]) for i in range(self.n_microbatches)] if self.has_last else None
        aux = {stage: {i: {k: v.cpu() for k, v in part.items()} for i, part in parts.items()}
               for stage, parts in self.hooks.aux.items()}
        gathered: list = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(gathered, (outs, aux), group=self.group)
        outs = gathered[self.last_rank][0]
        aux = {stage: parts for _, rank_aux in gathered for stage, parts in rank_aux.items()}
        loss_sum = count = 0.0
        units = 0
        metrics: dict[str, float] = {}
        for i, (out_loss, out_count, out_units, out_metrics) in enumerate(outs):
            if aux:  # the whole model's auxiliary losses of micro-batch i, added as one process adds them
                whole = combine_aux([aux[stage][i] for stage in sorted(aux)])
                part_loss, _, _, part_metrics = _floats(
                    self.loss.aux_loss({k: v.to(self._device) for k, v in whole.items()}, self._batches[i]))
                out_loss, out_metrics = out_loss + part_loss, {**out_metrics, **part_metrics}
            loss_sum, count, units = loss_sum + out_loss, count + out_count, units + out_units
            for k, v in out_metrics.items():
                metrics[k] = metrics.get(k, 0.0) + v / len(outs)
        return LossOutput(torch.tensor(loss_sum, dtype=torch.float64), count, units, metrics)

    def train_step(self, batches: list[dict]) -> LossOutput:
        """Forward and backward of ``batches`` (``n_microbatches`` of them); gradients accumulate in the stages."""
        out = self._run(batches, train=True)
        self.tied.sum_gradients(self.model)
        return out

    def evaluate(self, batches: list[dict]) -> LossOutput:
        return self._run(batches, train=False)

    @property
    def stage_ranks(self) -> int:
        """How many ranks hold each of this rank's stages (every rank's data-parallel and tensor-parallel peers)."""
        return dist.get_world_size() // dist.get_world_size(self.group)

    def counted_elsewhere(self) -> list[nn.Parameter]:
        """Parameters whose gradient the gradient norm counts on another stage: the last stage's tied copies."""
        return self.tied.copies(self.model)


def _floats(out: LossOutput) -> tuple[float, float, int, dict[str, float]]:
    """A micro-batch's loss as plain numbers, to send between ranks."""
    metrics = {k: float(v) for k, v in (out.metrics or {}).items()}
    return float(out.loss_sum.detach()), float(out.count), out.units, metrics


def _materialize_stages(model: nn.Module, device: torch.device, pp_rank: int) -> None:
    """``parallel.meta_init``: allocate and initialise the rank's own stages in full; FSDP then keeps its shards.
    (Sharded initialisation would have to allocate each buffer that the stage views share once for all of them.)

    Each pipeline rank draws from a random stream of its own (the same on its data-parallel ranks), so that no two
    stages start from the same numbers; the weights are a fresh draw, not those of the run without ``meta_init``.
    """
    with torch.random.fork_rng(devices=[device] if device.type != "cpu" else [], device_type=device.type):
        torch.manual_seed(torch.initial_seed() + 1 + pp_rank)
        materialize(model, device)


def build_pipeline(
    model: nn.Module,
    split: PipelineSplit,
    mesh: ParallelMesh,
    cfg: ParallelConfig,
    loss: StagedLoss,
    n_microbatches: int,
    device: torch.device | str,
    units: Sequence[str],
    forward_methods: Sequence[str] = (),
    tp_plan: dict[str, ParallelStyle] | None = None,
) -> tuple[nn.Module, Pipeline]:
    """Cut ``model`` (the full model, on every rank; on the meta device for ``parallel.meta_init``) down to this
    rank's stages and parallelize them as ``parallelize`` does the whole model: EP, TP (``tp_plan``, over the
    ``tp`` ranks of the rank's pipeline slice), activation checkpointing, compile, then FSDP per stage.

    Returns the rank's pruned model (train, clip and checkpoint it) and the ``Pipeline`` that runs its stages.
    """
    if mesh.pp is None:
        raise ConfigError("build_pipeline needs parallel.pp > 1")
    check_microbatches(cfg, n_microbatches)
    device = torch.device(device)
    layers = check_split(model, split)
    check_expert_parallel(model, cfg.ep)
    if mesh.tp is not None:
        if tp_plan is None:
            raise ConfigError(f"{type(model).__name__} has no tensor-parallel plan; set parallel.tp=1")
        check_plan(model, tp_plan)
    n_stages = cfg.pp * cfg.pp_virtual_stages
    ranges = _layer_ranges(stage_layer_counts(len(layers), n_stages, cfg.pp_layers))
    stage_ids = _stage_ids(cfg, mesh.pp.get_local_rank())
    owned = {str(i): layers[i] for s in stage_ids for i in ranges[s]}
    _keep(model, split, owned, first=0 in stage_ids, last=n_stages - 1 in stage_ids)
    tied = TiedWeights(model, split, mesh, first=0 in stage_ids, last=n_stages - 1 in stage_ids)
    if any(p.is_meta for p in model.parameters()):
        _materialize_stages(model, device, mesh.pp.get_local_rank())
    tied.copy_from_first(model)
    experts = expert_modules(model) if mesh.ep is not None else []
    if experts:  # a stage of dense layers has none
        apply_expert_parallel(model, mesh.expert_split)
    if mesh.tp is not None:
        apply_stage_tensor_parallel(model, mesh.tp, tp_plan, split,
                                    [(ranges[s], s == 0, s == n_stages - 1) for s in stage_ids], experts)
    if cfg.activation_checkpointing != "none":
        apply_activation_checkpointing(model, units, cfg.activation_checkpointing, cfg.ac_every)
    if cfg.compile:
        apply_compile(model, units)
    if len(stage_ids) == 1:
        views = [model]
    else:
        views = [_view(model, split, ranges[s], first=s == 0, last=s == n_stages - 1) for s in stage_ids]
    for view, s in zip(views, stage_ids):
        if mesh.tp is not None and s == n_stages - 1:
            apply_output_tensor_parallel(view, mesh.tp, tp_plan)
        apply_fsdp(view, units, mesh, cfg, forward_methods)
    group = mesh.pp.get_group()
    stages = [PipelineStage(view, s, n_stages, device, group=group) for view, s in zip(views, stage_ids)]
    return model, Pipeline(model, stages, cfg, mesh, loss, n_microbatches, tied)


def gather_full_state(model: nn.Module, mesh: ParallelMesh) -> dict[str, torch.Tensor]:
    """Every stage's full parameters on rank 0, on CPU (an empty dict elsewhere), for an export.

    Each stage's first data-parallel (and tensor-parallel) rank gathers its stage, then sends it to rank 0 through
    the object collectives: simple, and memory-hungry on rank 0 for very large models.
    """
    state = full_model_state(model)
    sends = mesh.dp_rank == 0 and (mesh.tp is None or mesh.tp.get_local_rank() == 0)  # one rank per stage
    mine = {k: v.cpu() for k, v in state.items()} if sends else {}
    parts: list = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, parts, dst=0)
    return {k: v for part in parts for k, v in part.items()} if parts is not None else {}
