import itertools

import numpy as np
import pytest
import torch

from mt.config import Config
from mt.data import Split, batch_by_tokens, collate, epoch_batches, train_splits
from mt.errors import MtError
from mt.tokenizer import BOS, EOS, PAD
from mt.train import step_batches


def write_split(tmp_path, name, src_seqs, tgt_seqs):
    for side, seqs in (("src", src_seqs), ("tgt", tgt_seqs)):
        np.save(tmp_path / f"{name}.{side}.ids.npy", np.concatenate([np.asarray(s, dtype=np.uint16) for s in seqs]))
        np.save(tmp_path / f"{name}.{side}.offsets.npy", np.cumsum([0] + [len(s) for s in seqs]).astype(np.int64))
    return Split(tmp_path, name)


@pytest.mark.parametrize("max_tokens", [16, 64, 300])
def test_every_example_lands_in_exactly_one_batch_within_the_budget(max_tokens):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 40, size=1000)
    batches = batch_by_tokens(lengths, max_tokens, np.random.default_rng(1))
    seen = np.concatenate(batches)
    assert sorted(seen.tolist()) == list(range(1000))
    for b in batches:
        assert len(b) == 1 or lengths[b].max() * len(b) <= max_tokens


def test_batches_group_similar_lengths():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 60, size=5000)
    batches = batch_by_tokens(lengths, 1024, np.random.default_rng(2))
    padded = sum(lengths[b].max() * len(b) for b in batches)
    assert lengths.sum() / padded > 0.9  # under 10% padding


def test_epoch_order_is_a_function_of_seed_and_epoch(tmp_path):
    seqs = [list(range(4, 4 + n)) for n in range(1, 30)]
    split = write_split(tmp_path, "train", seqs, seqs)
    a = epoch_batches(split, 50, 64, seed=1, epoch=0)
    b = epoch_batches(split, 50, 64, seed=1, epoch=0)
    c = epoch_batches(split, 50, 64, seed=1, epoch=1)
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    assert [x.tolist() for x in a] != [x.tolist() for x in c]


def test_epochs_take_the_sampled_copies_in_turn(tmp_path):
    # Copy k's pieces are all 100 k + something: each batch tells which copy it came from.
    lengths = range(1, 13)
    write_split(tmp_path, "train", *[[[4] * n for n in lengths]] * 2)
    assert [s.name for s in train_splits(tmp_path)] == ["train"]  # no copies: the best segmentation
    for k in (1, 2, 3):
        write_split(tmp_path, f"train-sample{k}", *[[[100 * k + i for i in range(n)] for n in lengths]] * 2)
    assert [s.name for s in train_splits(tmp_path)] == ["train-sample1", "train-sample2", "train-sample3"]

    cfg = Config()
    cfg.train.max_tokens, cfg.train.accumulate = 24, 1
    copies_seen = {}
    for step in itertools.islice(step_batches(train_splits(tmp_path), cfg, 0, 0, world=1, rank=0), 40):
        copies_seen.setdefault(step.epoch, set()).update(int(b.src[0, 0]) // 100 for b in step.group)
    assert copies_seen == {epoch: {epoch % 3 + 1} for epoch in copies_seen} and len(copies_seen) > 3


def test_collate_adds_specials_and_pads_per_batch(tmp_path):
    split = write_split(tmp_path, "train", [[5, 6, 7], [8]], [[9, 10], [11, 12, 13, 14]])
    batch = collate(split, np.array([0, 1]), max_len=64)
    assert batch.src.tolist() == [[5, 6, 7, EOS], [8, EOS, PAD, PAD]]
    assert batch.tgt_in.tolist() == [[BOS, 9, 10, PAD, PAD], [BOS, 11, 12, 13, 14]]
    assert batch.tgt_out.tolist() == [[9, 10, EOS, PAD, PAD], [11, 12, 13, 14, EOS]]
    assert batch.n_tgt_tokens == 8
    assert batch.src.dtype == torch.long


def test_collate_cuts_to_the_model_length(tmp_path):
    split = write_split(tmp_path, "train", [list(range(4, 30))], [list(range(4, 30))])
    batch = collate(split, np.array([0]), max_len=10)
    assert batch.src.size(1) == 10 and batch.tgt_in.size(1) == 10


def test_missing_split_says_how_to_make_it(tmp_path):
    with pytest.raises(MtError, match="mt prepare"):
        Split(tmp_path, "train")
