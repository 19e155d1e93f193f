"""Parallel corpora: find them and read them as (src, tgt) text pairs.

Reading is two steps, so that a bad path fails before any slow work starts:

    source = find_source("data/train", "de", "en", split="train")    # or multi30k("train", "de", "en")
    pairs = read_pairs(source)                                        # Iterator[tuple[str, str]], streamed

A *source* is one split of one corpus, one of four small dataclasses, each with `read()` and `describe()`:

- `TextFiles`: two line-aligned files, `PREFIX.de` and `PREFIX.en` (or `PREFIX.de.gz` when the plain one is absent).
- `TsvFile`: `src<TAB>tgt` per line (`.tsv`, or `.tsv.gz`); columns are in (src, tgt) order.
- `JsonlFile`: one object per line (`.jsonl`, or `.jsonl.gz`), `{"de": ..., "en": ...}` or
  `{"translation": {"de": ..., "en": ...}}`; blank lines are skipped.
- `HfDataset`: `hf:NAME[:CONFIG[:SPLIT]]`, anything `datasets.load_dataset` opens (a hub name or a local directory),
  rows shaped like the JSONL ones; streamed. Without SPLIT, train/valid/test mean train/validation/test.

`read_pairs` yields *normalised* text (see `normalise`), never filtered: every input line becomes one pair, so
valid and test sets keep all their lines and BLEU covers the whole test set. Filtering training data is a separate,
explicit step, `mt.data.clean.clean_pairs`.

Files are decoded as UTF-8 line by line (lines end at "\\n" only, as `wc -l` counts them), so an invalid byte is
reported with its file and line. Every problem a user can fix is an `MtError` whose message is one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mt.data.lines import check_aligned, read_lines
from mt.errors import MtError

SPLITS = ("train", "valid", "test")


# ---------------------------------------------------------------------------------------------- lines and text


# Characters that some line readers (str.splitlines, text-mode universal newlines) treat as line ends. Kept inside
# a sentence, they would make a written .txt reference file have more lines than the corpus it came from.
_LINE_BREAKS = re.compile("[\r\n\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def normalise(text: str) -> str:
    """Strip surrounding whitespace and turn line-break characters inside the text into spaces."""
    return _LINE_BREAKS.sub(" ", text).strip()


# ---------------------------------------------------------------------------------------------- the four sources


@dataclass(frozen=True)
class TextFiles:
    """Two line-aligned files, one sentence per line, one file per language."""

    src_path: Path
    tgt_path: Path

    def read(self, encoding_errors: str = "strict") -> Iterator[tuple[str, str]]:
        src_lines = read_lines(self.src_path, encoding_errors)
        tgt_lines = read_lines(self.tgt_path, encoding_errors)
        n = 0
        while True:  # not zip(): when one file ends first we need both exact counts for the error
            s = next(src_lines, None)
            t = next(tgt_lines, None)
            if s is None or t is None:
                break
            n += 1
            yield s, t
        if s is not None or t is not None:
            n_src = n + (s is not None) + sum(1 for _ in src_lines)
            n_tgt = n + (t is not None) + sum(1 for _ in tgt_lines)
            check_aligned(self.src_path, n_src, self.tgt_path, n_tgt)

    def describe(self) -> dict:
        return {"format": "text", "src": str(self.src_path), "tgt": str(self.tgt_path)}


@dataclass(frozen=True)
class TsvFile:
    """One file, `src<TAB>tgt` per line."""

    path: Path

    def read(self, encoding_errors: str = "strict") -> Iterator[tuple[str, str]]:
        for lineno, line in enumerate(read_lines(self.path, encoding_errors), 1):
            fields = line.split("\t")
            if len(fields) != 2:
                raise MtError(
                    f"{self.path}:{lineno}: expected 2 tab-separated fields (src<TAB>tgt), found {len(fields)}"
                )
            yield fields[0], fields[1]

    def describe(self) -> dict:
        return {"format": "tsv", "path": str(self.path)}


@dataclass(frozen=True)
class JsonlFile:
    """One JSON object per line, keyed by language code (directly or under "translation")."""

    path: Path
    src: str
    tgt: str

    def read(self, encoding_errors: str = "strict") -> Iterator[tuple[str, str]]:
        for lineno, line in enumerate(read_lines(self.path, encoding_errors), 1):
            if not line.strip():
                continue
            where = f"{self.path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise MtError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
            yield pair_from_row(row, self.src, self.tgt, where)

    def describe(self) -> dict:
        return {"format": "jsonl", "path": str(self.path)}


@dataclass(frozen=True)
class HfDataset:
    """One split of a Hugging Face dataset, read with `datasets.load_dataset(name, config, split=split)`."""

    name: str
    config: str | None
    split: str
    src: str
    tgt: str

    def read(self, encoding_errors: str = "strict") -> Iterator[tuple[str, str]]:
        """`encoding_errors` is unused: `datasets` hands over text that is already decoded."""
        import datasets  # imported here: it is slow to import, and only this source needs it

        label = f"hf:{self.name}" + (f":{self.config}" if self.config else "") + f" split {self.split!r}"
        # load_dataset raises whatever its backends raise (FileNotFoundError, ValueError for a bad split,
        # network errors, ...); any of them means "this dataset cannot be read", said in one line.
        try:
            rows = datasets.load_dataset(self.name, self.config, split=self.split, streaming=True)
        except Exception as e:
            raise MtError(f"{label}: cannot load ({type(e).__name__}: {e})") from None
        for i, row in enumerate(rows, 1):
            yield pair_from_row(row, self.src, self.tgt, f"{label} row {i}")

    def describe(self) -> dict:
        return {"format": "hf", "name": self.name, "config": self.config, "split": self.split}


@dataclass(frozen=True)
class TableFile:
    """A Parquet or CSV file with one column per language code (Parquet may instead hold a "translation" column
    of {lang: text}), streamed through `datasets`, so a file of any size is read a batch of rows at a time.
    An empty cell (null in Parquet) is an empty side, which cleaning counts and drops."""

    path: Path
    kind: str  # "parquet" or "csv": the `datasets` builder
    src: str
    tgt: str

    def read(self, encoding_errors: str = "strict") -> Iterator[tuple[str, str]]:
        """`encoding_errors` applies to CSV; Parquet stores its text as UTF-8 already."""
        import datasets

        try:
            # CSV cells stay text: no numbers inferred from "42", no NaN for an empty cell (cleaning counts those).
            options = {"converters": {self.src: str, self.tgt: str}, "na_filter": False,
                       "encoding_errors": encoding_errors} if self.kind == "csv" else {}
            rows = datasets.load_dataset(self.kind, data_files=str(self.path), split="train", streaming=True,
                                         **options)
            for i, row in enumerate(rows, 1):
                row = {key: "" if value is None else value for key, value in row.items()}
                yield pair_from_row(row, self.src, self.tgt, f"{self.path} row {i}")
        except MtError:
            raise
        except Exception as e:  # pyarrow and pandas errors for a file that is not what its name says
            raise MtError(f"{self.path}: cannot read as {self.kind} ({type(e).__name__}: {e})") from None

    def describe(self) -> dict:
        return {"format": self.kind, "path": str(self.path)}


Source = TextFiles | TsvFile | JsonlFile | TableFile | HfDataset


def pair_from_row(row: object, src: str, tgt: str, where: str) -> tuple[str, str]:
    """(src, tgt) text from `{src: .., tgt: ..}` or `{"translation": {src: .., tgt: ..}}`."""
    if isinstance(row, dict) and isinstance(row.get("translation"), dict):
        row = row["translation"]
    if not isinstance(row, dict):
        raise MtError(
            f"{where}: expected an object with {src!r} and {tgt!r} keys, got {type(row).__name__}"
        )
    for lang in (src, tgt):
        if lang not in row:
            raise MtError(f"{where}: no {lang!r} key (keys: {', '.join(map(str, row)) or 'none'})")
        if not isinstance(row[lang], str):
            raise MtError(f"{where}: {lang!r} is {type(row[lang]).__name__}, not text")
    return row[src], row[tgt]


_HF_SPLITS = {"train": "train", "valid": "validation", "test": "test"}


def find_source(spec: str, src: str, tgt: str, split: str) -> Source:
    """Resolve a user's corpus spec for one split; fails now, not mid-read, when a file is missing.

    `spec` is `hf:NAME[:CONFIG[:SPLIT]]`, a `.tsv`/`.jsonl`/`.csv` file (optionally `.gz`), a `.parquet` file,
    or else a path prefix to which `.{src}` and `.{tgt}` are appended. `split` (train/valid/test) only matters for
    `hf:` specs.
    """
    if split not in SPLITS:
        raise MtError(f"unknown split {split!r}; splits: {', '.join(SPLITS)}")
    if spec.startswith("hf:"):
        parts = spec[3:].split(":")
        if not parts[0] or len(parts) > 3:
            raise MtError(f"{spec!r}: expected hf:NAME[:CONFIG[:SPLIT]]")
        name, config, hf_split = (parts + [None, None])[:3]
        return HfDataset(name, config or None, hf_split or _HF_SPLITS[split], src, tgt)
    path = Path(spec).expanduser()
    kind = Path(path.name.removesuffix(".gz")).suffix
    if kind in (".tsv", ".jsonl", ".csv", ".parquet"):
        if not path.is_file():
            raise MtError(f"{path}: no such file")
        if kind == ".tsv":
            return TsvFile(path)
        if kind == ".jsonl":
            return JsonlFile(path, src, tgt)
        return TableFile(path, kind[1:], src, tgt)
    return TextFiles(_language_file(path, src), _language_file(path, tgt))


def _language_file(prefix: Path, lang: str) -> Path:
    plain = prefix.with_name(f"{prefix.name}.{lang}")
    gz = prefix.with_name(f"{prefix.name}.{lang}.gz")
    for path in (plain, gz):
        if path.is_file():
            return path
    raise MtError(f"no {lang} file for corpus prefix {prefix}: neither {plain} nor {gz} exists")


def read_pairs(source: Source, encoding_errors: str = "strict") -> Iterator[tuple[str, str]]:
    """Every pair of `source`, normalised (stripped, one line each), in order; nothing is dropped."""
    for s, t in source.read(encoding_errors):
        yield normalise(s), normalise(t)


# ---------------------------------------------------------------------------------------------- named corpora

NAMED_CORPORA = ("multi30k",)
MULTI30K_LANGS = ("en", "de", "fr", "cs")
MULTI30K_FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}"
# Found from the source tree (an editable install), where data/ sits beside the package.
CHECKSUMS = Path(__file__).resolve().parents[2] / "data" / "multi30k.sha256"


def named_source(name: str, split: str, src: str, tgt: str, mirror: Path | None = None) -> Source:
    """A named corpus's split: `multi30k` is the only one."""
    if name != "multi30k":
        raise MtError(f"unknown corpus {name!r}; known corpora: {', '.join(NAMED_CORPORA)}")
    return multi30k(split, src, tgt, mirror)


def multi30k(split: str, src: str, tgt: str, mirror: Path | None = None) -> TextFiles:
    """Multi30k task 1 (raw text): train / valid (val) / test (test_2016_flickr), any two of en, de, fr, cs.

    Files come from `<mirror>/multi30k/<file>.<lang>.gz` (`mirror` or env MT_MIRROR) when there, else from the
    download cache `$MT_CACHE/multi30k` (default `~/.cache/mt/multi30k`), downloading what is missing. Every file
    is checked against `data/multi30k.sha256`, mirrored ones included: a named corpus means exactly these bytes.
    """
    for lang in (src, tgt):
        if lang not in MULTI30K_LANGS:
            raise MtError(f"multi30k has no {lang!r}; languages: {', '.join(MULTI30K_LANGS)}")
    if src == tgt:
        raise MtError(f"source and target language are both {src!r}")
    if split not in MULTI30K_FILES:
        raise MtError(f"multi30k has no split {split!r}; splits: {', '.join(MULTI30K_FILES)}")
    checksums = _read_checksums(CHECKSUMS)
    mirror_dir = mirror if mirror is not None else os.environ.get("MT_MIRROR")
    src_path, tgt_path = (
        _multi30k_file(f"{MULTI30K_FILES[split]}.{lang}.gz", checksums, mirror_dir) for lang in (src, tgt)
    )
    return TextFiles(src_path, tgt_path)


def _multi30k_file(name: str, checksums: dict[str, str], mirror_dir: str | Path | None) -> Path:
    """A verified local copy of one Multi30k file: the mirror's, else the cache's, else downloaded to the cache."""
    if name not in checksums:
        raise MtError(f"{CHECKSUMS}: no checksum for {name}")
    mirrored = Path(mirror_dir).expanduser() / "multi30k" / name if mirror_dir else None
    if mirrored is not None and mirrored.is_file():
        verify_sha256(mirrored, checksums[name])
        return mirrored
    cached = (
        Path(os.environ.get("MT_CACHE") or Path.home() / ".cache" / "mt").expanduser() / "multi30k" / name
    )
    if cached.is_file() and sha256(cached) == checksums[name]:
        return cached
    url = MULTI30K_URL.format(name=name)
    try:
        download(url, cached, checksums[name])
    except OSError as e:  # URLError, timeouts, refused connections, an unwritable cache
        looked = f"{mirrored} does not exist" if mirrored else "no mirror is set"
        raise MtError(
            f"cannot download {url} ({e}) and {looked}; without internet, put the files in "
            "<mirror>/multi30k/<file>.<lang>.gz and pass --mirror or set MT_MIRROR"
        ) from None
    return cached


def _read_checksums(path: Path) -> dict[str, str]:
    """`sha256sum` output: `<hex>  <filename>` per line -> {filename: hex}."""
    if not path.is_file():
        raise MtError(f"{path}: checksum file not found (is mt installed from its source tree?)")
    sums = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            sums[name.lstrip("*")] = digest.lower()  # "*" marks binary mode in sha256sum output
    return sums


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(path: Path, expected: str) -> None:
    actual = sha256(path)
    if actual != expected:
        raise MtError(
            f"{path}: sha256 is {actual}, expected {expected}; the file is corrupt or not the original"
        )


def download(url: str, dest: Path, expected_sha256: str) -> None:
    """Fetch `url` to `dest` through a temporary name, so `dest` exists only complete and verified.

    Raises OSError when the fetch fails and MtError when the bytes are not the expected ones.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as f:
            shutil.copyfileobj(response, f)
        actual = sha256(tmp)
        if actual != expected_sha256:
            raise MtError(f"{url}: downloaded file has sha256 {actual}, expected {expected_sha256}")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
