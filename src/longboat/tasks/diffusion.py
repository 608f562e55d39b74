"""Image generation: a class- or text-conditional network trained by flow matching (rectified flow) or DDPM.

The data (``data/image_sources.py``) decides the model's ``image_size``, ``in_channels`` and ``num_classes``; any
architecture whose config meets the image-generator contract (``models/contracts.py``) trains, conditioned as its
config declares. With ``data.text_encoder`` the captions are embedded once by a registry decoder
(``text_encoder.py``), cached (``caption_cache.py``), and the model's ``text_dim`` comes from the encoder; a dropped
caption becomes the empty caption's embedding, the null condition. With ``data.source: video`` the samples are
captioned clips [3, T, H, W] (``diffusion_video.py``), for a model whose config says it takes clips. Every random draw
of a sample (its time, noise and whether its condition drops to the null one for classifier-free guidance) is keyed
by (seed, the sample's position in the job's sample stream), so one process or several ranks, and a resumed run,
draw the same. Validation adds the loss in time buckets (``loss/t0.00-0.25`` ...). EMA weights are on by default.

Exports carry ``diffusion.json``: the image shape, the class names or the text encoder (with its fingerprint), and the
objective: all ``longboat sample`` needs.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Callable, Literal

import torch
from pydantic import Field, model_validator
from torch.utils.data import Dataset

from longboat.config.base import ConfigError, StrictModel
from longboat.data.image_sources import ImageSet, ImageSourceConfig, open_split
from longboat.distributed.loss import LossFn, LossOutput
from longboat.models.contracts import (GeneratorCondition, accepts_text, generator_condition,
                                       require_image_generator, takes_clips)
from longboat.models.generative import flow_matching as fm
from longboat.models.generative.ddpm import NoiseScheduler
from longboat.models.generative.keyed_random import keyed_normal, keyed_uniform, noise_key
from longboat.tasks.base import Task, TaskData, fill_from_data, register_task
from longboat.tasks.caption_cache import Captioned, CaptionTable, caption_table, default_cache_dir
from longboat.tasks.text_encoder import TextEncoder, TextEncoderConfig
from longboat.tasks.diffusion_latents import LatentSamples, latent_spec, open_latent_split
from longboat.tasks.diffusion_video import ClipSamples, ClipSettings, clip_spec, open_clip_split
from longboat.utils.registry import Registry

SPEC_FILE = "diffusion.json"
SPEC_VERSION = 1
_STATE_KEY = "asset/" + SPEC_FILE
VIDEO = "video"  # data.source of captioned clips
# Keyed streams of a sample's draws: one each, so adding a draw never changes another.
_NOISE, _TIME, _DROP, _BUCKET = 0, 1, 2, 3
_TIME_PARAMS = {name: set(inspect.signature(fn).parameters) - {"u"} for name, fn in fm.TIME_DISTRIBUTIONS.items()}


class FlowObjective(StrictModel):
    """Rectified flow: x_t = t·noise + (1 − t)·x0, the network regresses the velocity noise − x0."""

    kind: Literal["flow"] = "flow"
    time: Literal["uniform", "logit_normal", "mode"] = "logit_normal"
    time_params: dict[str, float] = Field(default_factory=dict,
                                          description="logit_normal: mean, std; mode: scale; uniform: none")
    shift: float = Field(default=1.0, gt=0, description="SD3's time shift (>1: more time at the noisy end)")
    shift_base_size: int | None = Field(default=None, gt=0, description=(
        "resolution-dependent shift: shift × image_size / shift_base_size (SD3's square root of the pixel ratio)"))
    time_window: tuple[float, float] = Field(default=(0.0, 1.0), description="training times are mapped into "
                                             "[min, max]")

    @model_validator(mode="after")
    def _check(self) -> FlowObjective:
        unknown = set(self.time_params) - _TIME_PARAMS[self.time]
        if unknown:
            raise ValueError(f"time_params {sorted(unknown)} are not parameters of '{self.time}' "
                             f"(it takes {sorted(_TIME_PARAMS[self.time]) or 'none'})")
        lo, hi = self.time_window
        if not 0 <= lo < hi <= 1:
            raise ValueError(f"time_window must be [min, max] with 0 <= min < max <= 1, got [{lo}, {hi}]")
        return self

    def effective_shift(self, image_size: int) -> float:
        return self.shift * (image_size / self.shift_base_size if self.shift_base_size else 1.0)


class DDPMObjective(StrictModel):
    """DDPM on the squared-cosine schedule: the network predicts the noise (``epsilon``) or ``v``; DDIM samples."""

    kind: Literal["ddpm"] = "ddpm"
    prediction: Literal["epsilon", "v"] = "epsilon"
    train_timesteps: int = Field(default=1000, gt=1)


class DiffusionDataConfig(ImageSourceConfig):
    objective: FlowObjective | DDPMObjective = Field(default_factory=FlowObjective, discriminator="kind")
    cond_dropout: float = Field(default=0.1, ge=0, le=1, description="chance a label becomes the null class "
                                "(what classifier-free guidance samples with)")
    loss_weight: str = Field(default="none", description="per-time loss weighting: none, min_snr, or one registered")
    loss_weight_gamma: float = Field(default=5.0, gt=0, description="min_snr's gamma")
    eval_buckets: int = Field(default=4, ge=0, description="validation loss in this many equal time buckets")
    text_encoder: TextEncoderConfig | None = Field(default=None, description="condition on captions embedded by "
                                                   "this decoder (None: on class labels)")
    source: str = Field(default="", description="'digits', 'shapes', a folder of class subfolders, a .jsonl / "
                                                ".parquet file of rows, 'video' (data.video's clips); '' with "
                                                "data.latents")
    video: ClipSettings | None = Field(default=None, description="data.source: video reads these captioned clips")
    latents: str | None = Field(default=None, description="a latent cache directory (`longboat data encode`): train "
                                                          "on its latents instead of data.source's pixels")

    @model_validator(mode="after")
    def _one_source(self) -> DiffusionDataConfig:
        if bool(self.source) == bool(self.latents):
            raise ValueError("set one of data.source (pixels) and data.latents (a latent cache directory)")
        if (self.source == VIDEO) != (self.video is not None):
            raise ValueError("data.source: video reads the clips data.video names; set both or neither")
        return self


# ---- per-time loss weights -------------------------------------------------------------------------------------
# A weight is a function of (snr [B], x0_factor [B], gamma): x0_factor converts the squared error of the network's
# target to the squared error of the clean image it implies (epsilon: 1/snr, v: 1/(snr + 1), flow velocity: t²).
LossWeight = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
_LOSS_WEIGHTS: Registry[LossWeight] = Registry("loss weight", "known loss weights", ConfigError)


def register_loss_weight(name: str) -> Callable[[LossWeight], LossWeight]:
    """Function decorator: the per-time loss weight ``name`` (``data.loss_weight``)."""
    def wrap(fn: LossWeight) -> LossWeight:
        _LOSS_WEIGHTS.register(name, fn)
        return fn

    return wrap


@register_loss_weight("none")
def no_weight(snr: torch.Tensor, x0_factor: torch.Tensor, gamma: float) -> torch.Tensor:
    return torch.ones_like(snr)


@register_loss_weight("min_snr")
def min_snr_weight(snr: torch.Tensor, x0_factor: torch.Tensor, gamma: float) -> torch.Tensor:
    """Min-SNR-γ (Hang et al., 2023): the clean-image error weighted by min(snr, γ)."""
    return snr.clamp(max=gamma) * x0_factor


# ---- samples -------------------------------------------------------------------------------------------------------
class ImageSamples(Dataset):
    """Images with their labels and the ``noise_key`` of their position in the job's sample stream."""

    positioned = True  # the loader calls __getitem__((row, position))

    def __init__(self, images: ImageSet, seed: int):
        self.images, self.seed = images, seed

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int | tuple[int, int]) -> dict:
        row, position = index if isinstance(index, tuple) else (index, index)
        return {"image": self.images.images[row], "label": self.images.labels[row],
                "noise_key": torch.tensor(noise_key(self.seed, position), dtype=torch.int64)}


# ---- the objective ------------------------------------------------------------------------------------------------
class Objective:
    """Noisy inputs, model times, targets and the per-sample SNR for a batch, from uniform draws."""

    def __init__(self, cfg: FlowObjective | DDPMObjective, image_size: int):
        self.cfg = cfg
        self.shift = cfg.effective_shift(image_size) if isinstance(cfg, FlowObjective) else None
        self.scheduler = NoiseScheduler(cfg.train_timesteps, cfg.prediction, clip=None) \
            if isinstance(cfg, DDPMObjective) else None

    def times(self, u: torch.Tensor, raw: bool = False) -> torch.Tensor:
        """Training times from uniform draws ``u`` [B]: flow times in [0, 1] or DDPM timesteps (long). ``raw``: the
        draws as times themselves (evaluation buckets), no distribution, shift or window."""
        if self.scheduler is not None:
            return (u.double() * self.cfg.train_timesteps).long().clamp(max=self.cfg.train_timesteps - 1)
        if raw:
            return u
        t = fm.sample_time(u, self.cfg.time, self.shift if self.shift != 1 else None, **self.cfg.time_params)
        lo, hi = self.cfg.time_window
        return lo + (hi - lo) * t

    def pair(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor):
        """(x_t, target, snr [B], x0_factor [B])."""
        if self.scheduler is None:
            tt = t.clamp(min=1e-5).double()
            snr, factor = ((1 - tt) / tt) ** 2, tt ** 2
            return fm.interpolate(x0, noise, t), fm.velocity_target(x0, noise), snr, factor
        s = self.scheduler
        snr = s.snr(t)
        factor = 1 / snr if self.cfg.prediction == "epsilon" else 1 / (snr + 1)
        return s.add_noise(x0, noise, t), s.target(x0, noise, t), snr, factor


def batch_condition(batch: dict, condition: GeneratorCondition, dropped: torch.Tensor | None,
                    null_text: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
    """The model's condition inputs for ``batch``: (labels,) or (text, text_mask), the ``dropped`` [B] samples' set
    to the null class or the null caption."""
    if condition.kind == "class":
        labels = batch["label"].clone()
        labels[labels < 0] = condition.num_classes
        if dropped is not None:
            labels[dropped.to(labels.device)] = condition.num_classes
        return (labels,)
    text, mask = batch["text"], batch["text_mask"]
    if dropped is not None:
        null, null_mask = (v.to(text.device) for v in null_text)
        keep = ~dropped.to(text.device)
        text = torch.where(keep[:, None, None], text, null.to(text.dtype))
        mask = torch.where(keep[:, None], mask, null_mask)
    return text, mask


def make_diffusion_loss(data: DiffusionDataConfig, condition: GeneratorCondition, in_channels: int, image_size: int,
                        null_text: tuple[torch.Tensor, torch.Tensor] | None = None) -> LossFn:
    objective = Objective(data.objective, image_size)
    weight_fn = _LOSS_WEIGHTS.get(data.loss_weight)
    gamma = data.loss_weight_gamma

    def per_sample(model, x0, cond, keys, t):
        noise = keyed_normal(keys, tuple(x0.shape[1:]), _NOISE, dtype=x0.dtype)
        x_t, target, snr, factor = objective.pair(x0, noise, t)
        out = model(x_t, t, *cond)[:, :in_channels]
        return (out.float() - target.float()).pow(2).flatten(1).mean(1), snr, factor

    def diffusion_loss(model: torch.nn.Module, batch: dict) -> LossOutput:
        x0, keys = batch["image"], batch["noise_key"]
        dropped = None
        if data.cond_dropout > 0:
            dropped = keyed_uniform(keys, (1,), _DROP, torch.float64)[:, 0] < data.cond_dropout
        cond = batch_condition(batch, condition, dropped, null_text)
        t = objective.times(keyed_uniform(keys, (1,), _TIME)[:, 0].to(x0.device))
        mse, snr, factor = per_sample(model, x0, cond, keys, t)
        loss = mse * weight_fn(snr, factor, gamma).to(mse)
        n = x0.shape[0]
        metrics = {"mse": mse.detach().mean()}
        if not model.training and data.eval_buckets:
            metrics.update(bucket_losses(per_sample, model, x0, cond, keys, objective, data.eval_buckets))
        return LossOutput(loss.sum(), n, n, metrics)

    return diffusion_loss


@torch.no_grad()
def bucket_losses(per_sample, model, x0, cond, keys, objective: Objective, buckets: int) -> dict:
    """The unweighted loss of every sample at a keyed time inside each of ``buckets`` equal spans of [0, 1]."""
    out = {}
    for b in range(buckets):
        u = (b + keyed_uniform(keys, (1,), _BUCKET + b)[:, 0].to(x0.device)) / buckets
        mse, _, _ = per_sample(model, x0, cond, keys, objective.times(u, raw=True))
        out[f"loss/t{b / buckets:.2f}-{(b + 1) / buckets:.2f}"] = mse.mean()
    return out


# ---- the task -------------------------------------------------------------------------------------------------------
@register_task("diffusion")
class DiffusionTask(Task):
    """Class- or text-conditional image generation by flow matching or DDPM."""

    data_config = DiffusionDataConfig
    unit = "images"
    epochs = True
    train_defaults = {"ema": {"decay": 0.999}}

    def __init__(self, data: DiffusionDataConfig):
        super().__init__(data)
        self._split: tuple[ImageSet, ImageSet | None] | None = None
        self._spec: bytes | None = None  # set by build, or by a checkpoint's task state
        self._encoder: TextEncoder | None = None
        self._reads_text, self._reads_classes = False, True  # what the architecture takes (check_architecture)
        _LOSS_WEIGHTS.get(data.loss_weight)  # an unknown name fails now, listing the known ones

    def images(self) -> tuple[ImageSet, ImageSet | None]:
        if self._split is None:
            if self.data.video:
                self._split = open_clip_split(self.data.video, self.data.valid_fraction, self.data.split_seed)
            else:
                self._split = open_latent_split(self.data.latents, self.data.valid_fraction, self.data.split_seed) \
                    if self.data.latents else open_split(self.data)
        return self._split

    @property
    def _where(self) -> str:
        return self.data.latents or (self.data.video.path if self.data.video else self.data.source)

    def _check_clips(self, config) -> None:
        if self.data.video and not takes_clips(config):
            name = (config if isinstance(config, type) else type(config)).__name__
            raise ConfigError(f"data.source: video: model {name} takes images, not clips; pick a generator whose "
                              "config declares takes_clips")

    def _shape(self) -> tuple[int, int]:
        """(channels, side) of what the model makes: the data's images, or the cache's latents."""
        if self.data.latents:
            latents = self.images()[0]
            return latents.channels, int(latents.mean.shape[-1])
        if self.data.video:
            return 3, self.data.video.size
        return self.data.channels, self.data.image_size

    def _classes(self) -> list[str]:
        return self.images()[0].classes

    @property
    def text_encoder(self) -> TextEncoder | None:
        if self._encoder is None and self.data.text_encoder is not None:
            self._encoder = TextEncoder(self.data.text_encoder)
        return self._encoder

    def check_architecture(self, config) -> None:
        """Refuse a config class that is no image generator, and note whether it can read text."""
        require_image_generator(config, "diffusion")
        self._check_clips(config)
        self._reads_text = accepts_text(config)
        self._reads_classes = "num_classes" in getattr(config, "model_fields", {})

    def configure_model(self, fields: dict) -> dict:
        channels, size = self._shape()
        found = {"image_size": size, "in_channels": channels}
        if self.text_encoder is not None:
            if not self._reads_text:
                raise ConfigError("data.text_encoder: the model's config declares no text_dim, it reads no text; "
                                  "drop data.text_encoder or pick a text-conditioned architecture")
            found["text_dim"] = self.text_encoder.hidden_size
        elif self.data.video:
            raise ConfigError(f"data.video: {self.data.video.path}: clips are captioned and train text-conditioned "
                              "models; set data.text_encoder")
        elif self._reads_classes:
            found["num_classes"] = len(self._classes())
        where = self._where
        return fill_from_data(fields, found, where if self.text_encoder is None else f"{where} and data.text_encoder")

    def check(self, model_cfg) -> None:
        cfg = require_image_generator(model_cfg, "diffusion")
        self._check_clips(cfg)
        channels, size = self._shape()
        if cfg.image_size != size or cfg.in_channels != channels:
            what = "data.latents' latents" if self.data.latents else \
                "(3, data.video.size)" if self.data.video else "(data.channels, data.image_size)"
            raise ConfigError(f"model: makes {cfg.in_channels}×{cfg.image_size}×{cfg.image_size} images, the data "
                              f"{channels}×{size}×{size} {what}")
        condition = generator_condition(cfg)
        encoder = self.text_encoder
        if condition.kind == "class":
            if self.data.video:
                raise ConfigError(f"data.video: {self.data.video.path}: clips are captioned; model "
                                  f"{type(cfg).__name__} is class-conditional (set its text_dim)")
            if encoder is not None:
                raise ConfigError(f"data.text_encoder: model {type(cfg).__name__} is class-conditional (text_dim "
                                  "unset), it reads no text; drop data.text_encoder or condition the model on text")
            classes = len(self._classes())
            if cfg.num_classes < classes:
                raise ConfigError(f"model.num_classes={cfg.num_classes} is below the {classes} classes of "
                                  f"{self.data.latents or self.data.source}")
            return
        if encoder is None:
            raise ConfigError(f"model: {type(cfg).__name__} is conditioned on text (text_dim={condition.text_dim}); "
                              "set data.text_encoder to embed the captions")
        encoder.check()
        if encoder.hidden_size != condition.text_dim:
            raise ConfigError(f"data.text_encoder: its hidden size is {encoder.hidden_size}, model.text_dim is "
                              f"{condition.text_dim}; they must match")
        if self.images()[0].captions is None:
            where = f"data.latents: {self.data.latents}" if self.data.latents else f"data.source: {self._where}"
            raise ConfigError(f"{where} has no captions (column '{self.data.caption_key}', data.caption_key); "
                              "data.text_encoder needs one per image")

    def captions(self) -> CaptionTable:
        """The caption table of every image, read from the cache or encoded once into it."""
        train, valid = self.images()
        captions = list(train.captions) + (list(valid.captions) if valid is not None else [])
        cache_dir = self.data.text_encoder.cache_dir or default_cache_dir(self._where)
        return caption_table(self.text_encoder, captions, cache_dir)

    def build(self, model_cfg, train_cfg, seed: int, dp_size: int) -> TaskData:
        self.check(model_cfg)
        train, valid = self.images()
        per_step = train_cfg.micro_batch_size * dp_size
        if valid is not None and len(valid) < per_step:
            raise ConfigError(f"data: the validation split holds {len(valid)} images, fewer than one micro-batch on "
                              f"every rank ({train_cfg.micro_batch_size} × {dp_size}); raise data.valid_fraction")
        condition = generator_condition(model_cfg)
        table = self.captions() if condition.kind == "text" else None
        self._spec = self._make_spec(model_cfg)
        loss = make_diffusion_loss(self.data, condition, model_cfg.in_channels, model_cfg.image_size,
                                   table.null if table is not None else None)
        summary = {"train_images": len(train), "valid_images": len(valid) if valid is not None else 0}
        if table is not None:
            summary["captions"] = len(table.captions) - 1
        else:
            summary["classes"] = len(train.classes)
        if train.malformed:
            summary["unreadable_images"] = len(train.malformed)
        if self.data.latents:
            samples = LatentSamples
        elif self.data.video:
            summary["frames"] = self.data.video.frames
            samples = lambda clips, seed: ClipSamples(clips, seed, self.data.video.keep_decoded)  # noqa: E731
        else:
            samples = ImageSamples
        train_set, valid_set = samples(train, seed), samples(valid, seed) if valid is not None else None
        if table is not None:
            train_set = Captioned(train_set, train.captions, table)
            valid_set = Captioned(valid_set, valid.captions, table) if valid_set is not None else None
        return TaskData(train_set, valid_set, loss, summary)

    def flops_per_unit(self, model_cfg) -> float | None:
        flops = getattr(model_cfg, "flops_per_sample", None)
        return float(flops()) if callable(flops) else None

    def _make_spec(self, model_cfg) -> bytes:
        objective = self.data.objective.model_dump(mode="json")
        if isinstance(self.data.objective, FlowObjective):
            objective["effective_shift"] = self.data.objective.effective_shift(model_cfg.image_size)
        condition = generator_condition(model_cfg)
        spec = {"format_version": SPEC_VERSION, "image_size": model_cfg.image_size, "channels": model_cfg.in_channels,
                "conditioning": condition.kind, "source": self._where if self.data.video else self.data.source,
                "valid_fraction": self.data.valid_fraction, "split_seed": self.data.split_seed, "objective": objective}
        if condition.kind == "class":
            spec.update(num_classes=model_cfg.num_classes, classes=self._classes())
        else:
            encoder = self.data.text_encoder.model_dump(mode="json")
            for key in ("path", "tokenizer"):  # sampling may run from another folder
                if encoder[key] is not None:
                    encoder[key] = str(Path(encoder[key]).resolve())
            spec.update(num_classes=0, text_dim=condition.text_dim, text_encoder=encoder,
                        text_encoder_fingerprint=self.text_encoder.fingerprint())
        if self.data.latents:
            spec.update(latent_spec(self.images()[0]))
        if self.data.video:
            spec.update(clip_spec(self.data.video))
        return (json.dumps(spec, indent=2) + "\n").encode()

    def state_dict(self) -> dict[str, torch.Tensor]:
        if self._spec is None:
            return {}
        return {_STATE_KEY: torch.frombuffer(bytearray(self._spec), dtype=torch.uint8)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if _STATE_KEY in state:
            self._spec = bytes(state[_STATE_KEY].numpy().tobytes())

    def export_assets(self) -> dict[str, Path | bytes]:
        if self._spec is None:
            raise ConfigError(f"data.source: {self.data.source}: the sampling settings come from a built task or a "
                              "checkpoint's task state, and neither is at hand")
        return {SPEC_FILE: self._spec}
