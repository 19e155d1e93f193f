import gzip
import json
import shutil
from pathlib import Path

import pytest

from mt.data import corpus
from mt.data.corpus import (
    HfDataset,
    JsonlFile,
    TableFile,
    TextFiles,
    TsvFile,
    find_source,
    multi30k,
    named_source,
    normalise,
    read_pairs,
)
from mt.errors import MtError

DATA = Path(__file__).parents[3] / "shared/data"
MULTI30K = DATA / "multi30k"
needs_multi30k = pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"no Multi30k mirror at {MULTI30K}")


def write(path: Path, data: str | bytes) -> Path:
    raw = data.encode() if isinstance(data, str) else data
    if path.suffix == ".gz":
        raw = gzip.compress(raw)
    path.write_bytes(raw)
    return path


def read(spec: str, split: str = "train", **kwargs) -> list[tuple[str, str]]:
    return list(read_pairs(find_source(spec, "de", "en", split), **kwargs))


# ---------------------------------------------------------------------------------------------- formats


def test_prefix_reads_plain_and_gz_files(tmp_path):
    write(tmp_path / "c.de", "Hallo Welt\nGuten Tag\n")
    write(tmp_path / "c.en.gz", "Hello world\nGood day\n")
    source = find_source(str(tmp_path / "c"), "de", "en", "train")
    assert source == TextFiles(tmp_path / "c.de", tmp_path / "c.en.gz")
    assert list(read_pairs(source)) == [("Hallo Welt", "Hello world"), ("Guten Tag", "Good day")]


def test_prefix_prefers_the_plain_file_over_gz(tmp_path):
    write(tmp_path / "c.de", "plain\n")
    write(tmp_path / "c.de.gz", "gzipped\n")
    write(tmp_path / "c.en", "x\n")
    assert read(str(tmp_path / "c")) == [("plain", "x")]


def test_tsv(tmp_path):
    path = write(tmp_path / "c.tsv", "Hallo\tHello\n  Tag \t Day\n")
    assert find_source(str(path), "de", "en", "train") == TsvFile(path)
    assert read(str(path)) == [("Hallo", "Hello"), ("Tag", "Day")]


def test_tsv_gz(tmp_path):
    path = write(tmp_path / "c.tsv.gz", "Hallo\tHello\n")
    assert read(str(path)) == [("Hallo", "Hello")]


@pytest.mark.parametrize("bad_line", ["no tab here", "one\ttwo\tthree"])
def test_tsv_line_without_exactly_one_tab_names_file_and_line(tmp_path, bad_line):
    path = write(tmp_path / "c.tsv", f"a\tb\n{bad_line}\n")
    with pytest.raises(MtError, match=rf"{path}:2: expected 2 tab-separated fields"):
        read(str(path))


def test_jsonl_both_shapes_and_blank_lines(tmp_path):
    rows = [
        json.dumps({"de": "Hallo", "en": "Hello", "id": 1}),
        "",
        json.dumps({"translation": {"en": "Day", "de": "Tag"}}),
    ]
    path = write(tmp_path / "c.jsonl", "\n".join(rows) + "\n")
    assert find_source(str(path), "de", "en", "train") == JsonlFile(path, "de", "en")
    assert read(str(path)) == [("Hallo", "Hello"), ("Tag", "Day")]


def test_jsonl_errors_name_file_and_line(tmp_path):
    path = write(tmp_path / "c.jsonl", '{"de": "a", "en": "b"}\n{"de": "a", "fr": "b"}\n')
    with pytest.raises(MtError, match=rf"{path}:2: no 'en' key"):
        read(str(path))
    write(path, '{"de": "a", "en": "b"}\n{"de": "a", \n')
    with pytest.raises(MtError, match=rf"{path}:2: invalid JSON"):
        read(str(path))
    write(path, '{"de": "a", "en": null}\n')
    with pytest.raises(MtError, match=rf"{path}:1: 'en' is NoneType"):
        read(str(path))


def test_hf_dataset_from_a_local_directory(tmp_path, monkeypatch):
    # Real `datasets.load_dataset` on a local data directory, so no network; the env vars keep it offline and out
    # of ~/.cache when datasets is first imported here.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    data = tmp_path / "ds"
    data.mkdir()
    write(data / "train.jsonl", json.dumps({"translation": {"de": "Hallo", "en": "Hello"}}) + "\n")
    write(data / "validation.jsonl", json.dumps({"translation": {"de": " Tag\n", "en": "Day"}}) + "\n")

    source = find_source(f"hf:{data}", "de", "en", "valid")
    assert source == HfDataset(str(data), None, "validation", "de", "en")
    assert list(read_pairs(source)) == [("Tag", "Day")]
    assert read(f"hf:{data}::train", split="test") == [("Hallo", "Hello")]  # an explicit split wins
    with pytest.raises(MtError, match="split 'test'.*cannot load"):
        read(f"hf:{data}", split="test")
    with pytest.raises(MtError, match="no 'fr' key"):
        list(read_pairs(find_source(f"hf:{data}", "de", "fr", "train")))


def test_parquet_and_csv_are_streamed_through_datasets(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    pq.write_table(pa.table({"de": ["Hallo", " Welt ", None], "en": ["Hello", "World", "null"]}),
                   tmp_path / "c.parquet")
    assert read(str(tmp_path / "c.parquet")) == [("Hallo", "Hello"), ("Welt", "World"), ("", "null")]
    write(tmp_path / "c.csv", 'en,de\nHello,Hallo\n"Yes, world",Ja\n42,42\n,leer\n')
    assert find_source(str(tmp_path / "c.csv"), "de", "en", "train") == TableFile(tmp_path / "c.csv", "csv",
                                                                                  "de", "en")
    assert read(str(tmp_path / "c.csv")) == [("Hallo", "Hello"), ("Ja", "Yes, world"), ("42", "42"), ("leer", "")]
    with pytest.raises(MtError, match=r"c.csv row 1: no 'fr' key"):
        list(read_pairs(find_source(str(tmp_path / "c.csv"), "de", "fr", "train")))
    write(tmp_path / "bad.parquet", "not parquet\n")
    with pytest.raises(MtError, match=r"bad.parquet: cannot read as parquet"):
        read(str(tmp_path / "bad.parquet"))


# ---------------------------------------------------------------------------------------------- robustness


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path):
    de = write(tmp_path / "c.de", "a\nb\nc\n")
    en = write(tmp_path / "c.en", "x\ny\n")
    with pytest.raises(MtError) as error:
        read(str(tmp_path / "c"))
    assert str(error.value).startswith(f"{de} has 3 lines but {en} has 2")
    write(de, "a\n")
    with pytest.raises(MtError, match=f"{de} has 1 lines but {en} has 2"):
        read(str(tmp_path / "c"))


def test_missing_files_are_named(tmp_path):
    write(tmp_path / "c.de", "a\n")
    with pytest.raises(
        MtError, match=rf"no en file for corpus prefix .*{tmp_path / 'c.en'} nor {tmp_path / 'c.en.gz'}"
    ):
        find_source(str(tmp_path / "c"), "de", "en", "train")
    with pytest.raises(MtError, match=rf"{tmp_path / 'nope.tsv'}: no such file"):
        find_source(str(tmp_path / "nope.tsv"), "de", "en", "train")


def test_empty_file_is_an_error(tmp_path):
    write(tmp_path / "c.de", "")
    write(tmp_path / "c.en.gz", "x\n")
    with pytest.raises(MtError, match=rf"{tmp_path / 'c.de'}: file is empty"):
        read(str(tmp_path / "c"))
    write(tmp_path / "d.tsv.gz", "")
    with pytest.raises(MtError, match="file is empty"):
        read(str(tmp_path / "d.tsv.gz"))


def test_invalid_utf8_names_file_and_line_and_replace_works(tmp_path):
    de = write(tmp_path / "c.de", b"gut\nschl\xff\xfecht\n")
    write(tmp_path / "c.en", "good\nbad\n")
    with pytest.raises(MtError, match=rf"{de}:2: invalid UTF-8 .*--encoding-errors replace"):
        read(str(tmp_path / "c"))
    assert read(str(tmp_path / "c"), encoding_errors="replace") == [
        ("gut", "good"),
        ("schl\ufffd\ufffdcht", "bad"),
    ]
    assert read(str(tmp_path / "c"), encoding_errors="ignore")[1] == ("schlcht", "bad")


def test_crlf_and_bom_are_handled_silently(tmp_path):
    write(tmp_path / "c.de", b"\xef\xbb\xbfHallo\r\nWelt\r\n")
    write(tmp_path / "c.en.gz", b"\xef\xbb\xbfHello\r\nWorld")  # no final newline either
    assert read(str(tmp_path / "c")) == [("Hallo", "Hello"), ("Welt", "World")]
    write(tmp_path / "c.tsv", b"\xef\xbb\xbfHallo\tHello\r\n")
    assert read(str(tmp_path / "c.tsv")) == [("Hallo", "Hello")]
    write(tmp_path / "c.jsonl", b'\xef\xbb\xbf{"de": "Hallo", "en": "Hello"}\r\n')
    assert read(str(tmp_path / "c.jsonl")) == [("Hallo", "Hello")]


def test_lone_carriage_returns_do_not_split_lines(tmp_path):
    # Lines end at "\n" only (as `wc -l` counts), so a stray "\r" or U+2028 cannot misalign the two sides.
    write(tmp_path / "c.de", "ein\rzwei\u2028drei\nvier\n")
    write(tmp_path / "c.en", "one\ntwo\n")
    assert read(str(tmp_path / "c")) == [("ein zwei drei", "one"), ("vier", "two")]


def test_normalise():
    assert normalise("  a\tb \u2029c\x85 \n") == "a\tb  c"
    assert normalise("\n\r ") == ""


def test_read_pairs_keeps_empty_lines(tmp_path):
    write(tmp_path / "c.de", "a\n\n   \nd\n")
    write(tmp_path / "c.en", "w\nx\ny\n\n")
    assert read(str(tmp_path / "c"), split="test") == [("a", "w"), ("", "x"), ("", "y"), ("d", "")]


# ---------------------------------------------------------------------------------------------- multi30k


def test_unknown_corpus_and_language():
    with pytest.raises(MtError, match="unknown corpus 'wmt99'; known corpora: multi30k"):
        named_source("wmt99", "train", "de", "en")
    with pytest.raises(MtError, match="multi30k has no 'ja'"):
        multi30k("train", "ja", "en")


@needs_multi30k
def test_multi30k_from_the_mirror(monkeypatch, tmp_path):
    monkeypatch.setenv("MT_CACHE", str(tmp_path / "cache"))  # must not be touched
    source = named_source("multi30k", "test", "fr", "cs", mirror=DATA)
    assert source == TextFiles(MULTI30K / "test_2016_flickr.fr.gz", MULTI30K / "test_2016_flickr.cs.gz")
    assert len(list(read_pairs(source))) == 1000
    monkeypatch.setenv("MT_MIRROR", str(DATA))  # the environment variable works as well
    assert multi30k("valid", "de", "en") == TextFiles(MULTI30K / "val.de.gz", MULTI30K / "val.en.gz")
    assert not (tmp_path / "cache").exists()


def tampered_copy(directory: Path, name: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for lang in ("de", "en"):
        shutil.copy(MULTI30K / f"val.{lang}.gz", directory / f"val.{lang}.gz")
    with open(directory / name, "ab") as f:
        f.write(b"\0")


@needs_multi30k
def test_checksum_catches_a_tampered_mirror_file(tmp_path):
    tampered_copy(tmp_path / "mirror/multi30k", "val.en.gz")
    with pytest.raises(MtError, match=r"val\.en\.gz: sha256 is [0-9a-f]{64}, expected 14f7d25d"):
        multi30k("valid", "de", "en", mirror=tmp_path / "mirror")


@needs_multi30k
def test_download_goes_to_the_cache_verified(tmp_path, monkeypatch):
    # The real download code path, offline: urllib reads file:// URLs as it reads https:// ones.
    monkeypatch.delenv("MT_MIRROR", raising=False)
    monkeypatch.setenv("MT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(corpus, "MULTI30K_URL", f"file://{MULTI30K}/{{name}}")
    cache = tmp_path / "cache/multi30k"
    assert multi30k("valid", "de", "en") == TextFiles(cache / "val.de.gz", cache / "val.en.gz")
    assert sorted(p.name for p in cache.iterdir()) == ["val.de.gz", "val.en.gz"]

    monkeypatch.setattr(corpus, "MULTI30K_URL", f"file://{tmp_path}/nowhere/{{name}}")
    assert multi30k("valid", "de", "en").src_path == cache / "val.de.gz"  # served from the cache, no download
    with pytest.raises(MtError, match=r"cannot download file://.*/nowhere/train\.de\.gz .*MT_MIRROR"):
        multi30k("train", "de", "en")
    with pytest.raises(MtError, match=r"and .*/empty/multi30k/train\.de\.gz does not exist"):
        multi30k("train", "de", "en", mirror=tmp_path / "empty")  # a mirror without the file: try the cache

    tampered_copy(tmp_path / "tampered", "val.de.gz")
    monkeypatch.setattr(corpus, "MULTI30K_URL", f"file://{tmp_path}/tampered/{{name}}")
    (cache / "val.de.gz").unlink()
    with pytest.raises(
        MtError, match=r"val\.de\.gz: downloaded file has sha256 [0-9a-f]{64}, expected f0cba2f9"
    ):
        multi30k("valid", "de", "en")
    assert sorted(p.name for p in cache.iterdir()) == ["val.en.gz"]  # nothing half-written left behind
