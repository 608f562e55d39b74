"""``longboat sample``: images from an image generator (an export, a run directory or a checkpoint), one PNG each and
a grid, with classifier-free guidance, and on request the metrics of ``eval/image_metrics.py``.

A video generator (its ``diffusion.json`` records ``frames``) draws clips of ``--frames`` frames (its trained count
by default): an mp4 each and a grid of each clip's first, middle and last frames (``sample_video.py``).

A class-conditional model draws ``--class`` labels, guided against the null class; a text-conditioned one draws
``--prompt`` captions, embedded by the run's own text encoder (refused when its fingerprint changed since training)
and guided against the empty caption.

Image ``i`` of a command is drawn from its own seed, ``--seed + i``: its starting noise is keyed by that seed alone,
so an image does not depend on the batch it was sampled in, and ``--seed S+i --num 1 --class c`` redraws it. The
settings the model was trained with (image shape, classes, objective, time shift) come from the artifact's
``diffusion.json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from longboat.config.base import ConfigError
from longboat.data.image_sources import ImageSourceConfig, open_split
from longboat.models.generative import flow_matching as fm
from longboat.models.generative.ddpm import NoiseScheduler
from longboat.models.generative.keyed_random import keyed_normal, noise_key
from longboat.recipes.artifact import Artifact, open_artifact
from longboat.recipes.sample_video import check_frames, key_frames, write_clips
from longboat.tasks.diffusion import SPEC_FILE
from longboat.tasks.text_encoder import TextEncoder, TextEncoderConfig
from longboat.utils.outputs import staged_output

SAMPLERS = {"flow": ("euler", "heun"), "ddpm": ("ddim",)}
GRID_CELL = 64  # pixels a grid cell is at least (small images are scaled up, nearest neighbour)


@dataclass
class Generator:
    """An opened image generator and the settings it was trained with."""

    artifact: Artifact
    spec: dict
    frames: int | None = None  # a video generator's clip length; None: images

    @property
    def num_classes(self) -> int:
        return int(self.spec["num_classes"])

    @property
    def shape(self) -> tuple[int, ...]:
        side = int(self.spec["image_size"])
        return (int(self.spec["channels"]),) + ((self.frames,) if self.frames else ()) + (side, side)

    @property
    def objective(self) -> dict:
        return self.spec["objective"]

    @property
    def conditioning(self) -> str:
        return self.spec.get("conditioning", "class")

    def text_encoder(self) -> TextEncoder:
        """The run's text encoder; an error when its weights, tokenizer or settings changed since training."""
        where = f"{self.artifact.source}: {SPEC_FILE} text_encoder"
        encoder = TextEncoder(TextEncoderConfig.model_validate(self.spec["text_encoder"]), where)
        if encoder.fingerprint() != self.spec.get("text_encoder_fingerprint"):
            raise ConfigError(f"{where}: the encoder's weights, tokenizer or settings differ from those the model was "
                              "trained with (fingerprint changed)")
        return encoder


def open_generator(path: str | Path) -> Generator:
    """The model at ``path`` and its ``diffusion.json``; an error naming the artifact when it is no image generator."""
    artifact = open_artifact(path)
    found = artifact.assets.get(SPEC_FILE)
    if found is None:
        raise ConfigError(f"{artifact.source}: not an image generator (task {artifact.task!r}; no {SPEC_FILE} among "
                          "its assets)")
    raw = found.read_bytes() if isinstance(found, Path) else found
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{artifact.source}: {SPEC_FILE} is not JSON ({e.msg})") from None
    return Generator(artifact, spec, spec.get("frames"))


def check_settings(gen: Generator, classes: list[int], num: int, steps: int, cfg_scale: float,
                   sampler: str | None) -> str:
    """Refuse settings outside their range; the sampler to use (the objective's first when None)."""
    kind = gen.objective["kind"]
    if num < 1:
        raise ConfigError(f"--num must be at least 1, got {num}")
    if steps < 1:
        raise ConfigError(f"--steps must be at least 1, got {steps}")
    if not math.isfinite(cfg_scale) or cfg_scale < 0:
        raise ConfigError(f"--cfg must be 0 or more (1: no guidance), got {cfg_scale}")
    for c in classes:
        if not 0 <= c < gen.num_classes:
            raise ConfigError(f"--class {c}: the model knows classes 0..{gen.num_classes - 1}")
    sampler = sampler or SAMPLERS[kind][0]
    if sampler not in SAMPLERS[kind]:
        raise ConfigError(f"--sampler {sampler}: a {kind} model samples with {' or '.join(SAMPLERS[kind])}")
    return sampler


Condition = torch.Tensor | tuple[torch.Tensor, ...]


def text_condition(gen: Generator, prompts: list[str]) -> tuple[Condition, Condition]:
    """(text [N, L, D], mask [N, L]) of ``prompts`` and the null caption's (text [L, D], mask [L]), padded alike."""
    text, mask = gen.text_encoder().encode(list(prompts) + [""])
    return (text[:-1], mask[:-1]), (text[-1], mask[-1])


def guided(model: torch.nn.Module, cond: Condition, null: int | Condition, scale: float):
    """The network with classifier-free guidance: uncond + scale·(cond − uncond), both halves in one batch; scale 1
    is the conditional network alone, 0 the unconditional one. ``cond``: labels [B] or (text, mask) [B, ...];
    ``null``: the null class, or the null caption's (text, mask) without the batch dimension."""
    channels = None
    cond = cond if isinstance(cond, tuple) else (cond,)
    null = null if isinstance(null, tuple) else (torch.tensor(null),)

    def fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        nonlocal channels
        channels = channels or x.shape[1]
        if scale == 1:
            return model(x, t, *cond)[:, :channels]
        both = [torch.cat([c, n.to(c).expand_as(c)]) for c, n in zip(cond, null)]
        out = model(torch.cat([x, x]), torch.cat([t, t]), *both)
        c, uncond = out[:, :channels].chunk(2)
        return uncond + scale * (c - uncond)

    return fn


@torch.no_grad()
def sample_images(gen: Generator, labels: Condition, seeds: list[int], steps: int, cfg_scale: float = 1.0,
                  sampler: str | None = None, batch_size: int = 256, device: torch.device | str = "cpu",
                  null: Condition | None = None) -> torch.Tensor:
    """Images [N, C, H, W] (clips [N, C, T, H, W]) in [-1, 1] of class ``labels`` [N] (``num_classes``: none), or of the text condition
    (text, mask) [N, ...] with ``null`` the null caption's (``text_condition``); image i from ``seeds[i]``."""
    sampler = check_settings(gen, [], 1, steps, cfg_scale, sampler)
    model = gen.artifact.model.to(device).eval()
    objective = gen.objective
    keys = torch.tensor([noise_key(s, 0) for s in seeds], dtype=torch.int64)
    decode = latent_decoder(gen, device)
    out = []
    for i in range(0, len(seeds), batch_size):
        noise = keyed_normal(keys[i:i + batch_size], gen.shape).to(device)
        part = tuple(c[i:i + batch_size].to(device) for c in labels) if isinstance(labels, tuple) \
            else labels[i:i + batch_size].to(device)
        fn = guided(model, part, gen.num_classes if null is None else null, cfg_scale)
        if objective["kind"] == "flow":
            shift = objective.get("effective_shift", 1.0)
            integrate = fm.euler_sample if sampler == "euler" else fm.heun_sample
            x = integrate(fn, noise, steps, shift if shift != 1 else None)
        else:
            scheduler = NoiseScheduler(objective["train_timesteps"], objective["prediction"], clip=1.0)
            x = scheduler.sample(fn, noise, steps)
        out.append((x if decode is None else decode(x)).clamp(-1, 1).float().cpu())
    return torch.cat(out)


def latent_decoder(gen: Generator, device: torch.device | str = "cpu"):
    """For a model trained on a latent cache: its samples to pixels by the VAE the cache was encoded with (the
    weights checked against the hash the cache recorded); None for a pixel model."""
    vae = gen.spec.get("vae")
    if not vae:
        return None
    from longboat.recipes.latent_vae import open_vae

    model, _, _, digest = open_vae(vae)
    if gen.spec.get("vae_weights_sha256") not in (None, digest):
        raise ConfigError(f"{gen.artifact.source}: its VAE {vae} has changed since the latents were encoded (weights "
                          "hash differs); sampling would decode with other weights")
    model = model.to(device)
    return lambda z: model.decode(model.unscale_latents(z))


def to_pil(image: torch.Tensor) -> Image.Image:
    """[C, H, W] in [-1, 1] -> an 8-bit grey or RGB image."""
    array = ((image.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 0).numpy()
    return Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array, "L" if array.shape[2] == 1 else "RGB")


def grid(images: torch.Tensor, rows: int) -> Image.Image:
    """The images in ``rows`` rows, each cell scaled up (nearest) to at least ``GRID_CELL`` pixels, 2 px apart."""
    n, c, h, w = images.shape
    cols = math.ceil(n / rows)
    scale = max(1, math.ceil(GRID_CELL / max(h, w)))
    pad = 2
    sheet = Image.new("L" if c == 1 else "RGB", (cols * (w * scale + pad) + pad, rows * (h * scale + pad) + pad),
                      255 if c == 1 else (255, 255, 255))  # white between cells (255 alone is red in RGB)
    for i in range(n):
        cell = to_pil(images[i]).resize((w * scale, h * scale), Image.Resampling.NEAREST)
        r, k = divmod(i, cols)
        sheet.paste(cell, (pad + k * (w * scale + pad), pad + r * (h * scale + pad)))
    return sheet


def _png(image: Image.Image) -> bytes:
    import io

    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def sample(model_path: str | Path, out_dir: str | Path, classes: list[int] | None = None, num: int = 8,
           steps: int = 32, cfg_scale: float = 1.0, seed: int = 0, sampler: str | None = None,
           metrics: bool = False, overwrite: bool = False, batch_size: int = 256, device: str = "cpu",
           prompts: list[str] | None = None, frames: int | None = None) -> dict:
    """Write ``num`` images of each class in ``classes`` (every class when None; unconditional for a model with no
    classes), or of each of ``prompts`` for a text-conditioned model, as PNGs and ``grid.png`` (a row per class or
    prompt) to ``out_dir``; with ``metrics`` also ``metrics.json``. Returns the metrics (empty without them). A video
    generator writes clips of ``frames`` frames (its trained count when None) as mp4s instead of PNGs."""
    gen = open_generator(model_path)
    gen.frames = check_frames(frames, gen.frames, str(gen.artifact.source))
    if gen.conditioning == "text":
        return sample_prompts(gen, out_dir, classes, prompts, num, steps, cfg_scale, seed, sampler, metrics,
                              overwrite, batch_size, device)
    if prompts:
        raise ConfigError(f"--prompt: {gen.artifact.source} is class-conditional; draw it with --class")
    if gen.num_classes == 0 and classes:
        raise ConfigError(f"--class: {gen.artifact.source} is an unconditional model (no classes)")
    if not classes:
        classes = list(range(gen.num_classes)) or [gen.num_classes]  # no classes: the null label, unconditional
    sampler = check_settings(gen, classes if gen.num_classes else [], num, steps, cfg_scale, sampler)
    labels = torch.tensor([c for c in classes for _ in range(num)], dtype=torch.long)
    seeds = [seed + i for i in range(len(labels))]
    images = sample_images(gen, labels, seeds, steps, cfg_scale, sampler, batch_size, device)
    scores: dict = {}
    if metrics:
        if gen.spec.get("vae"):
            raise ConfigError(f"--metrics: {gen.artifact.source} is a latent model; its metrics are not computed yet")
        scores = image_scores(gen, images, labels)
        scores.update({"steps": steps, "cfg": cfg_scale, "sampler": sampler, "seed": seed})
    names = gen.spec.get("classes") or []
    with staged_output(out_dir, overwrite, [gen.artifact.source]) as stage:
        for i, (image, label, s) in enumerate(zip(images, labels.tolist(), seeds)):
            name = names[label] if label < len(names) else "none"
            (stage / f"{i:05d}_class-{name}_seed-{s}.png").write_bytes(_png(to_pil(image)))
        (stage / "grid.png").write_bytes(_png(grid(images, len(classes))))
        if metrics:
            (stage / "metrics.json").write_text(json.dumps(scores, indent=2) + "\n")
    return scores


def image_scores(gen: Generator, images: torch.Tensor, labels: torch.Tensor) -> dict:
    """``eval/image_metrics.py``'s scores against the data the model was trained on (its training split and
    held-out split, as ``diffusion.json`` records them)."""
    from longboat.eval.image_metrics import ImageJudge

    spec = gen.spec
    # A run without a held-out split still gets a floor: the judge holds out a fifth of the images itself.
    source = ImageSourceConfig(source=spec["source"], image_size=spec["image_size"], channels=spec["channels"],
                               valid_fraction=spec.get("valid_fraction") or 0.2, split_seed=spec.get("split_seed", 0))
    train, valid = open_split(source)
    judge = ImageJudge(train, valid)
    labels = labels.clone()
    labels[labels >= gen.num_classes] = -1
    return judge.score(images, labels)


def sample_prompts(gen: Generator, out_dir: str | Path, classes: list[int] | None, prompts: list[str] | None,
                   num: int, steps: int, cfg_scale: float, seed: int, sampler: str | None, metrics: bool,
                   overwrite: bool, batch_size: int, device: str) -> dict:
    """``sample`` for a text-conditioned model: ``num`` images of each prompt, a grid row per prompt."""
    if classes:
        raise ConfigError(f"--class: {gen.artifact.source} is conditioned on text; draw it with --prompt")
    if not prompts:
        raise ConfigError(f"--prompt: {gen.artifact.source} is conditioned on text; give at least one --prompt")
    if metrics:
        raise ConfigError("--metrics scores class-conditional models; this one is conditioned on text")
    sampler = check_settings(gen, [], num, steps, cfg_scale, sampler)
    (text, mask), null = text_condition(gen, prompts)
    rows = torch.arange(len(prompts)).repeat_interleave(num)
    seeds = [seed + i for i in range(len(rows))]
    images = sample_images(gen, (text[rows], mask[rows]), seeds, steps, cfg_scale, sampler, batch_size, device, null)
    names = [f"{i:05d}_prompt-{row}_seed-{s}" for i, (row, s) in enumerate(zip(rows.tolist(), seeds))]
    with staged_output(out_dir, overwrite, [gen.artifact.source]) as stage:
        if gen.frames:
            write_clips(stage, images, names, gen.spec.get("fps", "8"))
            images = key_frames(images)
        else:
            for image, name in zip(images, names):
                (stage / f"{name}.png").write_bytes(_png(to_pil(image)))
        (stage / "grid.png").write_bytes(_png(grid(images, len(prompts))))
        (stage / "prompts.json").write_text(json.dumps(prompts, indent=2, ensure_ascii=False) + "\n")
    return {}
