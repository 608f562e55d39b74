#!/usr/bin/env bash
# The Push-T clips recipe: record Push-T episodes, cut them into captioned clips, train a tiny Wan-style video
# transformer on them (pixel space, 9 frames of 32×32 at 5 fps) and sample clips with the task's prompt.
# Needs the simulators (pip install longboat[sim]); see docs/diffusion.md for what it takes and what it gives.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=runs/pusht_clips
longboat data record --env pusht:push_t --episodes 20 --max-steps 60 --size 64 --output "$RUN/pusht" --overwrite
longboat data clips "$RUN/pusht" "$RUN/clips" --frames 9 --fps 5 --size 32 --every 0.4 --overwrite
longboat train configs/diffusion/pusht_clips.yaml "$@"
longboat sample "$RUN" --prompt "push the T-shaped block onto the green target" --num 4 --steps 16 --sampler heun \
  --out samples/pusht_clips --overwrite
