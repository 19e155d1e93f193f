"""Sentences of documents: each unit of text a format's reader gives (mt/documents/formats.py) cut into sentences,
the sentences of all the documents at hand planned as one list of parts to translate, and the translations put
back in their places.

Each unit is cut into sentences by sentencex, and again where the document shows a stop is missing
(`missing_stops`); the sentences of all the documents at hand are translated together, through the one path of
mt/decode/translate.py (`Plan.parts` in, their translations to `finish`). Each translation takes its sentence's
place; what is between sentences stays as it was. Nothing is cut off or dropped: a sentence longer than the model
takes is cut at a safe point (punctuation, else a space) and its parts translated one by one; a sentence without a
letter is kept as it is, and so is one the model translates to nothing; a warning on stderr names each of these.

Torch-free: the model's part comes in as `count` (source pieces per text) and `limit` (the most it takes).
"""

from __future__ import annotations

import itertools
import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from mt.errors import MtError

SOFT = str.maketrans("\n\r\t\f\v", "     ")  # what the splitter sees of line breaks: a space, the same length
SAFE_AFTER = ",;:.!?)]}…\"'»”’"  # a long sentence is cut after one of these, at a space, sooner than anywhere else
WORD = re.compile(r"\S+")
STARTER_MIN = 3  # sentences a word must start in a document before a missing stop is seen in front of it ...
STARTER_RATIO = 2  # ... and how many times as often as it stands capitalized inside one


@dataclass
class Sentence:
    """One sentence of a unit: where it is in the unit's text; what takes its place (its translation, else itself);
    and which of `Plan.parts` it was translated as (`count` 0: kept as it is). `spans`: stretches of it translated
    on their own too (a bold word inside it, runs.py), each a Sentence of the unit's text."""

    start: int
    end: int
    text: str
    first: int = 0
    count: int = 0
    spans: list[Sentence] = field(default_factory=list)


@dataclass
class Document:
    """A document cut into units of text to translate, and how to put it back together: `render` takes each
    unit's sentences, translated, and returns the document (its text, or a file format's bytes). `spans`, where
    given, names for a unit's sentences (the unit's index, each one's start and end) the stretches of each to
    translate on their own too."""

    units: list[str]
    render: Callable[[list[list[Sentence]]], str | bytes]  # str for a text format, bytes for a file
    spans: Callable[[int, list[tuple[int, int]]], list[list[tuple[int, int]]]] | None = None


@dataclass
class Plan:
    """What some documents ask of the model: `parts`, to translate in one go, in this order."""

    documents: list[Document]
    sentences: list[list[list[Sentence]]]  # per document, per unit
    parts: list[str]


def splitter() -> Callable[[str, str], list[str]]:
    """sentencex's `segment(language, text)`, or MtError saying how to install it."""
    try:
        from sentencex import segment
    except ImportError:
        raise MtError("documents (--format other than lines) are cut into sentences by sentencex, which is not "
                      "installed: pip install 'mt[documents]' (or pip install sentencex)") from None
    return segment


def plan(documents: list[Document], lang: str, count: Callable[[list[str]], list[int]], limit: int) -> Plan:
    """Each unit of `documents` cut into sentences (sentencex's rules for `lang`), and the parts to translate: each
    sentence with a letter in it (and each of its `Document.spans` with one), its whitespace runs made single
    spaces, cut (`fit`) where it is longer than `limit` pieces (as `count` counts them)."""
    segment, parts, sentences = splitter(), [], []
    for doc in documents:
        spans = missing_stops(doc.units, [split_sentences(unit, lang, segment) for unit in doc.units])
        sentences.append([[Sentence(s, e, unit[s:e]) for s, e in unit_spans]
                          for unit, unit_spans in zip(doc.units, spans, strict=True)])
        for i, unit in enumerate(sentences[-1] if doc.spans else []):
            for s, stretches in zip(unit, doc.spans(i, [(s.start, s.end) for s in unit]), strict=True):
                s.spans = [Sentence(a, b, doc.units[i][a:b]) for a, b in stretches]
    todo = [t for doc in sentences for unit in doc for s in unit if any(c.isalpha() for c in s.text)
            for t in (s, *s.spans) if any(c.isalpha() for c in t.text)]
    sources = [" ".join(s.text.split()) for s in todo]
    for sentence, source, pieces in zip(todo, sources, count(sources), strict=True):
        cut = [source] if pieces <= limit else fit(source, limit, count)
        if len(cut) > 1:
            warn(len(parts), f"{pieces} pieces, more than the model takes ({limit}): translated in {len(cut)} parts, "
                             f"cut at punctuation or spaces: {source[:60]!r}")
        sentence.first, sentence.count = len(parts), len(cut)
        parts.extend(cut)
    return Plan(documents, sentences, parts)


def finish(plan: Plan, translations: list[str]) -> list[str | bytes]:
    """Each document's text, its sentences replaced by `translations` of `plan.parts` (in their order)."""
    if len(translations) != len(plan.parts):
        raise ValueError(f"{len(translations)} translations for {len(plan.parts)} parts")
    for k, (part, text) in enumerate(zip(plan.parts, translations, strict=True)):
        if not text.split():
            warn(k, f"the model translated it to nothing; it is kept untranslated: {part[:60]!r}")
    for doc in plan.sentences:
        for unit in doc:
            for s in (t for sentence in unit for t in (sentence, *sentence.spans)):
                if s.count:  # a part translated to nothing keeps its source text
                    text = " ".join(" ".join(translations[k].split()) or plan.parts[k]
                                    for k in range(s.first, s.first + s.count))
                    s.text = s.text if text == " ".join(s.text.split()) else text  # unchanged: as it was written
    return [doc.render(sentences) for doc, sentences in zip(plan.documents, plan.sentences, strict=True)]


def warn(part: int, message: str) -> None:
    """A warning on stderr (the CLI's, the server's log) about `Plan.parts[part]`, numbered from 1 as the
    glossary's warnings number them: what a document loses nothing by, but its reader should know."""
    print(f"warning: sentence {part + 1}: {message}", file=sys.stderr)


def split_sentences(text: str, lang: str, segment: Callable[[str, str], list[str]]) -> list[tuple[int, int]]:
    """(start, end) of each sentence of `text`, without the whitespace around it; line breaks are soft."""
    flat = text.translate(SOFT)
    pieces = list(segment(lang, flat))
    if "".join(pieces) != flat:  # sentencex gives the text back whole; should a release not, one sentence
        pieces = [flat]
    spans, pos = [], 0
    for piece in pieces:
        start, end = pos + len(piece) - len(piece.lstrip()), pos + len(piece.rstrip())
        if end > start:
            spans.append((start, end))
        pos += len(piece)
    return spans


def missing_stops(units: list[str], spans: list[list[tuple[int, int]]]) -> list[list[tuple[int, int]]]:
    """The sentence `spans` of a document's `units`, also cut where a stop is missing: before a word that, in this
    document, starts sentences (at least STARTER_MIN, and STARTER_RATIO times as often as it stands capitalized
    inside one) and is otherwise written in lower case (`Eine`: `eine`), after a word ending in a letter or digit.

    Captions and headings often end without a stop (`Ein Mann schläft Eine Frau liest.`), and a model translates
    two sentences run together badly, dropping half. This is the orthographic evidence of Punkt (Kiss and Strunk,
    2006), learned from the document itself: a name or a German noun is never written in lower case, so never cut
    before; a language without case is never cut.
    """
    words = [[[(m.start(), m.end()) for m in WORD.finditer(unit, s, e)] for s, e in unit_spans]
             for unit, unit_spans in zip(units, spans, strict=True)]
    starts, inside = Counter(), Counter()
    for unit, unit_words in zip(units, words, strict=True):
        for sentence in unit_words:
            starts[unit[slice(*sentence[0])]] += 1
            inside.update(unit[slice(*w)] for w in sentence[1:])
    lowered = {w for w in inside if w[:1].islower()}

    def starter(word: str) -> bool:
        return (word[:1].isupper() and word.lower() in lowered and starts[word] >= STARTER_MIN
                and inside[word] * STARTER_RATIO <= starts[word])

    def cut(unit: str, sentence: list[tuple[int, int]]) -> list[tuple[int, int]]:
        out, begin = [], sentence[0][0]
        for (_, before), (start, end) in itertools.pairwise(sentence):
            if unit[before - 1].isalnum() and starter(unit[start:end]):
                out.append((begin, before))
                begin = start
        return [*out, (begin, sentence[-1][1])]

    return [[span for sentence in unit_words for span in cut(unit, sentence)]
            for unit, unit_words in zip(units, words, strict=True)]


def fit(sentence: str, limit: int, count: Callable[[list[str]], list[int]]) -> list[str]:
    """`sentence` cut into parts of at most `limit` pieces each: in two at the safe point nearest its middle (a
    space after punctuation, else a space, else the middle itself), and again, until each part fits."""
    if len(sentence) < 2 or count([sentence])[0] <= limit:
        return [sentence]  # a single character longer than the model takes: the encoder cuts it, and warns
    middle = len(sentence) / 2
    spaces = [i for i, c in enumerate(sentence) if c == " " and 0 < i < len(sentence) - 1]
    safe = [i for i in spaces if sentence[i - 1] in SAFE_AFTER]
    cut = min(safe or spaces or [int(middle)], key=lambda i: abs(i - middle))
    return fit(sentence[:cut].rstrip(), limit, count) + fit(sentence[cut:].lstrip(), limit, count)


def join(text: str, sentences: list[Sentence]) -> str:
    """`text` with each of its sentences replaced by what takes its place, the whitespace between them kept."""
    out, pos = [], 0
    for s in sentences:
        out += [text[pos:s.start], s.text]
        pos = s.end
    return "".join(out) + text[pos:]
