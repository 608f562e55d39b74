#!/usr/bin/env bash
# Set up, then train a small Llama-style model on Shakespeare and print a sample from it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
longboat quickstart "$@"
