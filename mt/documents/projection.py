"""Where inline formatting goes in a sentence's translation: tag projection, as translation tools place inline
markup without alignments from the model.

A sentence's runs come in groups (runs.py): its dominant formatting (a group possibly of no run), a span of
another (a bold word, a link's text), the dominant, ..., the dominant; each span is also translated on its own.
`find` looks for each span's stretch in the sentence's translation, in the runs' order, each after the one
before, case-insensitive and on word boundaries: its own translation (less a stop the model added to the
fragment), else its source text (a name, a number kept as it was). `cut` gives each found span exactly its
stretch, and shares the rest, by words, among the groups between two found stretches (or an edge), in proportion
to the letters each had in the sentence: placed where they stood, since nothing says better; a span not found
gets a word first, then the dominant runs. So that no formatting the sentence had letters in is dropped, a found
stretch is let go, and placed by position like the rest, where the words between two found ones are too few for
the spans not found there (the model put them in another order), or where a formatting would get no word. The
spaces between two pieces go on the side where the source had them.
"""

from __future__ import annotations

import itertools
import re

WORD = re.compile(r"\S*\w\S*")  # a piece of translation starts at a word: a stop alone goes with the one before
ADDED_STOPS = ".,;:!?…"  # what a model adds at the end of a fragment it translates as if a sentence


def find(translation: str, needles: list[list[str]]) -> list[tuple[int, int] | None]:
    """Where in `translation` each span's stretch is, in order: the first of its `needles` found after the stretch
    of the span before; None for a span none of whose needles is found there."""
    found: list[tuple[int, int] | None] = []
    pos = 0
    for candidates in needles:
        hit = None
        for needle in candidates:
            words = needle.strip().rstrip(ADDED_STOPS).split()
            if words and (match := stretch(words).search(translation, pos)):
                hit = match.span()
                break
        found.append(hit)
        pos = hit[1] if hit else pos
    return found


def stretch(words: list[str]) -> re.Pattern:
    """`words` with any whitespace between them, not inside a longer word, in any case."""
    return re.compile(r"(?<!\w)" + r"\s+".join(map(re.escape, words)) + r"(?!\w)", re.IGNORECASE)


def cut(translation: str, found: list[tuple[int, int] | None], sources: list[str], kinds: list[object]) -> list[str]:
    """`translation` cut into a piece per group (`sources`, each group's text in the sentence: dominant, span, ...,
    dominant; `kinds`, the formatting each one's piece gets, None where a neighbour takes it; `found`, each span's
    stretch or None), the rule above; the pieces, joined, are `translation`. Where a formatting the sentence had
    letters in would get no word, found stretches are let go, the first first, until none would (at the last,
    every group placed by position)."""
    found = list(found)
    while (let_go := crowding(translation, found)) is not None:
        found[let_go] = None
    while True:
        pieces = spaced(by_position(translation, found, sources), sources)
        needed = {kind for source, kind in zip(sources, kinds, strict=True) if any(map(str.isalpha, source))}
        held = {kind for piece, kind in zip(pieces, kinds, strict=True) if any(map(str.isalnum, piece))}
        if needed - {None} <= held or not any(found):
            return pieces
        found[next(j for j, f in enumerate(found) if f)] = None


def by_position(translation: str, found: list[tuple[int, int] | None], sources: list[str]) -> list[str]:
    """The pieces: each found span its stretch, the rest shared by position (`share`)."""
    letters = [sum(map(str.isalpha, source)) for source in sources]
    end = len(translation)
    positions, first = [0], 0
    for j, (start, stop) in [*((j, f) for j, f in enumerate(found) if f), (len(found), (end, end))]:
        spans = [g % 2 == 1 for g in range(first, 2 * j + 1)]  # between found stretches: spans not found
        positions += share(translation, positions[-1], start, letters[first:2 * j + 1], spans)[1:]
        if j < len(found):
            positions.append(stop)
        first = 2 * j + 2
    return [translation[a:b] for a, b in itertools.pairwise(positions)]


def spaced(pieces: list[str], sources: list[str]) -> list[str]:
    """`pieces` with the spaces between two of them on the side their groups' `sources` had them (`SEE ` before a
    link, not ` THE SITE`), where they had any."""
    pieces = list(pieces)
    for k in range(len(pieces) - 1):
        left, right = pieces[k].rstrip(), pieces[k + 1].lstrip()
        space = pieces[k][len(left):] + pieces[k + 1][:len(pieces[k + 1]) - len(right)]
        if space and sources[k][-1:].isspace():
            pieces[k], pieces[k + 1] = left + space, right
        elif space and sources[k + 1][:1].isspace():
            pieces[k], pieces[k + 1] = left, space + right
    return pieces


def crowding(translation: str, found: list[tuple[int, int] | None]) -> int | None:
    """The found span to let go: the one before a stretch of `translation` with fewer words than the spans not
    found there need (else the one after it); None when each stretch has words enough, or none is left."""
    pos, waiting, last = 0, 0, None
    for j, f in enumerate([*found, (len(translation), len(translation))]):
        if f is None:
            waiting += 1
            continue
        if waiting > len(WORD.findall(translation, pos, f[0])):
            return last if last is not None else j if j < len(found) else None
        pos, waiting, last = f[1], 0, j
    return None


def share(translation: str, start: int, end: int, letters: list[int], spans: list[bool]) -> list[int]:
    """Where translation[start:end] is cut into len(letters) pieces: at the starts of words, each piece's words in
    proportion to its `letters`; each of the `spans` given a word (the later first, where there are too few), then
    the others with letters, most letters first, while words remain."""
    words = [m.start() for m in WORD.finditer(translation, start, end)]
    n, total = len(words), sum(letters) or 1
    wanted = [int(span) for span in spans]
    others = sorted((i for i, span in enumerate(spans) if letters[i] and not span), key=lambda i: -letters[i])
    for i in others[:max(n - sum(wanted), 0)]:
        wanted[i] = 1
    cuts = [0]
    for i, share_end in enumerate(itertools.accumulate(letters)):
        room = max(n - sum(wanted[i + 1:]), cuts[-1])  # the later pieces wanted keep a word each
        cuts.append(min(max(int(n * share_end / total + 0.5), cuts[-1] + wanted[i]), room))
    return [start, *(start if c == 0 else end if c == n else words[c] for c in cuts[1:-1]), end]
