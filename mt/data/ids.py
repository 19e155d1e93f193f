"""The token ids on disk: `IdsWriter` writes a side of a split a chunk at a time, `Split` memory-maps a split.

Each side of a split is two flat .npy arrays:

    {split}.{side}.ids.npy       1-D, every sentence's piece ids concatenated; uint16 (int32 if vocab >= 65536)
    {split}.{side}.offsets.npy   1-D int64, n + 1 entries: sentence i is ids[offsets[i]:offsets[i + 1]]

Ids are pieces only; BOS/EOS are added where sequences are batched. Both open with `np.load(path, mmap_mode="r")`,
so a corpus of any size costs only the batches in flight.
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import numpy as np

from mt.errors import MtError

# Sentence lengths turned into offsets per read when a writer closes: a bounded block, whatever the corpus size.
BLOCK_LENGTHS = 100_000


def side_file(data_dir: str | Path, split: str, side: str, kind: str = "ids") -> Path:
    """`{split}.{side}.{kind}.npy` in data_dir, kind "ids" or "offsets"."""
    return Path(data_dir) / f"{split}.{side}.{kind}.npy"


class Split:
    """One split of a prepared corpus: sentence i is src_ids[src_off[i]:src_off[i+1]] (and likewise tgt)."""

    @staticmethod
    def exists(data_dir: str | Path, split: str) -> bool:
        return side_file(data_dir, split, "src").is_file()

    def __init__(self, data_dir: str | Path, split: str):
        missing = [p for p in (side_file(data_dir, split, "src"), side_file(data_dir, split, "tgt"))
                   if not p.is_file()]
        if missing:
            raise MtError(f"{missing[0]}: not found; run `mt prepare` to create {data_dir}")
        self.src_ids = np.load(side_file(data_dir, split, "src"), mmap_mode="r")
        self.tgt_ids = np.load(side_file(data_dir, split, "tgt"), mmap_mode="r")
        self.src_off = np.load(side_file(data_dir, split, "src", "offsets"))
        self.tgt_off = np.load(side_file(data_dir, split, "tgt", "offsets"))
        self.name = split

    def __len__(self) -> int:
        return len(self.src_off) - 1

    @property
    def src_lens(self) -> np.ndarray:
        return np.diff(self.src_off)

    @property
    def tgt_lens(self) -> np.ndarray:
        return np.diff(self.tgt_off)

    def src(self, i: int) -> np.ndarray:
        return self.src_ids[self.src_off[i]:self.src_off[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        return self.tgt_ids[self.tgt_off[i]:self.tgt_off[i + 1]]


class IdsWriter:
    """Appends sentences to `{stem}.ids.npy` / `{stem}.offsets.npy` a chunk at a time, in bounded memory.

    A .npy header states the array's length, unknown until the end, so ids and sentence lengths are appended to
    raw `.part` files, and `close()` writes the headers and copies the ids, and the lengths' running sum, behind
    them a block at a time. Nothing grows with the corpus but the files.
    """

    def __init__(self, stem: Path, vocab_size: int):
        self.stem = stem
        self.dtype = np.dtype("<u2") if vocab_size < 2**16 else np.dtype("<i4")
        self.ids_part = stem.with_name(f"{stem.name}.ids.part")
        self.lengths_part = stem.with_name(f"{stem.name}.lengths.part")
        self.ids_part.write_bytes(b"")
        self.lengths_part.write_bytes(b"")
        self.sentences = self.tokens = 0

    def write(self, sentences: list[list[int]]) -> None:
        lengths = np.fromiter((len(s) for s in sentences), dtype="<i8", count=len(sentences))
        ids = np.fromiter(itertools.chain.from_iterable(sentences), dtype=self.dtype, count=int(lengths.sum()))
        with open(self.ids_part, "ab") as f:
            f.write(ids.tobytes())
        with open(self.lengths_part, "ab") as f:
            f.write(lengths.tobytes())
        self.sentences += len(sentences)
        self.tokens += len(ids)

    def close(self) -> tuple[int, int]:
        """Write both .npy files; returns (sentences, tokens)."""
        with open(self.stem.with_name(f"{self.stem.name}.ids.npy"), "wb") as f, open(self.ids_part, "rb") as part:
            _write_header(f, self.dtype, self.tokens)
            shutil.copyfileobj(part, f)
        with (open(self.stem.with_name(f"{self.stem.name}.offsets.npy"), "wb") as f,
              open(self.lengths_part, "rb") as part):
            _write_header(f, np.dtype("<i8"), self.sentences + 1)
            total = np.zeros(1, dtype="<i8")
            f.write(total.tobytes())  # offsets[0]
            while block := part.read(8 * BLOCK_LENGTHS):
                offsets = np.frombuffer(block, dtype="<i8").cumsum() + total[0]
                f.write(offsets.tobytes())
                total[0] = offsets[-1]
        self.ids_part.unlink()
        self.lengths_part.unlink()
        return self.sentences, self.tokens


def _write_header(f, dtype: np.dtype, length: int) -> None:
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (length,)}
    np.lib.format.write_array_header_1_0(f, header)
