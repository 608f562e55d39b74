"""What the engine asks of a model beyond ``forward``, declared by its ``ModelSpec.hooks``: the auxiliary losses of
the last forward, a hook after each optimizer step, which modules are expert sets and how they are sharded, extra
inputs from the batch; the language-model contract the LM tasks require of a model's config, and what a model that reads
images among its tokens offers the data (``image_reader``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

from longboat.config.base import ConfigError


@dataclass(frozen=True)
class ExpertSets:
    """The modules of a model that expert parallelism splits by expert, and what distributed applies to them.

    ``is_expert_set(module)``: whether ``module`` is one set of routed experts; ``n_experts(module)``: how many it
    holds; ``parallel_style()``: the style that shards one set over an ``ep`` (or ``ep × tp``) mesh;
    ``reads_local_shards(module)``: whether the module's forward swaps in its local shards (then it runs eagerly).
    """

    is_expert_set: Callable[[nn.Module], bool]
    n_experts: Callable[[nn.Module], int]
    parallel_style: Callable[[], Any]
    reads_local_shards: Callable[[nn.Module], bool]

    def modules(self, model: nn.Module) -> list[nn.Module]:
        return [m for m in model.modules() if self.is_expert_set(m)]


@dataclass(frozen=True)
class ModelHooks:
    """A model family's answers to the engine; None: the family has none.

    ``aux(model)``: the auxiliary losses and metrics of the model's last forward (``loss``, and what the task
    reports), or None when that forward added none; ``after_optimizer_step(model, dp_group)``: run after every
    optimizer step, outside the gradient; ``experts``: the expert sets expert and tensor parallelism shard;
    ``model_inputs(batch)``: keyword inputs the model takes from the batch besides those the task passes (the LM
    tasks pass ``tokens`` and, when the data has them, ``positions`` and ``segments``); ``output_head(model)``: a
    language model's last hidden states and its output head apart, ``(hidden(tokens, positions) -> [B, T, d],
    weight [vocab, d])``, so a caller that needs the logits of a few positions (scoring answers) computes only
    those instead of [B, T, vocab].
    """

    aux: Callable[[nn.Module], dict | None] | None = None
    after_optimizer_step: Callable[[nn.Module, Any], None] | None = None
    experts: ExpertSets | None = None
    model_inputs: Callable[[dict], dict] | None = None
    output_head: Callable[[nn.Module], tuple[Callable, Any]] | None = None


NO_HOOKS = ModelHooks()

# What the language-model tasks (pretrain, sft) read off a model's config: the vocabulary size the token ids must
# fit, the context length data.seq_len must fit, and ``flops_per_token(seq_len)`` for throughput and MFU.
LANGUAGE_MODEL_FIELDS = {
    "vocab_size": "the vocabulary size (token ids must be below it)",
    "max_seq_len": "the context length (data.seq_len must not exceed it)",
    "flops_per_token": "flops_per_token(seq_len): training FLOPs per token",
}


@dataclass(frozen=True)
class ImageReader:
    """What a model that reads images among its tokens tells the data: the token id its images' placeholders carry,
    the preprocessing (a ``data.images.processors.ImageProcessor``: tokens per image, pixels), and the training FLOPs
    an image token costs beyond a text token (the tower and projector)."""

    image_token_id: int
    processor: Any
    flops_per_image_token: int


def image_reader(cfg: Any) -> ImageReader | None:
    """The ``ImageReader`` of a model config with ``image_token_id``, ``image_processor()`` and
    ``flops_per_image_token()``; None for a text-only model."""
    if not callable(getattr(cfg, "image_processor", None)) or not isinstance(getattr(cfg, "image_token_id", None), int):
        return None
    return ImageReader(cfg.image_token_id, cfg.image_processor(), cfg.flops_per_image_token())


def require_language_model(cfg: Any, task: str) -> Any:
    """``cfg`` when it meets the language-model contract; else an error naming each missing field."""
    missing = [name for name in LANGUAGE_MODEL_FIELDS if not hasattr(cfg, name)]
    if not callable(getattr(cfg, "flops_per_token", None)) and "flops_per_token" not in missing:
        missing.append("flops_per_token")
    if missing:
        needs = "; ".join(f"{name}: {LANGUAGE_MODEL_FIELDS[name]}" for name in missing)
        raise ConfigError(f"task '{task}' trains a language model, but the model config {type(cfg).__name__} lacks "
                          f"{', '.join(missing)} ({needs})")
    return cfg

# What the image-generation task (diffusion) reads off a model's config. The model is called as
# ``model(x [B, in_channels, image_size, image_size], t [B], cond, cond_mask) -> [B, C >= in_channels, H, W]`` with
# the prediction in the first ``in_channels`` output channels. What ``cond`` is, the config declares:
# a class generator (``text_dim`` absent or None) takes labels [B] with label ``num_classes`` meaning "no class" and
# no mask; a text generator (``text_dim`` an int) takes text embeddings [B, L, text_dim] and their mask [B, L]
# (True: a real token).
IMAGE_GENERATOR_FIELDS = {
    "image_size": "the side of the square images it generates",
    "in_channels": "the channels of an image",
}
CONDITION_FIELDS = {
    "num_classes": "class labels 0..num_classes-1, and num_classes for 'no class' (classifier-free guidance)",
    "text_dim": "the width of the text embeddings it reads (None: class-conditional)",
}


@dataclass(frozen=True)
class GeneratorCondition:
    """What an image generator is conditioned on: ``kind`` "class" (``num_classes`` labels) or "text" (embeddings of
    width ``text_dim``)."""

    kind: str
    num_classes: int = 0
    text_dim: int = 0


def require_image_generator(cfg: Any, task: str) -> Any:
    """``cfg`` (a model config, or its class) when it meets the image-generator contract; else an error naming each
    missing field."""
    cls = cfg if isinstance(cfg, type) else type(cfg)
    declared = getattr(cls, "model_fields", {})
    missing = [name for name in IMAGE_GENERATOR_FIELDS
               if name not in declared and not isinstance(getattr(cfg, name, None), int)]
    if not any(name in declared or hasattr(cfg, name) for name in CONDITION_FIELDS):
        missing.append("num_classes or text_dim")
    if missing:
        needs = "; ".join(f"{name}: {IMAGE_GENERATOR_FIELDS.get(name, 'how it is conditioned')}" for name in missing)
        raise ConfigError(f"task '{task}' trains an image generator, but the model config {cls.__name__} lacks "
                          f"{', '.join(missing)} ({needs})")
    return cfg


def generator_condition(cfg: Any) -> GeneratorCondition:
    """The conditioning a (validated) image-generator config declares: text when ``text_dim`` is set, else class."""
    text_dim = getattr(cfg, "text_dim", None)
    if isinstance(text_dim, int):
        return GeneratorCondition("text", text_dim=text_dim)
    return GeneratorCondition("class", num_classes=int(getattr(cfg, "num_classes", 0) or 0))


def takes_clips(cfg: Any) -> bool:
    """Whether an image generator (config or class) also takes clips: ``x`` [B, in_channels, frames, image_size,
    image_size], any frame count 1 + 4k, the prediction shaped alike. Its config class says so with
    ``takes_clips: ClassVar[bool] = True``."""
    return bool(getattr(cfg if isinstance(cfg, type) else type(cfg), "takes_clips", False))


def accepts_text(cls: Any) -> bool:
    """Whether an image-generator config class can be conditioned on text (declares ``text_dim``)."""
    return "text_dim" in getattr(cls, "model_fields", {})
