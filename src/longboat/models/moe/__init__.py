"""Mixture-of-experts feed-forward layer shared by the decoder families."""

from longboat.models.moe.config import MoEConfig
from longboat.models.moe.experts import GroupedExperts, SwiGLU, fuse_gate_up, split_gate_up
from longboat.models.moe.layer import MoE
from longboat.models.moe.router import Router, Routing

__all__ = ["GroupedExperts", "MoE", "MoEConfig", "Router", "Routing", "SwiGLU", "fuse_gate_up", "split_gate_up"]
