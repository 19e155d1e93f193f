"""Beam search's ranking in C: each row's few best next tokens and their log-probabilities, straight from the logits
(native_search.c's `mt_top_logprobs`: one pass keeps the best, a second sums the exponentials), the rows shared
among PyTorch's threads. PyTorch writes the whole (rows, vocabulary) log-softmax and then reads it again to rank it.

Beside the C decoding step (mt/fast/native_step.py builds the library and gives each `NativeDecodeStep` one of
these, as its `rank`): `top_logprobs` ranks the few rows of mt/decode/few_rows.py's searches, in lists; `best_tokens`
ranks a batch's rows for mt/decode/search.py, in tensors, up to as many rows as it is measured the faster for on
this machine (mt/fast/choose.py). The log-probabilities agree with PyTorch's to a few units in the last place.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch
from torch import Tensor

from mt.data.tokenizer import EOS
from mt.fast.choose import Kept, measured_limit

RANK_ROWS = (16, 64, 256, 1024)  # rows timed for the crossover, in beam 4's width (8)
WIDTH = 8

Ranker = Callable[[Tensor, int, bool, Tensor], tuple[Tensor, Tensor]]  # (logits, width, bar_eos, at_limit) → ranked


class NativeRanking:
    def __init__(self, lib: ctypes.CDLL, vocab: int, max_rows: int | None = None):
        self.top, self.vocab, self.max_rows = lib.mt_top_logprobs, vocab, max_rows
        self.limits = Kept()  # threads → the most rows it ranks, measured

    def top_logprobs(self, logits: Tensor, width: int,
                     barred: int | None = None) -> tuple[list[list[float]], list[list[int]]]:
        """Each row's `width` most likely tokens other than `barred`, best first, and their log-probabilities
        (log-softmax over the whole row), in one call into C on one thread: what beam search over a few rows ranks
        (mt/decode/few_rows.py)."""
        values, tokens = self.ranked(logits, width, barred, 1)
        return values.tolist(), tokens.tolist()

    def best_tokens(self, logits: Tensor, width: int, bar_eos: bool, at_limit: Tensor,
                    plain: Ranker) -> tuple[Tensor, Tensor]:
        """`plain(logits, width, bar_eos, at_limit)` (rows, width), each row's best tokens' log-probabilities and
        the tokens, EOS barred with `bar_eos`, a row `at_limit` ending (EOS at 0, -inf after it): in C where C
        ranks this many rows faster on this machine, else by `plain`."""
        rows = logits.size(0)
        if (logits.device.type != "cpu" or logits.dim() != 2 or logits.size(1) != self.vocab
                or width + bar_eos > self.vocab or rows > self.rows_limit(plain)):
            return plain(logits, width, bar_eos, at_limit)
        values, tokens = self.ranked(logits, width, EOS if bar_eos else None, torch.get_num_threads())
        if at_limit.any():
            values[at_limit] = -torch.inf
            values[at_limit, 0], tokens[at_limit, 0] = 0.0, EOS
        return values, tokens

    def ranked(self, logits: Tensor, width: int, barred: int | None, threads: int) -> tuple[Tensor, Tensor]:
        if width < 1 or logits.dim() != 2 or logits.device.type != "cpu":
            raise ValueError(f"the C ranking takes CPU logits (rows, vocabulary) and width >= 1, not "
                             f"{tuple(logits.shape)} on {logits.device} and width {width}")
        logits = logits.float().contiguous()  # held in a name until C has read it
        rows, vocab = logits.shape
        values, tokens = torch.empty(rows, width), torch.empty(rows, width, dtype=torch.long)
        self.top(logits.data_ptr(), rows, vocab, width, -1 if barred is None else barred, values.data_ptr(),
                 tokens.data_ptr(), threads)
        return values, tokens

    def rows_limit(self, plain: Ranker) -> int:
        """Up to how many rows C ranks a step's: `max_rows` if set, else as measured on this machine for this
        vocabulary at the threads PyTorch runs, once."""
        def timed(rows: int, native: bool) -> Callable[[], object]:
            logits = torch.randn(rows, self.vocab, generator=torch.Generator().manual_seed(0)) * 4
            ending = torch.zeros(rows, dtype=torch.bool)
            if native:
                return lambda: self.ranked(logits, WIDTH, None, torch.get_num_threads())
            return lambda: plain(logits, WIDTH, False, ending)

        return measured_limit(self.max_rows, self.limits, lambda: f"beam candidates in C or PyTorch, vocabulary "
                              f"{self.vocab}, rows", RANK_ROWS, lambda rows: timed(rows, False),
                              lambda rows: timed(rows, True))
