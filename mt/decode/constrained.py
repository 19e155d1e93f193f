"""Lexical constraints: target phrases (a glossary's terms, mt/decode/glossary.py, as piece ids) that every
translation a search finishes must hold, and the bookkeeping of dynamic beam allocation (Post & Vilar 2018) that
`constrained_beam_search` (mt/decode/constrained_search.py) steps the model with. Plain Python, no tensors: a
sentence has a few phrases and a beam a few hypotheses.

Each hypothesis carries its `Progress`: the phrases it has placed, and the one it is in the middle of. A phrase
counts once its pieces appear in a row; a hypothesis that leaves a phrase half-way loses that phrase's progress. A
phrase's words stay whole: right after its last piece, no piece that would continue the word may follow (`glued`:
"dog" must not become "dogs").
At each step a hypothesis is offered, besides the beam's best continuations, the next piece of each phrase it could
go on with; the candidates are grouped into banks by how many phrase pieces they have placed, and the beam is
shared among the banks (`bank_sizes`), so that hypotheses at every stage of meeting the constraints stay in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass
class Constraints:
    """What a search's translations must hold: per source, target phrases (lists of piece ids, in reading order;
    empty ones count for nothing), and the pieces that would continue a word (`glued`, e.g. "s" without a word
    boundary before it), which may not follow a phrase's last piece."""

    phrases: list[list[list[int]]]
    glued: frozenset[int] = field(default_factory=frozenset)

    def __bool__(self) -> bool:
        """Whether any source has a phrase."""
        return any(p for phrases in self.phrases for p in phrases)

    def select(self, indices: list[int]) -> Constraints:
        return Constraints([self.phrases[i] for i in indices], self.glued)


class Progress(NamedTuple):
    """How far a hypothesis has come: the phrases placed (a bit per phrase), the phrase it is in the middle
    of (-1: none) with how many of its pieces it has emitted, and whether its last piece ended a phrase."""

    done: int = 0
    phrase: int = -1
    at: int = 0
    closed: bool = False


class Phrases:
    """One sentence's phrases (lists of piece ids; empty ones are dropped) and the rules of meeting them."""

    def __init__(self, phrases: list[list[int]]):
        self.phrases = [list(p) for p in phrases if p]
        self.total = sum(len(p) for p in self.phrases)  # the pieces to place: the highest bank

    def advance(self, progress: Progress, token: int) -> Progress:
        """The progress after emitting `token`."""
        done, phrase, at, _ = progress
        if phrase >= 0:
            if self.phrases[phrase][at] == token:
                if at + 1 == len(self.phrases[phrase]):
                    return Progress(done | 1 << phrase, closed=True)
                return Progress(done, phrase, at + 1)
            # left half-way: the phrase's progress is lost; the token may start another
        for i, pieces in enumerate(self.phrases):
            if not done >> i & 1 and pieces[0] == token:
                return Progress(done | 1 << i, closed=True) if len(pieces) == 1 else Progress(done, i, 1)
        return Progress(done)

    def allowed(self, progress: Progress) -> set[int]:
        """The tokens that take `progress` a piece further: the next piece of the phrase under way, else the first
        piece of each phrase not yet placed."""
        done, phrase, at, _ = progress
        if phrase >= 0:
            return {self.phrases[phrase][at]}
        return {pieces[0] for i, pieces in enumerate(self.phrases) if not done >> i & 1}

    def met(self, progress: Progress) -> int:
        """Phrase pieces placed: the hypothesis's bank, 0 to `total`."""
        placed = sum(len(p) for i, p in enumerate(self.phrases) if progress.done >> i & 1)
        return placed + (progress.at if progress.phrase >= 0 else 0)

    def placed(self, progress: Progress) -> int:
        """Whole phrases placed."""
        return progress.done.bit_count()

    def complete(self, progress: Progress) -> bool:
        return progress.done == (1 << len(self.phrases)) - 1


def holds(tokens: list[int], phrases: list[list[int]]) -> bool:
    """Whether `tokens` hold each of `phrases`, its pieces in a row."""
    return all(any(tokens[i:i + len(p)] == p for i in range(len(tokens) - len(p) + 1)) for p in phrases if p)


def bank_sizes(beam: int, counts: list[int]) -> list[int]:
    """How many of the `beam` slots each bank gets, given how many candidates each has (`counts[b]`: those that
    placed b pieces): an even share, the remainder to the highest bank; a bank with fewer candidates than its share
    passes the rest one bank down (the lowest to the highest), so the slots favour hypotheses further on but none is
    left empty while a candidate waits (Post & Vilar 2018; as Sockeye allocates)."""
    banks = len(counts)
    sizes = [beam // banks] * banks
    sizes[-1] += beam - sum(sizes)
    for b in reversed(range(banks)):
        extra = sizes[b] - counts[b]
        if extra > 0:
            sizes[b] -= extra
            sizes[(b - 1) % banks] += extra
    return sizes


def allocate(candidates: list[tuple[float, int]], beam: int, banks: int) -> list[int]:
    """Which of `candidates` (score, bank) fill the beam: the best of each bank within its share (`bank_sizes`),
    then, while slots are left, the best of the rest. Returns their indices, best first."""
    order = sorted(range(len(candidates)), key=lambda i: -candidates[i][0])
    counts = [0] * banks
    for _, bank in candidates:
        counts[bank] += 1
    sizes = bank_sizes(beam, counts)
    chosen, rest = [], []
    for i in order:
        bank = candidates[i][1]
        if sizes[bank] > 0:
            sizes[bank] -= 1
            chosen.append(i)
        else:
            rest.append(i)
    chosen += rest[:beam - len(chosen)]
    return sorted(chosen, key=lambda i: -candidates[i][0])
