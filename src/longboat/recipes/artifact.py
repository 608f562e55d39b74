"""``open_artifact``: the one way back from an export, a run directory or a checkpoint to a model.

``generate``, ``chat``, ``eval-lm``, ``export`` and ``convert`` (and later ``serve`` and ``eval``) start here. An
export is read from its safetensors and JSON; a checkpoint through its run's ``config.yaml``, with the EMA weights
when it has them and the task's assets rebuilt from the task's saved state; a Hugging Face directory through the
spec that reads its ``model_type``, with its tokenizer and generation config as assets; a LeRobot policy directory
(``config.json`` with a policy ``type``) through ``models.policy.read_lerobot``, its processors as our transforms. A LoRA run's checkpoint is
rebuilt with its model transforms (LoRA's adapters), loaded, and folded: what comes back is always the plain architecture. Every model is
first counted on the meta device: one that cannot fit in the memory available is refused before allocating.

Opening an export runs no code from it: the plugins it records are information only, and its architecture must
already be registered (by longboat, an installed package's ``longboat.plugins`` entry point, or plugins the user
loads, e.g. ``--plugin``). A run directory and its checkpoints are the user's own runs: opening them imports the
plugins of the run's ``config.yaml``, as training did.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from longboat.checkpoint.catalog import latest_checkpoint
from longboat.checkpoint.integrity import COMPLETE_MARKER
from longboat.checkpoint.export import EXPORT_CONFIG, ExportError, load_export_weights, read_export_config
from longboat.config.base import ConfigError, StrictModel, validate
from longboat.models import ModelSpec, get_model, hf_spec, model_names
from longboat.models.footprint import check_config_fits
from longboat.models.policy import is_lerobot_dir, read_lerobot
from longboat.recipes.config import TRANSFORMS, load_run_dir_config, load_run_dir_plugins
from longboat.recipes.transforms import build_model, fold_model, folded_records
from longboat.utils.plugins import load_entry_points

HF_CONFIG = "config.json"


@dataclass
class Artifact:
    arch: str
    config: StrictModel  # the architecture's config
    model: nn.Module  # weights loaded (the EMA's when the artifact has them), in eval mode
    task: str | None
    assets: dict[str, Path | bytes]  # the task's export files: name -> file, or its bytes
    source: Path  # the export or checkpoint directory read
    ema: bool = False
    plugins: tuple[str, ...] = ()
    hf_family: str | None = None  # the HF model_type an export was converted from
    folded: dict[str, dict] = field(default_factory=dict)  # model transforms folded into the weights: key -> settings

    @property
    def spec(self) -> ModelSpec:
        return get_model(self.arch)

    def asset_file(self, name: str) -> Path:
        """The file holding asset ``name``; an error naming the artifact when it has none."""
        value = self.assets.get(name)
        if not isinstance(value, Path):
            raise ExportError(f"{self.source}: no {name} among its assets ({', '.join(sorted(self.assets)) or 'none'})")
        return value


def export_metadata(task: str | None, plugins: list[str] | tuple[str, ...], ema: bool,
                    folded: dict[str, dict] | None = None) -> dict:
    """What an export records besides the model: its task, the plugins that register it, EMA weights, and the
    settings of each model transform folded into the weights (``lora_merged``: the LoRA adapters')."""
    meta = {"task": task, "plugins": list(plugins), "ema": ema}
    for key, settings in (folded or {}).items():
        meta[f"{key}_merged"] = dict(settings)
    return meta


def _folded(meta: dict) -> dict[str, dict]:
    return {key: meta[f"{key}_merged"] for key in TRANSFORMS if isinstance(meta.get(f"{key}_merged"), dict)}


def open_artifact(path: str | Path, prefer_checkpoint: bool = False) -> Artifact:
    """Accept an export dir, a run dir (its export, else its newest checkpoint; the checkpoint first with
    ``prefer_checkpoint``), a checkpoint dir, a LeRobot policy directory or a Hugging Face checkpoint dir."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such export, run directory, checkpoint or Hugging Face directory")
    load_entry_points()
    if (path / EXPORT_CONFIG).is_file():
        return _open_export(path)
    run_export = path / "export" / EXPORT_CONFIG
    if run_export.is_file() and not (prefer_checkpoint and latest_checkpoint(path / "checkpoints")):
        if (path / "config.yaml").is_file():  # a run directory: the user's own run, its plugins as in training
            load_run_dir_plugins(path)
        return _open_export(path / "export")
    if (path / COMPLETE_MARKER).is_file():  # run_dir/checkpoints/step_N
        return _open_checkpoint(path.parent.parent, path)
    if (path / "config.yaml").is_file():
        checkpoint = latest_checkpoint(path / "checkpoints")
        if checkpoint is None:
            raise ConfigError(f"{path}: run directory has neither an export nor a complete checkpoint")
        return _open_checkpoint(path, checkpoint)
    if is_lerobot_dir(path):
        return open_lerobot(path)
    if (path / HF_CONFIG).is_file():
        return _open_hf(path)
    raise ConfigError(f"{path}: expected an export ({EXPORT_CONFIG}), a run directory, a checkpoint or a Hugging "
                      f"Face checkpoint ({HF_CONFIG})")



def _open_export(path: Path) -> Artifact:
    meta = read_export_config(path)
    recorded = meta.get("plugins") or ()
    plugins = tuple(p for p in recorded if isinstance(p, str)) if isinstance(recorded, list) else ()
    if meta.get("arch") not in model_names():
        raise ExportError(unregistered_architecture(path / EXPORT_CONFIG, meta.get("arch"), plugins))
    spec = get_model(meta["arch"])
    cfg = validate(spec.config, meta["model"], str(path / EXPORT_CONFIG), prefix="model")
    check_config_fits(spec, cfg, path / EXPORT_CONFIG)
    model = spec.build(cfg)
    load_export_weights(path, model)
    assets = {name: path / name for name in meta["assets"]}
    return Artifact(meta["arch"], cfg, model.eval(), meta.get("task"), assets, path, bool(meta.get("ema")),
                    plugins, meta.get("hf_family"), _folded(meta))


def unregistered_architecture(source: Path, arch: object, plugins: tuple[str, ...]) -> str:
    """Why an export's architecture cannot be opened, and how to provide it: exports import none of their plugins."""
    if plugins:
        listed = ", ".join(map(repr, plugins))
        trained = f"it was trained with the plugins {listed}, which opening an export never imports"
        example = plugins[0]
    else:
        trained, example = "it names no plugins", "MODULE_OR_FILE"
    return (f"{source}: architecture {arch!r} is not registered (known: {', '.join(model_names())}); {trained}: pass "
            f"the one that registers it yourself (--plugin {example}) or install a package that registers it "
            f"through the 'longboat.plugins' entry points")


def check_hf_fits(spec: ModelSpec, hf_dir: Path) -> None:
    """Refuse a Hugging Face directory whose config.json asks for more memory than there is, before loading it."""
    source = Path(hf_dir) / HF_CONFIG
    check_config_fits(spec, validate(spec.config, spec.hf.config_fields(hf_dir), str(source), prefix="model"), source)


def _open_hf(path: Path) -> Artifact:
    spec = hf_spec(path)  # names the file when config.json's model_type is not one longboat reads
    check_hf_fits(spec, path)
    model, cfg, family, assets = spec.hf.load(path)
    return Artifact(spec.name, cfg, model.eval(), None, dict(assets), path, hf_family=family)


def open_lerobot(path: Path) -> Artifact:
    """A LeRobot policy directory as it is: its weights in our architecture, its processors as our transforms."""
    policy = read_lerobot(path)
    spec = get_model(policy.arch)
    cfg = validate(spec.config, policy.model_config, str(path / HF_CONFIG), prefix="model")
    model = spec.build(cfg)
    try:
        missing, unexpected = model.load_state_dict(policy.state_dict, strict=False)
    except RuntimeError as e:  # a tensor whose shape config.json does not give
        raise ExportError(f"{path}/model.safetensors: does not match {HF_CONFIG} ({str(e).splitlines()[1].strip()})"
                          ) from None
    if missing or unexpected:
        raise ExportError(f"{path}/model.safetensors: missing tensors {sorted(missing)}, unexpected tensors "
                          f"{sorted(unexpected)}")
    return Artifact(policy.arch, cfg, model.eval(), "policy", dict(policy.assets), path)


def _open_checkpoint(run_dir: Path, checkpoint: Path) -> Artifact:
    from longboat.checkpoint.dcp import load_model_weights, load_task_state

    resolved = load_run_dir_config(run_dir)
    check_config_fits(resolved.spec, resolved.model, run_dir / "config.yaml")
    model = build_model(resolved)  # the checkpoint holds the transformed model (e.g. with LoRA's adapters)
    ema = load_model_weights(checkpoint, model, ema=True)
    fold_model(resolved, model)
    state = load_task_state(checkpoint)
    if state is not None:
        resolved.task.load_state_dict(state)
    return Artifact(resolved.arch, resolved.model, model.eval(), resolved.cfg.task, resolved.task.export_assets(),
                    checkpoint, ema, tuple(resolved.cfg.plugins), folded=folded_records(resolved))
