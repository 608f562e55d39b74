"""Tiny vision-language models: configs small enough to train a step in well under a second on one thread."""

import pytest

from longboat.config.base import validate
from longboat.models import get_model

IMAGE_TOKEN = 5
LANGUAGE = {"preset": "tiny", "vocab_size": 64, "d_model": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1,
            "ffn_dim": 64, "max_seq_len": 64}
VIT = {"arch": "vit", "image_size": 16, "patch_size": 4, "d_model": 24, "n_layers": 2, "n_heads": 2}
QWEN = {"arch": "qwen2_5_vl_vision", "d_model": 32, "n_layers": 2, "n_heads": 2, "ffn_dim": 48, "out_dim": 40,
        "patch_size": 4, "window_size": 16, "full_attention_layers": [1], "min_pixels": 64,
        "max_pixels": 4096}


def vlm_fields(vision: dict = VIT, projector: dict | None = None, **language) -> dict:
    return {"vision": dict(vision), "projector": projector or {"kind": "mlp"},
            "language": {**LANGUAGE, **language}, "image_token_id": IMAGE_TOKEN}


def vlm_config(*args, **kwargs):
    return validate(get_model("vlm").config, vlm_fields(*args, **kwargs), "test")


@pytest.fixture(autouse=True)
def _tiny_models_on_one_thread(one_thread):
    yield
