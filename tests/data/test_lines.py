import gzip
import os

import pytest

from mt.data.lines import (
    LIMIT_ENV,
    check_aligned,
    check_input,
    check_not_input,
    read_lines,
    read_text,
    write_lines,
)
from mt.errors import MtError


def test_read_text_keeps_lines_exactly(tmp_path):
    path = tmp_path / "t"
    path.write_bytes("\ufeffone\r\n\r\nthree\x0bstill three\u2028and\rthree\n".encode())
    assert read_text(path) == ["one", "", "three\x0bstill three\u2028and\rthree"]
    path.write_bytes(b"no final newline")
    assert read_text(path) == ["no final newline"]


def test_gzip_files_read_like_plain_ones(tmp_path):
    (tmp_path / "t.gz").write_bytes(gzip.compress("\ufeffeins\r\nzwei\n".encode()))
    assert list(read_lines(tmp_path / "t.gz")) == ["eins", "zwei"]
    (tmp_path / "bad.gz").write_bytes(b"not gzip at all")
    with pytest.raises(MtError, match="bad.gz: cannot read"):
        read_text(tmp_path / "bad.gz")


def test_invalid_utf8_names_the_file_and_line_and_replace_reads_on(tmp_path):
    path = tmp_path / "t"
    path.write_bytes(b"ok\nschl\xffcht\n")
    with pytest.raises(MtError, match=rf"{path}:2: invalid UTF-8 .*column 5.*--encoding-errors replace"):
        read_text(path)
    assert read_text(path, "replace") == ["ok", "schl\ufffdcht"]
    with pytest.raises(MtError, match="encoding errors must be one of strict, replace, ignore"):
        read_text(path, "surrogateescape")


def test_missing_and_empty_files_are_named(tmp_path):
    with pytest.raises(MtError, match=f"{tmp_path / 'none'}: no such file"):
        read_text(tmp_path / "none")
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(MtError, match=f"{tmp_path / 'empty'}: file is empty"):
        read_text(tmp_path / "empty")


def test_check_aligned_names_both_inputs_and_their_counts():
    check_aligned("a.de", 3, "a.en", 3)
    with pytest.raises(MtError, match=r"^a\.de has 3 lines but a\.en has 2; they must be line-aligned$"):
        check_aligned("a.de", 3, "a.en", 2)


def test_write_lines_replaces_a_file_only_when_complete(tmp_path):
    path = tmp_path / "out.txt"
    write_lines(path, ["one", "", "three"])
    assert path.read_bytes() == b"one\n\nthree\n" and read_text(path) == ["one", "", "three"]

    def failing():
        yield "new"
        raise RuntimeError("the translation crashed")

    with pytest.raises(RuntimeError):
        write_lines(path, failing())
    assert path.read_bytes() == b"one\n\nthree\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temporary file left behind


def limited_file_size(limit: int):
    """For a subprocess: files may grow to `limit` bytes, and a write past it fails (EFBIG) instead of killing."""
    import resource
    import signal

    def set_limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return set_limit


def test_a_write_that_runs_out_of_room_keeps_the_previous_file_and_leaves_nothing_partial(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "out.txt"
    out.write_text("the previous translation\n")
    code = f"from mt.data.lines import write_lines; write_lines({str(out)!r}, ['x' * 100] * 1000)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            preexec_fn=limited_file_size(10_000))
    assert result.returncode != 0
    assert f"MtError: {out}: cannot write: the file size limit is reached" in result.stderr
    assert out.read_text() == "the previous translation\n" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_a_fifo_is_read_as_a_stream_while_its_writer_writes(tmp_path):
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    check_input(fifo, "--input")  # exists and readable, though not a regular file

    def write() -> None:
        with open(fifo, "wb") as f:
            for i in range(1000):
                f.write(f"line {i}\n".encode())

    writer = threading.Thread(target=write)
    writer.start()
    lines = list(read_lines(fifo))
    writer.join()
    assert lines == [f"line {i}" for i in range(1000)]


def test_check_input_names_what_cannot_be_read(tmp_path):
    with pytest.raises(MtError, match=f"^--input {tmp_path / 'none'}: input file not found$"):
        check_input(tmp_path / "none", "--input")
    with pytest.raises(MtError, match=f"^--input {tmp_path}: is a directory"):
        check_input(tmp_path, "--input")


def test_corrupt_gzip_data_behind_a_valid_header_is_one_error_naming_the_file(tmp_path):
    data = bytearray(gzip.compress(b"a line\n" * 10_000))
    data[10] = 0xFF  # the 10-byte header stays valid; the first deflate block gets type 3, which does not exist
    (tmp_path / "t.gz").write_bytes(bytes(data))
    with pytest.raises(MtError, match=rf"^{tmp_path / 't.gz'}:\d+: corrupt gzip data \(.*\); the file is damaged"):
        read_text(tmp_path / "t.gz")


def test_a_line_past_the_limit_is_refused_before_it_is_read_whole(tmp_path, monkeypatch):
    import tracemalloc

    bomb = tmp_path / "bomb.gz"
    bomb.write_bytes(gzip.compress(b"\0" * 50_000_000, compresslevel=1))  # 50 MB of one line, in some 200 KB
    assert bomb.stat().st_size < 1_000_000
    monkeypatch.setenv(LIMIT_ENV, "1000000")
    tracemalloc.start()
    try:
        with pytest.raises(MtError, match=rf"^{bomb}:1: a line longer than 1,000,000 bytes \({LIMIT_ENV}\); "
                                          rf".*raise {LIMIT_ENV}$"):
            read_text(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10_000_000, peak  # bounded by the limit, not the 50 MB line
    short = tmp_path / "short.txt"
    short.write_bytes(b"x" * 999_999 + b"\r\n" + b"y" * 1_000_000 + b"\n")  # at the limit, without its line end
    assert [len(line) for line in read_text(short)] == [999_999, 1_000_000]
    monkeypatch.setenv(LIMIT_ENV, "lots")
    with pytest.raises(MtError, match=f"{LIMIT_ENV}='lots': expected a number of bytes"):
        read_text(short)


def test_check_not_input_refuses_an_output_that_is_or_holds_an_input(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    best = run / "best.pt"
    best.write_bytes(b"weights")
    (tmp_path / "link.pt").symlink_to(best)
    os.link(best, tmp_path / "hard.pt")
    monkeypatch.chdir(tmp_path)
    check_not_input(run / "export", "--out", [best])  # beside it: fine
    check_not_input(tmp_path / "other.pt", "--out", [best, tmp_path / "missing"])
    with pytest.raises(MtError, match=rf"^--out run holds the input {best}, which replacing it would delete; "
                                      "choose another path for --out"):
        check_not_input("run", "--out", [best])
    for out in ("run/best.pt", "run/../run/./best.pt", "link.pt", "hard.pt"):
        with pytest.raises(MtError, match=rf"^--out {out} is the input {best}: .*choose another path for --out$"):
            check_not_input(out, "--out", [best])
    assert best.read_bytes() == b"weights"
