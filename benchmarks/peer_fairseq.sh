#!/usr/bin/env bash
# A peer for the results recipes (issue 29): fairseq trained on the same prepared Multi30k data for the same hour
# on the same machine, with the published anchor's settings (Wu et al. 2021's Transformer-Tiny: 4+4 layers,
# d_model 128, FFN 256, 4 heads, dropout 0.3, Adam lr 5e-3 with 2,000 warmup steps, 4,096 tokens a batch,
# label smoothing 0.1, shared embeddings; the last 10 epochs' checkpoints averaged, beam 5, length penalty 1.0).
# It reads the pieces `mt prepare` wrote (the same cleaned pairs and SentencePiece model as the recipe's), so the
# toolkits differ in training alone. Figures in docs/results.md.
#
#   bash benchmarks/peer_fairseq.sh NAME [MINUTES]       NAME: a prepared recipe, e.g. multi30k_en_de; 60 minutes
#
# Installs fairseq into build/peers/fairseq (its own venv, this torch) on first use; trains into runs/peer_fairseq_NAME
# (resumable: run it again after an interruption) and writes report.json there: BLEU cased and lowercased, chrF,
# TER on the test split, updates, epochs and minutes.
set -euo pipefail
NAME=${1:?usage: peer_fairseq.sh NAME [MINUTES]}
MINUTES=${2:-60}
DATA=data/prepared/$NAME
WORK=runs/peer_fairseq_$NAME
VENV=build/peers/fairseq
test -f "$DATA/meta.json" || { echo "$DATA: prepare it first (make recipe NAME=$NAME runs mt prepare)"; exit 2; }

if [ ! -f "$VENV/.installed" ]; then  # fairseq 0.12.2 does not run on Python 3.11; fairseq-fixed is its patched 0.12
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet torch==2.13.0  # pinned first, as the Makefile does: never a CUDA build
  "$VENV/bin/pip" install --quiet cffi cython hydra-core==1.3.2 omegaconf==2.3.0 "numpy<2.3" regex sacrebleu tqdm \
    bitarray scikit-learn packaging sentencepiece
  "$VENV/bin/pip" install --quiet --no-deps --no-build-isolation fairseq-fixed==0.12.3.1  # no torchaudio: text only
  touch "$VENV/.installed"
fi
PY=$VENV/bin/python
export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1  # fairseq 0.12 pickles its args; these are this script's own checkpoints

mkdir -p "$WORK/text"
if [ ! -f "$WORK/bin/dict.src.txt" ]; then  # the prepared ids as pieces, then fairseq's binary format
  "$PY" - "$DATA" "$WORK/text" <<'EOF'
import sys
from pathlib import Path
import numpy as np
import sentencepiece as spm
data, out = Path(sys.argv[1]), Path(sys.argv[2])
sp = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
for split in ("train", "valid", "test"):
    for side in ("src", "tgt"):
        ids, offsets = np.load(data / f"{split}.{side}.ids.npy"), np.load(data / f"{split}.{side}.offsets.npy")
        lines = [" ".join(sp.id_to_piece(int(i)) for i in ids[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]
        (out / f"{split}.{side}").write_text("\n".join(lines) + "\n", encoding="utf-8")
EOF
  "$VENV/bin/fairseq-preprocess" --source-lang src --target-lang tgt --trainpref "$WORK/text/train" \
    --validpref "$WORK/text/valid" --testpref "$WORK/text/test" --joined-dictionary --destdir "$WORK/bin" \
    --workers 2 > "$WORK/preprocess.log"
fi

# --stop-time-hours counts this process's time only: a resumed run gets the whole budget again, so say so.
[ -f "$WORK/checkpoints/checkpoint_last.pt" ] && echo "resuming $WORK: the time budget restarts (fairseq's rule)"
"$VENV/bin/fairseq-train" "$WORK/bin" --cpu --seed 1 --source-lang src --target-lang tgt \
  --arch transformer --share-all-embeddings --encoder-layers 4 --decoder-layers 4 \
  --encoder-embed-dim 128 --decoder-embed-dim 128 --encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 \
  --encoder-attention-heads 4 --decoder-attention-heads 4 --dropout 0.3 \
  --optimizer adam --adam-betas '(0.9, 0.98)' --lr 0.005 --lr-scheduler inverse_sqrt --warmup-updates 2000 \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 4096 \
  --stop-time-hours "$(python3 -c "print($MINUTES / 60)")" --keep-last-epochs 10 \
  --save-dir "$WORK/checkpoints" --log-format simple --log-interval 50 --no-progress-bar 2>&1 | tee -a "$WORK/train.log"

# The last 10 checkpoints averaged (the epochs' and the stop's), as Wu et al. average the last 10; then test with
# beam 5, length penalty 1.0.
"$PY" - "$WORK/checkpoints" <<'EOF'
import re, sys
from pathlib import Path
import torch
folder = Path(sys.argv[1])
epochs = sorted(folder.glob("checkpoint[0-9]*.pt"), key=lambda p: int(re.findall(r"\d+", p.name)[0]))
paths = (epochs + [folder / "checkpoint_last.pt"])[-10:]  # last: where the time budget stopped it, mid-epoch
states = [torch.load(p, map_location="cpu", weights_only=False) for p in paths]
averaged = states[-1]
averaged["model"] = {k: sum(s["model"][k].float() for s in states) / len(states) for k in states[-1]["model"]}
torch.save(averaged, folder / "averaged.pt")
print(f"averaged {', '.join(p.name for p in paths)}")
EOF
"$VENV/bin/fairseq-generate" "$WORK/bin" --cpu --path "$WORK/checkpoints/averaged.pt" --gen-subset test \
  --source-lang src --target-lang tgt --beam 5 --lenpen 1.0 --batch-size 128 --remove-bpe sentencepiece \
  > "$WORK/generate.log"
grep '^H-' "$WORK/generate.log" | sort -t- -k2,2n | cut -f3 > "$WORK/test.hyp.txt"
.venv/bin/python - "$WORK" "$DATA" <<'EOF'
import json, re, sys
from pathlib import Path
from mt.decode.evaluate import score
work, data = Path(sys.argv[1]), Path(sys.argv[2])
hyps = (work / "test.hyp.txt").read_text(encoding="utf-8").splitlines()
refs = (data / "test.tgt.txt").read_text(encoding="utf-8").splitlines()
cased, lower = score(hyps, refs), score(hyps, refs, lowercase=True)
ends = re.findall(r"epoch (\d+) \| .*?num_updates (\d+)", (work / "train.log").read_text(encoding="utf-8"))
report = {"toolkit": "fairseq-fixed 0.12.3.1", "bleu": cased["bleu"]["score"], "bleu_lc": lower["bleu"]["score"],
          "chrf": cased["chrf"]["score"], "ter": cased["ter"]["score"],
          "epochs": int(ends[-1][0]) if ends else None, "updates": int(ends[-1][1]) if ends else None,
          "signature": lower["bleu"]["signature"]}
(work / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
print(json.dumps(report, indent=2))
EOF
