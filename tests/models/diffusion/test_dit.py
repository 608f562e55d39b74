import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from longboat.config.base import ConfigError
from longboat.models import build_model, get_model
from longboat.models.diffusion import DiT, DiTConfig
from longboat.models.diffusion.dit import xavier_as_linear

SMALL = dict(image_size=8, in_channels=3, patch_size=2, hidden_size=32, depth=2, num_heads=4, num_classes=5)


def randomized(model: DiT, seed: int = 0) -> DiT:
    """The model with every parameter drawn at random, so the zero-initialised paths take part too."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


@pytest.mark.parametrize("learn_sigma", [False, True])
def test_output_shape_and_conditioning(learn_sigma):
    cfg = DiTConfig(**SMALL, learn_sigma=learn_sigma)
    model = randomized(DiT(cfg)).eval()
    x, t = torch.randn(3, 3, 8, 8), torch.rand(3)
    out = model(x, t, torch.tensor([0, 4, cfg.null_label]))
    assert out.shape == (3, 6 if learn_sigma else 3, 8, 8)
    # The time and the label change the output; no labels is the null class.
    assert not torch.allclose(out, model(x, t.flip(0), torch.tensor([0, 4, 5])))
    assert not torch.allclose(out, model(x, t, torch.tensor([1, 4, 5])))
    torch.testing.assert_close(model(x, t), model(x, t, torch.full((3,), cfg.null_label)))
    # Samples are independent of their batch mates.
    torch.testing.assert_close(model(x[1:2], t[1:2], torch.tensor([4])), out[1:2], rtol=1e-5, atol=1e-5)


def test_float_time_is_scaled_onto_integer_timesteps():
    model = randomized(DiT(DiTConfig(**SMALL))).eval()
    x = torch.randn(2, 3, 8, 8)
    steps = torch.tensor([250, 875])  # k / 1000 exact in binary: the two calls see the same numbers
    torch.testing.assert_close(model(x, steps / 1000), model(x, steps), rtol=0, atol=0)


def test_adaln_zero_start():
    """DiT's initialisation: every block starts as the identity and the output layer at zero, so the model outputs
    exactly zero, while the output layer's gradient is not zero (training can start)."""
    model = DiT(DiTConfig(**SMALL, learn_sigma=True))
    x, t, labels = torch.randn(2, 3, 8, 8), torch.rand(2), torch.tensor([1, 2])
    tokens, c = torch.randn(2, 16, 32), torch.randn(2, 32)
    for block in model.blocks:
        assert torch.equal(block(tokens, c), tokens)
    out = model(x, t, labels)
    assert torch.count_nonzero(out) == 0
    (out - torch.randn_like(out)).square().sum().backward()
    assert model.final.linear.weight.grad.abs().sum() > 0


def test_build_is_deterministic_per_seed():
    def built(seed: int) -> dict:
        torch.manual_seed(seed)
        return DiT(DiTConfig(**SMALL)).state_dict()

    a, b, c = built(0), built(0), built(1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["blocks.0.attn.qkv.weight"], c["blocks.0.attn.qkv.weight"])
    # The fixed position embedding is a buffer, rebuilt by init_weights (after to_empty) and not saved.
    assert "pos_embed" not in a
    model = DiT(DiTConfig(**SMALL))
    pos = model.pos_embed.clone()
    model.to_empty(device="cpu")
    model.init_weights()
    assert torch.equal(model.pos_embed, pos)


def test_gradients_reach_every_parameter():
    model = randomized(DiT(DiTConfig(**SMALL, learn_sigma=True)))
    out = model(torch.randn(2, 3, 8, 8), torch.rand(2), torch.tensor([0, 3]))
    out.square().mean().backward()
    for name, p in model.named_parameters():
        if name == "label_embed.weight":  # only the rows of the labels used
            assert p.grad[[0, 3]].abs().sum() > 0 and p.grad[[1, 2, 4, 5]].abs().sum() == 0
        else:
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_position_embedding_tells_patches_apart():
    model = randomized(DiT(DiTConfig(**SMALL))).eval()
    x, t = torch.randn(1, 3, 8, 8), torch.rand(1)
    moved = model(x.roll(2, dims=3), t).roll(-2, dims=3)  # move one patch column, then move the output back
    assert not torch.allclose(moved, model(x, t), atol=1e-4)
    pos = model.pos_embed[0]
    assert pos.shape == (16, 32) and torch.unique(pos, dim=0).shape[0] == 16


def test_bad_config_is_one_line():
    with pytest.raises(ConfigError, match=r"image_size \(10\) must be divisible by patch_size \(4\)") as e:
        build_model("dit", {"image_size": 10, "patch_size": 4})
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="num_heads"):
        build_model("dit", {"hidden_size": 96, "num_heads": 5})
    with pytest.raises(ValueError, match=r"takes \[B, 3, 8, 8\]"):
        DiT(DiTConfig(**SMALL))(torch.randn(1, 3, 16, 16), torch.rand(1))


def test_presets_build_and_flops_match_the_counter():
    spec = get_model("dit")
    assert {"tiny", "small", "xl-2"} <= set(spec.preset_names())
    tiny = build_model("dit", spec.load_preset("tiny"))
    assert tiny(torch.randn(2, 1, 8, 8), torch.rand(2), torch.tensor([3, 10])).shape == (2, 1, 8, 8)
    cfg = DiTConfig(**SMALL, learn_sigma=True)
    model = DiT(cfg)
    assert cfg.num_params() == sum(p.numel() for p in model.parameters())
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(1, 3, 8, 8), torch.rand(1), torch.tensor([0]))
    # The counter misses the CPU's attention kernel: its two [N, N] matmuls per block are added by hand.
    attention = cfg.depth * 4 * cfg.num_patches ** 2 * cfg.hidden_size
    assert cfg.flops_per_sample() == 3 * (counter.get_total_flops() + attention)



def test_patch_embedding_init_is_xavier_over_flattened_patches():
    w, reference = torch.empty(64, 4, 2, 2), torch.empty(64, 16)
    torch.manual_seed(0)
    xavier_as_linear(w)
    torch.manual_seed(0)
    torch.nn.init.xavier_uniform_(reference)
    torch.testing.assert_close(w.view(64, 16), reference)


def test_pooled_text_conditions_the_model_and_padding_is_ignored():
    cfg = DiTConfig(image_size=8, in_channels=3, patch_size=4, hidden_size=32, depth=2, num_heads=2, num_classes=0,
                    text_dim=12)
    torch.manual_seed(0)
    model = DiT(cfg).eval()
    assert cfg.num_params() == sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
        x, t, text = torch.randn(2, 3, 8, 8), torch.rand(2), torch.randn(2, 3, 12)
        out = model(x, t, text, torch.ones(2, 3, dtype=torch.bool))
        padded = torch.cat([text, torch.randn(2, 2, 12)], dim=1)
        mask = torch.tensor([[True] * 3 + [False] * 2] * 2)
        torch.testing.assert_close(model(x, t, padded, mask), out, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(model(x, t, text.flip(0)), out, atol=1e-4)  # the text matters
        assert not torch.allclose(model(x, t), out, atol=1e-4)  # no text: the null condition
