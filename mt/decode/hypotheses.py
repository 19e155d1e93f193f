"""What every search shares: a finished `Hypothesis`, the output length limit, the length penalty, the next
token's log-probabilities, and the best candidates of a step's beams (mt/decode/search.py, few_rows.py,
constrained_search.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mt.data.tokenizer import EOS, PAD
from mt.device import reads_wait
from mt.fast.row_max import row_max


@dataclass
class Hypothesis:
    tokens: list[int]  # pieces, without BOS/EOS
    score: float  # log-probability divided by the length penalty: what beams are ranked by
    logprob: float  # total log-probability, EOS included


def max_lengths(src: Tensor, a: float, b: int, limit: int) -> Tensor:
    """Per sentence output limit (in tokens, EOS included): a * source length + b, within the model's positions."""
    src_len = (src != PAD).sum(1)
    return (a * src_len.float() + b).long().clamp(min=1, max=limit - 1)


def length_penalty(length: Tensor | int, alpha: float) -> Tensor | float:
    """GNMT (Wu et al. 2016): ((5 + length) / 6) ** alpha; alpha 0 ranks by raw log-probability."""
    return ((5 + length) / 6) ** alpha


def candidates(scores: Tensor, logp: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each sentence's 2k best continuations of its k beams (2k: at least k of them do not end in EOS), best
    first: their scores (n, 2k), the beam each continues and the token it adds; from the beams' log-probabilities
    logp (n*k, V)."""
    return ranked(scores, *top_tokens(logp, min(2 * scores.size(1), logp.size(1))))


def ranked(scores: Tensor, row_lp: Tensor, row_tok: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """`candidates` from each beam's 2k best tokens (n*k, 2k), their log-probabilities and ids: the 2k best of a
    sentence are among them, so the top-k runs over (n, k*2k), never over k*V."""
    k, width = scores.size(1), row_lp.size(1)
    cand = (scores.view(-1, 1) + row_lp).view(-1, k * width)  # (n, k*width)
    top_scores, top_idx = cand.topk(min(2 * k, cand.size(1)), dim=1)
    return top_scores, top_idx // width, row_tok.view(-1, k * width).gather(1, top_idx)


def best_tokens(model, logits: Tensor, width: int, bar_eos: bool, at_limit: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's `width` best next tokens (rows, width), best first: their log-probabilities and ids, as
    `top_tokens(next_token_logprobs(...), width)` gives them; in C where the model decodes there and C ranks this
    many rows faster (mt/fast/native_rank.py)."""
    rank = getattr(model.decode_step, "rank", None)
    if rank is None:
        return plain_best_tokens(logits, width, bar_eos, at_limit)
    return rank.best_tokens(logits, width, bar_eos, at_limit, plain_best_tokens)


def plain_best_tokens(logits: Tensor, width: int, bar_eos: bool, at_limit: Tensor) -> tuple[Tensor, Tensor]:
    return top_tokens(next_token_logprobs(logits, bar_eos, at_limit), width)


def top_tokens(logp: Tensor, k: int, chunk: int = 64) -> tuple[Tensor, Tensor]:
    """`logp.topk(k, dim=1)` in two short passes: the k best of a row lie in the k chunks (of `chunk` tokens)
    with the highest maxima, since any other chunk has k elements above its maximum. The chunk maxima are one
    vectorised reduction; torch.topk over a whole vocabulary is not."""
    rows, vocab = logp.shape
    whole = vocab // chunk * chunk
    if whole < 4 * k * chunk:
        return logp.topk(k, dim=1)
    best_chunks = logp[:, :whole].view(rows, -1, chunk).amax(dim=2).topk(k, dim=1).indices  # (rows, k)
    cols = (best_chunks[:, :, None] * chunk + torch.arange(chunk, device=logp.device)).view(rows, -1)
    if whole < vocab:  # the tail that fills no chunk is always a candidate
        cols = torch.cat([cols, torch.arange(whole, vocab, device=logp.device).expand(rows, -1)], dim=1)
    values, at = logp.gather(1, cols).topk(k, dim=1)
    return values, cols.gather(1, at)


def next_token_logprobs(logits: Tensor, bar_eos: bool, at_limit: Tensor) -> Tensor:
    """Log-probabilities (B, V) of the next token. With `bar_eos`, EOS cannot be chosen; rows `at_limit` may
    only end (EOS gets log-probability 0, all else -inf)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    if bar_eos:
        logp[:, EOS] = -torch.inf
    if reads_wait(at_limit) or at_limit.any():  # the same, without asking the device whether any row is at its limit
        logp.masked_fill_(at_limit[:, None], -torch.inf)
        logp[:, EOS].masked_fill_(at_limit, 0.0)
    return logp


def next_token_best(logits: Tensor, bar_eos: bool, at_limit: Tensor) -> tuple[Tensor, Tensor]:
    """The log-probability and id (B,) of each row's most likely next token, as `next_token_logprobs(...).max(-1)`
    gives them, without writing the whole vocabulary's log-probabilities: what greedy search needs. Changes
    `logits` in place (barring EOS)."""
    logits = logits.float()
    norm = torch.logsumexp(logits, dim=-1)  # over every token, EOS included, as log_softmax normalises
    if bar_eos:
        logits[:, EOS] = -torch.inf
    best, tokens = row_max(logits)
    return best.sub_(norm).masked_fill_(at_limit, 0.0), tokens.masked_fill_(at_limit, EOS)


def until_eos(tokens: list[int]) -> list[int]:
    return tokens[:tokens.index(EOS)] if EOS in tokens else tokens
