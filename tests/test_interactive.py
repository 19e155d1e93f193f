import io

import torch

from mt.interactive import PROMPT, interactive
from mt.translate import Options, translate_stream

CPU = torch.device("cpu")


class Terminal(io.StringIO):
    """What a user types, line by line, then Ctrl-D (the end of the string)."""

    def isatty(self) -> bool:
        return True


def test_each_line_is_translated_as_entered_until_ctrl_d(loaded):
    opts = Options(beam=1, len_penalty=0.6, max_len_a=1.0, max_len_b=3, batch_tokens=64)
    typed = ["the cat sat", "", "a big dog"]
    stdout, stderr = io.StringIO(), io.StringIO()
    assert interactive(loaded, opts, CPU, Terminal("".join(t + "\n" for t in typed)), stdout, stderr) == 3
    assert stdout.getvalue().split("\n")[:-1] == list(translate_stream(loaded, typed, opts, CPU))
    assert stderr.getvalue() == PROMPT * 4 + "\n"  # a prompt per line and one more answered by Ctrl-D
