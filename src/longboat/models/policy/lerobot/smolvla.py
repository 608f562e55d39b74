"""LeRobot's ``smolvla`` policies <-> longboat's ``smolvla`` architecture.

LeRobot builds SmolVLA's backbone with transformers from ``vlm_model_name`` (a SmolVLM directory: its config.json and
tokenizer), keeps the first ``num_vlm_layers`` decoder layers and puts beside them an expert as wide as
``expert_width_multiplier`` of the backbone (its MLP width by LeRobot's rounding), with ``num_expert_layers`` layers,
cross-attention (``attention_mode``) interleaved with self-attention every ``self_attn_every_n_layers``. Its rotary
embedding is its own (base 10000, whatever the backbone's ``rope_theta``), so ours is set to that. The prompt gets a
newline and is tokenised by the backbone's tokenizer, truncated to ``tokenizer_max_length``; ours reads the same
files (assets of the import) and the same suffix. Tensors are renamed only.

``vlm_model_name`` is read as a directory: beside config.json (as the fixtures hold it), else as given. Refused,
naming the key: a name that is no local directory, an environment-state input, ``adapt_to_pi_aloha``,
``empty_cameras``, ``add_image_special_tokens``, ``use_cache: false``, real-time chunking, more than one observation
step, layer counts LeRobot's cached inference cannot run.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from pydantic import ValidationError

from longboat.data.tokenizer import TOKENIZER_FILES
from longboat.models.policy.lerobot.registry import Converter, LeRobotError, register_converter

_STATE = "observation.state"
_PREFIX = "model.vlm_with_expert."
_REFUSED = {"adapt_to_pi_aloha": False, "use_delta_joint_actions_aloha": False, "empty_cameras": 0,
            "add_image_special_tokens": False, "use_cache": True, "n_obs_steps": 1}
# (LeRobot's name, ours) outside the backbone and the expert's layers.
_HEADS = [("model.state_proj.", "state_proj."), ("model.action_in_proj.", "action_in."),
          ("model.action_out_proj.", "action_out."), ("model.action_time_mlp_in.", "time_mlp_in."),
          ("model.action_time_mlp_out.", "time_mlp_out."), (_PREFIX + "lm_expert.norm.", "expert.norm.")]
_LAYER = [("self_attn.q_proj.", "attention.wq."), ("self_attn.k_proj.", "attention.wk."),
          ("self_attn.v_proj.", "attention.wv."), ("self_attn.o_proj.", "attention.wo."),
          ("input_layernorm.", "attention_norm."), ("post_attention_layernorm.", "ffn_norm."),
          ("mlp.gate_proj.", "feed_forward.w1."), ("mlp.up_proj.", "feed_forward.w3."),
          ("mlp.down_proj.", "feed_forward.w2.")]


# Our config's names in a refusal, as LeRobot's config.json spells them.
_OUR_NAMES = {"expert.n_layers": "num_expert_layers", "vlm.language.n_layers": "num_vlm_layers",
              "resize_pad": "resize_imgs_with_padding ([H, W])", "max_state_dim": "max_state_dim"}


def _refuse(source: str, key: str, why: str) -> LeRobotError:
    return LeRobotError(f"{source}: {key} {why}")


def vlm_dir(config: dict, source: str) -> Path:
    """The SmolVLM directory ``vlm_model_name`` names: beside config.json, else as given."""
    name = config.get("vlm_model_name")
    here = Path(source.split(":")[0]).parent
    for candidate in (here / str(name), Path(str(name))):
        if (candidate / "config.json").is_file():
            return candidate
    raise _refuse(source, "vlm_model_name", f"= {name!r} is no local directory with a config.json (looked in "
                  f"{here / str(name)} and {name}); longboat reads SmolVLA's backbone config and tokenizer from it: "
                  "download the SmolVLM checkpoint and set vlm_model_name to its path")


def expert_ffn(width: int) -> int:
    """LeRobot's expert MLP width for an expert of ``width``: 4·(2/3)·width rounded up to a multiple of 256."""
    hidden = int(4 * int(2 * width / 3))
    return 256 * ((hidden + 255) // 256)


def _vlm_config(directory: Path, layers: int, source: str) -> dict:
    from longboat.models.llm.hf.adapter import HFConversionError
    from longboat.models.vlm.smolvlm_hf import SmolVLMAdapter

    try:
        vlm = SmolVLMAdapter().config_from_hf(json.loads((directory / "config.json").read_text()))
    except (HFConversionError, KeyError, ValueError) as e:
        raise LeRobotError(f"{directory / 'config.json'}: not a SmolVLM config longboat reads ({e})") from None
    language = dict(vlm["language"])
    if language.get("rope_scaling") is not None:
        raise _refuse(source, "vlm_model_name", "names a backbone with rope_scaling; SmolVLA's rotary embedding has "
                      "none")
    total = language["n_layers"]
    if layers > total:
        raise _refuse(source, "num_vlm_layers", f"= {layers} exceeds the backbone's {total} layers")
    language.update(n_layers=layers if layers > 0 else total, rope_theta=10000.0)
    return {**vlm, "language": language}


def config_in(config: dict, source: str) -> dict:
    for key, expected in _REFUSED.items():
        if config.get(key, expected) != expected:
            raise _refuse(source, key, f"= {config[key]!r}: longboat's SmolVLA has {key} {expected!r} only")
    if (config.get("rtc_config") or {}).get("enabled"):
        raise _refuse(source, "rtc_config", "enables real-time chunking, which longboat does not run")
    inputs, outputs = config["input_features"], config["output_features"]
    env = [k for k, f in inputs.items() if f["type"] not in ("VISUAL", "STATE")]
    if env or _STATE not in inputs:
        raise _refuse(source, "input_features", f"must be cameras and {_STATE} (got {sorted(inputs)})")
    actions = [k for k, f in outputs.items() if f["type"] == "ACTION"]
    if len(actions) != 1:
        raise _refuse(source, "output_features", f"must hold one ACTION feature, got {actions}")
    directory = vlm_dir(config, source)
    vlm = _vlm_config(directory, int(config.get("num_vlm_layers", 16)), source)
    layers = vlm["language"]["n_layers"]
    width = int(vlm["language"]["d_model"] * float(config.get("expert_width_multiplier", 0.75)))
    n_expert = int(config.get("num_expert_layers", -1))
    resize = config.get("resize_imgs_with_padding")
    out = {
        "image_features": {k: list(f["shape"]) for k, f in inputs.items() if f["type"] == "VISUAL"},
        "state_feature": _STATE, "state_dim": int(inputs[_STATE]["shape"][0]),
        "action_feature": actions[0], "action_dim": int(outputs[actions[0]]["shape"][0]),
        "horizon": int(config.get("chunk_size", 50)), "n_obs_steps": 1, "vlm": vlm,
        "expert": {"d_model": width, "ffn_dim": expert_ffn(width), "n_layers": n_expert if n_expert > 0 else layers,
                   "norm_eps": vlm["language"].get("norm_eps", 1e-5),
                   "attention": "cross" if "cross" in config.get("attention_mode", "cross_attn") else "self",
                   "self_attn_every": max(0, int(config.get("self_attn_every_n_layers", 2)))},
        "resize_pad": [int(resize[1]), int(resize[0])] if resize is not None else None,
        "max_state_dim": int(config.get("max_state_dim", 32)), "max_action_dim": int(config.get("max_action_dim", 32)),
        "max_prompt_len": int(config.get("tokenizer_max_length", 48)), "tokenizer": str(directory.resolve()),
        "prompt_suffix": "\n" if _newline(Path(source).parent) else "", "num_steps": int(config.get("num_steps", 10)),
        "min_period": float(config.get("min_period", 4e-3)), "max_period": float(config.get("max_period", 4.0)),
    }
    from longboat.models.policy.smolvla import SmolVLAConfig

    try:
        SmolVLAConfig(**out)
    except ValidationError as e:
        error = e.errors()[0]
        message = " ".join([".".join(map(str, error["loc"])), error["msg"].removeprefix("Value error, ")]).strip()
        for ours, theirs in _OUR_NAMES.items():
            message = message.replace(ours, theirs)
        raise LeRobotError(f"{source}: {message}") from None
    return out


def _newline(directory: Path) -> bool:
    """Whether the preprocessor beside config.json ends prompts with a newline (SmolVLA's own step)."""
    try:
        steps = json.loads((directory / "policy_preprocessor.json").read_text()).get("steps") or []
    except (OSError, ValueError, AttributeError):
        return True  # the preprocessor's own reading names what is wrong with it
    return any(isinstance(s, dict) and s.get("registry_name") == "smolvla_new_line_processor" for s in steps)


def prompt(config: dict, preprocessor: dict, source: str) -> tuple[dict, dict[str, bytes]]:
    """(``policy.json``'s prompt: length and suffix, the tokenizer's files) from the preprocessor's steps."""
    names = [s.get("registry_name") for s in preprocessor.get("steps") or [] if isinstance(s, dict)]
    step = next((s for s in preprocessor["steps"] if s.get("registry_name") == "tokenizer_processor"), None)
    if step is None:
        raise LeRobotError(f"{source}: has no tokenizer_processor step; SmolVLA reads a tokenised prompt")
    cfg = step.get("config") or {}
    if cfg.get("truncation", True) is not True:
        raise LeRobotError(f"{source}: tokenizer_processor.truncation must be true (longboat truncates prompts)")
    if cfg.get("task_key", "task") != "task":
        raise LeRobotError(f"{source}: tokenizer_processor.task_key {cfg['task_key']!r}: longboat reads 'task'")
    directory = vlm_dir(config, source)
    assets = {name: (directory / name).read_bytes() for name in TOKENIZER_FILES if (directory / name).is_file()}
    length = int(cfg.get("max_length") or config.get("tokenizer_max_length", 48))
    return ({"max_prompt_len": length, "suffix": "\n" if "smolvla_new_line_processor" in names else ""}, assets)


def _layer_in(rest: str) -> str:
    for theirs, ours in _LAYER:
        rest = rest.replace(theirs, ours)
    return rest


def weights_in(weights: dict[str, torch.Tensor], cfg: dict) -> dict[str, torch.Tensor]:
    from longboat.models.policy.smolvla import SmolVLAConfig
    from longboat.models.vlm.smolvlm_hf import SmolVLMAdapter

    out, backbone = {}, {}
    for name, value in weights.items():
        head = next(((theirs, ours) for theirs, ours in _HEADS if name.startswith(theirs)), None)
        if head is not None:
            out[head[1] + name.removeprefix(head[0])] = value
        elif name.startswith(_PREFIX + "lm_expert.layers."):
            out["expert.layers." + _layer_in(name.removeprefix(_PREFIX + "lm_expert.layers."))] = value
        elif name.startswith(_PREFIX + "vlm."):
            backbone[name.removeprefix(_PREFIX + "vlm.")] = value
        else:
            raise LeRobotError(f"model.safetensors: unexpected tensor {name!r} in a SmolVLA checkpoint")
    vlm = SmolVLAConfig(**cfg).vlm
    out.update({f"vlm.{k}": v for k, v in SmolVLMAdapter().state_dict_from_hf(backbone, vlm).items()})
    return out


def weights_out(state: dict[str, torch.Tensor], cfg: dict) -> dict[str, torch.Tensor]:
    from longboat.models.policy.smolvla import SmolVLAConfig
    from longboat.models.vlm.smolvlm_hf import SmolVLMAdapter

    out, backbone = {}, {}
    for name, value in state.items():
        head = next(((theirs, ours) for theirs, ours in _HEADS if name.startswith(ours)), None)
        if name.startswith("vlm."):
            backbone[name.removeprefix("vlm.")] = value
        elif name.startswith("expert.layers."):
            rest = name.removeprefix("expert.layers.")
            for theirs, ours in _LAYER:
                rest = rest.replace(ours, theirs)
            out[_PREFIX + "lm_expert.layers." + rest] = value
        elif head is not None:
            out[head[0] + name.removeprefix(head[1])] = value
    vlm = SmolVLAConfig(**cfg).vlm
    out.update({_PREFIX + "vlm." + k: v for k, v in SmolVLMAdapter().state_dict_to_hf(backbone, vlm).items()})
    return out


def config_out(cfg: dict, base: dict) -> dict:
    """LeRobot's config.json keys for our SmolVLA config ``cfg`` over ``base`` (the original's other keys);
    ``vlm_model_name`` is the original's, else the backbone's directory (``tokenizer``)."""
    from longboat.models.policy.smolvla import SmolVLAConfig

    c = SmolVLAConfig(**cfg)
    d, e = c.vlm.language.d_model, c.expert
    multiplier = e.d_model / d
    if int(d * multiplier) != e.d_model or e.ffn_dim != expert_ffn(e.d_model) or c.vlm.language.rope_theta != 10000:
        raise LeRobotError(f"model: LeRobot's SmolVLA builds an expert of width int(d_model x multiplier) with MLP "
                           f"width {expert_ffn(e.d_model)} and a rotary base of 10000 (got expert.d_model "
                           f"{e.d_model}, expert.ffn_dim {e.ffn_dim}, rope_theta {c.vlm.language.rope_theta})")
    name = base.get("vlm_model_name") if base.get("type") == "smolvla" else c.tokenizer
    if name is None:
        raise LeRobotError("model.tokenizer: LeRobot's SmolVLA names its backbone's directory (vlm_model_name); "
                           "set tokenizer to it")
    inputs = {k: {"type": "VISUAL", "shape": list(v)} for k, v in c.image_features.items()}
    inputs[_STATE] = {"type": "STATE", "shape": [c.state_dim]}
    resize = c.resize_pad
    layers = c.vlm.language.n_layers
    kept = base.get("expert_width_multiplier", multiplier)  # the original's spelling where it gives the same width
    out = dict(base)
    out.update({
        "type": "smolvla", "n_obs_steps": 1, "input_features": inputs,
        "output_features": {c.action_feature: {"type": "ACTION", "shape": [c.action_dim]}},
        "chunk_size": c.horizon, "max_state_dim": c.max_state_dim, "max_action_dim": c.max_action_dim,
        "resize_imgs_with_padding": [resize[1], resize[0]] if resize is not None else None,
        "tokenizer_max_length": c.max_prompt_len, "num_steps": c.num_steps, "vlm_model_name": name,
        "attention_mode": "cross_attn" if e.attention == "cross" else "self_attn",
        "num_expert_layers": e.n_layers if e.n_layers != layers else base.get("num_expert_layers", -1),
        "num_vlm_layers": layers, "self_attn_every_n_layers": e.self_attn_every,
        "expert_width_multiplier": kept if int(d * kept) == e.d_model else multiplier,
        "min_period": c.min_period, "max_period": c.max_period,
    })
    out.setdefault("n_action_steps", c.horizon)
    return out


SMOLVLA_CONVERTER = register_converter(Converter("smolvla", "smolvla", config_in, config_out, weights_in, weights_out,
                                                 prompt=prompt))
