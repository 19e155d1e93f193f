"""Text in, text out: encode, sort by length, batch by a token budget, search, detokenize, restore input order.

Exactly one output line per input line: an empty or blank input line gives an empty output line, a line
longer than the model allows is cut (with a warning on stderr), and control characters pass to SentencePiece,
which maps what it does not know to <unk>.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mt.checkpoint import Loaded
from mt.config import DecodeConfig
from mt.data import batch_by_tokens, pad
from mt.linear import Linear, linear, native_bf16, prefers_onednn
from mt.search import Hypothesis, beam_search, greedy
from mt.tokenizer import EOS

CHUNK_LINES = 10_000  # lines read ahead and sorted together; bounds memory on endless input
PRECISIONS = ("fp32", "bf16", "int8")


def for_inference(model: nn.Module, precision: str) -> nn.Module:
    """The model to decode with, its linear layers frozen for speed: fp32 (or bf16 under autocast) weights stored
    transposed (`FrozenLinear`), or int8 dynamically quantized.

    int8 quantizes every nn.Linear's weights but the output layer's once and each activation on the fly (CPU
    only): roughly twice the fp32 speed on CPUs with VNNI, at a small cost in BLEU (measure it with `mt evaluate`).
    Each activation's scale spans the whole batch, so an int8 translation may change slightly with the sentences
    batched beside it; fp32 translates a sentence the same alone or in any batch. The model is changed
    in place and can no longer be trained.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision == "int8":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao.quantization announces its successor; it still works
            # The output projection is not quantized: it decides every token, and int8 there cost the most BLEU.
            # It runs in bf16 where the CPU multiplies bf16 in hardware, else in fp32.
            linears = {name for name, m in model.named_modules() if isinstance(m, nn.Linear) and name != "output"}
            for name in linears:  # the quantizer takes nn.Linear itself, not subclasses such as mt's Linear
                parent, _, child = name.rpartition(".")
                setattr(model.get_submodule(parent), child, plain_linear(model.get_submodule(name)))
            model = torch.ao.quantization.quantize_dynamic(model, linears, dtype=torch.qint8, inplace=True)
        if native_bf16():
            model.output = Bf16Linear(model.output)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) in (nn.Linear, Linear):
                setattr(module, name, FrozenLinear(child))
    return model.eval()


def plain_linear(layer: nn.Linear) -> nn.Linear:
    """An nn.Linear holding `layer`'s parameters."""
    plain = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None, device="meta")
    plain.weight, plain.bias = layer.weight, layer.bias
    return plain


class Bf16Linear(nn.Module):
    """nn.Linear for inference in bf16 (fp32 accumulation), returning fp32: the int8 model's output layer on CPUs
    that multiply bf16 in hardware, where it makes int8 beam search 5-12% faster (machine B) and its logits are
    good to about three significant digits."""

    def __init__(self, layer: nn.Linear):
        super().__init__()
        self.register_buffer("weight", layer.weight.detach().to(torch.bfloat16))
        self.register_buffer("bias", None if layer.bias is None else layer.bias.detach().to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(torch.bfloat16), self.weight, self.bias).float()


class FrozenLinear(nn.Module):
    """nn.Linear for inference, its weight stored transposed and contiguous, (in_features, out_features).

    F.linear multiplies by the transpose of an (out, in) weight; on CPU, MKL runs the small matrices of
    step-by-step decoding faster against a weight already laid out as (in, out). Where oneDNN is the faster
    kernel (see mt/linear.py), fp32 goes through it instead, as fast with this layout.
    """

    def __init__(self, layer: nn.Linear):
        super().__init__()
        self.register_buffer("weight_t", layer.weight.detach().t().contiguous())
        self.register_buffer("bias", None if layer.bias is None else layer.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if prefers_onednn(x, self.weight_t):
            return linear(x, self.weight_t.t(), self.bias)
        flat = x.reshape(-1, x.size(-1))
        y = flat @ self.weight_t if self.bias is None else torch.addmm(self.bias, flat, self.weight_t)
        return y.view(*x.shape[:-1], y.size(-1))


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
