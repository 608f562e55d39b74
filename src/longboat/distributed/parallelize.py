"""Apply parallelism to a plain model from outside: EP → TP → CP → checkpointing → compile → FSDP/DDP.

The order matters (as in torchtitan): EP and TP turn weights into DTensors on the ``ep`` and ``tp`` axes, CP hooks
the model's own modules where its sequence plan cuts the tokens, activation checkpointing and compilation wrap whole
blocks, and FSDP shards last so that it sees the final modules and their DTensors.
Which modules are units (checkpointed, compiled, sharded one by one) the model's ``ModelSpec.parallel_units``
says; ``meta_init`` needs the model to define ``init_weights()``.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from fnmatch import fnmatchcase
from typing import Sequence

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from longboat.config.base import ConfigError
from longboat.distributed.config import ParallelConfig
from longboat.distributed.expert_parallel import apply_expert_parallel
from longboat.distributed.layout_checks import check_expert_parallel, expert_modules, expert_sets
from longboat.distributed.mesh import ParallelMesh
from longboat.models.registry import spec_of

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# FSDP2 (torch >= 2.13) warns on every forward whose output is a view, as logits from F.linear are, in case the
# caller modifies it in place; longboat's tasks only read model outputs.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


def parallel_units(model: nn.Module, names: Sequence[str]) -> list[tuple[nn.Module, str, nn.Module]]:
    """``(parent, attribute, unit)`` for every unit ``names`` declare: each child of a ``ModuleList``/``ModuleDict``,
    any other named module itself. The parent and attribute let a wrapper take the unit's place."""
    units = []
    for name in names:
        try:
            module = model.get_submodule(name)
        except AttributeError:
            raise ConfigError(f"parallel unit '{name}' names no module of {type(model).__name__}") from None
        if isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            units.extend((module, child_name, child) for child_name, child in module.named_children())
        else:
            parent, _, attr = name.rpartition(".")
            units.append((model.get_submodule(parent), attr, module))
    return units


def _require_units(model: nn.Module, names: Sequence[str], what: str) -> list[tuple[nn.Module, str, nn.Module]]:
    units = parallel_units(model, names)
    if not units:
        raise ConfigError(f"{what} works per unit, but {type(model).__name__}'s spec declares no parallel_units")
    return units


# ---- tensor parallel ---------------------------------------------------------------------------------------
def plan_entry_matches(name: str, pattern: str) -> bool:
    """``*`` stands for exactly one dotted component (a block index); ``""`` is the root module."""
    if pattern == "" or name == "":
        return pattern == name
    parts, pats = name.split("."), pattern.split(".")
    return len(parts) == len(pats) and all(fnmatchcase(p, q) for p, q in zip(parts, pats))


def apply_tensor_parallel(model: nn.Module, tp_mesh, plan: dict[str, ParallelStyle],
                          split_already: Sequence[nn.Module] = ()) -> None:
    """Apply each plan entry to every module its pattern names; a pattern that names nothing is an error.
    ``split_already`` (expert parallel's experts, which its ``ep × tp`` mesh split over tp too) are left alone."""
    modules = dict(model.named_modules())
    skip = {id(m) for m in split_already}
    for pattern, style in plan.items():
        targets = [name for name in modules if plan_entry_matches(name, pattern)]
        if not targets:
            raise ConfigError(
                f"tensor-parallel plan entry '{pattern}' matches no module of {type(model).__name__}; "
                "the plan is out of date with the model"
            )
        for name in targets:
            if id(modules[name]) not in skip:
                parallelize_module(modules[name], tp_mesh, style)


# ---- activation checkpointing and compile ------------------------------------------------------------------
def _save_list() -> set:
    """Ops whose outputs selective checkpointing keeps: matmuls (the experts' grouped ones too), attention, TP's
    reduce-scatters and CP's all-to-alls (a recomputed collective would communicate again)."""
    aten = torch.ops.aten
    names = [
        (aten, "mm"), (aten, "addmm"), (aten, "bmm"), (aten, "_grouped_mm"),
        (aten, "_scaled_dot_product_flash_attention"), (aten, "_scaled_dot_product_efficient_attention"),
        (aten, "_scaled_dot_product_cudnn_attention"), (aten, "_scaled_dot_product_flash_attention_for_cpu"),
        (torch.ops._c10d_functional, "reduce_scatter_tensor"), (torch.ops._c10d_functional, "all_to_all_single"),
    ]
    return {getattr(ns, op).default for ns, op in names if hasattr(ns, op)}


def _untrack_profiler_markers() -> None:
    """Selective checkpointing counts every op a block dispatches and expects its recompute to dispatch the same ones.
    The profiler's ``record_function`` markers break that where FSDP's hooks run inside the block (the experts, their
    own FSDP unit under expert parallel, compiled around): those hooks mark other work in backward than in forward.
    The markers compute nothing, so they join the ops torch's checkpointing leaves untracked."""
    ignored = getattr(torch.utils.checkpoint, "SAC_IGNORED_OPS", None)
    if ignored is not None:
        ignored.update({torch.ops.profiler._record_function_enter_new.default,
                        torch.ops.profiler._record_function_exit._RecordFunction})


def _selective_policy(save: set, ctx, op, *args, **kwargs) -> CheckpointPolicy:
    # Matmuls and attention are expensive to redo and their outputs small next to the pointwise ops
    # (norms, SiLU, RoPE) around them, which are cheap to recompute.
    return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE


def apply_activation_checkpointing(model: nn.Module, units: Sequence[str], mode: str, every: int) -> None:
    """Wrap every ``every``-th unit: ``full`` recomputes the whole unit, ``selective`` all but matmuls."""
    found = _require_units(model, units, f"parallel.activation_checkpointing={mode}")
    kwargs = {}
    if mode == "selective":
        _untrack_profiler_markers()
        policy = functools.partial(_selective_policy, _save_list())
        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, policy)
    for i, (parent, attr, unit) in enumerate(found):
        if i % every == 0:
            # The wrapper's state-dict hooks drop its `_checkpoint_wrapped_module.` prefix, so checkpoints and
            # exports keep the model's own names.
            parent.register_module(attr, checkpoint_wrapper(unit, **kwargs))


def apply_compile(model: nn.Module, units: Sequence[str], eager: Sequence[nn.Module] = ()) -> None:
    """Compile each unit in place (names unchanged); identical blocks share one compiled graph.

    A unit holding a module that must run eagerly instead has its largest submodules that hold none compiled, each
    as one graph, and runs the rest eagerly (torchtitan compiles its MoE blocks the same way). Such modules are those
    of ``eager`` and every module whose forward swaps in its local shards (the spec's
    ``ExpertSets.reads_local_shards``: tensor- and expert-parallel experts). Expert-parallel experts also read their all-to-all sizes from the routing on the host
    and send tokens with an in-place collective, neither of which a graph can hold.
    """
    sets = expert_sets(model)
    local = [m for m in model.modules() if sets.reads_local_shards(m)] if sets is not None else []
    eager_ids = {id(m) for m in eager} | {id(m) for m in local}
    for _, _, unit in _require_units(model, units, "parallel.compile"):
        _compile_around(unit, eager_ids)


def _compile_around(module: nn.Module, eager_ids: set[int]) -> None:
    if id(module) in eager_ids:
        return
    if not any(id(m) in eager_ids for m in module.modules()):
        # torch.compile finds no frame to trace in a bare torch.nn module (a norm or a linear layer on its own):
        # those stay eager, every module of the model's own is one graph.
        if not type(module).__module__.startswith("torch.nn."):
            module.compile(fullgraph=True)
        return
    for child in module.children():
        _compile_around(child, eager_ids)


# ---- data parallel -----------------------------------------------------------------------------------------
def apply_fsdp(model: nn.Module, units: Sequence[str], mesh: ParallelMesh, cfg: ParallelConfig,
               forward_methods: Sequence[str] = ()) -> None:
    """FSDP2 per unit, then the root (whatever no unit holds: embeddings, final norm, head); HSDP on a 2-D mesh.
    ``forward_methods`` (e.g. a policy's ``predict``) gather the root's weights as ``forward`` does."""
    mp = MixedPrecisionPolicy(
        param_dtype=_DTYPES[cfg.param_dtype] if cfg.param_dtype != "fp32" else None,
        reduce_dtype=_DTYPES[cfg.reduce_dtype],
    )
    blocks = [unit for _, _, unit in parallel_units(model, units)]
    for i, block in enumerate(blocks):
        # The last unit's gathered weights are needed again at once by backward: keep them.
        reshard = cfg.reshard_after_forward and i < len(blocks) - 1
        _shard_experts(model, block, mesh, mp, reshard)
        fully_shard(block, mesh=mesh.fsdp, mp_policy=mp, reshard_after_forward=reshard)
    _shard_experts(model, model, mesh, mp, cfg.reshard_after_forward)
    fully_shard(model, mesh=mesh.fsdp, mp_policy=mp, reshard_after_forward=cfg.reshard_after_forward)
    for name in forward_methods:
        register_fsdp_forward_method(model, name)


def _shard_experts(model: nn.Module, module: nn.Module, mesh: ParallelMesh, mp: MixedPrecisionPolicy,
                   reshard: bool) -> None:
    """Under expert parallel, FSDP units of their own for the experts (not yet sharded) inside ``module``, over
    the ranks that hold the same experts; the enclosing unit then leaves their weights alone."""
    if mesh.expert_fsdp is None:
        return
    for experts in expert_modules(model, module):
        if not isinstance(experts, FSDPModule):
            fully_shard(experts, mesh=mesh.expert_fsdp, mp_policy=mp, reshard_after_forward=reshard)


def apply_ddp(model: nn.Module, mesh: ParallelMesh, device: torch.device, cfg: ParallelConfig) -> nn.Module:
    """Wrap in ``DistributedDataParallel`` over all data-parallel ranks.

    The wrapper (not the private composable ``replicate``) is the stable API, and DCP's ``get_state_dict`` strips
    its ``module.`` prefix, so checkpoints move freely between DDP, FSDP and a single process.
    """
    # Buffers (RoPE tables) are computed identically on every rank; broadcasting them each step is waste.
    # (torch 2.13 renamed the flag; older versions know only the first name.)
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    no_sync = {"forward_sync_buffers": False} if "forward_sync_buffers" in params else {"broadcast_buffers": False}
    ddp = DistributedDataParallel(
        model,
        process_group=mesh.grad_group,  # with context parallel, its ranks' gradient shares too
        device_ids=[device.index] if device.type != "cpu" else None,
        **no_sync,
    )
    if cfg.reduce_dtype == "bf16":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

        ddp.register_comm_hook(mesh.grad_group, bf16_compress_hook)
    return ddp


# ---- meta-device initialisation ----------------------------------------------------------------------------
def _on_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in model.parameters()) or any(t.is_meta for t in model.buffers())


def materialize(model: nn.Module, device: torch.device) -> None:
    """Allocate a meta-device model (only this rank's shards once sharded) and initialise it.

    Modules added to a built model from outside (LoRA adapters), which the model's ``init_weights`` does not
    know, initialise their own tensors with ``init_adapter_weights()``.
    """
    if not callable(getattr(model, "init_weights", None)):
        raise ConfigError(f"parallel.meta_init needs {type(model).__name__}.init_weights() to fill the weights")
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights()
        for module in model.modules():
            if callable(getattr(module, "init_adapter_weights", None)):
                module.init_adapter_weights()


def _sharded_init_supported(device: torch.device) -> bool:
    # DTensor draws random shards consistently across ranks only where the device has a settable RNG state
    # (CUDA and the like). Elsewhere every rank initialises the full model first, then it is sharded.
    handle = getattr(torch, device.type, None)
    return handle is not None and hasattr(handle, "set_rng_state")


# ---- all together ------------------------------------------------------------------------------------------
def parallelize(
    model: nn.Module,
    mesh: ParallelMesh | None,
    cfg: ParallelConfig,
    tp_plan: dict[str, ParallelStyle] | None = None,
    device: torch.device | str = "cpu",
    units: Sequence[str] | None = None,
    forward_methods: Sequence[str] | None = None,
) -> nn.Module:
    """Apply ``cfg`` to ``model`` on ``mesh`` (None: one process) and return the module to train.

    ``units`` and ``forward_methods`` default to the ones the model's registered spec declares. The result is the same module, except
    with DDP, whose wrapper is returned. A model built on the meta device comes back allocated on ``device`` and
    initialised.
    """
    device = torch.device(device)
    if units is None:
        units = spec_of(model).parallel_units
    if forward_methods is None:
        forward_methods = spec_of(model).forward_methods
    uses_fsdp = mesh is not None and cfg.data_parallel == "fsdp"
    if cfg.param_dtype != "fp32" and not uses_fsdp:
        raise ConfigError(
            f"parallel.param_dtype={cfg.param_dtype} is applied by FSDP, which a single-process run does not use; "
            "use train.dtype=bf16 (autocast) or launch with torchrun"
        )
    check_expert_parallel(model, cfg.ep)
    if _on_meta(model) and not _sharded_init_supported(device):
        materialize(model, device)
    experts = expert_modules(model) if cfg.ep > 1 else []
    if mesh is not None and mesh.ep is not None:
        apply_expert_parallel(model, mesh.expert_split)
    if mesh is not None and mesh.tp is not None:
        if tp_plan is None:
            raise ConfigError(f"{type(model).__name__} has no tensor-parallel plan; set parallel.tp=1")
        apply_tensor_parallel(model, mesh.tp, tp_plan, split_already=experts)
    if mesh is not None and mesh.cp is not None:
        # Loaded here: it matches the plan's module patterns as the tensor-parallel plan's are matched above.
        from longboat.distributed.context_parallel import apply_context_parallel

        spec = spec_of(model)
        if spec.sequence_parallel is None:
            raise ConfigError(f"model '{spec.name}' has no sequence-parallel plan; set parallel.cp=1")
        apply_context_parallel(model, mesh.cp, spec.sequence_parallel)
    if cfg.activation_checkpointing != "none":
        apply_activation_checkpointing(model, units, cfg.activation_checkpointing, cfg.ac_every)
    if cfg.compile:
        apply_compile(model, units)
    if uses_fsdp:
        apply_fsdp(model, units, mesh, cfg, forward_methods)
    if _on_meta(model):
        materialize(model, device)
    if mesh is not None and cfg.data_parallel == "ddp":
        model = apply_ddp(model, mesh, device, cfg)
    return model
