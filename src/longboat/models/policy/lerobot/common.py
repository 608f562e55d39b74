"""Reading and writing LeRobot policy directories (LeRobot 0.4's layout), whatever the policy type.

A LeRobot policy directory holds ``config.json`` (its ``type`` and features), ``model.safetensors`` and the
processor pipelines ``policy_preprocessor.json`` / ``policy_postprocessor.json`` with their statistics in
safetensors files. Importing one gives our model config, our state dict and the assets of a longboat policy
export: the normaliser steps become one ``normalize`` transform over the same statistics (``transforms.json`` /
``transforms.safetensors``), and ``policy.json`` records the features, the window and LeRobot's execution settings
(``n_action_steps``, ``temporal_ensemble_coeff``). The original ``config.json`` rides along as an asset, so
exporting back keeps what longboat does not model (optimizer presets, the backbone's pretrained-weights name).

Processor steps besides renaming, batching, device placement and (un)normalisation change what the model sees in
ways longboat does not represent; they are refused, one line naming the step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load, load_file

from longboat.data.robot.transforms import Pipeline, pipeline_assets
from longboat.data.robot.transforms.export import TRANSFORMS_CONFIG, TRANSFORMS_STATS
from longboat.errors import LongboatError
from longboat.models.policy.lerobot.registry import LeRobotError, converter_for_type
from longboat.models.policy.manifest import POLICY_SPEC, POLICY_SPEC_VERSION

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
PREPROCESSOR = "policy_preprocessor.json"
POSTPROCESSOR = "policy_postprocessor.json"
ORIGINAL_CONFIG = "lerobot_config.json"  # the asset keeping LeRobot's config.json

# LeRobot's normalisation modes -> ours; QUANTILE10 (q10..q90) has no counterpart.
MODES = {"MEAN_STD": "mean_std", "MIN_MAX": "min_max", "QUANTILES": "quantiles", "IDENTITY": "identity"}
MODE_STATS = {"mean_std": ("mean", "std"), "min_max": ("min", "max"), "quantiles": ("q01", "q99"), "identity": ()}
PASSIVE_STEPS = {"to_batch_processor", "device_processor"}  # change no value the model reads


@dataclass
class LeRobotPolicy:
    """A LeRobot policy as longboat holds it: architecture, model config, state dict and export assets."""

    lerobot_type: str
    arch: str
    model_config: dict
    state_dict: dict[str, torch.Tensor]
    assets: dict[str, bytes]


def is_lerobot_dir(path: str | Path) -> bool:
    """Whether ``path`` looks like a LeRobot policy directory: a ``config.json`` with a policy ``type`` and
    ``input_features`` (Hugging Face model configs have ``model_type`` instead)."""
    config = Path(path) / CONFIG
    if not config.is_file():
        return False
    try:
        data = json.loads(config.read_text())
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and "type" in data and "input_features" in data and "model_type" not in data


def _json(path: Path) -> dict:
    if not path.is_file():
        raise LeRobotError(f"{path}: missing; a LeRobot policy directory (LeRobot 0.4 or later) holds {CONFIG}, "
                           f"{WEIGHTS}, {PREPROCESSOR} and {POSTPROCESSOR}")
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise LeRobotError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise LeRobotError(f"{path}: expected a JSON object")
    return data


def _features(config: dict, key: str, source: str) -> dict[str, dict]:
    features = config.get(key)
    if not isinstance(features, dict) or not all(
            isinstance(f, dict) and isinstance(f.get("type"), str) and isinstance(f.get("shape"), list)
            for f in features.values()):
        raise LeRobotError(f"{source}: {key} must map each feature to {{type, shape}}")
    return features


def _normalizer(directory: Path, pipeline: dict, source: str, kind: str) -> tuple[dict[str, str], dict, float]:
    """(feature -> our mode, feature -> stat -> tensor, eps) of the pipeline's one (un)normaliser step."""
    found = None
    for i, step in enumerate(pipeline.get("steps") or []):
        name = step.get("registry_name") if isinstance(step, dict) else None
        if name == kind:
            found = step
        elif name == "rename_observations_processor":
            continue
        elif name not in PASSIVE_STEPS:
            raise LeRobotError(f"{source}: steps[{i}] '{name}' is a processor step longboat cannot represent "
                               f"(it reads renaming, batching, device and (un)normalisation steps)")
    if found is None:
        return {}, {}, 1e-8
    cfg = found.get("config") or {}
    stats: dict[str, dict[str, torch.Tensor]] = {}
    if found.get("state_file"):
        path = directory / found["state_file"]
        if not path.is_file():
            raise LeRobotError(f"{path}: missing; {source} names it as the statistics of its {kind}")
        try:
            flat = load_file(str(path))
        except SafetensorError as e:
            raise LeRobotError(f"{path}: not a readable safetensors file ({e})") from None
        for name, value in flat.items():
            feature, _, stat = name.rpartition(".")
            stats.setdefault(feature, {})[stat] = value
    norm_map = cfg.get("norm_map") or {}
    modes = {}
    for feature, info in (cfg.get("features") or {}).items():
        lerobot_mode = norm_map.get(info.get("type"), "IDENTITY")
        if lerobot_mode not in MODES:
            raise LeRobotError(f"{source}: norm_map.{info.get('type')} = {lerobot_mode!r} has no longboat "
                               f"normalisation (longboat reads {', '.join(MODES)})")
        modes[feature] = MODES[lerobot_mode]
        missing = [s for s in MODE_STATS[modes[feature]] if s not in stats.get(feature, {})]
        if missing:
            raise LeRobotError(f"{source}: '{feature}' is normalised {lerobot_mode} but its statistics lack {missing}")
    return modes, stats, float(cfg.get("eps", 1e-8))


def _stored(feature: dict, model_shape: list[int] | None) -> dict:
    """A feature of policy.json: as a dataset stores it (images [H, W, C]) and as the model sees it (cropped)."""
    shape = list(feature["shape"])
    if feature["type"] == "VISUAL":
        return {"shape": [*shape[1:], shape[0]], "dtype": "image", "model_shape": list(model_shape or shape)}
    return {"shape": shape, "dtype": "float32", "model_shape": shape}


def _rename_map(pipeline: dict) -> dict[str, str]:
    for step in pipeline.get("steps") or []:
        if isinstance(step, dict) and step.get("registry_name") == "rename_observations_processor":
            return dict((step.get("config") or {}).get("rename_map") or {})
    return {}


def read_lerobot(path: str | Path) -> LeRobotPolicy:
    """A LeRobot policy directory as our config, state dict and export assets; refusals name the file and key."""
    directory = Path(path)
    converter, model_config, assets = _read_description(directory)
    try:
        weights = load((directory / WEIGHTS).read_bytes())
    except SafetensorError as e:
        raise LeRobotError(f"{directory / WEIGHTS}: not a readable safetensors file ({e})") from None
    state_dict = converter.weights_in(weights, model_config)
    return LeRobotPolicy(converter.lerobot_type, converter.arch, model_config, state_dict, assets)


def lerobot_manifest(path: str | Path) -> bytes:
    """The ``policy.json`` a LeRobot policy directory imports as, read without its weights (for evaluation's
    set-up: what the envs must render)."""
    return _read_description(Path(path))[2][POLICY_SPEC]


def lerobot_source(path: str | Path) -> tuple[str, dict, list[dict], dict[str, dict[str, list]]]:
    """What a run starting from a LeRobot policy needs besides its weights: the architecture, the model config,
    the transform list and the statistics it reads (plain lists, for the run's config)."""
    converter, model_config, assets = _read_description(Path(path))
    transforms = json.loads(assets[TRANSFORMS_CONFIG])["transforms"]
    stats: dict[str, dict[str, list]] = {}
    for key, value in load(assets[TRANSFORMS_STATS]).items():
        feature, _, stat = key.rpartition("/")
        stats.setdefault(feature, {})[stat] = value.tolist()
    return converter.arch, model_config, transforms, stats


def _read_description(directory: Path):
    """(converter, our model config, export assets) of a LeRobot directory: everything but the weights."""
    config_path = directory / CONFIG
    config = _json(config_path)
    converter = converter_for_type(config.get("type"), f"{config_path}: type")
    pre, post = _json(directory / PREPROCESSOR), _json(directory / POSTPROCESSOR)
    if not (directory / WEIGHTS).is_file():
        raise LeRobotError(f"{directory / WEIGHTS}: missing; the policy's weights are not there")
    inputs = _features(config, "input_features", str(config_path))
    outputs = _features(config, "output_features", str(config_path))
    model_config = converter.config_in(config, str(config_path))

    in_modes, in_stats, eps = _normalizer(directory, pre, str(directory / PREPROCESSOR), "normalizer_processor")
    out_modes, out_stats, out_eps = _normalizer(directory, post, str(directory / POSTPROCESSOR),
                                                "unnormalizer_processor")
    modes, stats = {}, {}
    for key in inputs:
        modes[key] = in_modes.get(key, "identity")
        stats[key] = in_stats.get(key, {})
    for key in outputs:
        modes[key] = out_modes.get(key, "identity")
        stats[key] = out_stats.get(key, {})
        if key in in_modes and (in_modes[key], eps) != (modes[key], out_eps):
            raise LeRobotError(f"{directory / POSTPROCESSOR}: '{key}' is unnormalised {modes[key]} (eps {out_eps}) "
                               f"but normalised {in_modes[key]} (eps {eps}) by {PREPROCESSOR}; longboat applies one "
                               "normalisation and its exact inverse")
    if eps != out_eps and out_modes:
        raise LeRobotError(f"{directory}: the pre- and postprocessor normalise with different eps "
                           f"({eps}, {out_eps}); longboat's normalize has one")
    transforms = []
    if any(mode != "identity" for mode in modes.values()):
        transforms.append({"type": "normalize", "features": modes, "eps": eps})
    transforms += converter.transforms_in(config)  # after normalising, as the model does
    try:
        pipeline = Pipeline.from_config(transforms, stats, source=str(directory / PREPROCESSOR), train=False)
    except LongboatError as e:
        raise LeRobotError(f"{directory / PREPROCESSOR}: {e}") from None
    rename = _rename_map(pre)
    wire_keys = {wire: feature for wire, feature in rename.items() if feature in inputs}
    wire_keys.update({key: key for key in inputs if key not in wire_keys.values()})
    spec = {
        "format_version": POLICY_SPEC_VERSION,
        "fps": None,
        "robot_type": None,
        "horizon": model_config["horizon"],
        "n_obs_steps": model_config.get("n_obs_steps", 1),
        "input_features": {k: _stored(v, model_config["image_features"].get(k)) for k, v in inputs.items()},
        "output_features": {k: {"shape": list(v["shape"]), "dtype": "float32", "model_shape": list(v["shape"])}
                            for k, v in outputs.items()},
        "wire_keys": wire_keys,
        "tasks": [],
        "prompt": None,
        "n_action_steps": config.get("n_action_steps"),
        "temporal_ensemble_coeff": config.get("temporal_ensemble_coeff"),
        "lerobot_type": converter.lerobot_type,
    }
    assets = {**pipeline_assets(pipeline), POLICY_SPEC: (json.dumps(spec, indent=2) + "\n").encode(),
              ORIGINAL_CONFIG: config_path.read_bytes()}
    return converter, model_config, assets
