"""The one error a user can fix: its message says what went wrong and what to do, in one line.

Every command catches `MtError`, prints `error: MESSAGE` and exits with `exit_code` (2, or 130 for an interrupted
run), never a traceback. `mt serve` answers a request it cannot translate with an `ApiError` instead.
"""

import errno


class MtError(Exception):
    """A problem the user can fix; the message names the file, the line or the key, and the fix."""

    exit_code = 2


class ApiError(Exception):
    """What `mt serve` answers a request with instead of a translation: an HTTP status and a one-line message."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


WRITE_FAILURES = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EFBIG: "the file size limit is reached (ulimit -f)",
}


def cannot_write(path: object, error: OSError) -> MtError:
    """The error of a write to `path` that failed, e.g. on a full disk, after the partial file was removed."""
    reason = WRITE_FAILURES.get(error.errno, error.strerror or str(error))
    return MtError(f"{path}: cannot write: {reason}; the previous file there is unchanged and no partial file is left")
