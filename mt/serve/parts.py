"""What a request's texts ask of the model, and its answer put back together: each text cut at its line breaks,
each line with text one part to translate, a line longer than the model takes cut into sentences as a document's
are (mt/documents/sentences.py), and the translations joined back with the same breaks; nothing is cut off in
silence. Also the bounds on that work, judged before anything is queued: the parts of one request
(--max-sentences), the glossary's terms times the text's characters (`GLOSSARY_WORK`: each term is sought at every
character) and the terms to place in one part (--max-sentence-terms).

Runs off the event loop: it tokenizes every line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mt.decode.glossary import Glossary
from mt.decode.load import Loaded
from mt.decode.translate import plan_documents, source_limit
from mt.documents.sentences import Plan, finish, splitter
from mt.documents.text import text_document
from mt.errors import ApiError, MtError
from mt.options import ServeOptions

GLOSSARY_WORK = 10 ** 8  # a glossary's terms times the characters they are sought in: about 0.25 s a pass on a CPU
# What str.splitlines breaks at: each break is kept as it was written
LINE_BREAK = re.compile(r"(\r\n|[\n\r\v\f\x1c-\x1e\x85\u2028\u2029])")


@dataclass
class Parts:
    """A request's texts as the model translates them: `parts`, in one go; per text, its `layout` (each break
    and blank line as a string, kept; each line with text as the index of its unit); per unit, ("part", index in
    `parts`) for a line translated whole, ("document", index in `sentences.documents`) for one cut into sentences,
    whose parts follow the whole lines'. `warnings` says what could not be kept whole."""

    parts: list[str]
    layouts: list[list[str | int]]
    units: list[tuple[str, int]]
    sentences: Plan | None = None
    owners: list[int] = field(default_factory=list)  # the text of each part
    warnings: list[str] = field(default_factory=list)

    def whole(self, text: int) -> int | None:
        """The part that text `text` is translated as, when it is one line translated whole (else None; also for
        a blank text, which has no part)."""
        layout = self.layouts[text]
        if len(layout) != 1 or not isinstance(layout[0], int):
            return None
        kind, index = self.units[layout[0]]
        return index if kind == "part" else None

    def put_back(self, translations: list[str]) -> list[str]:
        """Each text's translation, from the translations of `parts`."""
        start = len(self.parts) - (len(self.sentences.parts) if self.sentences else 0)
        cut = finish(self.sentences, translations[start:]) if self.sentences else []
        return ["".join(item if isinstance(item, str) else translations[self.units[item][1]]
                        if self.units[item][0] == "part" else cut[self.units[item][1]] for item in layout)
                for layout in self.layouts]


def plan_texts(loaded: Loaded, texts: list[str], labels: list[str]) -> Parts:
    """The parts of `texts` (each called by its label in errors and warnings, e.g. "text 2")."""
    layouts, lines, owners = [], [], []
    for i, text in enumerate(texts):
        layout: list[str | int] = []
        for k, piece in enumerate(LINE_BREAK.split(text)):
            if k % 2 or not piece.strip():
                layout.append(piece if k % 2 else "")  # a break as it was; a blank line blank, as mt translate's
            else:
                layout.append(len(lines))
                lines.append(piece)
                owners.append(i)
        layouts.append(layout)
    limit, counts = source_limit(loaded), [len(ids) for ids in loaded.src_tok.encode([s.strip() for s in lines])]
    long = [j for j, n in enumerate(counts) if n > limit]
    if long:
        try:
            splitter()
        except MtError as error:
            j = long[0]
            raise ApiError(413, f"{labels[owners[j]]}: a line of {counts[j]} pieces, longer than the model takes "
                                f"({limit}), and this server cannot cut it into sentences ({error}): send shorter "
                                f"lines") from None
    units: list[tuple[str, int]] = [("part", 0)] * len(lines)
    parts, part_owners = [], []
    for j, line in enumerate(lines):
        if counts[j] <= limit:
            units[j] = ("part", len(parts))
            parts.append(line)
            part_owners.append(owners[j])
    sentences = plan_documents(loaded, [text_document([lines[j]]) for j in long]) if long else None
    for d, j in enumerate(long):
        units[j] = ("document", d)
        part_owners += [owners[j]] * sum(s.count for unit in sentences.sentences[d] for s in unit)
    return Parts(parts + (sentences.parts if sentences else []), layouts, units, sentences, part_owners)


def owners_of(plan: Plan) -> list[int]:
    """The document of each of `plan.parts`."""
    return [d for d, doc in enumerate(plan.sentences) for unit in doc for s in unit for _ in range(s.count)]


def check_parts(loaded: Loaded, parts: list[str], owners: list[int], labels: list[str], glossary: Glossary | None,
                options: ServeOptions) -> list[str]:
    """ApiError 413 when `parts` are more than a request may ask (--max-sentences), a glossary sought in them costs
    more than GLOSSARY_WORK, or one holds more glossary terms to place than --max-sentence-terms; else the warnings
    for a part the model cannot take whole even so (a single character longer than it takes), which the encoder
    cuts."""
    if len(parts) > options.max_sentences:
        raise ApiError(413, f"the request is {len(parts):,} sentences to translate (its lines, and the sentences of "
                            f"documents and of lines longer than the model takes); the limit is "
                            f"{options.max_sentences:,} (--max-sentences): send it in several requests")
    work = len(glossary.terms) * sum(len(part) for part in parts) if glossary is not None else 0
    if work > GLOSSARY_WORK:
        raise ApiError(413, f"the glossary's {len(glossary.terms):,} terms, each sought in the request's "
                            f"{work // len(glossary.terms):,} characters, are {work:,} term-characters of work; the "
                            f"limit is {GLOSSARY_WORK:,}: send fewer terms (those the text needs) or less text")
    if glossary is not None and glossary.terms and glossary.method == "constrain":
        for part, owner in zip(parts, owners, strict=True):
            found = len(glossary.find(part))
            if found > options.max_sentence_terms:
                raise ApiError(413, f"{labels[owner]}: a sentence holds {found} of the glossary's terms; the limit is "
                                    f"{options.max_sentence_terms} a sentence (--max-sentence-terms): send fewer "
                                    f"terms, or glossary_method replace")
    limit = source_limit(loaded)
    return [f"{labels[owner]}: a part of {len(ids)} pieces was cut to the model's {limit}"
            for ids, owner in zip(loaded.src_tok.encode([p.strip() for p in parts]), owners, strict=True)
            if len(ids) > limit]
