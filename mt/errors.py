"""The one error a user can fix: its message says what went wrong and what to do, in one line.

Every command catches `MtError`, prints `error: MESSAGE` and exits with `exit_code` (2, or 130 for an interrupted
run), never a traceback.
"""


class MtError(Exception):
    """A problem the user can fix; the message names the file, the line or the key, and the fix."""

    exit_code = 2
