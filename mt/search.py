"""Greedy and beam search over a batch of source sentences, decoding incrementally with a KV cache.

Both functions take a model with `encode` / `start_cache` / `decode_step` (see mt/model.py) and a padded
source batch (B, S), and return hypotheses as lists of piece ids without BOS/EOS. Finished sentences leave the
running batch, so a long sentence does not keep short ones computing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from mt.tokenizer import BOS, EOS, PAD


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


@torch.inference_mode()
def greedy(model, src: Tensor, max_len_a: float = 1.5, max_len_b: int = 10, min_len: int = 0) -> list[Hypothesis]:
    """The most likely next token at every step until EOS or the length limit (EOS barred before `min_len`)."""
    memory, src_mask = model.encode(src)
    limit = max_lengths(src, max_len_a, max_len_b, model.cfg.max_len)
    steps = int(limit.max())
    cache = model.start_cache(memory, src_mask, steps)
    n = src.size(0)
    active = torch.arange(n, device=src.device)  # original row of each running row
    tokens = torch.full((n,), BOS, dtype=torch.long, device=src.device)
    out = torch.full((n, steps), EOS, dtype=torch.long, device=src.device)
    logprob = torch.zeros(n, device=src.device)
    for step in range(steps):
        logits, cache = model.decode_step(tokens, cache)
        logp = next_token_logprobs(logits, step < min_len, limit[active] <= step + 1)
        best, tokens = logp.max(dim=-1)
        out[active, step] = tokens
        logprob[active] += best
        running = tokens != EOS
        if not running.all():
            if not running.any():
                break
            keep = running.nonzero().squeeze(1)
            active, tokens, cache = active[keep], tokens[keep], cache.select(keep, keep)
    return [Hypothesis(until_eos(row), lp, lp) for row, lp in zip(out.tolist(), logprob.tolist(), strict=True)]


@torch.inference_mode()
def beam_search(model, src: Tensor, beam: int = 4, len_penalty: float = 0.6, max_len_a: float = 1.5,
                max_len_b: int = 10, nbest: int = 1, min_len: int = 0) -> list[list[Hypothesis]]:
    """Beam search with the GNMT length penalty; returns the `nbest` best hypotheses per sentence, best first.

    A hypothesis that emits EOS among the top `beam` candidates is finished. A sentence stops once it has
    `nbest` finished hypotheses and no live beam can still beat the worst of them, judging a live beam by its
    score normalised at the current length (as most toolkits do; with len_penalty 0 the judgment is exact,
    since log-probabilities only fall). With beam 1 this is exactly greedy search. EOS is barred before
    `min_len` tokens (benchmarks use it, with the length limit, to fix the output length).
    """
    if nbest > beam:
        raise ValueError(f"nbest ({nbest}) cannot exceed the beam size ({beam})")
    device = src.device
    n, k = src.size(0), beam
    memory, src_mask = model.encode(src)
    limit = max_lengths(src, max_len_a, max_len_b, model.cfg.max_len)
    steps = int(limit.max())
    cache = model.start_cache(memory, src_mask, steps, beam=k)  # each sentence's k beams side by side

    active = torch.arange(n, device=device)  # original sentence of each running sentence
    scores = torch.full((n, k), -torch.inf, device=device)
    scores[:, 0] = 0.0  # all beams start identical: only the first may expand at step 0
    prefixes = torch.zeros((n * k, 0), dtype=torch.long, device=device)
    last = torch.full((n * k,), BOS, dtype=torch.long, device=device)
    finished: list[list[Hypothesis]] = [[] for _ in range(n)]
    kth_best = torch.full((n,), -torch.inf, device=device)  # score of each sentence's nbest-th finished hypothesis

    for step in range(steps):
        logits, cache = model.decode_step(last, cache)
        logp = next_token_logprobs(logits, step < min_len, (limit[active] <= step + 1).repeat_interleave(k))
        vocab = logp.size(1)
        # A sentence's 2k best continuations (2k: at least k of them do not end in EOS) are among its beams'
        # 2k best tokens each, so the top-k runs over (n*k, V) once and then over (n, k*2k), never over k*V.
        width = min(2 * k, vocab)
        row_lp, row_tok = top_tokens(logp, width)  # (n*k, width)
        cand = (scores.view(-1, 1) + row_lp).view(-1, k * width)  # (n, k*width)
        top_scores, top_idx = cand.topk(min(2 * k, cand.size(1)), dim=1)
        top_beam, top_tok = top_idx // width, row_tok.view(-1, k * width).gather(1, top_idx)

        # Finish the hypotheses that end in EOS among the k best candidates (a few per step: a short loop).
        ends = (top_tok[:, :k] == EOS) & torch.isfinite(top_scores[:, :k])
        if ends.any():
            penalty = length_penalty(step + 1, len_penalty)
            for s, j in ends.nonzero().tolist():
                i = int(active[s])
                logprob = float(top_scores[s, j])
                finished[i].append(Hypothesis(prefixes[s * k + int(top_beam[s, j])].tolist(), logprob / penalty,
                                              logprob))
                if len(finished[i]) >= nbest:
                    finished[i] = sorted(finished[i], key=lambda h: h.score, reverse=True)[:nbest]
                    kth_best[i] = finished[i][-1].score

        # The k best continuations that do not end in EOS stay live, each parent's first child in its parent's
        # slot, so that the cache copies only the rows of the other children (into the slots of dead beams).
        live = top_scores.masked_fill(top_tok == EOS, -torch.inf)
        ranked, pick = live.topk(k, dim=1)  # (n, k), best first
        at = pick.gather(1, slot_order(top_beam.gather(1, pick)))  # the candidate each slot gets
        best, scores = ranked[:, 0], live.gather(1, at)
        beam_of, tok = top_beam.gather(1, at), top_tok.gather(1, at)
        parent = (torch.arange(active.numel(), device=device)[:, None] * k + beam_of).view(-1)

        # A sentence is done when no live beam can beat the nbest-th finished one (-inf >= -inf: none can).
        keep = kth_best[active] < best / length_penalty(step + 1, len_penalty)
        sentences = None  # the encoder side changes only when sentences finish
        if not keep.all():
            if not keep.any():
                break
            sentences = keep.nonzero().squeeze(1)
            parent = parent.view(-1, k)[keep].view(-1)
            scores, tok, active = scores[keep], tok[keep], active[keep]
        prefixes = torch.cat([prefixes.index_select(0, parent), tok.view(-1, 1)], dim=1)
        last = tok.view(-1)
        cache = cache.select(parent, sentences)

    return [sorted(hyps, key=lambda h: h.score, reverse=True)[:nbest] for hyps in finished]


def top_tokens(logp: Tensor, k: int, chunk: int = 64) -> tuple[Tensor, Tensor]:
    """`logp.topk(k, dim=1)` in two short passes: the k best of a row lie in the k chunks (of `chunk` tokens)
    with the highest maxima, since any other chunk has k elements above its maximum. The chunk maxima are one
    vectorised reduction; torch.topk over a whole 8k vocabulary is not (machine B: 0.45 against 0.75 ms for
    256 rows)."""
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


def slot_order(parents: Tensor) -> Tensor:
    """Where the next beams go, given the beam each continues (n, k): each parent's first (best) child takes
    its parent's slot, the other children the slots of the parents left without children, in order. Returns,
    for each slot, the index of the child in it; the slots of a sentence are then in no order of score."""
    k = parents.size(1)
    children = F.one_hot(parents, k)  # (n, child, parent)
    first = children.cumsum(1).gather(2, parents[..., None]).squeeze(2) == 1
    childless_first = (children.sum(1) > 0).to(torch.int8).argsort(dim=1, stable=True)  # childless parents first
    slot = torch.where(first, parents, childless_first.gather(1, ((~first).cumsum(1) - 1).clamp(min=0)))
    return slot.argsort(1)  # slot is a permutation: its inverse


def next_token_logprobs(logits: Tensor, bar_eos: bool, at_limit: Tensor) -> Tensor:
    """Log-probabilities (B, V) of the next token. With `bar_eos`, EOS cannot be chosen; rows `at_limit` may
    only end (EOS gets log-probability 0, all else -inf). (torch.logsumexp, to normalise only the few tokens a
    search keeps, measured 2x slower than log_softmax over all of them.)"""
    logp = torch.log_softmax(logits.float(), dim=-1)
    if bar_eos:
        logp[:, EOS] = -torch.inf
    if at_limit.any():
        logp[at_limit] = -torch.inf
        logp[at_limit, EOS] = 0.0
    return logp


def until_eos(tokens: list[int]) -> list[int]:
    return tokens[:tokens.index(EOS)] if EOS in tokens else tokens
