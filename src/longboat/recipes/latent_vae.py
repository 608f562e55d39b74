"""The VAE of a latent cache: opened from an export, a run, a checkpoint or a Hugging Face directory (or
``ARCH:PRESET`` with seed-0 random weights, for trials), identified by the SHA-256 of its weights, and wrapped as the
``LatentEncoder`` ``data/latent_cache.py`` encodes with. ``longboat sample`` decodes a latent model's samples with the
same VAE, found by the path its cache recorded."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn

from longboat.checkpoint.export import WEIGHTS
from longboat.config.base import ConfigError, validate
from longboat.data.latent_cache import LatentEncoder
from longboat.data.latent_fingerprint import sha256_file
from longboat.models import get_model, model_names
from longboat.recipes.artifact import open_artifact


def _state_digest(model: nn.Module) -> str:
    """SHA-256 over a model's tensors (names, dtypes, shapes, bytes), for weights that are not one file."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{t.dtype}:{list(t.shape)}".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def open_vae(vae: str) -> tuple[nn.Module, str, dict, str]:
    """(model in eval mode, architecture, config as JSON, weights SHA-256) of ``vae``; one line when it is missing or
    not a VAE (a model with ``encode``, ``decode`` and ``scale_latents``)."""
    arch, _, preset = vae.partition(":")
    if preset and not Path(vae).exists() and arch in model_names():
        spec = get_model(arch)
        cfg = validate(spec.config, spec.load_preset(preset), f"--vae {vae}", prefix="model")
        torch.manual_seed(0)
        model = spec.build(cfg)
        if hasattr(model, "init_weights"):
            model.init_weights()
        if hasattr(model, "init_buffers"):
            model.init_buffers()
        model.eval()
        digest = _state_digest(model)
    else:
        if not Path(vae).exists():
            raise ConfigError(f"--vae {vae}: no such export, run, checkpoint or Hugging Face directory (or ARCH:PRESET "
                              f"of a registered architecture)")
        artifact = open_artifact(vae)
        model, arch, cfg = artifact.model, artifact.arch, artifact.config
        weights = artifact.source / WEIGHTS
        digest = sha256_file(weights) if weights.is_file() else _state_digest(model)
    wanted = ("encode", "decode", "scale_latents", "unscale_latents")
    missing = [m for m in wanted if not callable(getattr(model, m, None))]
    if missing:
        raise ConfigError(f"--vae {vae}: architecture {arch!r} is no VAE (it has no {', '.join(missing)})")
    return model, arch, cfg.model_dump(mode="json"), digest


def latent_encoder(vae: str, device: str = "cpu") -> LatentEncoder:
    """``vae`` as the cache's encoder: pixels to (mean, logvar) on ``device``, identified by its weights and config."""
    model, arch, config, digest = open_vae(vae)
    model = model.to(device)

    def encode(pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            posterior = model.encode(pixels.to(device))
        except ValueError as err:  # images for a video VAE, clips for an image VAE, channels that differ
            raise ConfigError(f"--vae {vae}: {err} (--frames encodes clips, without it images)") from None
        return posterior.mean, posterior.logvar

    return LatentEncoder(encode, str(Path(vae).resolve()) if Path(vae).exists() else vae,
                         {"arch": arch, "config": config, "weights_sha256": digest},
                         int(config.get("in_channels", 3)), lambda z: model.scale_latents(z.to(device)).cpu())
