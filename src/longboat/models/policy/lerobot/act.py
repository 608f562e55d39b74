"""LeRobot's ``act`` policies <-> longboat's ``act`` architecture.

LeRobot builds ACT on torchvision's ResNet-18/34 with frozen batch norm, DETR's interleaved 2-D sine positions and
``nn.MultiheadAttention`` (packed query/key/value projections); ours gains ``backbone.norm: frozen_batch`` and
``positions_2d: interleaved`` for them, and the packed projections are split here (and joined back on export)
without changing a byte. The CVAE encoder's fixed 1-D positions, a buffer of LeRobot's state dict, are recomputed
on export exactly as LeRobot computes them (float64 angles, then float32).

Refused, naming the key: an environment-state input, a dilated last stage, a non-ResNet-18/34 backbone, the
``glu`` activation, more than one observation step, cameras in an order other than sorted.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from longboat.models.policy.lerobot.registry import Converter, LeRobotError, register_converter

_BACKBONES = {"resnet18": [2, 2, 2, 2], "resnet34": [3, 4, 6, 3]}
_STATE = "observation.state"

# (LeRobot name, ours) for every tensor other than the backbone's and the packed attention projections.
_RENAMES = [
    ("model.encoder_img_feat_input_proj.", "image_proj."),
    ("model.encoder_latent_input_proj.", "latent_proj."),
    ("model.encoder_robot_state_input_proj.", "state_proj."),
    ("model.encoder_1d_feature_pos_embed.", "token_pos."),
    ("model.decoder_pos_embed.", "queries."),
    ("model.action_head.", "action_head."),
    ("model.vae_encoder_cls_embed.", "vae_cls."),
    ("model.vae_encoder_robot_state_input_proj.", "vae_state_proj."),
    ("model.vae_encoder_action_input_proj.", "vae_action_proj."),
    ("model.vae_encoder_latent_output_proj.", "latent_head."),
    ("model.backbone.conv1.", "backbone.stem.0."),
    ("model.backbone.bn1.", "backbone.stem.1."),
    ("model.vae_encoder.", "vae_encoder."),
    ("model.encoder.", "encoder."),
    ("model.decoder.", "decoder."),
]
# Inside a transformer layer, and inside a backbone block.
_LAYER = [(".multihead_attn.", ".cross_attn."), (".self_attn.out_proj.", ".self_attn.wo."),
          (".cross_attn.out_proj.", ".cross_attn.wo."), (".linear1.", ".ffn.w1."), (".linear2.", ".ffn.w2.")]
_BLOCK = [(".bn1.", ".norm1."), (".bn2.", ".norm2."), (".downsample.", ".shortcut.")]
_POS_ENC = "model.vae_encoder_pos_enc"


def _refuse(source: str, key: str, why: str) -> LeRobotError:
    return LeRobotError(f"{source}: {key} {why}")


def config_in(config: dict, source: str) -> dict:
    inputs, outputs = config["input_features"], config["output_features"]
    env = [k for k, f in inputs.items() if f["type"] == "ENV"]
    if env:
        raise _refuse(source, f"input_features.{env[0]}", "is an environment state, which longboat's ACT does not read")
    backbone = config.get("vision_backbone", "resnet18")
    if backbone not in _BACKBONES:
        raise _refuse(source, "vision_backbone", f"= {backbone!r}: longboat reads {', '.join(_BACKBONES)}")
    if config.get("replace_final_stride_with_dilation"):
        raise _refuse(source, "replace_final_stride_with_dilation", "is set: longboat's ResNet has no dilation")
    activation = config.get("feedforward_activation", "relu")
    if activation not in ("relu", "gelu"):
        raise _refuse(source, "feedforward_activation", f"= {activation!r}: longboat's ACT has relu and gelu")
    if config.get("n_obs_steps", 1) != 1:
        raise _refuse(source, "n_obs_steps", "must be 1 (ACT reads the current frame only)")
    cameras = [k for k, f in inputs.items() if f["type"] == "VISUAL"]
    if cameras != sorted(cameras):
        raise _refuse(source, "input_features", f"lists the cameras {cameras} unsorted; longboat's ACT reads its "
                      "cameras in sorted order")
    states = [k for k, f in inputs.items() if f["type"] == "STATE"]
    if [k for k in states if k != _STATE]:
        raise _refuse(source, "input_features", f"has a state other than {_STATE}: {states}")
    actions = [k for k, f in outputs.items() if f["type"] == "ACTION"]
    if len(actions) != 1:
        raise _refuse(source, "output_features", f"must hold one ACTION feature, got {actions}")
    return {
        "image_features": {k: list(inputs[k]["shape"]) for k in cameras},
        "state_feature": _STATE if states else None,
        "state_dim": int(inputs[_STATE]["shape"][0]) if states else 0,
        "action_feature": actions[0],
        "action_dim": int(outputs[actions[0]]["shape"][0]),
        "horizon": int(config.get("chunk_size", 100)),
        "n_obs_steps": 1,
        "d_model": int(config.get("dim_model", 512)),
        "n_heads": int(config.get("n_heads", 8)),
        "ffn_dim": int(config.get("dim_feedforward", 3200)),
        "n_encoder_layers": int(config.get("n_encoder_layers", 4)),
        "n_decoder_layers": int(config.get("n_decoder_layers", 1)),
        "n_vae_encoder_layers": int(config.get("n_vae_encoder_layers", 4)),
        "latent_dim": int(config.get("latent_dim", 32)),
        "kl_weight": float(config.get("kl_weight", 10.0)),
        "dropout": float(config.get("dropout", 0.1)),
        "norm_eps": 1e-5,
        "pre_norm": bool(config.get("pre_norm", False)),
        "activation": activation,
        "use_vae": bool(config.get("use_vae", True)),
        "positions_2d": "interleaved",
        "backbone": {"in_channels": 3, "widths": [64, 128, 256, 512], "blocks": _BACKBONES[backbone],
                     "norm": "frozen_batch", "stem_stride": 4},
    }


def config_out(cfg: dict, base: dict) -> dict:
    """LeRobot's config.json keys for our ACT config ``cfg`` (a dict), over ``base``."""
    backbone = cfg["backbone"]
    names = {tuple(v): k for k, v in _BACKBONES.items()}
    if (backbone["norm"] != "frozen_batch" or backbone["widths"] != [64, 128, 256, 512]
            or tuple(backbone["blocks"]) not in names or backbone["stem_stride"] != 4 or backbone["in_channels"] != 3):
        raise LeRobotError("model.backbone: LeRobot's ACT builds torchvision's ResNet-18/34 with frozen batch norm "
                           "(norm: frozen_batch, widths 64..512, stem_stride 4, 3 channels)")
    if cfg["positions_2d"] != "interleaved" or cfg["norm_eps"] != 1e-5:
        raise LeRobotError("model: LeRobot's ACT has positions_2d: interleaved and norm_eps 1e-5")
    if sorted(cfg["image_features"]) != list(cfg["image_features"]):
        cfg = {**cfg, "image_features": dict(sorted(cfg["image_features"].items()))}
    inputs = {k: {"type": "VISUAL", "shape": list(v)} for k, v in sorted(cfg["image_features"].items())}
    if cfg["state_feature"] is not None:
        if cfg["state_feature"] != _STATE:
            raise LeRobotError(f"model.state_feature: LeRobot's ACT reads '{_STATE}', not '{cfg['state_feature']}'")
        inputs[_STATE] = {"type": "STATE", "shape": [cfg["state_dim"]]}
    out = dict(base)
    out.update({
        "type": "act", "n_obs_steps": 1, "input_features": inputs,
        "output_features": {cfg["action_feature"]: {"type": "ACTION", "shape": [cfg["action_dim"]]}},
        "chunk_size": cfg["horizon"], "vision_backbone": names[tuple(backbone["blocks"])],
        "replace_final_stride_with_dilation": False, "pre_norm": cfg["pre_norm"], "dim_model": cfg["d_model"],
        "n_heads": cfg["n_heads"], "dim_feedforward": cfg["ffn_dim"], "feedforward_activation": cfg["activation"],
        "n_encoder_layers": cfg["n_encoder_layers"], "n_decoder_layers": cfg["n_decoder_layers"],
        "use_vae": cfg["use_vae"], "latent_dim": cfg["latent_dim"], "n_vae_encoder_layers": cfg["n_vae_encoder_layers"],
        "dropout": cfg["dropout"], "kl_weight": cfg["kl_weight"],
    })
    out.setdefault("n_action_steps", cfg["horizon"])
    out["n_action_steps"] = min(out["n_action_steps"], cfg["horizon"])
    out.setdefault("pretrained_backbone_weights", None)
    return out


def _rename(name: str, table: list[tuple[str, str]], reverse: bool = False) -> str:
    """Apply ``table``'s infix renames in order (reversed, each pair swapped, for ``reverse``)."""
    for theirs, ours in (reversed(table) if reverse else table):
        a, b = (ours, theirs) if reverse else (theirs, ours)
        name = name.replace(a, b, 1)
    return name


def _prefix(name: str, reverse: bool = False) -> str:
    """The first of ``_RENAMES`` whose prefix ``name`` starts with, applied (names are unchanged otherwise)."""
    for theirs, ours in _RENAMES:
        a, b = (ours, theirs) if reverse else (theirs, ours)
        if name.startswith(a):
            return b + name[len(a):]
    return name


def _name_in(name: str) -> str:
    return _rename(_prefix(name), _LAYER)


def _name_out(name: str) -> str:
    return _prefix(_rename(name, _LAYER, reverse=True), reverse=True)


_LAYER_IN = re.compile(r"^model\.backbone\.layer(\d+)\.")
_LAYER_OUT = re.compile(r"^backbone\.stages\.(\d+)\.")


def weights_in(weights: dict[str, torch.Tensor], cfg: dict) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, value in weights.items():
        if name == _POS_ENC or name.endswith("num_batches_tracked"):
            continue
        if name.endswith("in_proj_weight") or name.endswith("in_proj_bias"):
            prefix = _name_in(name.rsplit(".", 1)[0] + ".")[:-1]
            kind = "weight" if name.endswith("weight") else "bias"
            for part, chunk in zip(("wq", "wk", "wv"), value.chunk(3, dim=0)):
                out[f"{prefix}.{part}.{kind}"] = chunk.clone()
            continue
        match = _LAYER_IN.match(name)
        if match:
            ours = f"backbone.stages.{int(match.group(1)) - 1}." + _rename(name[match.end() - 1:], _BLOCK)[1:]
        else:
            ours = _name_in(name)
        out[ours] = value
    return out


def vae_positions(n: int, d: int) -> torch.Tensor:
    """LeRobot's ``vae_encoder_pos_enc`` [1, n, d]: the 1-D sine table computed in float64, stored as float32."""
    j = np.arange(d)
    angles = np.arange(n)[:, None] / np.power(10000, 2 * (j // 2) / d)[None]
    angles[:, 0::2] = np.sin(angles[:, 0::2])
    angles[:, 1::2] = np.cos(angles[:, 1::2])
    return torch.from_numpy(angles).float()[None]


def weights_out(state: dict[str, torch.Tensor], cfg: dict) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    packed: dict[str, dict[str, torch.Tensor]] = {}
    for name, value in state.items():
        parts = name.split(".")
        if len(parts) >= 3 and parts[-2] in ("wq", "wk", "wv"):
            packed.setdefault(".".join(parts[:-2]) + "." + parts[-1], {})[parts[-2]] = value
            continue
        match = _LAYER_OUT.match(name)
        if match:
            theirs = f"model.backbone.layer{int(match.group(1)) + 1}." + \
                _rename(name[match.end() - 1:], _BLOCK, reverse=True)[1:]
        else:
            theirs = _name_out(name)
        out[theirs] = value
    for key, qkv in packed.items():
        prefix, kind = key.rsplit(".", 1)
        theirs = _name_out(prefix + ".")[:-1]
        out[f"{theirs}.in_proj_{kind}"] = torch.cat([qkv["wq"], qkv["wk"], qkv["wv"]])
    if cfg["use_vae"]:
        out[_POS_ENC] = vae_positions(1 + cfg["horizon"] + (cfg["state_feature"] is not None), cfg["d_model"])
    return out


ACT_CONVERTER = register_converter(Converter("act", "act", config_in, config_out, weights_in, weights_out))
