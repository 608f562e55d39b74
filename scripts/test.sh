#!/usr/bin/env bash
# Set up, then run the whole test suite. Pass pytest arguments through, e.g. `-m "not slow"`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pytest -q "$@"
