"""SmolVLA's own behaviour beyond LeRobot parity (tests/models/policy/lerobot/test_smolvla.py): the image resizing,
prompt padding that changes nothing, the flow-matching loss, keyed sampling, the layer layouts it refuses."""

import pytest
import torch
from pydantic import ValidationError

from longboat.models.policy.smolvla import SmolVLA, SmolVLAConfig
from longboat.models.policy.smolvla.model import resize_with_pad

VLM = {"vision": {"arch": "siglip", "image_size": 16, "patch_size": 4, "d_model": 16, "n_layers": 1, "n_heads": 2,
                  "final_norm": True},
       "projector": {"kind": "pixel_shuffle", "merge_size": 2},
       "language": {"vocab_size": 40, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 64,
                    "max_seq_len": 64},
       "image_token_id": 3}


def config(**changes) -> SmolVLAConfig:
    fields = {"image_features": {"observation.images.cam": [3, 12, 16]}, "state_dim": 3, "action_dim": 2,
              "horizon": 4, "vlm": VLM, "expert": {"d_model": 24, "ffn_dim": 48, "n_layers": 2},
              "resize_pad": [16, 16], "max_state_dim": 4, "max_action_dim": 3, "max_prompt_len": 6, "num_steps": 3}
    return SmolVLAConfig(**{**fields, **changes})


def batch(prompt_len=6, valid=4):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 40, (2, prompt_len), generator=g)
    mask = torch.zeros(2, prompt_len, dtype=torch.bool)
    mask[:, :valid] = True
    return {"observation.images.cam": torch.rand(2, 1, 3, 12, 16, generator=g),
            "observation.state": torch.randn(2, 1, 3, generator=g), "prompt_tokens": tokens, "prompt_mask": mask,
            "action": torch.randn(2, 4, 2, generator=g), "action_is_pad": torch.zeros(2, 4, dtype=torch.bool),
            "noise_key": torch.tensor([5, 6])}


def model(**changes) -> SmolVLA:
    torch.manual_seed(0)
    m = SmolVLA(config(**changes)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return m


def test_resize_with_pad_keeps_the_aspect_and_pads_top_left():
    image = torch.rand(1, 3, 8, 16)
    out = resize_with_pad(image, 16, 16)
    assert out.shape == (1, 3, 16, 16)
    assert (out[..., :8, :] == 0).all()  # the top rows padded
    torch.testing.assert_close(out[..., 8:, :], image)  # same scale: no resampling


@pytest.mark.parametrize("attention, every", [("cross", 2), ("self", 0)])
def test_prompt_padding_changes_nothing(attention, every):
    m = model(expert={"d_model": 24, "ffn_dim": 48, "n_layers": 2, "attention": attention, "self_attn_every": every})
    noise = torch.randn(2, 4, 3)
    short = batch()
    long = {**batch(), "prompt_tokens": torch.cat((short["prompt_tokens"], torch.full((2, 3), 7)), dim=1),
            "prompt_mask": torch.cat((short["prompt_mask"], torch.zeros(2, 3, dtype=torch.bool)), dim=1)}
    torch.testing.assert_close(m.predict(short, noise=noise), m.predict(long, noise=noise), rtol=0, atol=1e-6)
    changed = {**short, "prompt_tokens": short["prompt_tokens"].roll(1, dims=1)}
    assert not torch.allclose(m.predict(short, noise=noise), m.predict(changed, noise=noise))


def test_keyed_sampling_repeats_and_the_loss_trains_the_expert_only():
    m = model()
    first = m.predict(batch(), noise_key=torch.tensor([1, 2]))
    assert first.shape == (2, 4, 2)
    torch.testing.assert_close(first, m.predict(batch(), noise_key=torch.tensor([1, 2])), rtol=0, atol=0)
    m.train()
    loss = m(batch())["loss"]
    assert loss.shape == (2,) and torch.isfinite(loss).all()
    loss.sum().backward()
    trained = set(m.param_groups()["expert"][0])
    assert "state_proj.weight" in trained and "expert.layers.0.attention.wk.weight" in trained
    assert not any(name.startswith("vlm.") for name in trained)
    assert m.expert.layers[1].attention.wk.weight.grad.abs().sum() > 0


def test_cross_layers_read_the_backbones_key_width():
    m = model()  # layer 0 self-attention (every 2), layer 1 cross-attention
    assert m.expert.layers[0].attention.wk.in_features == 24
    assert m.expert.layers[1].attention.wk.in_features == 2 * 8  # kv heads x head size of the backbone


@pytest.mark.parametrize("changes, message", [
    ({"expert": {"d_model": 24, "ffn_dim": 48, "n_layers": 1, "attention": "self"}}, "no expert layer"),
    ({"expert": {"d_model": 24, "ffn_dim": 48, "n_layers": 3}}, "must divide"),
    ({"resize_pad": None}, "set resize_pad"),
    ({"state_dim": 5}, "max_state_dim"),
])
def test_layouts_it_cannot_run_are_refused(changes, message):
    with pytest.raises(ValidationError, match=message):
        config(**changes)
