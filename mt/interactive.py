"""Interactive translation: a prompt, one sentence at a time, Ctrl-D to quit.

`mt translate` uses it when stdin is a terminal and no files are given. The prompt goes to stderr, so what
reaches stdout is only translations, as in batch mode.
"""

from __future__ import annotations

from typing import TextIO

import torch

from mt.checkpoint import Loaded
from mt.translate import Options, translate_stream

PROMPT = "> "


def interactive(loaded: Loaded, opts: Options, device: torch.device, stdin: TextIO, stdout: TextIO,
                stderr: TextIO) -> int:
    """Translate each line as it is entered until end of input (Ctrl-D) or Ctrl-C; returns lines translated."""
    count = 0
    try:
        while True:
            stderr.write(PROMPT)
            stderr.flush()
            line = stdin.readline()
            if not line:  # Ctrl-D
                break
            for out in translate_stream(loaded, [line], opts, device):
                stdout.write(out + "\n")
            stdout.flush()
            count += 1
    except KeyboardInterrupt:  # Ctrl-C quits as quietly as Ctrl-D
        pass
    stderr.write("\n")  # leave the shell's prompt on a line of its own
    stderr.flush()
    return count
