"""Token ids on disk → length-grouped, token-budget batches with per-batch padding → the batches of each step.

The splits `mt prepare` wrote are memory-mapped (`mt.data.ids.Split`): a corpus of any size costs only the batches
in flight.

Training takes its data a step at a time (`step_batches`): world × train.accumulate consecutive batches of the
epoch's list, rank r collating the r-th, (r + world)-th, ... of them, so the data position (epoch, batch) is one
global number, the same on every rank. `Prefetch` collates the next steps in a background thread.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from mt.config import Config
from mt.data.ids import Split
from mt.data.tokenizer import BOS, EOS, PAD, Tokenizer, same_pieces
from mt.errors import MtError


def train_splits(data_dir: str | Path, two_way: bool = False) -> list[Split | BothWays]:
    """The training data as the epochs take it in turn (epoch e: item e mod N): the copies segmented by sampling
    that `mt prepare --subword-samples N` wrote, or else the one split of best segmentations; for a two-way
    model (`train.two_way`), each read both ways with its tags."""
    data_dir = Path(data_dir)
    copies: list[Split] = []
    while Split.exists(data_dir, name := f"train-sample{len(copies) + 1}"):
        copies.append(Split(data_dir, name))
    splits = copies or [Split(data_dir, "train")]
    return [BothWays(split, tags(data_dir)) for split in splits] if two_way else splits


def valid_split(data_dir: str | Path, two_way: bool = False, right_to_left: bool = False
                ) -> Split | Tagged | RightToLeft:
    """The validation pairs as the model reads them: a two-way model's sources led by the target's tag, a
    right-to-left model's targets last piece first."""
    split = Split(data_dir, "valid")
    split = Tagged(split, tags(data_dir)[0]) if two_way else split
    return RightToLeft(split) if right_to_left else split


def tags(data_dir: str | Path) -> tuple[int, int]:
    """The ids of the target's tag and the source's, for data prepared with `mt prepare --two-way`."""
    meta = json.loads((Path(data_dir) / "meta.json").read_text(encoding="utf-8"))
    by_lang = (meta.get("tokenizer") or {}).get("tags") or {}
    if not by_lang:
        raise MtError(f"train.two_way: {data_dir} has no language tags; prepare it with `mt prepare ... --two-way`")
    return by_lang[meta["tgt"]], by_lang[meta["src"]]


def text_files(data_dir: str | Path, split: str, langs: dict | None) -> tuple[Path, Path]:
    """The (source, reference) text files of a split for a model going `langs` ({"src", "tgt"}): as prepared,
    or swapped for a two-way model's other direction."""
    src, tgt = Path(data_dir) / f"{split}.src.txt", Path(data_dir) / f"{split}.tgt.txt"
    return (tgt, src) if turned(data_dir, langs) else (src, tgt)


def turned(data_dir: str | Path, langs: dict | None) -> bool:
    """Whether a model going `langs` goes the other way from the one `data_dir` was prepared in."""
    meta_path = Path(data_dir) / "meta.json"
    if not langs or not meta_path.is_file():
        return False
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    return (langs.get("src"), langs.get("tgt")) == (meta.get("tgt"), meta.get("src"))


class BothWays:
    """A split read both ways, as a `Split`: its pairs as written, then each with source and target swapped, every
    source led by the tag of the language it goes to (`tags`: the target's, the source's)."""

    def __init__(self, split: Split, tags: tuple[int, int]):
        self.split, self.n, self.name = split, len(split), f"{split.name}, both ways"
        self.lead = [np.array([tag], dtype=split.src_ids.dtype) for tag in tags]

    def __len__(self) -> int:
        return 2 * self.n

    @property
    def src_lens(self) -> np.ndarray:
        return np.concatenate([self.split.src_lens, self.split.tgt_lens]) + 1

    @property
    def tgt_lens(self) -> np.ndarray:
        return np.concatenate([self.split.tgt_lens, self.split.src_lens])

    def src(self, i: int) -> np.ndarray:
        ids = self.split.src(i) if i < self.n else self.split.tgt(i - self.n)
        return np.concatenate((self.lead[int(i >= self.n)], ids))

    def tgt(self, i: int) -> np.ndarray:
        return self.split.tgt(i) if i < self.n else self.split.src(i - self.n)


class Tagged:
    """A split, as a `Split`, whose every source is led by `tag`: a two-way model's data read one way."""

    def __init__(self, split: Split, tag: int):
        self.split, self.name, self.lead = split, split.name, np.array([tag], dtype=split.src_ids.dtype)
        self.tgt_lens, self.tgt = split.tgt_lens, split.tgt

    def __len__(self) -> int:
        return len(self.split)

    @property
    def src_lens(self) -> np.ndarray:
        return self.split.src_lens + 1

    def src(self, i: int) -> np.ndarray:
        return np.concatenate((self.lead, self.split.src(i)))


class RightToLeft:
    """A split, as a `Split`, whose every target is read last piece first: a right-to-left model's data."""

    def __init__(self, split: Split | BothWays | Tagged):
        self.split, self.name = split, split.name
        self.src, self.src_lens, self.tgt_lens = split.src, split.src_lens, split.tgt_lens

    def __len__(self) -> int:
        return len(self.split)

    def tgt(self, i: int) -> np.ndarray:
        return self.split.tgt(i)[::-1]


def epoch_split(splits: list[Split | BothWays], epoch: int, right_to_left: bool = False
                ) -> Split | BothWays | RightToLeft:
    """The one of `train_splits` that epoch `epoch` reads, its targets last piece first for a right-to-left
    model."""
    split = splits[epoch % len(splits)]
    return RightToLeft(split) if right_to_left else split


def load_tokenizers(data_dir: Path) -> tuple[Tokenizer, Tokenizer, dict]:
    """The source and target SentencePiece models of prepared data (one model twice when joint), and meta.json."""
    meta_path = data_dir / "meta.json"
    if not meta_path.is_file():
        raise MtError(f"{meta_path}: not found; run `mt prepare ... --out {data_dir}` first, or set `data:`")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("joint", True):
        tok = Tokenizer.load(data_dir / "spm.model")
        return tok, tok, meta
    return Tokenizer.load(data_dir / "spm.src.model"), Tokenizer.load(data_dir / "spm.tgt.model"), meta


def fit_vocab(cfg: Config, src_tok: Tokenizer, tgt_tok: Tokenizer, joint: bool) -> None:
    """Size the model's tables to the data; a config that already names other sizes is an error."""
    model_cfg = cfg.model
    for key, have in (("src_vocab_size", src_tok.vocab_size), ("tgt_vocab_size", tgt_tok.vocab_size)):
        want = getattr(model_cfg, key)
        if want and want != have:
            raise MtError(f"model.{key}={want} but the data in {cfg.data} has a vocabulary of {have}; "
                          f"remove model.{key} (it is taken from the data) or prepare the data again")
        setattr(model_cfg, key, have)
    # Separate vocabularies cannot share one table; two SentencePiece models of one vocabulary can (the same pieces,
    # id for id, segmented each its own way: an imported OPUS-MT model's, `mt import`).
    if model_cfg.share_embeddings and not (joint or same_pieces(src_tok, tgt_tok)):
        model_cfg.share_embeddings = False
    if cfg.train.two_way and not joint:
        raise MtError(f"train.two_way: one model for both directions needs one joint vocabulary: prepare {cfg.data} "
                      "with --two-way and without --separate-vocab")
    if cfg.train.two_way:
        tags(cfg.data)  # raises, saying how to prepare the data, where it has none


def batch_by_tokens(lengths: np.ndarray, max_tokens: int, rng: np.random.Generator | None = None) -> list[np.ndarray]:
    """Group example indices into batches of similar length whose padded size stays within `max_tokens`.

    `lengths[i]` is example i's padded cost per row (e.g. max(source, target) with specials). Examples are
    sorted by length (ties broken at random when `rng` is given) and cut greedily, so each batch pads little;
    with `rng` the batch order is shuffled too. An example longer than the budget gets a batch of its own.
    """
    lengths = np.asarray(lengths)
    tiebreak = rng.permutation(len(lengths)) if rng is not None else np.arange(len(lengths))
    order = tiebreak[np.argsort(lengths[tiebreak], kind="stable")]
    batches, start, longest = [], 0, 0
    for pos, i in enumerate(order):
        longest_with_i = max(longest, int(lengths[i]))
        if pos > start and longest_with_i * (pos - start + 1) > max_tokens:
            batches.append(order[start:pos])
            start, longest_with_i = pos, int(lengths[i])
        longest = longest_with_i
    if start < len(order):
        batches.append(order[start:])
    if rng is not None:
        rng.shuffle(batches)
    return batches


def pad(seqs: list[np.ndarray | list[int]], prefix: list[int], suffix: list[int], multiple: int = 1,
        limit: int | None = None) -> Tensor:
    """Right-pad sequences (with BOS/EOS added as asked) into one (B, T) int64 tensor, T rounded up to a multiple of
    `multiple` but not past `limit`."""
    width = rounded(max(len(s) for s in seqs) + len(prefix) + len(suffix), multiple, limit)
    out = torch.full((len(seqs), width), PAD, dtype=torch.long)
    for row, s in enumerate(seqs):
        full = prefix + [int(t) for t in s] + suffix
        out[row, :len(full)] = torch.tensor(full, dtype=torch.long)
    return out


def rounded(width: int, multiple: int, limit: int | None) -> int:
    """`width` rounded up to a multiple of `multiple`, but not past `limit` (nor below `width`)."""
    return max(width, min(-(-width // multiple) * multiple, limit if limit is not None else width + multiple))


@dataclass
class Batch:
    src: Tensor  # (B, S): pieces + EOS, right-padded
    tgt_in: Tensor  # (B, T): BOS + pieces, the decoder's input
    tgt_out: Tensor  # (B, T): pieces + EOS, what it must predict
    n_tgt_tokens: int  # non-padding tokens in tgt_out: the loss is normalised by them

    def to(self, device: torch.device) -> Batch:
        nb = device.type == "cuda"
        return Batch(self.src.to(device, non_blocking=nb), self.tgt_in.to(device, non_blocking=nb),
                     self.tgt_out.to(device, non_blocking=nb), self.n_tgt_tokens)


def collate(split: Split, indices: np.ndarray, max_len: int, multiple: int = 1) -> Batch:
    """Build a padded batch. Sequences are cut to fit `max_len` positions including their BOS/EOS; the lengths of
    source and target are rounded up to a multiple of `multiple` (within `max_len`)."""
    srcs = [split.src(i)[:max_len - 1] for i in indices]
    tgts = [split.tgt(i)[:max_len - 1] for i in indices]
    tgt_in, tgt_out = shift_targets(tgts, multiple, max_len)
    return Batch(pad(srcs, [], [EOS], multiple, max_len), tgt_in, tgt_out, int((tgt_out != PAD).sum()))


def shift_targets(tgts: list[np.ndarray | list[int]], multiple: int = 1, limit: int | None = None
                  ) -> tuple[Tensor, Tensor]:
    """Teacher forcing: the decoder reads BOS + pieces and must predict pieces + EOS; both (B, T), right-padded,
    T rounded up to a multiple of `multiple` (within `limit`)."""
    # BOS ... EOS, one column more than the decoder reads: its input drops the last column, its output the first
    width = rounded(max(len(t) for t in tgts) + 1, multiple, limit) + 1
    tgt = pad(tgts, [BOS], [EOS])
    if width > tgt.size(1):  # rounded up: padding columns (no copy where nothing is added, as on a CPU)
        tgt = torch.nn.functional.pad(tgt, (0, width - tgt.size(1)), value=PAD)
    tgt_in, tgt_out = tgt[:, :-1].clone(), tgt[:, 1:].clone()
    tgt_in[tgt_in == EOS] = PAD  # the EOS of shorter rows is not an input
    return tgt_in, tgt_out


def epoch_batches(split: Split, max_tokens: int, max_len: int, seed: int, epoch: int) -> list[np.ndarray]:
    """The batches of one training epoch: a pure function of (seed, epoch), so a resumed run sees the same."""
    cost = np.minimum(np.maximum(split.src_lens + 1, split.tgt_lens + 1), max_len)
    return batch_by_tokens(cost, max_tokens, np.random.default_rng([seed, epoch]))


@dataclass
class StepBatches:
    """One optimizer step's data as one rank sees it."""

    epoch: int
    batch: int  # the step's first batch in the epoch's list: the data position while the step trains
    batches: list[Batch]  # this rank's micro-batches, on the host
    n_tokens: int  # target tokens of the whole step, all ranks' batches: the loss is normalised by them


def step_batches(splits: list[Split], cfg: Config, epoch: int, batch: int, world: int, rank: int,
                 multiple: int = 1) -> Iterator[StepBatches]:
    """The steps from batch `batch` of epoch `epoch` on, forever, each epoch from its `epoch_split`. Each step takes
    world × accumulate consecutive batches of the epoch's list, and rank r collates the r-th, (r + world)-th, ... of
    them, their lengths rounded up to a multiple of `multiple`. An epoch's tail too short for a whole step is left
    out (the next epoch's shuffle brings it back)."""
    train_cfg, max_len = cfg.train, cfg.model.max_len
    per_step = world * train_cfg.accumulate
    while True:
        split = epoch_split(splits, epoch, cfg.model.right_to_left)
        tgt_lens = split.tgt_lens  # a property that computes them: once an epoch, not once a batch
        batches = epoch_batches(split, train_cfg.max_tokens, max_len, train_cfg.seed, epoch)
        if len(batches) < per_step:
            raise MtError(f"an epoch has {len(batches)} batches, fewer than the {per_step} of one step "
                          f"({world} processes × train.accumulate={train_cfg.accumulate}); lower "
                          f"train.max_tokens or train.accumulate")
        while batch + per_step <= len(batches):
            mine = batches[batch + rank:batch + per_step:world]
            n_tokens = sum(target_tokens(tgt_lens, batches[i], max_len) for i in range(batch, batch + per_step))
            yield StepBatches(epoch, batch, [collate(split, idx, max_len, multiple) for idx in mine], n_tokens)
            batch += per_step
        epoch, batch = epoch + 1, 0


def target_tokens(tgt_lens: np.ndarray, indices: np.ndarray, max_len: int) -> int:
    """`collate(split, indices, max_len).n_tgt_tokens` without collating: each target's pieces, cut to fit
    `max_len`, plus its EOS. Every rank counts the whole step's tokens this way, with no communication."""
    return int(np.minimum(tgt_lens[indices], max_len - 1).sum()) + len(indices)


def epoch_tokens(splits: list[Split | BothWays], max_len: int) -> int:
    """The target tokens of an epoch (of the first of `splits`, as `target_tokens` counts them)."""
    tgt_lens = splits[0].tgt_lens
    return target_tokens(tgt_lens, np.arange(len(tgt_lens)), max_len)


def pinned(step: StepBatches) -> StepBatches:
    """The step's batches in pinned host memory, from which the copy to the GPU runs asynchronously."""
    batches = [Batch(b.src.pin_memory(), b.tgt_in.pin_memory(), b.tgt_out.pin_memory(), b.n_tgt_tokens)
               for b in step.batches]
    return StepBatches(step.epoch, step.batch, batches, step.n_tokens)


class Prefetch:
    """Draws from `items` in a background thread, at most `depth` items ahead of `next()`, so collating the next
    steps' batches overlaps the current step's compute. Order is unchanged; an error in the thread is raised by
    the `next()` that would have returned the item."""

    def __init__(self, items: Iterator, depth: int):
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self.fill, args=(items,), name="mt-prefetch", daemon=True)
        self.thread.start()

    def fill(self, items: Iterator) -> None:
        try:
            for item in items:
                if not self.put((item, None)):
                    return
        except Exception as e:  # handed to the consumer, who raises it
            self.put((None, e))

    def put(self, entry: tuple) -> bool:
        while not self.closed.is_set():
            try:
                self.queue.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def next(self):
        item, error = self.queue.get()
        if error is not None:
            raise error
        return item

    def close(self) -> None:
        self.closed.set()
        self.thread.join(timeout=10)  # a daemon thread: should it still be collating, it does not hold up exit
