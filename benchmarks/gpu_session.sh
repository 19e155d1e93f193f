#!/usr/bin/env bash
# A lent GPU's session for issue 89, in two commands that each fit a 10-minute call, from the repository root:
#   bash benchmarks/gpu_session.sh bench    # make gpu-bench within BENCH_S seconds (default 420)
#   bash benchmarks/gpu_session.sh recipe   # the GPU recipe, de→en, RECIPE_MINUTES of training (default 3)
# Multi30k from MT_MIRROR (default data/mirror, carried: mkdir -p data/mirror && cp -r ../shared/data/multi30k
# data/mirror/). Nothing is installed: the Python found (PYTHON, default python3). Reports go to OUT (default
# runs/gpu-session), which the device tool brings back when OUT is its $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
export MT_MIRROR=${MT_MIRROR:-$PWD/data/mirror}
PYTHON=${PYTHON:-python3}
OUT=${OUT:-runs/gpu-session}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
case "${1:-}" in
  bench)
    make --no-print-directory gpu-bench PYTHON="$PYTHON" GPU_BENCH_OUT="$OUT/gpu-bench.json" \
      GPU_BENCH="--budget ${BENCH_S:-420}" ;;
  recipe)
    make --no-print-directory recipe NAME=multi30k_de_en NO_VENV=1 GPU=yes PYTHON="$PYTHON" \
      TRAIN_SET="--set train.max_minutes=${RECIPE_MINUTES:-3}"
    cp runs/multi30k_de_en/report.json "$OUT/recipe-report.json"
    cp runs/multi30k_de_en/log.jsonl "$OUT/recipe-log.jsonl" 2>/dev/null || true ;;
  *) echo "usage: bash benchmarks/gpu_session.sh bench|recipe" >&2; exit 2 ;;
esac
