"""Glossaries (terminology constraints): a source term's translation is its target term, whenever the source term is
in the input. Read from a TSV file (`mt translate --glossary`) or a request (mt/serve/app.py), applied to a chunk
of lines before it is searched, and checked in each translation afterwards.

A source term is found in a line as whole words (not inside a longer word), case-sensitively, the longest term
first where two overlap. Two methods place the target term:
- `constrain`: the search must place its pieces (lexically constrained beam search, mt/decode/constrained.py and
  `constrained_beam_search` in mt/decode/constrained_search.py); the model's own search otherwise;
- `replace`: the source term is replaced in the input by the target term itself, which the model (not trained for
  it) mostly copies; any search, a CTranslate2 export's too.

Either way a target term counts as placed when it is in the translation as whole words, case-sensitively; the
terms not placed are reported per line (`missed`). docs/glossaries.md has the file format and the measurements.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import TextIO

from mt.data.lines import read_lines
from mt.data.tokenizer import Tokenizer
from mt.decode.constrained import Constraints
from mt.errors import MtError

METHODS = ("constrain", "replace")
DEFAULT_METHOD = "constrain"  # for a model that can constrain its search; docs/glossaries.md says why


@dataclass(frozen=True)
class Term:
    source: str
    target: str


@dataclass(frozen=True)
class Glossary:
    """Terms and how to place them. Equal glossaries compare equal, so the server batches their requests together."""

    terms: tuple[Term, ...]
    method: str = DEFAULT_METHOD

    @cached_property
    def pattern(self) -> re.Pattern:
        """Any source term, as whole words; the longest first, so that a term inside a longer one loses to it."""
        sources = sorted({t.source for t in self.terms}, key=lambda s: (-len(s), s))
        return re.compile(r"(?<!\w)(?:" + "|".join(re.escape(s) for s in sources) + r")(?!\w)")

    @cached_property
    def targets(self) -> dict[str, str]:
        return {t.source: t.target for t in self.terms}

    def find(self, line: str) -> list[Term]:
        """The terms whose source is in `line`, in order of first appearance, each once."""
        if not self.terms:
            return []
        sources = dict.fromkeys(m.group() for m in self.pattern.finditer(line))
        return [Term(source, self.targets[source]) for source in sources]

    def replaced(self, line: str) -> str:
        """`line` with each source term replaced by its target term (the `replace` method)."""
        return self.pattern.sub(lambda m: self.targets[m.group()], line) if self.terms else line


@dataclass
class Applied:
    """A chunk of lines with the glossary applied: what to encode, the constraints to search with (None: plain
    search), and each line's terms, to check the translations against."""

    lines: list[str]
    constraints: Constraints | None
    terms: list[list[Term]] = field(default_factory=list)

    def missed(self, index: int, text: str) -> list[Term]:
        """The terms of line `index` that the translation `text` does not hold."""
        return [t for t in self.terms[index] if not placed(t.target, text)] if self.terms else []


def apply(glossary: Glossary | None, lines: list[str], tgt_tok: Tokenizer) -> Applied:
    """The lines as the method needs them: unchanged with the target terms' pieces as constraints (`constrain`), or
    with the source terms replaced (`replace`). No glossary, or no term in any line: the lines as they are."""
    if glossary is None or not glossary.terms:
        return Applied(lines, None)
    terms = [glossary.find(line) if line.strip() else [] for line in lines]
    if not any(terms):
        return Applied(lines, None, terms)
    if glossary.method == "replace":
        return Applied([glossary.replaced(line) for line in lines], None, terms)
    pieces = dict(zip(glossary.targets.values(), tgt_tok.encode(list(glossary.targets.values())), strict=True))
    return Applied(lines, Constraints([[pieces[t.target] for t in found] for found in terms], glued(tgt_tok)), terms)


@cache
def glued(tok: Tokenizer) -> frozenset[int]:
    """The pieces that continue the word before them: no word boundary (▁) before a letter or digit."""
    return frozenset(i for i, piece in enumerate(tok.pieces()) if piece[:1].isalnum())


def missed(glossary: Glossary, line: str, text: str) -> list[Term]:
    """The terms of `glossary` in `line` that its translation `text` does not hold."""
    return [t for t in glossary.find(line) if not placed(t.target, text)]


def placed(target: str, text: str) -> bool:
    """Whether `target` is in `text` as whole words."""
    return re.search(r"(?<!\w)" + re.escape(target) + r"(?!\w)", text) is not None


def warn_missed(line: int, missed: list[Term], warn: TextIO | None = None, unit: str = "line") -> None:
    """The warning of `mt translate` for input line `line` (1-based; a document's sentence with `unit` "sentence")
    whose translation misses terms."""
    if missed:
        terms = "; ".join(f"{t.source} → {t.target}" for t in missed)
        print(f"warning: {unit} {line}: glossary term{'s' if len(missed) > 1 else ''} not in the translation: {terms}",
              file=warn or sys.stderr)


def check_method(method: str, exported: bool) -> str:
    """The method to place terms with: `method` if the model can do it, else an MtError saying what can."""
    if method not in METHODS:
        raise MtError(f"--glossary-method {method}: must be one of {', '.join(METHODS)}")
    if method == "constrain" and exported:
        raise MtError("--glossary-method constrain: a CTranslate2 export cannot constrain its search; use "
                      "--glossary-method replace, or give the checkpoint")
    return method


def default_method(exported: bool) -> str:
    """The method for a model when none is asked for: DEFAULT_METHOD where the model can, else `replace`."""
    return "replace" if exported else DEFAULT_METHOD


def read_glossary(path: Path, method: str = DEFAULT_METHOD) -> Glossary:
    """A glossary file: UTF-8, one `source term<TAB>target term` per line; blank lines and lines starting with # are
    skipped. A line that is not a term, or a source term given twice with different targets, is an MtError naming
    the file and line."""
    seen: dict[str, tuple[str, int]] = {}
    for number, line in enumerate(read_lines(path, empty_ok=True), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        term = parse_term(line, f"{path}:{number}")
        if term.source in seen and seen[term.source][0] != term.target:
            raise MtError(f"{path}:{number}: {term.source!r} was already given as {seen[term.source][0]!r} on line "
                          f"{seen[term.source][1]}: give each source term one target term")
        seen.setdefault(term.source, (term.target, number))
    if not seen:
        raise MtError(f"{path}: no terms in it: write one `source term<TAB>target term` per line")
    return Glossary(tuple(Term(source, target) for source, (target, _) in seen.items()), method)


def parse_term(line: str, where: str) -> Term:
    """One glossary line, `source<TAB>target`, each side stripped; an MtError that starts with `where` if it is
    not one."""
    fields = line.split("\t")
    if len(fields) != 2:
        found = "no tab" if len(fields) == 1 else f"{len(fields) - 1} tabs"
        raise MtError(f"{where}: {found}: write the source term, one tab, then the target term (e.g. "
                      f"`Hund<TAB>dog`)")
    source, target = (f.strip() for f in fields)
    return term(source, target, where)


def term(source: str, target: str, where: str) -> Term:
    """A term of two non-empty sides that are words (a side of spaces, or of no letter or digit at all, could not
    be found as whole words); an MtError that starts with `where` otherwise."""
    for side, text in (("source", source), ("target", target)):
        if not text:
            raise MtError(f"{where}: the {side} term is empty: give both terms, source then target")
        if not any(c.isalnum() for c in text):
            raise MtError(f"{where}: the {side} term {text!r} holds no letter or digit: a term is a word or words")
        if "\n" in text or "\r" in text:
            raise MtError(f"{where}: the {side} term spans lines: a term is one line")
    return Term(source, target)
