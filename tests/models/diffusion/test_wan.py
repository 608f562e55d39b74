import pytest
import torch

from longboat.config.base import ConfigError
from longboat.models import build_model
from longboat.models.diffusion import Wan, WanConfig

CFG = dict(in_channels=4, hidden_size=24, num_heads=2, depth=2, ffn_dim=32, text_dim=16, freq_dim=32,
           rope_max_seq_len=16)


def test_shapes_any_grid_zero_start_and_gradients():
    model = Wan(WanConfig(**CFG))
    context = torch.randn(2, 5, 16)
    for frames, height, width in [(1, 4, 4), (3, 8, 6)]:  # an image is a one-frame video
        x = torch.randn(2, 4, frames, height, width)
        out = model(x, torch.rand(2), context)
        assert out.shape == x.shape and torch.count_nonzero(out) == 0  # the output layer starts at zero
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model(torch.randn(2, 4, 3, 8, 6), torch.rand(2), context).square().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    # The rotary positions tell frames apart: the same frames in another order give other outputs.
    model.eval()
    x, t = torch.randn(1, 4, 3, 4, 4), torch.rand(1)
    with torch.no_grad():
        assert not torch.allclose(model(x.flip(2), t, context[:1]).flip(2), model(x, t, context[:1]), atol=1e-4)


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match=r"\(1, 2, 2\) patches divide"):
        Wan(WanConfig(**CFG))(torch.randn(1, 4, 2, 7, 6), torch.rand(1), torch.randn(1, 3, 16))
    with pytest.raises(ValueError, match="at most 16 patches an axis"):
        Wan(WanConfig(**CFG))(torch.randn(1, 4, 17, 2, 2), torch.rand(1), torch.randn(1, 3, 16))
    with pytest.raises(ConfigError, match=r"hidden_size \(24\) must be divisible by num_heads \(5\)") as e:
        build_model("wan", {**CFG, "num_heads": 5})
    assert "\n" not in str(e.value)


def test_an_image_is_a_one_frame_clip_and_masked_context_is_ignored():
    torch.manual_seed(0)
    model = Wan(WanConfig(**CFG)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
        x, t, context = torch.randn(2, 4, 8, 8), torch.rand(2), torch.randn(2, 3, 16)
        image = model(x, t, context)
        assert image.shape == x.shape
        torch.testing.assert_close(image, model(x.unsqueeze(2), t, context)[:, :, 0], rtol=0, atol=0)
        # Padding the context with tokens the mask excludes changes nothing; unmasked, it does.
        padded = torch.cat([context, torch.randn(2, 4, 16)], dim=1)
        mask = torch.tensor([[True] * 3 + [False] * 4] * 2)
        torch.testing.assert_close(model(x, t, padded, mask), image, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(model(x, t, padded), image, atol=1e-3)
