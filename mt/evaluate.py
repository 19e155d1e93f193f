"""BLEU, chrF and TER through sacreBLEU, each reported with its signature so scores are comparable."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from sacrebleu.metrics import BLEU, CHRF, TER


class EvaluateError(Exception):
    """Inputs that cannot be scored; the message names the files."""


def score(hyps: list[str], refs: list[str], lowercase: bool = False) -> dict:
    """Corpus-level scores: {"bleu": {"score", "signature", "verbose"}, "chrf": {...}, "ter": {...}}."""
    if len(hyps) != len(refs):
        raise EvaluateError(f"{len(hyps)} hypotheses but {len(refs)} references; they must be line-aligned")
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


def read_text(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file, CRLF and a BOM tolerated; errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise EvaluateError(f"{path}: file not found")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise EvaluateError(f"{path}, line {line}: not valid UTF-8; convert the file to UTF-8") from None
    lines = [line.rstrip("\r") for line in text.split("\n")]
    return lines[:-1] if lines[-1] == "" else lines  # a final newline ends the last line, not a new one


def write_lines(path: str | Path, lines: Iterable[str]) -> None:
    """Write lines to a temporary file beside `path` and rename it into place when complete."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            for line in lines:
                f.write(line + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def score_files(hyp: str | Path, ref: str | Path, lowercase: bool = False) -> dict:
    hyps, refs = read_text(hyp), read_text(ref)
    if len(hyps) != len(refs):
        raise EvaluateError(f"{hyp} has {len(hyps)} lines but {ref} has {len(refs)}; they must be line-aligned")
    return score(hyps, refs, lowercase)
