"""Diffusion networks over images, latents and video; importing this package registers the "dit", "wan",
"autoencoder_kl" and "wan_vae" architectures."""

from longboat.models.diffusion.diffusers_interop import DiffusersInterop
from longboat.models.diffusion.dit import DiT, DiTConfig
from longboat.models.diffusion.dit_diffusers import DIT_FORMAT
from longboat.models.diffusion.vae import AutoencoderKL, VAEConfig
from longboat.models.diffusion.vae_diffusers import VAE_FORMAT
from longboat.models.diffusion.wan import Wan, WanConfig
from longboat.models.diffusion.wan_diffusers import WAN_FORMAT
from longboat.models.diffusion.wan_vae import WanVAE, WanVAEConfig
from longboat.models.diffusion.wan_vae_diffusers import WAN_VAE_FORMAT
from longboat.models.registry import ModelSpec, SequenceCut, SequencePlan, register_model


def _tensor_parallel_plan(cfg: DiTConfig, tp: int) -> dict:
    # DTensor's parallel styles load on first use: a run without tp > 1 never pays for them.
    from longboat.models.diffusion.parallel_plan import tensor_parallel_plan

    return tensor_parallel_plan(cfg, tp)


DIT_SPEC = register_model(ModelSpec(
    name="dit",
    config=DiTConfig,
    module=DiT,
    presets="longboat.models.diffusion",
    parallel_units=("blocks",),
    tensor_parallel=_tensor_parallel_plan,
    hf=DiffusersInterop(DIT_FORMAT),
))
# Wan's tokens are cut after the patch embedding (as they enter the first block), each with its rotary angles in
# the whole grid; each block's self-attention exchanges heads for tokens; cross-attention reads the text every rank
# holds whole; the final layer's tokens are gathered again before unpatchifying.
WAN_SEQUENCE_PLAN = SequencePlan(
    split=(SequenceCut("blocks.0", dim=1, arg="x"), SequenceCut("blocks.*", dim=0, arg="rope")),
    attention=("blocks.*.self_attn.core",),
    gather=(SequenceCut("final", dim=1),),
    heads="num_heads",
)
WAN_SPEC = register_model(ModelSpec(
    name="wan",
    config=WanConfig,
    module=Wan,
    parallel_units=("blocks",),
    sequence_parallel=WAN_SEQUENCE_PLAN,
    hf=DiffusersInterop(WAN_FORMAT),
))
VAE_SPEC = register_model(ModelSpec(
    name="autoencoder_kl",
    config=VAEConfig,
    module=AutoencoderKL,
    parallel_units=("encoder.down", "encoder.mid", "decoder.mid", "decoder.up"),
    hf=DiffusersInterop(VAE_FORMAT),
))
WAN_VAE_SPEC = register_model(ModelSpec(
    name="wan_vae",
    config=WanVAEConfig,
    module=WanVAE,
    presets="longboat.models.diffusion",
    preset_folder="presets/wan_vae",
    parallel_units=("encoder.down", "encoder.mid", "decoder.mid", "decoder.up"),
    hf=DiffusersInterop(WAN_VAE_FORMAT),
))

__all__ = ["DIT_SPEC", "DiT", "DiTConfig", "VAE_SPEC", "AutoencoderKL", "VAEConfig", "WAN_SPEC", "Wan", "WanConfig",
           "WAN_VAE_SPEC", "WanVAE", "WanVAEConfig"]
