import gzip

import pytest

from mt.errors import MtError
from mt.lines import check_aligned, read_lines, read_text, write_lines


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
    code = f"from mt.lines import write_lines; write_lines({str(out)!r}, ['x' * 100] * 1000)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            preexec_fn=limited_file_size(10_000))
    assert result.returncode != 0
    assert f"MtError: {out}: cannot write: the file size limit is reached" in result.stderr
    assert out.read_text() == "the previous translation\n" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]
