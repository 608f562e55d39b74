"""Latent caches: a source's images (or clips) encoded once by a VAE into safetensors shards, so a latent diffusion
model trains without running the encoder at every step.

What is stored is the encoder's posterior, its ``mean`` and ``logvar`` (float32), not one draw of it: training draws
``mean + exp(logvar / 2) · noise`` with the sample's own keyed noise at every visit, as Stable-Diffusion-style
training samples ``latent_dist`` each step, and then applies the VAE's scaling (stored per channel as ``shift`` and
``scale``: the model sees ``(z − shift) · scale``).

A cache is the directory ``<output>/latents-<hash>/`` where the hash covers the source's files (names, sizes and
SHA-256 of their bytes), the preprocessing (size, channels, frames, fps), the VAE (SHA-256 of its weights and its
config) and ``FORMAT_VERSION``: a changed input makes a new directory, an unchanged one is found and never encoded
again. It is written under a temporary name and renamed into place; its ``index.json`` records each shard's size and
SHA-256, and a cache whose shards do not match is never read (``encode_source`` rebuilds it, ``open_latents``
refuses it in one line).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

import torch
from pydantic import Field
from safetensors.torch import load as load_safetensors
from safetensors.torch import save_file

from longboat.config.base import ConfigError, StrictModel
from longboat.data.index_cache import cache_key
from longboat.data.latent_fingerprint import sha256_file, source_fingerprint
from longboat.data.source_files import NAMED
from longboat.errors import LongboatError
from longboat.utils.outputs import cache_directory

FORMAT_VERSION = 1
INDEX = "index.json"
KIND = "latents"


class LatentCacheError(LongboatError, ValueError):
    """A latent cache directory that is missing, incomplete or damaged."""


class LatentSourceConfig(StrictModel):
    """``longboat data encode``: what to encode and how its pixels are prepared."""

    source: str = Field(description="'digits', a folder of class subfolders, a .jsonl / .parquet file of rows, or "
                                    "(with frames) Wan's metadata.csv or rows of clips")
    size: int = Field(default=256, gt=0, description="images are resized to size × size; clips cover it and are "
                                                     "centre-cropped")
    channels: Literal[1, 3] | None = Field(default=None, description="image channels; None: the VAE's input's")
    frames: int | None = Field(default=None, gt=0, description="clips: frames per clip (1 + 4k); None: images")
    fps: float | str = Field(default=16, description="clips: frames per second they are read at")
    batch: int = Field(default=8, gt=0, description="items per encoder call")
    shard_items: int = Field(default=4096, gt=0, description="items per safetensors shard")
    latent_channels: int | None = Field(default=None, gt=0, description="refuse a VAE whose latents have another "
                                                                        "channel count")
    max_malformed_fraction: float = Field(default=0.0, ge=0, le=1, description="share of unreadable inputs "
                                                                               "tolerated (skipped)")
    image_key: str = "image"
    label_key: str = "label"
    caption_key: str = Field(default="", description="the caption column; '' for the source's usual one")
    video_key: str = "video"


@dataclass
class LatentEncoder:
    """A VAE as the cache sees it: pixels [B, C, (T,) H, W] in [-1, 1] to the posterior's (mean, logvar), what names
    it (``source``), what identifies it (``identity``: its weights' hash and config), and its latent scaling
    (``scale_latents``: posterior latents to the diffusion model's, affine per channel)."""

    encode: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    source: str
    identity: dict
    in_channels: int
    scale_latents: Callable[[torch.Tensor], torch.Tensor]


def channel_affine(scale_latents: Callable[[torch.Tensor], torch.Tensor],
                   channels: int) -> tuple[list[float], list[float]]:
    """(scale, shift) per channel such that ``scale_latents(z) = (z − shift) · scale``, read off the function."""
    with torch.no_grad():
        at0 = scale_latents(torch.zeros(1, channels, 1, 1)).flatten().double()
        at1 = scale_latents(torch.ones(1, channels, 1, 1)).flatten().double()
    scale = at1 - at0
    return scale.tolist(), (-at0 / scale).tolist()


@dataclass
class Items:
    """Decoded, preprocessed pixels to encode: ``pixels(i)`` is item i [C, (T,) H, W]."""

    pixels: Callable[[int], torch.Tensor]
    count: int
    labels: list[int]
    classes: list[str]
    captions: list[str] | None
    names: list[str]
    malformed: list[str]


@dataclass
class LatentSet:
    """A cache read whole: posteriors [N, C, (T,) h, w], labels [N] (-1: none), the per-channel scaling."""

    mean: torch.Tensor
    logvar: torch.Tensor
    labels: torch.Tensor
    classes: list[str]
    captions: list[str] | None
    names: list[str]
    scale: torch.Tensor  # [C]
    shift: torch.Tensor  # [C]
    index: dict = field(default_factory=dict)
    path: Path | None = None

    def __len__(self) -> int:
        return int(self.mean.shape[0])

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def malformed(self) -> list[str]:
        """The source's inputs that could not be read when the cache was encoded."""
        return list(self.index.get("malformed", []))

    @property
    def channels(self) -> int:
        return int(self.mean.shape[1])

    def draw(self, row: int, noise: torch.Tensor) -> torch.Tensor:
        """Item ``row``'s latent drawn with standard-normal ``noise`` and scaled for the diffusion model."""
        z = self.mean[row] + torch.exp(0.5 * self.logvar[row]) * noise
        view = (-1,) + (1,) * (z.ndim - 1)
        return (z - self.shift.view(view)) * self.scale.view(view)

    def subset(self, index: torch.Tensor) -> LatentSet:
        pick = index.tolist()
        captions = None if self.captions is None else [self.captions[i] for i in pick]
        return LatentSet(self.mean[index], self.logvar[index], self.labels[index], self.classes, captions,
                         [self.names[i] for i in pick], self.scale, self.shift, self.index, self.path)


# ---- what a cache depends on ---------------------------------------------------------------------------------------
def describe(cfg: LatentSourceConfig, encoder: LatentEncoder) -> dict:
    """Everything the cache's latents depend on; its hash names the directory."""
    keys = {"image_key": cfg.image_key, "label_key": cfg.label_key, "caption_key": cfg.caption_key}
    if cfg.frames is not None:
        from longboat.data.video_sources import frame_rate  # PyAV, only for clips

        keys = {"video_key": cfg.video_key, "caption_key": cfg.caption_key}
    preprocessing = {"size": cfg.size, "channels": cfg.channels or encoder.in_channels, "frames": cfg.frames,
                     "fps": str(frame_rate(cfg.fps)) if cfg.frames is not None else None,
                     "resize": "bicubic, squeezed to a square" if cfg.frames is None else "cover, centre crop",
                     "max_malformed_fraction": cfg.max_malformed_fraction, **keys}
    return {"format_version": FORMAT_VERSION, "source": source_fingerprint(cfg.source, cfg.frames is not None, keys),
            "preprocessing": preprocessing, "vae": encoder.identity}


def cache_dir(output: str | os.PathLike, description: dict) -> Path:
    return Path(output) / f"{KIND}-{cache_key(description)}"


# ---- reading the source -----------------------------------------------------------------------------------------
def open_items(cfg: LatentSourceConfig, channels: int) -> Items:
    """The source's readable items, preprocessed as ``cfg`` says; unreadable ones counted and named (past
    ``max_malformed_fraction`` opening fails, naming the first)."""
    if cfg.frames is None:
        from longboat.data.image_sources import ImageSourceConfig, open_images

        images = open_images(ImageSourceConfig(
            source=cfg.source, image_size=cfg.size, channels=channels, valid_fraction=0,
            max_malformed_fraction=cfg.max_malformed_fraction, image_key=cfg.image_key, label_key=cfg.label_key,
            caption_key=cfg.caption_key or "caption"))
        names = images.names or [f"{cfg.source}[{i}]" for i in range(len(images))]
        return Items(lambda i: images.images[i], len(images), images.labels.tolist(), images.classes,
                     images.captions, names, images.malformed)
    from longboat.data.video_sources import VideoSourceConfig, open_clips

    if channels != 3:
        raise ConfigError(f"--vae: takes {channels}-channel input, clips are RGB (3 channels)")
    clips = open_clips(VideoSourceConfig(
        source=cfg.source, frames=cfg.frames, fps=cfg.fps, height=cfg.size, width=cfg.size,
        max_malformed_fraction=cfg.max_malformed_fraction, video_key=cfg.video_key, caption_key=cfg.caption_key))
    return Items(lambda i: clips[i]["video"], len(clips), [-1] * len(clips), [], clips.captions,
                 [c.name for c in clips.clips], clips.malformed)


# ---- writing -------------------------------------------------------------------------------------------------------
def encode_source(cfg: LatentSourceConfig, encoder: LatentEncoder, output: str | os.PathLike,
                  progress: bool = False) -> tuple[Path, bool]:
    """The cache of ``cfg.source`` under ``output``: found (its shards checked) or encoded now; returns (directory,
    found). A damaged cache at the same name is replaced."""
    description = describe(cfg, encoder)
    final = cache_dir(output, description)
    if final.is_dir():
        try:
            index = check_cache(final)
            _check_channels(cfg, encoder, index["latent_channels"])
            return final, True
        except LatentCacheError as err:
            print(f"rebuilding a damaged latent cache: {err}", flush=True)
            shutil.rmtree(final, ignore_errors=True)
    items = open_items(cfg, cfg.channels or encoder.in_channels)
    with cache_directory(final) as tmp:
        shards, channels = _write_shards(tmp, items, cfg, encoder, progress)
        scale, shift = channel_affine(encoder.scale_latents, channels)
        index = {**description, "vae_source": encoder.source, "latent_channels": channels, "scale": scale,
                 "shift": shift,
                 "classes": items.classes, "malformed": items.malformed, "shards": shards,
                 "items": [{"shard": i // cfg.shard_items, "offset": i % cfg.shard_items,
                            "label": items.labels[i],
                            "caption": None if items.captions is None else items.captions[i],
                            "file": items.names[i]} for i in range(items.count)]}
        (tmp / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    return final, False


def _write_shards(tmp: Path, items: Items, cfg: LatentSourceConfig, encoder: LatentEncoder,
                  progress: bool) -> tuple[list[dict], int]:
    """Encode every item in batches; shards of ``cfg.shard_items``; returns (the shards, latent channels)."""
    shards, means, logvars, pending = [], [], [], 0
    with _Bar(progress, items.count, f"encoding {items.count} items of {cfg.source}") as bar:
        for start in range(0, items.count, cfg.batch):
            stop = min(start + cfg.batch, items.count)
            with torch.no_grad():
                mean, logvar = encoder.encode(torch.stack([items.pixels(i) for i in range(start, stop)]))
            _check_channels(cfg, encoder, int(mean.shape[1]))
            means.append(mean.float().cpu())
            logvars.append(logvar.float().cpu())
            pending += stop - start
            bar.advance(stop - start)
            while pending >= cfg.shard_items or (stop == items.count and pending):
                mean_all, logvar_all = torch.cat(means), torch.cat(logvars)
                n = min(cfg.shard_items, pending)
                shards.append(_save_shard(tmp, len(shards), mean_all[:n], logvar_all[:n]))
                means, logvars, pending = [mean_all[n:]], [logvar_all[n:]], pending - n
    return shards, int(mean.shape[1])


def malformed_note(index: dict) -> str:
    """'; N unreadable skipped (the first named)' for a cache that skipped inputs, else ''."""
    bad = index.get("malformed") or []
    if not bad:
        return ""
    more = f" and {len(bad) - NAMED} more" if len(bad) > NAMED else ""
    return f"; {len(bad)} unreadable skipped ({', '.join(bad[:NAMED])}{more})"


def _check_channels(cfg: LatentSourceConfig, encoder: LatentEncoder, channels: int) -> None:
    if cfg.latent_channels is not None and channels != cfg.latent_channels:
        raise ConfigError(f"--vae {encoder.source}: makes {channels}-channel latents, --latent-channels says "
                          f"{cfg.latent_channels}")


def _save_shard(tmp: Path, number: int, mean: torch.Tensor, logvar: torch.Tensor) -> dict:
    name = f"shard-{number:05d}.safetensors"
    save_file({"mean": mean.contiguous(), "logvar": logvar.contiguous()}, str(tmp / name))
    return {"file": name, "items": int(mean.shape[0]), "bytes": (tmp / name).stat().st_size,
            "sha256": sha256_file(tmp / name)}


class _Bar:
    """A rich progress bar on a terminal's stderr; nothing off a terminal or when disabled."""

    def __init__(self, enabled: bool, total: int, description: str):
        self._progress, self.total, self.description = None, total, description
        self.enabled, self.start = enabled, time.perf_counter()

    def __enter__(self) -> _Bar:
        if self.enabled:
            from rich.console import Console
            from rich.progress import Progress

            console = Console(stderr=True)
            if console.is_terminal:
                self._progress = Progress(console=console)
                self._progress.__enter__()
                self._task = self._progress.add_task(self.description, total=self.total)
        return self

    def advance(self, n: int) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)


# ---- reading -------------------------------------------------------------------------------------------------------
def read_index(path: str | os.PathLike) -> dict:
    """A cache's ``index.json``; one line when it is absent, not JSON or of another format version."""
    path = Path(path)
    where = f"data.latents: {path}"
    if not (path / INDEX).is_file():
        raise LatentCacheError(f"{where}: no {INDEX}; expected a directory written by `longboat data encode`")
    try:
        index = json.loads((path / INDEX).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise LatentCacheError(f"{where}: {INDEX} is not JSON ({err})") from None
    if not isinstance(index, dict) or index.get("format_version") != FORMAT_VERSION:
        found = index.get("format_version") if isinstance(index, dict) else None
        raise LatentCacheError(f"{where}: latent cache format {found!r}, this version reads {FORMAT_VERSION}; "
                               "encode the source again")
    return index


def check_cache(path: Path) -> dict:
    """The index, once every shard has the size and SHA-256 it records."""
    index = read_index(path)
    for shard in index["shards"]:
        file = path / shard["file"]
        if not file.is_file() or file.stat().st_size != shard["bytes"] or sha256_file(file) != shard["sha256"]:
            raise LatentCacheError(f"data.latents: {file}: missing, truncated or changed since it was written; "
                                   "run `longboat data encode` again to rebuild the cache")
    return index


def open_latents(path: str | os.PathLike) -> LatentSet:
    """Every item of the cache at ``path``, read whole after its shards are checked."""
    path = Path(path)
    index = check_cache(path)
    means, logvars = [], []
    for shard in index["shards"]:
        tensors = load_safetensors((path / shard["file"]).read_bytes())
        means.append(tensors["mean"])
        logvars.append(tensors["logvar"])
    items = index["items"]
    captions = [item["caption"] or "" for item in items] if any(i["caption"] is not None for i in items) else None
    return LatentSet(torch.cat(means), torch.cat(logvars), torch.tensor([i["label"] for i in items], dtype=torch.int64),
                     list(index["classes"]), captions, [i["file"] for i in items],
                     torch.tensor(index["scale"], dtype=torch.float32),
                     torch.tensor(index["shift"], dtype=torch.float32), index, path)
