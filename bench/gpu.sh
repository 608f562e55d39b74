#!/usr/bin/env bash
# The GPU benchmarks in one call: training throughput and MFU (a ~1B Llama and Qwen3-30B-A3B cut to 8 layers,
# bench/gpu_train.py), then one Qwen3-30B-A3B MoE layer's forward+backward against transformers' grouped_mm
# path, fp32 and bf16 (bench/moe.py). Made for a GPU machine that has CUDA's PyTorch and transformers but no
# package index: what longboat needs beyond them travels as wheels in .whl/ (git-ignored: carry it along).
#
#   bash bench/gpu.sh --fetch-wheels   # with pip and an index: the wheels (Python 3.12, x86-64) into .whl/
#   bash bench/gpu.sh                  # on the GPU: install .whl/ if needed, run both, logs into $OUT
#   bash bench/gpu.sh --tiny           # CPU dry run of the same steps, small sizes
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
    ""|--tiny|--fetch-wheels) ;;
    *) echo "bench/gpu.sh: unknown option '$1' (expected none, --tiny or --fetch-wheels)" >&2; exit 2 ;;
esac

if [[ "${1:-}" == "--fetch-wheels" ]]; then
    # pydantic is the one core dependency missing from the image; its own needs come with it.
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "pydantic==2.14.4" "pydantic-core==2.50.5" "annotated-types==0.8.0" "typing-inspection==0.4.5"
    exit 0
fi

out="${OUT:-runs/bench-gpu}"
mkdir -p "$out"
if ! python3 -c "import pydantic" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1

if [[ "${1:-}" == "--tiny" ]]; then
    torchrun --nproc_per_node=1 bench/gpu_train.py --tiny 2>&1 | tee "$out/gpu_train.txt"
    python3 bench/moe.py --tokens 256 --repeats 1 --dtypes float32 2>&1 | tee "$out/moe.txt"
    exit 0
fi
if ! command -v nvidia-smi >/dev/null; then
    echo "bench/gpu.sh: no nvidia-smi here; this runs on a GPU machine (use --tiny for a CPU dry run)" >&2
    exit 1
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
timeout 420 torchrun --nproc_per_node=1 bench/gpu_train.py 2>&1 | tee "$out/gpu_train.txt"
timeout 150 python3 bench/moe.py --shape qwen3-30b-a3b --tokens 16384 --repeats 10 2>&1 | tee "$out/moe.txt"
