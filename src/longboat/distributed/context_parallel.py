"""Context parallelism, Ulysses-style: the ``cp`` ranks share each sample's token sequence, where the model's
``SequencePlan`` says.

Each rank keeps a contiguous ``1/cp`` of the tokens from the plan's split on, so everything that works per token
(projections, norms, MLPs, cross-attention to a context every rank holds whole) runs on a share. Around each
attention core an all-to-all on the ``cp`` process group trades the rank's tokens of all heads for all tokens of
``H / cp`` heads, the core attends over the whole sequence with those heads, and the reverse all-to-all brings the
rank its tokens back with every head. At the plan's gather the whole sequence is assembled on every rank.

The collectives are torch's differentiable functional ones. The gather's backward sums the ranks' (equal) output
gradients, so each rank's gradients are ``cp`` times its tokens' share; data parallelism then averages them over
``dp_shard × cp`` (FSDP) or ``dp × cp`` (DDP), which yields the sum of the shares: the single-process gradient.
Hooks leave the module tree (and so the state dict) as it is; they are registered before activation checkpointing
and compilation wrap the blocks, which then recompute and trace them with the block.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from longboat.config.base import ConfigError
from longboat.distributed.parallelize import plan_entry_matches
from longboat.models.registry import SequenceCut, SequencePlan

# torch 2.13 renamed the gather; older versions know only the first name.
_all_gather = getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd


def apply_context_parallel(model: nn.Module, cp_mesh: DeviceMesh, plan: SequencePlan) -> None:
    """Register the plan's splits, attention exchanges and gathers on ``model`` for the ranks of ``cp_mesh``."""
    group, size, rank = cp_mesh.get_group(), cp_mesh.size(), cp_mesh.get_local_rank()
    modules = dict(model.named_modules())
    for cut in plan.split:
        _hook_cut(modules, cut, functools.partial(_split, size=size, rank=rank), "split")
    for pattern in plan.attention:
        for name in _targets(modules, pattern, "attention"):
            modules[name].register_forward_pre_hook(
                functools.partial(_on_inputs, functools.partial(_tokens_to_heads, group=group, size=size, where=name)),
                with_kwargs=True)
            modules[name].register_forward_hook(
                lambda m, args, out: _heads_to_tokens(out, group=group, size=size))
    for cut in plan.gather:
        _hook_cut(modules, cut, functools.partial(_gather, group=group), "gather")


def _targets(modules: dict[str, nn.Module], pattern: str, what: str) -> list[str]:
    names = [name for name in modules if plan_entry_matches(name, pattern)]
    if not names:
        model = type(modules[""]).__name__
        raise ConfigError(f"sequence-parallel plan: {what} entry '{pattern}' matches no module of {model}; the plan "
                          "is out of date with the model")
    return names


def _hook_cut(modules: dict[str, nn.Module], cut: SequenceCut, fn, what: str) -> None:
    """``fn(x, dim, where)`` applied to the output, or to the named input, of every module the cut names."""
    for name in _targets(modules, cut.module, what):
        module, where = modules[name], f"{name or 'the model'}" + (f" ({cut.arg})" if cut.arg else "")
        apply = functools.partial(_each, fn, dim=cut.dim, where=where)
        if cut.arg is None:
            module.register_forward_hook(lambda m, args, out, apply=apply: apply(out))
            continue
        params = list(inspect.signature(module.forward).parameters)
        if cut.arg not in params:
            raise ConfigError(f"sequence-parallel plan: {type(module).__name__} at '{name}' takes no argument "
                              f"'{cut.arg}' (it takes {', '.join(params)})")
        index = params.index(cut.arg)
        module.register_forward_pre_hook(
            functools.partial(_on_argument, arg=cut.arg, index=index, apply=apply), with_kwargs=True)


def _each(fn, x: Any, dim: int, where: str) -> Any:
    """``fn`` on a tensor, or on each tensor of a tuple or list (rotary cos and sin)."""
    if isinstance(x, (tuple, list)):
        return type(x)(_each(fn, t, dim, where) for t in x)
    return fn(x, dim=dim, where=where) if isinstance(x, torch.Tensor) else x


def _on_argument(module: nn.Module, args: tuple, kwargs: dict, arg: str, index: int, apply) -> tuple[tuple, dict]:
    if arg in kwargs:
        return args, {**kwargs, arg: apply(kwargs[arg])}
    if index < len(args):
        return (*args[:index], apply(args[index]), *args[index + 1:]), kwargs
    return args, kwargs


def _on_inputs(fn, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``fn`` on every tensor input of an attention core (its queries, keys and values)."""
    def each(x):
        return fn(x) if isinstance(x, torch.Tensor) else x

    return tuple(each(a) for a in args), {k: each(v) for k, v in kwargs.items()}


def _split(x: torch.Tensor, dim: int, where: str, size: int, rank: int) -> torch.Tensor:
    """This rank's contiguous share along ``dim`` (its backward leaves the other ranks' positions zero)."""
    n = x.shape[dim]
    if n % size:
        raise ConfigError(f"parallel.cp={size} must divide the token count: {where} has {n} along dim {dim} "
                          f"(shape {list(x.shape)}); choose a frame count and size whose patch grid {size} divides")
    return x.narrow(dim, rank * (n // size), n // size)


def _gather(x: torch.Tensor, dim: int, where: str, group) -> torch.Tensor:
    """The ranks' shares concatenated along ``dim`` in rank order."""
    whole = _all_gather(x.movedim(dim, 0).contiguous(), 0, group)
    return whole.movedim(0, dim)


def _tokens_to_heads(x: torch.Tensor, group, size: int, where: str) -> torch.Tensor:
    """[B, N / cp, H, D] (this rank's tokens, every head) -> [B, N, H / cp, D] (every token, this rank's heads)."""
    b, n, h, d = x.shape
    if h % size:
        raise ConfigError(f"parallel.cp={size} must divide the {h} heads attending at {where}")
    x = x.reshape(b, n, size, h // size, d).permute(2, 0, 1, 3, 4).contiguous()  # [head group, B, n, H/cp, D]
    x = funcol.all_to_all_single_autograd(x, None, None, group)  # now [token share, B, n, H/cp, D]
    return x.permute(1, 0, 2, 3, 4).reshape(b, size * n, h // size, d)


def _heads_to_tokens(x: torch.Tensor, group, size: int) -> torch.Tensor:
    """The reverse: [B, N, H / cp, D] -> [B, N / cp, H, D]."""
    b, n, h, d = x.shape
    x = x.reshape(b, size, n // size, h, d).permute(1, 0, 2, 3, 4).contiguous()  # [token share, B, N/cp, H/cp, D]
    x = funcol.all_to_all_single_autograd(x, None, None, group)  # now [head group, B, N/cp, H/cp, D]
    return x.permute(1, 2, 0, 3, 4).reshape(b, n // size, size * h, d)
