"""BLEU, chrF and TER through sacreBLEU, each reported with its signature so scores are comparable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from sacrebleu.metrics import BLEU, CHRF, TER

from mt.data.lines import check_aligned, read_text
from mt.errors import MtError
from mt.options import DEVICE

if TYPE_CHECKING:
    from sacrebleu.metrics.bleu import BLEUScore


def score(hyps: list[str], refs: list[str], lowercase: bool = False) -> dict:
    """Corpus-level scores: {"bleu": {"score", "signature", "verbose", "length_ratio"}, "chrf": {...}, "ter": {...}}."""
    check_aligned("the hypothesis list", len(hyps), "the reference list", len(refs))
    report = {}
    for name, metric in (("bleu", BLEU(lowercase=lowercase)), ("chrf", CHRF(lowercase=lowercase)),
                         ("ter", TER(case_sensitive=not lowercase))):
        result = metric.corpus_score(hyps, [refs])
        report[name] = {"score": round(result.score, 2), "signature": str(metric.get_signature()),
                        "verbose": str(result)}
        if name == "bleu":
            report[name]["length_ratio"] = length_ratio(result)
    report["sentences"] = len(hyps)
    return report


def length_ratio(bleu: BLEUScore) -> float:
    """The output's length over the references' (sacreBLEU's tokens): what a length penalty moves."""
    return round(bleu.sys_len / max(bleu.ref_len, 1), 3)


def evaluate(ref: Path, hyp: Path | None = None, checkpoint: Path | None = None, src: Path | None = None,
             beam: int | None = None, lowercase: bool = False, device: str = DEVICE,
             len_penalty: float | None = None) -> dict:
    """Score `hyp`, or `checkpoint`'s translation of `src` (decoded with its own defaults, or `beam`), against
    `ref`; `score`'s report."""
    if (hyp is None) == (checkpoint is None):
        raise MtError("give either --hyp FILE, or --checkpoint C with --src FILE")
    if checkpoint is not None and src is None:
        raise MtError("--checkpoint needs --src FILE (the sentences to translate)")
    refs = read_text(ref)
    if hyp is not None:
        hyps = read_text(hyp)
    else:
        # torch: imported only when there is something to translate
        from mt.decode.translate import translate_file

        hyps = translate_file(checkpoint, src, beam, device, len_penalty)
    check_aligned(hyp or src, len(hyps), ref, len(refs))
    return score(hyps, refs, lowercase)


def render(report: dict, as_json: bool = False) -> str:
    if as_json:
        return json.dumps(report, indent=2)
    lines = [f"{name.upper():5} {report[name]['score']:6.2f}   {report[name]['signature']}"
             for name in ("bleu", "chrf", "ter")]
    lines.append(report["bleu"]["verbose"])
    return "\n".join(lines)
