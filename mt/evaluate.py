"""BLEU, chrF and TER through sacreBLEU, each reported with its signature so scores are comparable."""

from __future__ import annotations

import json
from pathlib import Path

from sacrebleu.metrics import BLEU, CHRF, TER

from mt.errors import MtError
from mt.lines import read_text


def score(hyps: list[str], refs: list[str], lowercase: bool = False) -> dict:
    """Corpus-level scores: {"bleu": {"score", "signature", "verbose"}, "chrf": {...}, "ter": {...}}."""
    if len(hyps) != len(refs):
        raise MtError(f"{len(hyps)} hypotheses but {len(refs)} references; they must be line-aligned")
    report = {}
    for name, metric in (("bleu", BLEU(lowercase=lowercase)), ("chrf", CHRF(lowercase=lowercase)),
                         ("ter", TER(case_sensitive=not lowercase))):
        result = metric.corpus_score(hyps, [refs])
        report[name] = {"score": round(result.score, 2), "signature": str(metric.get_signature()),
                        "verbose": str(result)}
    report["sentences"] = len(hyps)
    return report


def render(report: dict, as_json: bool = False) -> str:
    if as_json:
        return json.dumps(report, indent=2)
    lines = [f"{name.upper():5} {report[name]['score']:6.2f}   {report[name]['signature']}"
             for name in ("bleu", "chrf", "ter")]
    lines.append(report["bleu"]["verbose"])
    return "\n".join(lines)


def score_files(hyp: str | Path, ref: str | Path, lowercase: bool = False) -> dict:
    hyps, refs = read_text(hyp), read_text(ref)
    if len(hyps) != len(refs):
        raise MtError(f"{hyp} has {len(hyps)} lines but {ref} has {len(refs)}; they must be line-aligned")
    return score(hyps, refs, lowercase)
