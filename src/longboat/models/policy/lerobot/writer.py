"""A longboat policy written in LeRobot's layout (LeRobot 0.4): ``config.json``, ``model.safetensors`` and the
processor pipelines with their statistics, loadable by LeRobot's ``from_pretrained`` and processor loaders.

The export's transform pipeline must be one ``normalize`` step (or none) whose mode is the same for every feature
of a LeRobot feature type (LeRobot normalises by type: VISUAL, STATE, ACTION); anything else is refused, naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save, save_file

from longboat.data.robot.transforms import pipeline_from_assets
from longboat.data.robot.transforms.export import TRANSFORMS_CONFIG, TRANSFORMS_STATS
from longboat.models.policy.lerobot.common import (CONFIG, MODE_STATS, MODES, ORIGINAL_CONFIG, POSTPROCESSOR,
                                                   PREPROCESSOR, WEIGHTS)
from longboat.models.policy.lerobot.registry import LeRobotError, converter_for_arch
from longboat.models.policy.manifest import POLICY_SPEC, read_policy_manifest

_LEROBOT_MODE = {ours: theirs for theirs, ours in MODES.items()}
_PRE_STATS = "policy_preprocessor_step_3_normalizer_processor.safetensors"
_POST_STATS = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"


def _bytes(assets: dict[str, Path | bytes], name: str, source: str) -> bytes:
    value = assets.get(name)
    if value is None:
        raise LeRobotError(f"{source}: no {name}; only a policy trained or imported by longboat has one")
    return value.read_bytes() if isinstance(value, Path) else value


def _normalisation(assets: dict, source: str, converter) -> tuple[dict[str, str], dict, float, dict]:
    """(feature -> mode, statistics, eps, config.json keys of the transforms after the normalisation)."""
    pipeline = pipeline_from_assets(_bytes(assets, TRANSFORMS_CONFIG, source), _bytes(assets, TRANSFORMS_STATS, source),
                                    f"{source}/{TRANSFORMS_CONFIG}")
    specs = pipeline.to_dict()
    normalize = specs[:1] if specs and specs[0].get("type") == "normalize" else []
    rest = specs[len(normalize):]
    keys = {}
    if rest:
        if converter.transforms_out is None:
            raise LeRobotError(f"{source}/{TRANSFORMS_CONFIG}: transforms {[s.get('type') for s in specs]}: LeRobot's "
                               "processors hold one normalisation; other transforms have no LeRobot counterpart")
        keys = converter.transforms_out(rest, f"{source}/{TRANSFORMS_CONFIG}")
    specs = normalize
    if not specs:
        return {}, {}, 1e-8, keys
    flat = pipeline.state_dict()
    stats: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in flat.items():
        feature, _, stat = key.rpartition("/")
        stats.setdefault(feature, {})[stat] = value
    return dict(specs[0]["features"]), stats, float(specs[0].get("eps", 1e-6)), keys


def _feature_types(config: dict) -> dict[str, dict]:
    return {**config["input_features"], **config["output_features"]}


def _norm_map(modes: dict[str, str], features: dict[str, dict], source: str) -> dict[str, str]:
    by_type: dict[str, str] = {}
    for key, info in features.items():
        mode = _LEROBOT_MODE[modes.get(key, "identity")]
        if by_type.setdefault(info["type"], mode) != mode:
            raise LeRobotError(f"{source}/{TRANSFORMS_CONFIG}: the {info['type']} features are normalised "
                               f"differently ({key}: {mode}, others: {by_type[info['type']]}); LeRobot normalises "
                               "by feature type")
    return by_type


def _step(name: str, features: dict, norm_map: dict, eps: float, state_file: str) -> dict:
    return {"registry_name": name, "config": {"eps": eps, "features": features, "norm_map": norm_map},
            "state_file": state_file}


def _stats_file(stats: dict[str, dict[str, torch.Tensor]], keys, modes: dict[str, str]) -> bytes:
    flat = {f"{k}.{s}": stats[k][s].contiguous() for k in keys for s in MODE_STATS[modes.get(k, "identity")]}
    return save(flat)


def write_lerobot(out_dir: Path, arch: str, model_config: dict, state_dict: dict[str, torch.Tensor],
                  assets: dict[str, Path | bytes], source: str) -> None:
    """Write the LeRobot directory of a policy into ``out_dir`` (an empty directory the caller provides)."""
    converter = converter_for_arch(arch, source)
    base = json.loads(assets[ORIGINAL_CONFIG]) if isinstance(assets.get(ORIGINAL_CONFIG), bytes) else (
        json.loads(assets[ORIGINAL_CONFIG].read_text()) if ORIGINAL_CONFIG in assets else {})
    spec = read_policy_manifest(_bytes(assets, POLICY_SPEC, source), f"{source}/{POLICY_SPEC}")
    if "input_features" not in base:  # the cameras as stored ([H, W, C]), for a policy that crops them
        base["input_features"] = {k: {"type": "VISUAL", "shape": [v["shape"][-1], *v["shape"][:2]]}
                                  for k, v in spec["input_features"].items() if len(v["shape"]) == 3}
    if spec.get("n_action_steps") is not None:
        base["n_action_steps"] = spec["n_action_steps"]
    if spec.get("temporal_ensemble_coeff") is not None or (arch == "act" and "temporal_ensemble_coeff" in spec):
        base["temporal_ensemble_coeff"] = spec["temporal_ensemble_coeff"]
    modes, stats, eps, transform_keys = _normalisation(assets, source, converter)
    config = converter.config_out(model_config, {**base, **transform_keys})
    features = _feature_types(config)
    norm_map = _norm_map(modes, features, source)
    for key in features:
        missing = [s for s in MODE_STATS[modes.get(key, "identity")] if s not in stats.get(key, {})]
        if missing:
            raise LeRobotError(f"{source}/{TRANSFORMS_STATS}: no {missing} statistics of '{key}'")
    outputs = config["output_features"]
    rename = {wire: feature for wire, feature in spec["wire_keys"].items() if wire != feature}
    pre = {"name": "policy_preprocessor", "steps": [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": rename}},
        {"registry_name": "to_batch_processor", "config": {}},
        {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
        _step("normalizer_processor", features, norm_map, eps, _PRE_STATS)]}
    post = {"name": "policy_postprocessor", "steps": [
        _step("unnormalizer_processor", outputs, norm_map, eps, _POST_STATS),
        {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}]}
    out_dir = Path(out_dir)
    (out_dir / CONFIG).write_text(json.dumps(config, indent=4) + "\n")
    save_file({k: v.contiguous() for k, v in converter.weights_out(state_dict, model_config).items()},
              str(out_dir / WEIGHTS), metadata={"format": "pt"})
    (out_dir / PREPROCESSOR).write_text(json.dumps(pre, indent=2) + "\n")
    (out_dir / POSTPROCESSOR).write_text(json.dumps(post, indent=2) + "\n")
    (out_dir / _PRE_STATS).write_bytes(_stats_file(stats, features, modes))
    (out_dir / _POST_STATS).write_bytes(_stats_file(stats, outputs, modes))
