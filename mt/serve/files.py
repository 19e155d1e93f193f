"""The translated files of `POST /translate_file`, kept for `GET /download_file/<name>` a while, as LibreTranslate
keeps them.

Each file is stored under a random name (`secrets.token_urlsafe`, 128 bits, and the upload's suffix) in a private
temporary folder (mode 0700) that the server removes when it stops; the name a client sent is never part of a path,
only of the download's Content-Disposition, sanitized (`download_name`). A file goes `file_ttl` seconds after it was
stored, and the store holds at most `max_files` files and `max_stored_bytes` bytes: past either, a new file is
refused (503, Retry-After: when the oldest goes) rather than one still promised to a client removed early.
"""

from __future__ import annotations

import math
import re
import secrets
import tempfile
import threading
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from mt.data.lines import write_file
from mt.errors import ApiError, MtError

NAME = re.compile(r"[A-Za-z0-9_-]{22}\.[a-z0-9]{1,10}")  # what `put` names a file: a token and a suffix
MAX_NAME = 120  # characters of a download's name


@dataclass
class Stored:
    path: Path
    download_name: str
    size: int
    expires: float


class FileStore:
    """Translated files by their random name, each until it expires; the folder is made when first needed."""

    def __init__(self, ttl: float, max_files: int, max_bytes: int, clock: Callable[[], float] = time.monotonic):
        self.ttl, self.max_files, self.max_bytes, self.clock = ttl, max_files, max_bytes, clock
        self.files: dict[str, Stored] = {}
        self.folder: tempfile.TemporaryDirectory | None = None  # removed at close, or at exit should close not run
        self.lock = threading.Lock()

    def check_room(self, size: int = 0) -> None:
        """ApiError 503 unless a file of `size` bytes fits now."""
        with self.lock:
            self.expire()
            self.refuse_unless_room(size)

    def put(self, data: bytes, suffix: str, download_name: str) -> str:
        """Store `data`; its name in the store (a random token and `suffix`, e.g. ".txt")."""
        with self.lock:
            self.expire()
            self.refuse_unless_room(len(data))
            if self.folder is None:
                self.folder = tempfile.TemporaryDirectory(prefix="mt-serve-files-")  # mkdtemp's: mode 0700
            name = secrets.token_urlsafe(16) + suffix
            path = Path(self.folder.name) / name
            try:
                write_file(path, data)  # whole or not at all
            except MtError as error:
                raise ApiError(507, f"the translated file could not be stored ({error}); retry later") from None
            self.files[name] = Stored(path, download_name, len(data), self.clock() + self.ttl)
            return name

    def read(self, name: str) -> tuple[bytes, str] | None:
        """The bytes and download name of the file stored as `name`, if it is there and has not expired."""
        if not NAME.fullmatch(name):  # what no `put` names; nothing a client sends reaches a path
            return None
        with self.lock:
            self.expire()
            stored = self.files.get(name)
            return (stored.path.read_bytes(), stored.download_name) if stored else None

    def sweep(self) -> None:
        """Remove what has expired."""
        with self.lock:
            self.expire()

    def expire(self) -> None:
        """Remove what has expired (the lock held)."""
        now = self.clock()
        for name in [name for name, one in self.files.items() if one.expires <= now]:
            self.files.pop(name).path.unlink(missing_ok=True)

    def refuse_unless_room(self, size: int) -> None:
        held = sum(one.size for one in self.files.values())
        if len(self.files) < self.max_files and held + size <= self.max_bytes:
            return
        wait = min((one.expires for one in self.files.values()), default=self.clock()) - self.clock()
        what = (f"{len(self.files)} translated files, its limit (--max-files)" if len(self.files) >= self.max_files
                else f"{held:,} bytes of translated files, and this one is {size:,}; the limit is {self.max_bytes:,} "
                     f"(--max-stored-bytes)")
        raise ApiError(503, f"the server holds {what}: retry in {math.ceil(max(wait, 1))} s, when the oldest "
                            f"expires", {"Retry-After": str(math.ceil(max(wait, 1)))})

    def close(self) -> None:
        """Remove every file and the folder."""
        with self.lock:
            self.files.clear()
            if self.folder is not None:
                self.folder.cleanup()
                self.folder = None


def download_name(filename: str, suffix: str) -> str:
    """The name a download is offered under: the upload's own last path part, without control characters, quotes,
    separators or leading dots, at most MAX_NAME characters, keeping `suffix`; "translated" + suffix if nothing is
    left."""
    base = re.split(r"[/\\]", filename)[-1]
    kept = "".join(ch for ch in base if unicodedata.category(ch)[0] not in "CZ" or ch == " ")
    kept = re.sub(r'["*:<>?|;]', "_", kept).strip(" .")
    stem = kept[:len(kept) - len(suffix)] if kept.lower().endswith(suffix) else kept
    return (stem[:MAX_NAME - len(suffix)].strip(" .") or "translated") + suffix


def content_disposition(name: str) -> str:
    """An attachment named `name`: quoted as it is when it is plain ASCII, else %-escaped UTF-8 (RFC 6266)."""
    if name.isascii() and quote(name, safe="") == name:
        return f'attachment; filename="{name}"'
    return "attachment; filename*=UTF-8''" + quote(name, safe="")
