import numpy as np
import pytest

import mt.data.ids
from mt.data.ids import IdsWriter, Split
from mt.errors import MtError


def write_side(stem, sentences, vocab_size, per_write=7):
    writer = IdsWriter(stem, vocab_size)
    for start in range(0, len(sentences), per_write):
        writer.write(sentences[start:start + per_write])
    return writer.close()


def test_ids_are_written_in_blocks_that_add_up_to_the_whole(tmp_path, monkeypatch):
    # Offsets are summed a block at a time on close (bounded memory); blocks of 10 lengths force many of them.
    monkeypatch.setattr(mt.data.ids, "BLOCK_LENGTHS", 10)
    rng = np.random.default_rng(0)
    sentences = [rng.integers(4, 300, size=rng.integers(0, 9)).tolist() for _ in range(57)]
    assert write_side(tmp_path / "train.src", sentences, vocab_size=300) == (57, sum(map(len, sentences)))
    ids, offsets = np.load(tmp_path / "train.src.ids.npy"), np.load(tmp_path / "train.src.offsets.npy")
    assert ids.dtype == np.uint16 and offsets[0] == 0 and len(offsets) == 58
    assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(57)] == sentences
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.src.ids.npy", "train.src.offsets.npy"]


def test_a_split_reads_back_what_the_writers_wrote_and_a_large_vocabulary_keeps_its_ids(tmp_path):
    src = [[5, 6, 7], [], [70_000, 4]]
    tgt = [[8], [9, 10], [11, 12, 13, 14]]
    write_side(tmp_path / "valid.src", src, vocab_size=80_000)
    write_side(tmp_path / "valid.tgt", tgt, vocab_size=300)
    split = Split(tmp_path, "valid")
    assert len(split) == 3
    assert [split.src(i).tolist() for i in range(3)] == src
    assert [split.tgt(i).tolist() for i in range(3)] == tgt
    assert split.src_lens.tolist() == [3, 0, 2] and split.tgt_lens.tolist() == [1, 2, 4]


def test_missing_split_says_how_to_make_it(tmp_path):
    with pytest.raises(MtError, match="mt prepare"):
        Split(tmp_path, "train")
