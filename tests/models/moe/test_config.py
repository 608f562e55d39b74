"""MoE config errors name the problem."""

from __future__ import annotations

import pytest

from longboat.config.base import ConfigError, validate
from longboat.models.moe import MoEConfig


def test_config_errors_name_the_problem():
    with pytest.raises(ConfigError, match="did you mean 'top_k'"):
        validate(MoEConfig, {"d_model": 8, "n_experts": 4, "topk": 2, "expert_ffn_dim": 8})
    with pytest.raises(ConfigError, match="divisible by n_groups"):
        validate(MoEConfig, {"d_model": 8, "n_experts": 6, "top_k": 2, "expert_ffn_dim": 8, "n_groups": 4})
    with pytest.raises(ConfigError, match="top_k"):
        validate(MoEConfig, {"d_model": 8, "n_experts": 8, "top_k": 6, "expert_ffn_dim": 8, "n_groups": 4,
                             "topk_groups": 1})
    with pytest.raises(ConfigError, match="shared_expert_gate"):
        validate(MoEConfig, {"d_model": 8, "n_experts": 4, "top_k": 2, "expert_ffn_dim": 8, "shared_expert_gate": True})
