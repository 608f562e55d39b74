import pytest
import torch
from diffusers import WanTransformer3DModel

from longboat.models.diffusion.wan import Wan, WanConfig
from longboat.cli.main import main
from longboat.models import get_model, hf_spec
from longboat.models.diffusion.wan_diffusers import (
    config_from_diffusers,
    config_to_diffusers,
    state_dict_from_diffusers,
    state_dict_to_diffusers,
)
from longboat.models.llm.hf.adapter import HFConversionError

TINY = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
            text_dim=16, freq_dim=32, ffn_dim=48, num_layers=2, rope_max_seq_len=32)


def randomize(model: torch.nn.Module, seed: int = 0) -> None:
    """Random weights; the query and key norms' large, so attention is sharp and the rotary positions count."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            sharp = any(n in name for n in ("norm_q", "norm_k", "q_norm", "k_norm"))
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (4.0 if sharp else 0.0))


def inputs():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 3, 8, 6, generator=g)  # 3 frames of 8x6: a 3x4x3 patch grid
    return x, torch.tensor([17, 950]), torch.randn(2, 5, 16, generator=g)


def assert_same_outputs(ours: Wan, theirs: WanTransformer3DModel) -> None:
    x, steps, context = inputs()
    with torch.no_grad():
        want = theirs(x, timestep=steps, encoder_hidden_states=context).sample
        assert want.shape == x.shape and want.abs().mean() > 0.1
        torch.testing.assert_close(ours(x, steps, context), want, rtol=0, atol=1e-4)
        torch.testing.assert_close(ours(x, steps / 1000, context), want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("cross_attn_norm", [True, False])
def test_diffusers_to_ours(cross_attn_norm):
    theirs = WanTransformer3DModel(**TINY, cross_attn_norm=cross_attn_norm).eval()
    randomize(theirs)
    cfg = WanConfig(**config_from_diffusers(dict(theirs.config)))
    assert cfg.hidden_size == 24 and cfg.rope_dims == (4, 4, 4)
    ours = Wan(cfg).eval()
    ours.load_state_dict(state_dict_from_diffusers(theirs.state_dict(), cfg))
    assert_same_outputs(ours, theirs)


def test_ours_to_diffusers_and_back():
    cfg = WanConfig(patch_size=(2, 2, 1), in_channels=4, out_channels=8, hidden_size=36, num_heads=2, depth=2,
                    ffn_dim=40, text_dim=16, freq_dim=32, rope_max_seq_len=16)
    assert cfg.rope_dims == (6, 6, 6)
    ours = Wan(cfg).eval()
    randomize(ours)
    config = {k: v for k, v in config_to_diffusers(cfg).items() if not k.startswith("_")}
    theirs = WanTransformer3DModel(**config).eval()
    theirs.load_state_dict(state_dict_to_diffusers(ours.state_dict(), cfg), strict=True)
    x, steps, context = inputs()
    x = torch.randn(2, 4, 4, 6, 5)
    with torch.no_grad():
        want = theirs(x, timestep=steps, encoder_hidden_states=context).sample
        assert want.shape == (2, 8, 4, 6, 5)
        torch.testing.assert_close(ours(x, steps, context), want, rtol=0, atol=1e-4)
    back = state_dict_from_diffusers(theirs.state_dict(), cfg)
    assert all(torch.equal(back[k], v) for k, v in ours.state_dict().items())


def test_what_cannot_be_represented_is_named():
    with pytest.raises(HFConversionError, match="image_dim=8 is not supported"):
        config_from_diffusers({**dict(WanTransformer3DModel(**TINY).config), "image_dim": 8})
    cfg = WanConfig(**config_from_diffusers(dict(WanTransformer3DModel(**TINY).config)))
    with pytest.raises(HFConversionError, match="model.rope_theta=5000.0"):
        config_to_diffusers(cfg.model_copy(update={"rope_theta": 5000.0}))


def test_directories_and_the_convert_command(tmp_path):
    theirs = WanTransformer3DModel(**TINY).eval()
    randomize(theirs)
    theirs.save_pretrained(tmp_path / "theirs")
    assert hf_spec(tmp_path / "theirs").name == "wan"
    ours, cfg, family, _ = get_model("wan").hf.load(tmp_path / "theirs")
    assert family == "WanTransformer3DModel"
    assert_same_outputs(ours, theirs)
    assert main(["convert", "diffusers-to-longboat", str(tmp_path / "theirs"), str(tmp_path / "export")]) == 0
    assert main(["convert", "longboat-to-diffusers", str(tmp_path / "export"), str(tmp_path / "again")]) == 0
    assert_same_outputs(ours, WanTransformer3DModel.from_pretrained(tmp_path / "again").eval())
