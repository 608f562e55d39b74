"""The diffusion task on a latent cache (``data.latents``, written by ``longboat data encode``) instead of pixels.

An item is a draw of its stored posterior, ``mean + std · noise``, the noise keyed by (seed, the sample's position)
on a stream of its own, then scaled by the VAE's factors; labels are the cache's. The model's shape is the latents'
(channels × side), and its export records the VAE so ``longboat sample`` decodes with it.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from longboat.config.base import ConfigError
from longboat.data.latent_cache import LatentSet, open_latents
from longboat.data.source_files import held_out
from longboat.models.generative.keyed_random import keyed_normal, noise_key

POSTERIOR_STREAM = 1 << 20  # the posterior draw's keyed stream, clear of the loss's (noise, time, drop, buckets)


class LatentSamples(Dataset):
    """Cached latents, each drawn from its posterior with the keyed noise of its position, with its label and key."""

    positioned = True  # the loader calls __getitem__((row, position))

    def __init__(self, latents: LatentSet, seed: int):
        self.latents, self.seed = latents, seed

    def __len__(self) -> int:
        return len(self.latents)

    def __getitem__(self, index: int | tuple[int, int]) -> dict:
        row, position = index if isinstance(index, tuple) else (index, index)
        key = torch.tensor([noise_key(self.seed, position)], dtype=torch.int64)
        noise = keyed_normal(key, tuple(self.latents.mean.shape[1:]), POSTERIOR_STREAM)[0]
        return {"image": self.latents.draw(row, noise), "label": self.latents.labels[row], "noise_key": key[0]}


def open_latent_split(path: str, valid_fraction: float, split_seed: int) -> tuple[LatentSet, LatentSet | None]:
    """(train, valid) of the cache at ``path``; only square image latents [N, C, h, h] train this task."""
    latents = open_latents(path)
    shape = tuple(latents.mean.shape[1:])
    if len(shape) != 3 or shape[1] != shape[2]:
        raise ConfigError(f"data.latents: {path} holds latents of shape {list(shape)}; the diffusion task trains on "
                          "square image latents [channels, side, side]")
    if valid_fraction == 0:
        return latents, None
    train, valid = held_out(len(latents), valid_fraction, split_seed, path, "latents")
    return latents.subset(train), latents.subset(valid)


def latent_spec(latents: LatentSet) -> dict:
    """What ``diffusion.json`` adds for a latent model: the VAE that decodes its samples and the latents' scaling."""
    return {"latents": str(latents.path), "vae": latents.index.get("vae_source"),
            "vae_weights_sha256": latents.index.get("vae", {}).get("weights_sha256"),
            "latent_scale": latents.scale.tolist(), "latent_shift": latents.shift.tolist()}
