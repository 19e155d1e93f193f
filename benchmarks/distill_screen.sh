#!/usr/bin/env bash
# Synthetic pairs in the cooldown, screened on Multi30k en→de (issue 29; figures in docs/results.md). A one-model
# recipe hour goes on from the checkpoint where its cooldown begins, optimizer and schedule included, on the
# original pairs plus synthetic ones, against the same resume on the original pairs alone (arm ctl):
#   mix: the checkpoint's own beam translations of the training sources (sequence-level self-distillation);
#   bt:  a de→en model's beam translations of the training targets as their sources (back-translation).
# A synthetic arm stops short by one translation's time in steps, as it would inside the hour. Budgets are in steps
# (cooldown by steps), so a busy machine slows the arms without changing their outcome.
#
#   ARMS="mix ctl" bash benchmarks/distill_screen.sh RUN_DIR STEP END_STEP SYNTHETIC_END_STEP [DE_EN_CHECKPOINT]
#   e.g. bash benchmarks/distill_screen.sh runs/multi30k_en_de/member-1 6800 8551 8290 \
#          runs/multi30k_de_en_s2/member-1/checkpoint-3600.pt
#
# RUN_DIR: a one-model run of configs/multi30k_en_de.yaml with its checkpoint-STEP.pt; END_STEP: where it ended.
# Each arm goes to $WORK/ARM, averaged and tuned on valid as `make recipe` does.
set -euo pipefail
RUN=$1 STEP=$2 END=$3 END_MIX=$4 BACKWARD=${5:-}
ARMS=${ARMS:-mix ctl${BACKWARD:+ bt}}
MIRROR=${MT_MIRROR:-$(cd "$(dirname "$0")/../.." && pwd)/shared/data}/multi30k
WORK=${WORK:-runs/kd}
MT=${MT:-.venv/bin/mt}
TRAIN=${TRAIN:-"env OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node 2 -m mt train"}
TEACHER=$RUN/checkpoint-$STEP.pt

mkdir -p "$WORK"
zcat "$MIRROR/train.en.gz" > "$WORK/train.en"
zcat "$MIRROR/train.de.gz" > "$WORK/train.de"
synthetic() {  # NAME CHECKPOINT FROM TO: translate the training side FROM, write $WORK/NAME.{en,de}, prepare it
  /usr/bin/time -f "$1: translated the training data in %e s" \
    "$MT" translate -c "$2" -i "$WORK/train.$3" -o "$WORK/$1.$4" --beam 5 --len-penalty 1.0 --threads 2
  cat "$WORK/train.$3" "$WORK/train.$3" > "$WORK/$1_pairs.$3"
  cat "$WORK/train.$4" "$WORK/$1.$4" > "$WORK/$1_pairs.$4"
  "$MT" prepare --src en --tgt de --train "$WORK/$1_pairs" --valid "$MIRROR/val" --test "$MIRROR/test_2016_flickr" \
    --tokenizer "$TEACHER" --out "$WORK/data_$1" -q
}

arm() {  # NAME DATA END_STEP: resume RUN at STEP on DATA, to END_STEP
  local dir=$WORK/$1
  rm -rf "$dir" && mkdir -p "$dir"
  cp "$RUN/config.yaml" "$TEACHER" "$dir/"
  python3 - "$RUN/log.jsonl" "$dir/log.jsonl" "$STEP" <<'PY'
import json, sys
rows = [line for line in open(sys.argv[1]) if json.loads(line).get("step", 0) <= int(sys.argv[3])]
open(sys.argv[2], "w").writelines(rows)
PY
  $TRAIN --resume --out "$dir" --set data="$2" --set train.max_minutes=0 --set train.max_steps="$3" -q
  "$MT" average "$dir" --last 1,2,4,8 --out "$dir/final.pt"
  "$MT" tune --checkpoint "$dir/final.pt" --out "$dir/final.pt"
}
for name in $ARMS; do
  case $name in
    mix) synthetic mix "$TEACHER" en de && arm mix "$WORK/data_mix" "$END_MIX" ;;
    bt) synthetic bt "$BACKWARD" de en && arm bt "$WORK/data_bt" "$END_MIX" ;;
    ctl) arm ctl "$(sed -n 's/^data: //p' "$RUN/config.yaml")" "$END" ;;
  esac
done
