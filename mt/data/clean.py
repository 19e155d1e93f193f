"""Cleaning training pairs: `clean_pairs` drops the pairs not worth learning from and says why in `CleanCounts`.

Only training data is cleaned; valid and test sets keep every line, so BLEU covers the whole test set.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass
class CleanCounts:
    """What happened to the training pairs. Each dropped pair is counted once, under the first reason that applies,
    in the order of the fields; `kept` is whatever is left, so the counts always add up."""

    read: int = 0
    empty: int = 0  # either side empty after stripping
    too_long: int = 0  # more than max_words whitespace-separated words on either side
    ratio: int = 0  # longer side / shorter side, in characters, above max_ratio
    duplicates: int = 0  # the exact same (src, tgt) pair seen before
    too_many_pieces: int = 0  # more than max_pieces subword pieces on either side (counted by prepare)

    @property
    def kept(self) -> int:
        return self.read - self.empty - self.too_long - self.ratio - self.duplicates - self.too_many_pieces

    def as_dict(self) -> dict[str, int]:
        return {
            "read": self.read,
            "empty": self.empty,
            "too_long": self.too_long,
            "ratio": self.ratio,
            "duplicates": self.duplicates,
            "too_many_pieces": self.too_many_pieces,
            "kept": self.kept,
        }


def clean_pairs(
    pairs: Iterable[tuple[str, str]],
    counts: CleanCounts,
    max_words: int = 250,
    max_ratio: float = 9.0,
    dedup: bool = False,
) -> Iterator[tuple[str, str]]:
    """Yield the training pairs worth learning from, updating `counts` as it goes.

    Pairs are stripped first. The length ratio is measured in characters, not words as in Moses'
    clean-corpus-n: whitespace words mean nothing for Chinese, Japanese or Thai, where a whole sentence is one
    "word" and a word ratio would drop nearly every pair. Dedup keeps an 8-byte hash per distinct pair, not
    the text, so memory stays small on large corpora.
    """
    seen: set[int] = set()
    for s, t in pairs:
        counts.read += 1
        s, t = s.strip(), t.strip()
        if not s or not t:
            counts.empty += 1
        elif len(s.split()) > max_words or len(t.split()) > max_words:
            counts.too_long += 1
        elif max(len(s), len(t)) / min(len(s), len(t)) > max_ratio:
            counts.ratio += 1
        elif dedup and (key := _pair_hash(s, t)) in seen:
            counts.duplicates += 1
        else:
            if dedup:
                seen.add(key)
            yield s, t


def _pair_hash(s: str, t: str) -> int:
    # "\0" separates the sides so ("ab", "c") and ("a", "bc") differ. blake2b, unlike hash(), is the same in every run.
    digest = hashlib.blake2b(f"{s}\0{t}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")
