import json

import pytest
import torch
from diffusers import DiTTransformer2DModel

from longboat.models import get_model, hf_spec
from longboat.models.diffusion import DiT, DiTConfig
from longboat.models.diffusion.diffusers_interop import load_diffusers, save_diffusers
from longboat.models.diffusion.dit_diffusers import (
    DIT_FORMAT,
    config_from_diffusers,
    config_to_diffusers,
    state_dict_from_diffusers,
    state_dict_to_diffusers,
    tensor_name,
)
from longboat.models.llm.hf.adapter import HFConversionError
from longboat.cli.main import main

TINY = dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=2, sample_size=8, patch_size=2,
            num_embeds_ada_norm=5)


def randomize(model: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def diffusers_dit(learn_sigma: bool, seed: int = 0) -> DiTTransformer2DModel:
    """A random diffusers DiT whose blocks hold one shared embedding, as DiT's checkpoints do."""
    theirs = DiTTransformer2DModel(**TINY, out_channels=8 if learn_sigma else None).eval()
    randomize(theirs, seed)
    first = theirs.transformer_blocks[0].norm1.emb.state_dict()
    for block in theirs.transformer_blocks[1:]:
        block.norm1.emb.load_state_dict(first)
    return theirs


def inputs(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 4, 8, 8, generator=g)
    return x, torch.tensor([0, 417, 999]), torch.tensor([0, 4, 5])  # label 5: the null class


def assert_same_outputs(ours: DiT, theirs: DiTTransformer2DModel) -> None:
    x, steps, labels = inputs()
    with torch.no_grad():
        want = theirs(x, timestep=steps, class_labels=labels).sample
        torch.testing.assert_close(ours(x, steps, labels), want, rtol=0, atol=1e-4)
        # Flow time t = k / 1000 is timestep k, up to float32 rounding of t·1000.
        torch.testing.assert_close(ours(x, steps / 1000, labels), want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("learn_sigma", [False, True])
def test_diffusers_to_ours(learn_sigma):
    theirs = diffusers_dit(learn_sigma)
    cfg = DiTConfig(**config_from_diffusers(dict(theirs.config)))
    assert cfg.learn_sigma == learn_sigma and cfg.hidden_size == 16 and cfg.null_label == 5
    ours = DiT(cfg).eval()
    ours.load_state_dict(state_dict_from_diffusers(theirs.state_dict(), cfg))
    assert_same_outputs(ours, theirs)


@pytest.mark.parametrize("learn_sigma", [False, True])
def test_ours_to_diffusers(learn_sigma):
    cfg = DiTConfig(image_size=8, in_channels=4, patch_size=2, hidden_size=16, depth=2, num_heads=2, num_classes=5,
                    learn_sigma=learn_sigma, mlp_norm_eps=1e-5)
    ours = DiT(cfg).eval()
    randomize(ours)
    config = config_to_diffusers(cfg)
    theirs = DiTTransformer2DModel(**{k: v for k, v in config.items() if not k.startswith("_")}).eval()
    theirs.load_state_dict(state_dict_to_diffusers(ours.state_dict(), cfg), strict=True)
    assert_same_outputs(ours, theirs)
    # ... and back again, exactly.
    back = state_dict_from_diffusers(theirs.state_dict(), cfg)
    assert all(torch.equal(back[k], v) for k, v in ours.state_dict().items())


def test_directories_both_ways_and_the_convert_command(tmp_path):
    theirs = diffusers_dit(learn_sigma=True)
    theirs.save_pretrained(tmp_path / "theirs")
    assert hf_spec(tmp_path / "theirs").name == "dit"
    ours, cfg = load_diffusers(DIT_FORMAT, tmp_path / "theirs")
    assert_same_outputs(ours, theirs)
    save_diffusers(DIT_FORMAT, ours, tmp_path / "ours", cfg, max_shard_size="20KB")  # sharded, with an index
    assert (tmp_path / "ours" / "diffusion_pytorch_model.safetensors.index.json").is_file()
    assert_same_outputs(ours, DiTTransformer2DModel.from_pretrained(tmp_path / "ours").eval())
    # longboat convert: diffusers directory -> export -> diffusers directory.
    assert main(["convert", "diffusers-to-longboat", str(tmp_path / "theirs"), str(tmp_path / "export")]) == 0
    assert main(["convert", "longboat-to-diffusers", str(tmp_path / "export"), str(tmp_path / "again")]) == 0
    assert_same_outputs(ours, DiTTransformer2DModel.from_pretrained(tmp_path / "again").eval())


def test_what_cannot_be_represented_is_named(tmp_path):
    base = dict(DiTTransformer2DModel(**TINY).config)
    for key, value in [("norm_elementwise_affine", True), ("activation_fn", "geglu"), ("out_channels", 5),
                       ("upcast_attention", True), ("dropout", 0.1), ("cross_attention_dim", 8)]:
        with pytest.raises(HFConversionError, match=key):
            config_from_diffusers({**base, key: value})
    cfg = DiTConfig(**config_from_diffusers(base))
    for field, value in [("time_freq_shift", 0.0), ("norm_eps", 1e-5), ("mlp_ratio", 2.0)]:
        with pytest.raises(HFConversionError, match=f"model.{field}="):
            config_to_diffusers(cfg.model_copy(update={field: value}))
    theirs = DiTTransformer2DModel(**TINY)  # diffusers' own init: each block's embedding drawn apart
    with pytest.raises(HFConversionError, match=r"transformer_blocks.1.norm1.emb.timestep_embedder.linear_1.weight "
                                                "differs from block 0's"):
        state_dict_from_diffusers(theirs.state_dict(), cfg)
    (tmp_path / "config.json").write_text(json.dumps({"_class_name": "UNet2DModel"}))
    with pytest.raises(Exception, match="'UNet2DModel' is not supported"):
        hf_spec(tmp_path)


def test_tensor_names():
    assert tensor_name("blocks.1.mlp.fc1.weight") == "transformer_blocks.1.ff.net.0.proj.weight"
    assert tensor_name("final.linear.bias") == "proj_out_2.bias"
    assert tensor_name("blocks.0.attn.qkv.weight") is None and tensor_name("time_mlp.0.weight") is None


def test_the_xl_2_preset_is_diffusers_dit_xl_2():
    with torch.device("meta"):  # diffusers' defaults are DiT-XL/2 at 256 pixels; facebook/DiT-XL-2-256 adds sigma
        theirs = DiTTransformer2DModel(out_channels=8)
    assert DiTConfig(**config_from_diffusers(dict(theirs.config))) == DiTConfig(**get_model("dit").load_preset("xl-2"))
