"""LeRobot's ``diffusion`` policies <-> longboat's ``diffusion`` architecture.

LeRobot builds Diffusion Policy on torchvision's ResNet-18/34 with GroupNorm(C // 16, C) (or its batch norm),
one image encoder shared by the cameras unless ``use_separate_rgb_encoder_per_camera``, a spatial softmax and
diffusers' DDPM or DDIM scheduler (float32 tables, "leading" timesteps); its chunk starts at the current step
(``n_obs_steps - 1``). Ours gains the options for each (``vision.group_size``, ``shared_camera_encoder``,
``sampler``, ``spacing``, ``float32_tables``, ``first_action``, ``final_n_groups``); tensors are renamed only.

Its in-model crop (``crop_shape``, random while training unless ``crop_is_random`` is false) becomes a
``random_crop`` or ``center_crop`` transform after the normalisation (the two commute: normalisation is per
channel), centred at torchvision's offset.

Refused, naming the key: resizing inside the model, an environment-state input, a backbone other than
ResNet-18/34, linear betas other than 1e-4..0.02, cameras in an order other than sorted.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from longboat.models.policy.lerobot.registry import Converter, LeRobotError, register_converter

_BACKBONES = {"resnet18": [2, 2, 2, 2], "resnet34": [3, 4, 6, 3]}
_STATE = "observation.state"
_SCHEDULERS = {"DDPM": "ddpm", "DDIM": "ddim"}
_FINAL_GROUPS = 8  # LeRobot's output conv block keeps the default group count


def _refuse(source: str, key: str, why: str) -> LeRobotError:
    return LeRobotError(f"{source}: {key} {why}")


def config_in(config: dict, source: str) -> dict:
    inputs, outputs = config["input_features"], config["output_features"]
    env = [k for k, f in inputs.items() if f["type"] == "ENV"]
    if env:
        raise _refuse(source, f"input_features.{env[0]}", "is an environment state, which longboat's Diffusion "
                      "Policy does not read")
    if _STATE not in inputs:
        raise _refuse(source, "input_features", f"lacks {_STATE}, which LeRobot's Diffusion Policy reads")
    if config.get("resize_shape") is not None:
        raise _refuse(source, "resize_shape", f"= {config['resize_shape']}: longboat's Diffusion Policy does not "
                      "resize inside the model")
    backbone = config.get("vision_backbone", "resnet18")
    if backbone not in _BACKBONES:
        raise _refuse(source, "vision_backbone", f"= {backbone!r}: longboat reads {', '.join(_BACKBONES)}")
    scheduler = config.get("noise_scheduler_type", "DDPM")
    if scheduler not in _SCHEDULERS:
        raise _refuse(source, "noise_scheduler_type", f"= {scheduler!r}: longboat reads DDPM and DDIM")
    schedule = config.get("beta_schedule", "squaredcos_cap_v2")
    if schedule not in ("squaredcos_cap_v2", "linear") or (
            schedule == "linear" and (config.get("beta_start"), config.get("beta_end")) != (1e-4, 0.02)):
        raise _refuse(source, "beta_schedule", f"= {schedule!r} (beta_start {config.get('beta_start')}, beta_end "
                      f"{config.get('beta_end')}): longboat has squaredcos_cap_v2 and linear 1e-4..0.02")
    cameras = [k for k, f in inputs.items() if f["type"] == "VISUAL"]
    if cameras != sorted(cameras):
        raise _refuse(source, "input_features", f"lists the cameras {cameras} unsorted; longboat reads its cameras "
                      "in sorted order")
    actions = [k for k, f in outputs.items() if f["type"] == "ACTION"]
    if len(actions) != 1:
        raise _refuse(source, "output_features", f"must hold one ACTION feature, got {actions}")
    keypoints = int(config.get("spatial_softmax_num_keypoints", 32))
    n_obs = int(config.get("n_obs_steps", 2))
    train_steps = int(config.get("num_train_timesteps", 100))
    crop = config.get("crop_shape")
    return {
        "image_features": {k: [inputs[k]["shape"][0], *crop] if crop else list(inputs[k]["shape"]) for k in cameras},
        "state_feature": _STATE, "state_dim": int(inputs[_STATE]["shape"][0]),
        "action_feature": actions[0], "action_dim": int(outputs[actions[0]]["shape"][0]),
        "horizon": int(config.get("horizon", 16)), "n_obs_steps": n_obs, "first_action": n_obs - 1,
        "vision": {"in_channels": 3, "widths": [64, 128, 256, 512], "blocks": _BACKBONES[backbone],
                   "norm": "group" if config.get("use_group_norm", True) else "batch", "group_size": 16,
                   "stem_stride": 4},
        "keypoints": keypoints, "image_feature_dim": 2 * keypoints,
        "shared_camera_encoder": not config.get("use_separate_rgb_encoder_per_camera", False),
        "down_dims": list(config.get("down_dims", [512, 1024, 2048])), "kernel_size": int(config.get("kernel_size", 5)),
        "n_groups": int(config.get("n_groups", 8)), "final_n_groups": _FINAL_GROUPS,
        "step_embed_dim": int(config.get("diffusion_step_embed_dim", 128)),
        "film_scale": bool(config.get("use_film_scale_modulation", True)),
        "train_timesteps": train_steps, "inference_steps": int(config.get("num_inference_steps") or train_steps),
        "prediction": config.get("prediction_type", "epsilon"), "clip_sample": bool(config.get("clip_sample", True)),
        "clip_sample_range": float(config.get("clip_sample_range", 1.0)),
        "mask_padding": bool(config.get("do_mask_loss_for_padding", False)),
        "sampler": _SCHEDULERS[scheduler], "beta_schedule": schedule, "spacing": "leading", "float32_tables": True,
    }


def config_out(cfg: dict, base: dict) -> dict:
    vision = cfg["vision"]
    names = {tuple(v): k for k, v in _BACKBONES.items()}
    if (vision["widths"] != [64, 128, 256, 512] or tuple(vision["blocks"]) not in names or vision["stem_stride"] != 4
            or vision["in_channels"] != 3 or (vision["norm"] == "group" and vision.get("group_size") != 16)
            or vision["norm"] == "frozen_batch"):
        raise LeRobotError("model.vision: LeRobot's Diffusion Policy builds torchvision's ResNet-18/34 with "
                           "GroupNorm(C // 16, C) or batch norm (widths 64..512, stem_stride 4, 3 channels)")
    if (cfg["spacing"], cfg["float32_tables"], cfg["final_n_groups"], cfg["image_feature_dim"]) != (
            "leading", True, _FINAL_GROUPS, 2 * cfg["keypoints"]) or cfg["first_action"] != cfg["n_obs_steps"] - 1:
        raise LeRobotError("model: LeRobot's Diffusion Policy has spacing: leading, float32_tables: true, "
                           "final_n_groups: 8, image_feature_dim = 2 * keypoints and first_action = n_obs_steps - 1")
    crop = base.get("crop_shape")
    known = base.get("input_features") or {}
    if crop is not None and any(k not in known for k in cfg["image_features"]):
        raise LeRobotError("model.image_features: a cropping policy's LeRobot config needs its cameras' uncropped "
                           "shapes, which its policy.json does not give")
    inputs = {k: {"type": "VISUAL", "shape": list(known[k]["shape"]) if crop is not None else list(v)}
              for k, v in sorted(cfg["image_features"].items())}
    inputs[_STATE] = {"type": "STATE", "shape": [cfg["state_dim"]]}
    out = dict(base)
    out.update({
        "type": "diffusion", "n_obs_steps": cfg["n_obs_steps"], "horizon": cfg["horizon"], "input_features": inputs,
        "output_features": {cfg["action_feature"]: {"type": "ACTION", "shape": [cfg["action_dim"]]}},
        "vision_backbone": names[tuple(vision["blocks"])], "resize_shape": None, "crop_shape": crop,
        "crop_is_random": bool(base.get("crop_is_random", True)),
        "use_group_norm": vision["norm"] == "group", "spatial_softmax_num_keypoints": cfg["keypoints"],
        "use_separate_rgb_encoder_per_camera": not cfg["shared_camera_encoder"], "down_dims": list(cfg["down_dims"]),
        "kernel_size": cfg["kernel_size"], "n_groups": cfg["n_groups"], "diffusion_step_embed_dim": cfg["step_embed_dim"],
        "use_film_scale_modulation": cfg["film_scale"], "noise_scheduler_type": cfg["sampler"].upper(),
        "num_train_timesteps": cfg["train_timesteps"], "beta_schedule": cfg["beta_schedule"],
        "prediction_type": cfg["prediction"], "clip_sample": cfg["clip_sample"],
        "clip_sample_range": cfg["clip_sample_range"], "num_inference_steps": cfg["inference_steps"],
        "do_mask_loss_for_padding": cfg["mask_padding"],
    })
    out.setdefault("n_action_steps", cfg["horizon"] - cfg["n_obs_steps"] + 1)
    out.setdefault("pretrained_backbone_weights", None)
    return out


# (LeRobot's name, ours) as regular expressions over the part after the encoder or U-Net prefix; each pair is
# applied in both directions (groups referenced as \1, \2, ...).
_BACKBONE_NAMES = [(r"backbone\.0\.", "backbone.stem.0."), (r"backbone\.1\.", "backbone.stem.1.")]
_BLOCK = [(".bn1.", ".norm1."), (".bn2.", ".norm2."), (".downsample.", ".shortcut.")]
_UNET = [
    (r"diffusion_step_encoder\.(\d+)\.", r"step_embed.\1."),
    (r"down_modules\.(\d+)\.([01])\.", r"down.\1.blocks.\2."),
    (r"down_modules\.(\d+)\.2\.", r"down.\1.downsample."),
    (r"mid_modules\.(\d+)\.", r"mid.\1."),
    (r"up_modules\.(\d+)\.([01])\.", r"up.\1.blocks.\2."),
    (r"up_modules\.(\d+)\.2\.", r"up.\1.upsample."),
    (r"final_conv\.0\.block\.", "final.0."),
    (r"final_conv\.1\.", "final.1."),
]
_RESIDUAL = [(".conv1.block.", ".conv1."), (".conv2.block.", ".conv2."), (".cond_encoder.", ".film."),
             (".residual_conv.", ".residual.")]


def _unet_in(rest: str) -> str:
    for pattern, template in _UNET:
        new, n = re.subn("^" + pattern, template, rest)
        if n:
            rest = new
            break
    for theirs, ours in _RESIDUAL:
        rest = rest.replace(theirs, ours)
    return rest


def _encoder_in(rest: str) -> str:
    match = re.match(r"^backbone\.(\d+)\.", rest)
    if match and int(match.group(1)) >= 4:  # layer1..4 are children 4..7 of torchvision's ResNet
        tail = rest[match.end() - 1:]
        for theirs, ours in _BLOCK:
            tail = tail.replace(theirs, ours)
        return f"backbone.stages.{int(match.group(1)) - 4}" + tail
    for pattern, template in _BACKBONE_NAMES:
        rest = re.sub("^" + pattern, template, rest)
    return rest.replace("pool.nets.", "keypoints.proj.")


def weights_in(weights: dict[str, torch.Tensor], cfg: dict) -> dict[str, torch.Tensor]:
    out = {}
    for name, value in weights.items():
        if name.endswith(".pos_grid"):
            continue
        if name.startswith("diffusion.unet."):
            out["unet." + _unet_in(name.removeprefix("diffusion.unet."))] = value
            continue
        rest = name.removeprefix("diffusion.rgb_encoder.")
        index = 0
        if not cfg["shared_camera_encoder"]:
            head, _, rest = rest.partition(".")
            index = int(head)
        out[f"encoder.cameras.{index}." + _encoder_in(rest)] = value
    return out


def _unet_out(rest: str) -> str:
    for theirs, ours in _RESIDUAL:
        rest = rest.replace(ours, theirs)
    reverse = [(r"step_embed\.(\d+)\.", r"diffusion_step_encoder.\1."), (r"down\.(\d+)\.blocks\.(\d+)\.",
               r"down_modules.\1.\2."), (r"down\.(\d+)\.downsample\.", r"down_modules.\1.2."),
               (r"mid\.(\d+)\.", r"mid_modules.\1."), (r"up\.(\d+)\.blocks\.(\d+)\.", r"up_modules.\1.\2."),
               (r"up\.(\d+)\.upsample\.", r"up_modules.\1.2."), (r"final\.0\.", "final_conv.0.block."),
               (r"final\.1\.", "final_conv.1.")]
    for pattern, template in reverse:
        new, n = re.subn("^" + pattern, template, rest)
        if n:
            return new
    return rest


def _encoder_out(rest: str) -> str:
    match = re.match(r"^backbone\.stages\.(\d+)\.", rest)
    if match:
        tail = rest[match.end() - 1:]
        for theirs, ours in _BLOCK:
            tail = tail.replace(ours, theirs)
        return f"backbone.{int(match.group(1)) + 4}" + tail
    rest = rest.replace("backbone.stem.0.", "backbone.0.").replace("backbone.stem.1.", "backbone.1.")
    return rest.replace("keypoints.proj.", "pool.nets.")


def keypoint_grid(h: int, w: int) -> torch.Tensor:
    """LeRobot's spatial-softmax grid [h * w, 2] ((x, y) from numpy's float64 linspace, stored as float32)."""
    xs, ys = np.meshgrid(np.linspace(-1.0, 1.0, w), np.linspace(-1.0, 1.0, h))
    return torch.from_numpy(np.concatenate([xs.reshape(-1, 1), ys.reshape(-1, 1)], axis=1)).float()


def weights_out(state: dict[str, torch.Tensor], cfg: dict) -> dict[str, torch.Tensor]:
    out = {}
    for name, value in state.items():
        if name.startswith("unet."):
            out["diffusion.unet." + _unet_out(name.removeprefix("unet."))] = value
            continue
        match = re.match(r"^encoder\.cameras\.(\d+)\.", name)
        prefix = "diffusion.rgb_encoder." + ("" if cfg["shared_camera_encoder"] else f"{match.group(1)}.")
        out[prefix + _encoder_out(name[match.end():])] = value
    # The grid's size is the feature map's: the image through the ResNet's five stride-2 stages.
    _, h, w = next(iter(cfg["image_features"].values()))
    for _ in range(5):
        h, w = (h + 1) // 2, (w + 1) // 2
    n = 1 if cfg["shared_camera_encoder"] else len(cfg["image_features"])
    for i in range(n):
        prefix = "diffusion.rgb_encoder." + ("" if cfg["shared_camera_encoder"] else f"{i}.")
        out[prefix + "pool.pos_grid"] = keypoint_grid(h, w)
    return out


def transforms_in(config: dict) -> list[dict]:
    """LeRobot's in-model crop as our transform after the normalisation: random while training (LeRobot's
    ``crop_is_random``), else the centre crop at torchvision's offset."""
    crop = config.get("crop_shape")
    if crop is None:
        return []
    cameras = [k for k, f in config["input_features"].items() if f["type"] == "VISUAL"]
    kind = "random_crop" if config.get("crop_is_random", True) else "center_crop"
    return [{"type": kind, "keys": cameras, "size": list(crop), "centre": "round"}]


def transforms_out(specs: list[dict], source: str) -> dict:
    """config.json's crop keys for the transforms after the normalisation: one crop of every camera or none."""
    if len(specs) != 1 or specs[0].get("type") not in ("random_crop", "center_crop") or \
            specs[0].get("centre") != "round":
        raise LeRobotError(f"{source}: transforms {[s.get('type') for s in specs]} after the normalisation: "
                           "LeRobot's Diffusion Policy holds one crop (random_crop or center_crop, centre: round)")
    return {"crop_shape": list(specs[0]["size"]), "crop_is_random": specs[0]["type"] == "random_crop"}


DIFFUSION_CONVERTER = register_converter(Converter("diffusion", "diffusion", config_in, config_out, weights_in,
                                                   weights_out, transforms_in, transforms_out))
