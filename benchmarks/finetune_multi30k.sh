#!/usr/bin/env bash
# Fine-tuning measured on Multi30k de→en (issue 30; figures in docs/results.md): a model trained on one half of the
# training pairs, then fine-tuned on the other half, against (a) training from scratch on that half, (b) going on
# with the first half, (c) one run on all of it for the same total budget; then a small learning-rate / warmup sweep
# for the fine-tune. Budgets are in steps (BASE_STEPS for the first model, TUNE_STEPS for each follow-up: about 20
# and 9 minutes of this recipe on 2 CPU cores), so a busy machine slows the runs without changing their outcome.
#
#   bash benchmarks/finetune_multi30k.sh [STAGE ...]     stages: data base tune scratch continue all sweep score
#
# Each stage skips runs that already finished; scores go to $WORK/scores.jsonl (BLEU with beam 5, lp 1.0, of each
# run's best.pt on test2016 and on the 500 held-back pairs of each half).
set -euo pipefail
MIRROR=${MT_MIRROR:-$(cd "$(dirname "$0")/../.." && pwd)/shared/data}/multi30k
WORK=${WORK:-runs/finetune}
BASE_STEPS=${BASE_STEPS:-3000}
TUNE_STEPS=${TUNE_STEPS:-2000}
MT=${MT:-.venv/bin/mt}
TRAIN=${TRAIN:-"env OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node 2 -m mt train"}
CONFIG=configs/multi30k_de_en.yaml
COMMON=(--set train.max_minutes=0 --set train.max_tokens=2048 -q)  # 2 processes × 2,048 tokens: the recipe's batch

data() {
  mkdir -p "$WORK/text"
  for lang in de en; do  # half A: pairs 1-14,000 (14,001-14,500 held back); half B: 14,501-28,500 (the rest held)
    zcat "$MIRROR/train.$lang.gz" > "$WORK/text/full.$lang"
    sed -n '1,14000p' "$WORK/text/full.$lang" > "$WORK/text/a.$lang"
    sed -n '14001,14500p' "$WORK/text/full.$lang" > "$WORK/text/a_held.$lang"
    sed -n '14501,28500p' "$WORK/text/full.$lang" > "$WORK/text/b.$lang"
    sed -n '28501,29000p' "$WORK/text/full.$lang" > "$WORK/text/b_held.$lang"
    cat "$WORK/text/a.$lang" "$WORK/text/b.$lang" > "$WORK/text/ab.$lang"
    zcat "$MIRROR/test_2016_flickr.$lang.gz" > "$WORK/text/test.$lang"
  done
  local splits=(--valid "$MIRROR/val" --test "$MIRROR/test_2016_flickr" --src de --tgt en -q)
  [ -f "$WORK/data_a/meta.json" ] || $MT prepare --train "$WORK/text/a" "${splits[@]}" --out "$WORK/data_a"
}

data_with_base_vocabulary() {  # half B and both halves, encoded with the first model's vocabulary
  for half in b ab; do
    [ -f "$WORK/data_$half/meta.json" ] || $MT prepare --train "$WORK/text/$half" --valid "$MIRROR/val" \
      --test "$MIRROR/test_2016_flickr" --src de --tgt en --tokenizer "$WORK/base/best.pt" --out "$WORK/data_$half" -q
  done
}

train() {  # NAME DATA STEPS [mt train options]
  local name=$1 data=$2 steps=$3
  shift 3
  [ -f "$WORK/$name/done" ] && return
  rm -rf "$WORK/$name"
  local started=$SECONDS
  $TRAIN "$CONFIG" --out "$WORK/$name" --set "data=$WORK/$data" --set "train.max_steps=$steps" "${COMMON[@]}" "$@"
  echo "$((SECONDS - started))" > "$WORK/$name/done"  # wall seconds
}

fine_tune() {  # NAME DATA LR WARMUP
  train "$1" "$2" "$TUNE_STEPS" --init "$WORK/base/best.pt" --set "train.lr=$3" --set "train.warmup=$4"
}

score() {
  for run in "$WORK"/*/done; do
    run=$(dirname "$run")
    for set in test a_held b_held; do
      bleu=$($MT evaluate --checkpoint "$run/best.pt" --src "$WORK/text/$set.de" --ref "$WORK/text/$set.en" \
        --beam 5 --json | .venv/bin/python -c "import json,sys; print(json.load(sys.stdin)['bleu']['score'])")
      printf '{"run": "%s", "set": "%s", "bleu": %s, "train_seconds": %s}\n' "$(basename "$run")" "$set" "$bleu" \
        "$(cat "$run/done")" >> "$WORK/scores.jsonl"
    done
  done
}

for stage in "${@:-data base tune scratch all continue sweep score}"; do
  for s in $stage; do
    case $s in
      data) data ;;
      base) train base data_a "$BASE_STEPS" ;;
      tune) data_with_base_vocabulary; fine_tune tune_lr1e-3_w100 data_b 1e-3 100 ;;
      scratch) data_with_base_vocabulary; train scratch_b data_b "$TUNE_STEPS" ;;
      all) data_with_base_vocabulary; train all data_ab "$((BASE_STEPS + TUNE_STEPS))" ;;
      continue) fine_tune continue_a data_a 1e-3 100 ;;
      sweep) for setting in "3e-4 100" "3e-3 100" "1e-3 400"; do
               set -- $setting; fine_tune "tune_lr$1_w$2" data_b "$1" "$2"; done ;;
      score) rm -f "$WORK/scores.jsonl"; score ;;
      *) echo "unknown stage $s"; exit 2 ;;
    esac
  done
done
