"""Corpus -> SentencePiece -> token ids on disk + meta.json, written atomically.

`prepare()` produces one directory (`split` is train/valid/test, `side` is src/tgt):

    meta.json                      what was read, what was removed and why, vocabulary, per-split sizes
    spm.model                      the joint SentencePiece model (separate vocabularies: spm.src.model, spm.tgt.model)
    {split}.{side}.ids.npy, .offsets.npy   the pieces of each sentence, as `mt.data.ids` writes and reads them
    valid.{side}.txt, test.{side}.txt   normalised text, one line per input line: the references for BLEU
    train-sample{k}.{side}.ids.npy, .offsets.npy   with `subword_samples`: the training pairs again, k = 1..N,
                                   each segmented by sampling (subword regularization); training takes one per epoch

Everything is built in a sibling temporary directory and renamed into place at the end: a failure at any step
leaves an existing `out_dir` as it was.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from mt import __version__
from mt.data.clean import CleanCounts, clean_pairs
from mt.data.corpus import Source, find_source, named_source, read_pairs
from mt.data.ids import IdsWriter
from mt.data.lines import ENCODING_ERRORS, check_not_input, check_output_dir, read_lines
from mt.data.tokenizer import Tokenizer, tag, train_sentencepiece
from mt.errors import MtError

MODEL_TYPES = ("unigram", "bpe")
SIDES = ("src", "tgt")
# Lines encoded per SentencePiece call: big enough to be fast, small enough to stay in memory.
CHUNK_LINES = 10_000


@dataclass(frozen=True)
class PrepareOptions:
    """How `prepare` cleans the training pairs and builds the vocabulary; its defaults are `mt prepare`'s."""

    vocab_size: int = 8000
    joint: bool = True  # one SentencePiece model for both languages
    model_type: str = "unigram"
    spm_sentences: int = 1_000_000  # SentencePiece trains on a sample of at most this many lines (bounds memory)
    max_words: int = 250
    max_ratio: float = 9.0
    max_pieces: int = 254  # the default model's 256 positions (model.max_len) less BOS and EOS
    dedup: bool = False
    encoding_errors: str = "strict"
    # Subword regularization pays off only with long training; the one-hour recipes leave it off.
    subword_samples: int = 0
    subword_alpha: float = 0.3
    # A checkpoint or SentencePiece .model whose vocabulary to encode with, instead of training one (to fine-tune).
    tokenizer: str | None = None
    # Tags naming each target language (>>de<<), for one model of both directions (`train.two_way`).
    two_way: bool = False

    def check(self) -> None:
        """Raise `MtError` for a setting that cannot work, before any slow work starts."""
        if self.model_type not in MODEL_TYPES:
            raise MtError(f"model type must be one of {', '.join(MODEL_TYPES)}, not {self.model_type!r}")
        if self.encoding_errors not in ENCODING_ERRORS:
            raise MtError(f"encoding errors must be one of {', '.join(ENCODING_ERRORS)}, "
                          f"not {self.encoding_errors!r}")
        if self.spm_sentences < 1:
            raise MtError(f"spm_sentences={self.spm_sentences}: SentencePiece needs at least one sentence to sample")
        if self.tokenizer is not None and not Path(self.tokenizer).is_file():
            raise MtError(f"--tokenizer {self.tokenizer}: not found; give an mt checkpoint (.pt) or a SentencePiece "
                          ".model file")
        if self.subword_samples < 0 or self.subword_samples and not 0 < self.subword_alpha <= 1:
            raise MtError(f"subword samples {self.subword_samples}, alpha {self.subword_alpha}: give samples >= 0 "
                          "and 0 < alpha <= 1 (e.g. --subword-samples 8 --subword-alpha 0.3)")
        if self.two_way and not self.joint:
            raise MtError("--two-way trains one model for both directions, which needs one joint vocabulary: "
                          "drop --separate-vocab")


def prepare(
    out_dir: Path, src: str, tgt: str, corpus: str | None = None, train: str | None = None,
    valid: str | None = None, test: str | None = None, mirror: Path | None = None,
    vocab_size: int = PrepareOptions.vocab_size, joint: bool = PrepareOptions.joint,
    model_type: str = PrepareOptions.model_type, max_words: int = PrepareOptions.max_words,
    max_ratio: float = PrepareOptions.max_ratio, max_pieces: int = PrepareOptions.max_pieces,
    dedup: bool = PrepareOptions.dedup, spm_sentences: int = PrepareOptions.spm_sentences,
    encoding_errors: str = PrepareOptions.encoding_errors, subword_samples: int = PrepareOptions.subword_samples,
    subword_alpha: float = PrepareOptions.subword_alpha, tokenizer: str | Path | None = None,
    two_way: bool = PrepareOptions.two_way, progress: bool = True,
) -> dict:
    """Prepare `out_dir` for training `src` -> `tgt` and return the meta dict written to its meta.json.

    `corpus` names a corpus (`multi30k`) that supplies all three splits; `train`, `valid` and `test` are specs
    (see `mt.data.corpus.find_source`) that replace the named corpus's split, or stand alone without one. Training pairs
    are cleaned (`mt.data.clean.clean_pairs`), then those with more than `max_pieces` pieces on either side are dropped;
    valid and test pairs are only normalised, never dropped. `spm_sentences` caps the lines SentencePiece samples.
    `subword_samples` > 0 also writes that many copies of the kept training pairs, each segmented by sampling at
    smoothness `subword_alpha` (repeatably: each draw is seeded), for training to take one per epoch in turn.
    `tokenizer` (an mt checkpoint or a SentencePiece .model) gives the vocabulary instead of training one, so that
    a trained model can go on training on this data; meta.json records where it came from and its sha256.
    `two_way` adds a tag for each language to the vocabulary (`mt.data.tokenizer.tag`), for `train.two_way`.
    """
    options = PrepareOptions(vocab_size=vocab_size, joint=joint, model_type=model_type, spm_sentences=spm_sentences,
                      max_words=max_words, max_ratio=max_ratio, max_pieces=max_pieces, dedup=dedup,
                      encoding_errors=encoding_errors, subword_samples=subword_samples, subword_alpha=subword_alpha,
                      tokenizer=str(tokenizer) if tokenizer is not None else None, two_way=two_way)
    out_dir = Path(out_dir).absolute()
    if src == tgt:
        raise MtError(f"source and target language are both {src!r}")
    options.check()
    sources = resolve_sources(src, tgt, corpus, train, valid, test, mirror)
    check_not_input(out_dir, "--out", input_paths(sources, options.tokenizer))
    check_output_dir(out_dir, "--out")
    _check_replaceable(out_dir)
    tmp = out_dir.with_name(f"{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)  # a leftover from a killed run that had our pid
    tmp.mkdir(parents=True)
    try:
        meta = _build(tmp, src, tgt, corpus, sources, options, progress)
        _replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def default_out(corpus: str | None, train: str | None, src: str, tgt: str) -> Path:
    """`mt prepare`'s output directory when none is given: data/prepared/CORPUS_SRC_TGT."""
    if corpus is None and train is None:
        raise MtError("name a corpus (e.g. `mt prepare multi30k`) or give --train")
    return Path("data/prepared") / f"{corpus or Path(train).stem}_{src}_{tgt}"


def input_paths(sources: dict[str, Source], tokenizer: str | None) -> list[Path]:
    """The files and directories `prepare` reads, as meta.json records them (a `hf:` name is a path when it is a
    local directory), and the tokenizer's checkpoint."""
    described = [source.describe() for source in sources.values()]
    paths = [Path(d[key]) for d in described for key in ("src", "tgt", "path") if key in d]
    paths += [Path(d["name"]) for d in described if d["format"] == "hf" and Path(d["name"]).exists()]
    return paths + ([Path(tokenizer)] if tokenizer else [])


def resolve_sources(src: str, tgt: str, corpus: str | None, train: str | None, valid: str | None,
                    test: str | None, mirror: Path | None) -> dict[str, Source]:
    """Every split's source, resolved before any slow work, so a mistyped path fails in a second."""
    if corpus is None and train is None:
        raise MtError("no training data: name a corpus (e.g. multi30k) or give a train spec")
    sources: dict[str, Source] = {}
    for split, spec in (("train", train), ("valid", valid), ("test", test)):
        if spec is not None:
            sources[split] = find_source(spec, src, tgt, split)
        elif corpus is not None:
            sources[split] = named_source(corpus, split, src, tgt, mirror)
    return sources


def _build(tmp: Path, src: str, tgt: str, corpus: str | None, sources: dict[str, Source], options: PrepareOptions,
           progress: bool) -> dict:
    """Write the whole prepared directory into `tmp`: text, SentencePiece, ids, meta.json; returns the meta."""
    # valid/test first: they are small, so their errors show up before the long train read.
    for split in ("valid", "test"):
        if split in sources:
            pairs = read_pairs(sources[split], options.encoding_errors)
            _write_text(_bar(pairs, f"read {split}", progress), tmp, split)
    counts = CleanCounts()
    pairs = _bar(read_pairs(sources["train"], options.encoding_errors), "read train", progress)
    _write_text(clean_pairs(pairs, counts, options.max_words, options.max_ratio, options.dedup), tmp, "train")
    if counts.kept == 0:
        raise MtError(f"no training pairs left after cleaning: {counts.as_dict()}")

    model_files = _vocabulary(tmp, options, [tag(tgt), tag(src)] if options.two_way else [])
    tokenizers = {side: Tokenizer.load(tmp / model_files[side]) for side in SIDES}
    tags = {lang: tokenizers["src"].tag_id(lang) for lang in (tgt, src)} if options.two_way else {}
    splits, samples = {}, None
    for split in sources:
        train_split = split == "train"
        splits[split], sampled = _encode_split(tmp, split, tokenizers, options.max_pieces if train_split else None,
                                               counts, options.subword_samples if train_split else 0,
                                               options.subword_alpha, progress)
        samples = samples or sampled  # only the training split is sampled
    # The cleaned training text also holds pairs dropped for too many pieces; the ids are the truth.
    for side in SIDES:
        (tmp / f"train.{side}.txt").unlink()
    if counts.kept == 0:
        raise MtError(f"no training pair has at most {options.max_pieces} pieces a side: {counts.as_dict()}")
    meta = _meta(src, tgt, corpus, sources, options, tokenizers, model_files, splits, samples, counts, tags)
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return meta


def _meta(src: str, tgt: str, corpus: str | None, sources: dict[str, Source], options: PrepareOptions,
          tokenizers: dict[str, Tokenizer], model_files: dict[str, str], splits: dict, samples: dict | None,
          counts: CleanCounts, tags: dict[str, int]) -> dict:
    """meta.json: what was read, what was removed and why, the vocabulary, per-split sizes."""
    sampling = {"samples": options.subword_samples, "alpha": options.subword_alpha, **samples} if samples else None
    joint = model_files["src"] == model_files["tgt"]
    return {
        "src": src,
        "tgt": tgt,
        "joint": joint,
        "vocab_size": tokenizers["src"].vocab_size if joint else None,
        "src_vocab_size": tokenizers["src"].vocab_size,
        "tgt_vocab_size": tokenizers["tgt"].vocab_size,
        "tokenizer": {
            "model_type": None if options.tokenizer else options.model_type,  # None: the source's
            "requested_vocab_size": None if options.tokenizer else options.vocab_size,
            "spm_sentences": options.spm_sentences,
            "files": sorted(set(model_files.values())),
            "src": model_files["src"],
            "tgt": model_files["tgt"],
            "from": options.tokenizer,  # None: trained here
            "sha256": {side: hashlib.sha256(tokenizers[side].model_proto).hexdigest() for side in SIDES},
            "tags": tags,  # language -> id of its tag: the data serves a model of both directions
        },
        "splits": splits,
        "subword_sampling": sampling,
        "cleaning": counts.as_dict(),
        "filters": {"max_words": options.max_words, "max_ratio": options.max_ratio,
                    "max_pieces": options.max_pieces, "dedup": options.dedup},
        "inputs": {
            "corpus": corpus,
            "encoding_errors": options.encoding_errors,
            **{split: source.describe() for split, source in sources.items()},
        },
        "mt_version": __version__,
    }


def summary(meta: dict) -> str:
    """The few lines `mt prepare` prints: pairs per split, what cleaning removed and why, the vocabulary."""
    pair = f"{meta['src']}-{meta['tgt']}"
    kind = meta["tokenizer"]["model_type"] or f"reused (from {meta['tokenizer']['from']})"
    if meta["joint"]:
        vocab = f"joint {kind} vocabulary of {meta['vocab_size']:,} pieces"
    else:
        vocab = (f"separate {kind} vocabularies of {meta['src_vocab_size']:,} (src) and "
                 f"{meta['tgt_vocab_size']:,} (tgt) pieces")
    if tags := meta["tokenizer"].get("tags"):
        vocab += f", with tags {' '.join(tag(lang) for lang in tags)} for a model of both directions"
    lines = [f"{pair}: {vocab}"]
    for split, stats in meta["splits"].items():
        n = stats["pairs"]
        avg_src = stats["src_tokens"] / n if n else 0.0
        avg_tgt = stats["tgt_tokens"] / n if n else 0.0
        lines.append(
            f"  {split:<5} {n:>10,} pairs   tokens per sentence: src {avg_src:.1f}, tgt {avg_tgt:.1f}"
        )
    c = meta["cleaning"]
    removed = c["read"] - c["kept"]
    reasons = ", ".join(
        f"{label} {c[key]:,}"
        for key, label in [
            ("empty", "empty"),
            ("too_long", f"over {meta['filters']['max_words']} words"),
            ("ratio", f"length ratio over {meta['filters']['max_ratio']:g}"),
            ("duplicates", "duplicates"),
            ("too_many_pieces", f"over {meta['filters']['max_pieces']} pieces"),
        ]
    )
    lines.append(f"  train cleaning: read {c['read']:,}, kept {c['kept']:,}, removed {removed:,} ({reasons})")
    if sampling := meta.get("subword_sampling"):
        train = meta["splits"]["train"]
        longer = {side: sampling[f"{side}_tokens"] / (sampling["samples"] * train[f"{side}_tokens"]) - 1
                  for side in SIDES}
        lines.append(f"  train sampled {sampling['samples']} times more (alpha {sampling['alpha']:g}): "
                     f"{longer['src']:+.0%} src, {longer['tgt']:+.0%} tgt tokens per sentence")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- steps


def _check_replaceable(out_dir: Path) -> None:
    """Only an empty directory or an earlier `prepare` output may be replaced: `--out .` must not wipe a project."""
    if not out_dir.is_dir():  # absent (a file in its way is check_output_dir's to report)
        return
    if any(out_dir.iterdir()) and not (out_dir / "meta.json").is_file():
        raise MtError(
            f"{out_dir} exists and is not a prepared data directory (no meta.json); refusing to replace it"
        )


def _replace_dir(new: Path, out_dir: Path) -> None:
    # Linux cannot atomically swap two directories with rename(), so it takes two renames; in the instant between
    # them the previous output is complete under `.old-<pid>`, never half-deleted.
    if out_dir.exists():
        old = out_dir.with_name(f"{out_dir.name}.old-{os.getpid()}")
        os.rename(out_dir, old)
        os.rename(new, out_dir)
        shutil.rmtree(old)
    else:
        os.rename(new, out_dir)


def _bar(items: Iterable, desc: str, progress: bool) -> Iterable:
    return tqdm(items, desc=desc, unit=" pairs", disable=not progress or not sys.stderr.isatty())


def _write_text(pairs: Iterable[tuple[str, str]], directory: Path, split: str) -> int:
    """Write `{split}.src.txt` and `{split}.tgt.txt`, one pair per line; returns the number of pairs."""
    n = 0
    with (
        open(directory / f"{split}.src.txt", "w", encoding="utf-8", newline="\n") as src_file,
        open(directory / f"{split}.tgt.txt", "w", encoding="utf-8", newline="\n") as tgt_file,
    ):
        for s, t in pairs:
            src_file.write(s + "\n")
            tgt_file.write(t + "\n")
            n += 1
    return n


def _vocabulary(directory: Path, options: PrepareOptions, symbols: list[str]) -> dict[str, str]:
    """The SentencePiece model file of each side in `directory`: copied from `options.tokenizer`, or trained on
    the cleaned training text (with a warning when the text cannot fill the vocabulary asked for)."""
    if options.tokenizer is not None:
        return _copy_tokenizers(directory, Path(options.tokenizer))
    model_files = _train_tokenizers(directory, options.joint, options.vocab_size, options.model_type,
                                    options.spm_sentences, symbols)
    for name in sorted(set(model_files.values())):
        made = Tokenizer.load(directory / name).vocab_size
        if made < options.vocab_size:  # SentencePiece makes what the corpus supports (hard_vocab_limit off)
            print(f"warning: {name}: asked for a vocabulary of {options.vocab_size:,} pieces; the training text "
                  f"supports {made:,}, which is what was made (--vocab-size {made} says so and silences this)",
                  file=sys.stderr)
    return model_files


def _copy_tokenizers(directory: Path, source: Path) -> dict[str, str]:
    """Write the SentencePiece model(s) of `source` (an mt checkpoint, or a .model file) into `directory`."""
    if source.suffix == ".model":
        protos = {"src": source.read_bytes(), "tgt": source.read_bytes()}
    else:
        from mt.checkpoint import load  # torch: imported only for a checkpoint

        protos = load(source)["spm"]
    files = {"src": "spm.model", "tgt": "spm.model"} if protos["src"] == protos["tgt"] else \
        {side: f"spm.{side}.model" for side in SIDES}
    for side in SIDES:
        Tokenizer(protos[side])  # raises MtError for a model without mt's special ids
        (directory / files[side]).write_bytes(protos[side])
    return files


def _train_tokenizers(
    directory: Path, joint: bool, vocab_size: int, model_type: str, spm_sentences: int, symbols: list[str]
) -> dict[str, str]:
    """Train SentencePiece on the cleaned training text; returns the model file name for each side."""
    if joint:
        plan = {"spm": [directory / "train.src.txt", directory / "train.tgt.txt"]}
        files = {"src": "spm.model", "tgt": "spm.model"}
    else:
        plan = {f"spm.{side}": [directory / f"train.{side}.txt"] for side in SIDES}
        files = {side: f"spm.{side}.model" for side in SIDES}
    for prefix, paths in plan.items():
        lines = itertools.chain.from_iterable(read_lines(path) for path in paths)
        try:
            train_sentencepiece(
                lines, directory / prefix, vocab_size, model_type, seed_sentences=spm_sentences,
                user_symbols=symbols)
        except RuntimeError as e:  # SentencePiece reports bad settings (e.g. a vocabulary too small) this way
            raise MtError(f"SentencePiece training failed: {e}") from None
    return files


def _encode_split(
    directory: Path,
    split: str,
    tokenizers: dict[str, Tokenizer],
    max_pieces: int | None,
    counts: CleanCounts,
    samples: int,
    alpha: float,
    progress: bool,
) -> tuple[dict[str, int], dict[str, int] | None]:
    """Encode `{split}.{side}.txt` into ids/offsets arrays, dropping pairs over `max_pieces` (None: keep all).
    Returns the split's pairs and tokens, and the sampled copies' tokens (None without `samples`).

    With `samples`, the kept pairs are encoded that many times more by sampling at `alpha`, into
    `{split}-sample{k}`. The best segmentation decides what is kept, so
    every copy holds the same pairs in the same order.
    """
    writers = {side: IdsWriter(directory / f"{split}.{side}", tokenizers[side].vocab_size) for side in SIDES}
    sampled = [{side: IdsWriter(directory / f"{split}-sample{k}.{side}", tokenizers[side].vocab_size)
                for side in SIDES} for k in range(1, samples + 1)]
    lines = zip(
        read_lines(directory / f"{split}.src.txt"), read_lines(directory / f"{split}.tgt.txt"), strict=True
    )
    draws = itertools.count(1)  # each sampling call's seed: the copies are repeatable, and differ
    with tqdm(desc=f"encode {split}", unit=" pairs", disable=not progress or not sys.stderr.isatty()) as bar:
        while chunk := list(itertools.islice(lines, CHUNK_LINES)):
            bar.update(len(chunk))
            src_ids = tokenizers["src"].encode([s for s, _ in chunk])
            tgt_ids = tokenizers["tgt"].encode([t for _, t in chunk])
            if max_pieces is not None:
                keep = [len(s) <= max_pieces and len(t) <= max_pieces for s, t in zip(src_ids, tgt_ids, strict=True)]
                counts.too_many_pieces += keep.count(False)
                chunk, src_ids, tgt_ids = (list(itertools.compress(x, keep)) for x in (chunk, src_ids, tgt_ids))
            writers["src"].write(src_ids)
            writers["tgt"].write(tgt_ids)
            for copy in sampled:
                for i, side in enumerate(SIDES):
                    copy[side].write(tokenizers[side].encode([pair[i] for pair in chunk], alpha, next(draws)))
    n_src, src_tokens = writers["src"].close()
    _, tgt_tokens = writers["tgt"].close()
    closed = [{side: copy[side].close()[1] for side in SIDES} for copy in sampled]
    sampled_tokens = {f"{side}_tokens": sum(c[side] for c in closed) for side in SIDES} if closed else None
    return {"pairs": n_src, "src_tokens": src_tokens, "tgt_tokens": tgt_tokens}, sampled_tokens
