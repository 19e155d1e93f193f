#!/usr/bin/env bash
# Sequence-level self-distillation in the cooldown, screened on Multi30k en→de (issue 29; figures in
# docs/results.md). A one-model recipe hour's checkpoint where its cooldown begins translates the training sources
# (beam 5); the run then goes on from that checkpoint, optimizer and schedule included, on the original pairs plus
# these translations, against the same resume on the original pairs alone. The distilled arm stops short by the
# translation's time in steps, as it would inside the hour. Budgets are in steps (cooldown by steps), so a busy
# machine slows the arms without changing their outcome.
#
#   bash benchmarks/distill_screen.sh RUN_DIR STEP END_STEP DISTILLED_END_STEP
#   e.g. bash benchmarks/distill_screen.sh runs/multi30k_en_de/member-1 6800 8551 8290
#
# RUN_DIR: a one-model run of configs/multi30k_en_de.yaml with its checkpoint-STEP.pt; END_STEP: where it ended.
# Arms go to $WORK/ctl and $WORK/mix, each averaged and tuned on valid as `make recipe` does.
set -euo pipefail
RUN=$1 STEP=$2 END=$3 END_MIX=$4
MIRROR=${MT_MIRROR:-$(cd "$(dirname "$0")/../.." && pwd)/shared/data}/multi30k
WORK=${WORK:-runs/kd}
MT=${MT:-.venv/bin/mt}
TRAIN=${TRAIN:-"env OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node 2 -m mt train"}
TEACHER=$RUN/checkpoint-$STEP.pt

mkdir -p "$WORK"
zcat "$MIRROR/train.en.gz" > "$WORK/train.en"
zcat "$MIRROR/train.de.gz" > "$WORK/train.de"
/usr/bin/time -f "translated the training sources in %e s" \
  "$MT" translate -c "$TEACHER" -i "$WORK/train.en" -o "$WORK/distilled.de" --beam 5 --len-penalty 1.0 --threads 2
cat "$WORK/train.en" "$WORK/train.en" > "$WORK/mix.en"
cat "$WORK/train.de" "$WORK/distilled.de" > "$WORK/mix.de"
"$MT" prepare --src en --tgt de --train "$WORK/mix" --valid "$MIRROR/val" --test "$MIRROR/test_2016_flickr" \
  --tokenizer "$TEACHER" --out "$WORK/data_mix" -q

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
arm mix "$WORK/data_mix" "$END_MIX"
arm ctl "$(sed -n 's/^data: //p' "$RUN/config.yaml")" "$END"
