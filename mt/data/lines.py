"""Text files, one sentence per line: the one reader, the one line-count check and the one writer.

Lines end at "\\n" only (as `wc -l` counts them), a trailing "\\r" is dropped, and a leading byte-order mark is
ignored. Files are decoded as UTF-8 line by line, so an invalid byte is reported with its file and line; a line is
read at most MT_MAX_LINE_BYTES at a time, so a file without line ends (or a gzip bomb) is refused, not read whole.
Any readable path is an input, a FIFO or <(command) too. Output is written to a temporary name and renamed into
place, so a crash never leaves half a file; the checks before any work make sure it is not one of the inputs.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import BinaryIO

from mt.errors import MtError, cannot_write

ENCODING_ERRORS = ("strict", "replace", "ignore")
LIMIT_ENV = "MT_MAX_LINE_BYTES"
MAX_LINE_BYTES = 1 << 20  # far above any sentence's length, and what a line may hold in memory


def read_lines(source: str | Path | BinaryIO, encoding_errors: str = "strict", empty_ok: bool = False,
               ask: Callable[[], None] | None = None, name: str = "stdin", limit: int | None = None
               ) -> Iterator[str]:
    """Yield the lines of a UTF-8 file (plain, or gzip by suffix) or of a binary stream such as stdin (called
    `name` in errors), without their "\\n" or "\\r\\n"; each line is read only when asked for, after `ask()`
    (an interactive prompt). A leading byte-order mark is dropped. Raises `MtError` for a missing or unreadable
    file, an empty one (unless `empty_ok`), a line longer than `limit` bytes (default: `max_line_bytes()`) and,
    when `encoding_errors` is "strict", invalid UTF-8.
    """
    if encoding_errors not in ENCODING_ERRORS:
        raise MtError(f"encoding errors must be one of {', '.join(ENCODING_ERRORS)}, not {encoding_errors!r}")
    is_file = isinstance(source, (str, Path))
    name, lineno, limit = str(source) if is_file else name, 0, max_line_bytes() if limit is None else limit
    try:
        with _open_binary(Path(source)) if is_file else nullcontext(source) as f:  # a stream given stays open
            while True:
                if ask is not None:
                    ask()
                raw = f.readline(limit + 1)
                if not raw:
                    break
                lineno += 1
                if len(raw) > limit and not raw.endswith(b"\n"):
                    raise MtError(f"{name}:{lineno}: a line longer than {limit:,} bytes ({LIMIT_ENV}); is it text, "
                                  f"one sentence per line? Split it, or raise {LIMIT_ENV}")
                line = _decode(raw, name, lineno, encoding_errors)
                yield (line.removeprefix("\ufeff") if lineno == 1 else line).removesuffix("\n").removesuffix("\r")
    except FileNotFoundError:
        raise MtError(f"{name}: no such file") from None
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError; a truncated .gz ends in EOFError
        raise MtError(f"{name}: cannot read ({e})") from None
    except zlib.error as e:  # a valid gzip header over damaged data
        raise MtError(f"{name}:{lineno + 1}: corrupt gzip data ({e}); the file is damaged: fetch or compress it "
                      "again") from None
    if lineno == 0 and not empty_ok:
        raise MtError(f"{name}: file is empty")


def max_line_bytes() -> int:
    """The longest line `read_lines` takes, in bytes: MT_MAX_LINE_BYTES, else MAX_LINE_BYTES."""
    value = os.environ.get(LIMIT_ENV, "").strip()
    if not value:
        return MAX_LINE_BYTES
    if not value.isdigit() or int(value) < 1:
        raise MtError(f"{LIMIT_ENV}={value!r}: expected a number of bytes, at least 1 (default {MAX_LINE_BYTES})")
    return int(value)


def _open_binary(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _decode(raw: bytes, name: str, lineno: int, encoding_errors: str) -> str:
    try:
        return raw.decode("utf-8", encoding_errors)
    except UnicodeDecodeError as e:
        raise MtError(f"{name}:{lineno}: invalid UTF-8 ({e.reason}, byte 0x{raw[e.start]:02x} at column "
                      f"{e.start + 1}); fix the file, or pass --encoding-errors replace (mt prepare, mt translate)"
                      ) from None


def read_text(path: str | Path, encoding_errors: str = "strict") -> list[str]:
    """Every line of a file, as `read_lines` reads them."""
    return list(read_lines(path, encoding_errors))


def check_aligned(name_a: str | Path, count_a: int, name_b: str | Path, count_b: int) -> None:
    """Raise `MtError` naming both inputs and their line counts unless they have as many lines."""
    if count_a != count_b:
        raise MtError(f"{name_a} has {count_a} lines but {name_b} has {count_b}; they must be line-aligned")


def write_lines(path: str | Path, lines: Iterable[str]) -> None:
    """Write lines to a temporary file beside `path` and rename it into place when complete."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            for line in lines:
                f.write(line + "\n")
        os.replace(tmp, path)
    except OSError as e:  # a full disk, a quota, a missing directory: one line, not a traceback
        raise cannot_write(path, e) from None
    finally:
        tmp.unlink(missing_ok=True)


def write_file(path: str | Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path` and rename it into place when complete."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        raise cannot_write(path, e) from None
    finally:
        tmp.unlink(missing_ok=True)


def check_output(path: str | Path, option: str, create_parent: bool = False) -> None:
    """Before any work: a file can be written at `path` (its directory exists, or with `create_parent` can be
    created, and is writable; no directory is in the way); else `MtError` naming the option, the path and the fix."""
    path = Path(path)
    if path.is_dir():
        raise MtError(f"{option} {path}: is a directory; choose another path, a file's")
    parent = path.absolute().parent
    if create_parent:
        return check_output_dir(parent, option)
    if not parent.is_dir():
        raise MtError(f"{option} {path}: its directory {parent} does not exist; create it, or choose another path")
    if not os.access(parent, os.W_OK):
        raise MtError(f"{option} {path}: cannot write into {parent} (permission denied); choose another path")


def check_output_dir(path: str | Path, option: str) -> None:
    """Before any work: a directory at `path` exists or can be created (no file is in the way, and the nearest
    existing directory above it is writable); else `MtError` naming the option, the path and the fix."""
    path = Path(path).absolute()
    if path.exists() and not path.is_dir():
        raise MtError(f"{option} {path}: a file is in the way of the directory; move it, or choose another path")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise MtError(f"{option} {path}: {existing} is a file, not a directory; choose another path")
    if not os.access(existing, os.W_OK):
        raise MtError(f"{option} {path}: cannot write into {existing} (permission denied); choose another path")


def check_input(path: str | Path, option: str) -> None:
    """Before any work: `path` can be read, as a stream: a file, a FIFO, /dev/stdin or <(command) alike, anything
    but a directory; else `MtError` naming the option and the path."""
    path = Path(path)
    if not path.exists():
        raise MtError(f"{option} {path}: input file not found")
    if path.is_dir():
        raise MtError(f"{option} {path}: is a directory; give a file")
    if not os.access(path, os.R_OK):
        raise MtError(f"{option} {path}: cannot read it (permission denied)")


def check_not_input(output: str | Path, option: str, inputs: Iterable[str | Path]) -> None:
    """Before anything is written or deleted: `output` (a file to write, or a directory to write or replace) is
    none of `inputs` and holds none of them, paths resolved; else `MtError` naming both paths and the fix."""
    out = Path(output).resolve()
    for given in inputs:
        source = Path(given).resolve()
        if out == source or (out.exists() and source.exists() and os.path.samefile(out, source)):
            raise MtError(f"{option} {output} is the input {given}: writing it would destroy what it is made from; "
                          f"choose another path for {option}")
        if out in source.parents:
            raise MtError(f"{option} {output} holds the input {given}, which replacing it would delete; choose "
                          f"another path for {option}, one that holds no input")
