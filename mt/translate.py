"""Text in, text out: encode, sort by length, batch by a token budget, search, detokenize, restore input order.

Exactly one output line per input line: an empty or blank input line gives an empty output line, a line
longer than the model allows is cut (with a warning on stderr), and control characters pass to SentencePiece,
which maps what it does not know to <unk>.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from mt.checkpoint import Loaded
from mt.config import DecodeConfig
from mt.data import batch_by_tokens, pad
from mt.search import Hypothesis, beam_search, greedy
from mt.tokenizer import EOS

CHUNK_LINES = 10_000  # lines read ahead and sorted together; bounds memory on endless input


def autocast(precision: str, device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()


@dataclass
class Options:
    """What `mt translate` may change per call; the rest comes from the checkpoint's decode config."""

    beam: int
    len_penalty: float
    max_len_a: float
    max_len_b: int
    batch_tokens: int
    nbest: int = 1
    precision: str = "fp32"  # bf16 runs the search under autocast; int8 needs a model from for_inference

    @classmethod
    def from_config(cls, d: DecodeConfig, **changes) -> Options:
        opts = cls(d.beam, d.len_penalty, d.max_len_a, d.max_len_b, d.batch_tokens)
        for key, value in changes.items():
            if value is not None:
                setattr(opts, key, value)
        return opts


def translate_ids(model, srcs: list[list[int]], opts: Options, device: torch.device) -> list[list[Hypothesis]]:
    """Search for every source (piece ids, no EOS); results in input order, `opts.nbest` per source."""
    lengths = [len(s) + 1 for s in srcs]
    results: list[list[Hypothesis]] = [[] for _ in srcs]
    for idx in batch_by_tokens(lengths, opts.batch_tokens):
        src = pad([srcs[i] for i in idx], [], [EOS]).to(device)
        with autocast(opts.precision, device):
            if opts.beam == 1 and opts.nbest == 1:
                hyps = [[h] for h in greedy(model, src, opts.max_len_a, opts.max_len_b)]
            else:
                hyps = beam_search(model, src, opts.beam, opts.len_penalty, opts.max_len_a, opts.max_len_b,
                                   opts.nbest)
        for i, h in zip(idx, hyps, strict=True):
            results[i] = h
    return results


def translate_lines(loaded: Loaded, lines: list[str], opts: Options, device: torch.device,
                    warn=sys.stderr) -> list[list[Hypothesis]]:
    """Hypotheses for each line (an empty list for a blank line)."""
    limit = loaded.model.cfg.max_len - 1  # room for EOS
    todo = [i for i, line in enumerate(lines) if line.strip()]
    srcs = loaded.src_tok.encode([lines[i].strip() for i in todo])
    for i, s in zip(todo, srcs, strict=True):
        if len(s) > limit:
            print(f"warning: input line {i + 1} has {len(s)} pieces; cut to the model's {limit}", file=warn)
    results: list[list[Hypothesis]] = [[] for _ in lines]
    for i, hyps in zip(todo, translate_ids(loaded.model, [s[:limit] for s in srcs], opts, device), strict=True):
        results[i] = hyps
    return results


def translate_stream(loaded: Loaded, lines: Iterable[str], opts: Options, device: torch.device) -> Iterator[str]:
    """Output lines for input lines, chunk by chunk, in order. With nbest > 1: `i ||| text ||| score` lines."""
    chunk: list[str] = []
    offset = 0
    for line in lines:
        chunk.append(line.rstrip("\r\n"))
        if len(chunk) == CHUNK_LINES:
            yield from _render(loaded, chunk, offset, translate_lines(loaded, chunk, opts, device), opts.nbest)
            offset += len(chunk)
            chunk = []
    if chunk:
        yield from _render(loaded, chunk, offset, translate_lines(loaded, chunk, opts, device), opts.nbest)


def _render(loaded: Loaded, chunk: list[str], offset: int, results: list[list[Hypothesis]],
            nbest: int) -> Iterator[str]:
    for i, hyps in enumerate(results):
        texts = loaded.tgt_tok.decode([h.tokens for h in hyps]) if hyps else [""]
        if nbest == 1:
            yield texts[0]
        else:
            for text, h in zip(texts, hyps or [Hypothesis([], 0.0, 0.0)], strict=True):
                yield f"{offset + i} ||| {text} ||| {h.score:.4f}"
