import itertools

import numpy as np
import pytest
import torch

from mt.config import Config
from mt.data.batches import (
    Prefetch,
    batch_by_tokens,
    collate,
    epoch_batches,
    fit_vocab,
    step_batches,
    target_tokens,
    train_splits,
)
from mt.data.ids import Split
from mt.data.spm_proto import Piece, read_pieces, with_pieces
from mt.data.tokenizer import BOS, EOS, PAD, Tokenizer

from ..conftest import prepare_corpus


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
        copies_seen.setdefault(step.epoch, set()).update(int(b.src[0, 0]) // 100 for b in step.batches)
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


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepare_corpus(tmp_path_factory.mktemp("corpus"), n_valid=10)


def step_config(accumulate: int) -> Config:
    cfg = Config()
    cfg.model.max_len, cfg.train.max_tokens, cfg.train.accumulate = 32, 256, accumulate
    return cfg


def test_ranks_split_each_step_as_one_process_accumulates_it(prepared):
    split = Split(prepared, "train")
    one = step_batches([split], step_config(accumulate=4), 0, 0, world=1, rank=0)
    ranks = [step_batches([split], step_config(accumulate=2), 0, 0, world=2, rank=r) for r in (0, 1)]
    for _ in range(16):  # a few epochs: the steps roll over epochs at the same points
        single, *per_rank = next(one), *(next(r) for r in ranks)
        for step in per_rank:
            assert (step.epoch, step.batch, step.n_tokens) == (single.epoch, single.batch, single.n_tokens)
        # Rank r trains on the r-th, (r + 2)-th, ... of the step's batches; together, exactly the step's batches.
        assert [b.src.tolist() for b in single.batches] == [
            per_rank[i % 2].batches[i // 2].src.tolist() for i in range(4)]
        assert single.n_tokens == sum(b.n_tgt_tokens for b in single.batches)
    assert single.epoch >= 2


def test_target_tokens_are_counted_from_the_lengths_as_collate_counts_them(prepared):
    split = Split(prepared, "train")
    for max_len in (32, 6):  # 6: most targets are cut to fit
        for indices in np.array_split(np.arange(len(split)), 20):
            assert target_tokens(split.tgt_lens, indices, max_len) == collate(split, indices, max_len).n_tgt_tokens


def test_prefetch_keeps_the_order_and_raises_the_producers_error():
    def items():
        yield from range(5)
        raise ValueError("bad batch")

    prefetch = Prefetch(items(), depth=2)
    assert [prefetch.next() for _ in range(5)] == list(range(5))
    with pytest.raises(ValueError, match="bad batch"):
        prefetch.next()
    prefetch.close()


def test_lengths_rounded_to_a_multiple_change_the_shape_and_nothing_else(tmp_path):
    # Lengths 3, 5, 9 and one at the model's limit: rounded up to multiples of 8, never past max_len.
    split = write_split(tmp_path, "train", [[5] * 3, [6] * 5, [7] * 9, [8] * 40],
                        [[9] * 4, [10] * 5, [11] * 2, [12] * 7])
    for rows in ([0, 1], [2], [3]):
        plain, rounded = collate(split, np.array(rows), 16), collate(split, np.array(rows), 16, multiple=8)
        for name in ("src", "tgt_in", "tgt_out"):
            before, after = getattr(plain, name), getattr(rounded, name)
            assert after.size(1) in (8, 16) and after.size(1) >= before.size(1)
            assert torch.equal(after[:, :before.size(1)], before) and (after[:, before.size(1):] == PAD).all()
        assert rounded.n_tgt_tokens == plain.n_tgt_tokens


def test_on_a_gpu_every_training_batch_comes_in_a_few_shapes(prepared):
    """Token-budget batches bring a new (source, target) length almost every step; rounded to multiples of 8, as
    `mt train` does on a GPU (`pad_multiple`), they repeat."""
    split = Split(prepared, "train")
    cfg = step_config(accumulate=1)
    plain, rounded = set(), set()
    steps = zip(step_batches([split], cfg, 0, 0, 1, 0), step_batches([split], cfg, 0, 0, 1, 0, multiple=8),
                strict=True)
    for a, b in itertools.islice(steps, 60):
        (x,), (y,) = a.batches, b.batches
        plain.add((x.src.size(1), x.tgt_in.size(1)))
        rounded.add((y.src.size(1), y.tgt_in.size(1)))
        assert y.src.size(1) % 8 == 0 or y.src.size(1) == cfg.model.max_len
        assert y.tgt_in.size(1) % 8 == 0 or y.tgt_in.size(1) == cfg.model.max_len
        assert a.n_tokens == b.n_tokens
    assert len(rounded) < len(plain)


def test_two_sentencepiece_models_of_one_vocabulary_keep_one_shared_table(tokenizer):
    """Two files whose pieces are the same, id for id, with other scores (an imported OPUS-MT model's: `mt import`)
    are one vocabulary: the model keeps one table. Other pieces are another vocabulary: two tables."""
    pieces = read_pieces(tokenizer.model_proto)
    rescored = Tokenizer(with_pieces(tokenizer.model_proto, pieces[:4] + [Piece(p.text, p.score - 1.0, p.type)
                                                                           for p in pieces[4:]]))
    swapped = Tokenizer(with_pieces(tokenizer.model_proto, pieces[:4] + pieces[5:6] + pieces[4:5] + pieces[6:]))
    for target, shared in ((rescored, True), (swapped, False)):
        cfg = Config()
        fit_vocab(cfg, tokenizer, target, joint=False)
        assert cfg.model.share_embeddings is shared
