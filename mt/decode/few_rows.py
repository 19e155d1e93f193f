"""Greedy and beam search over a few rows (a lone sentence, its beam), their bookkeeping in Python lists: `greedy`
and `beam_search` (mt/decode/search.py) hand them searches of up to `FEW_ROWS` rows.

Why: each step of the tensor searches runs a dozen (greedy) to sixty (beam) small tensor operations, microseconds
each whatever their size; for a few rows that is as long as the decoding step itself (docs/performance.md). Here a
step runs the decoder and finds each row's best tokens (`row_candidates`: in C where the model decodes there), and
the rest is a few dozen numbers in Python: the same hypotheses as the tensor searches find (tests hold them equal),
up to the order of exact ties. Where the step is in C, greedy search and a lone sentence's beam search are one call
into C, steps and choices alike (`NativeDecodeStep.greedy`, `.beam_search`): a lone sentence's Python between steps
had been a fifth (greedy) to a third (beam 4) of its time.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mt.data.tokenizer import BOS, EOS
from mt.decode.hypotheses import Hypothesis, length_penalty, max_lengths, next_token_logprobs, top_tokens


@torch.inference_mode()
def few_greedy(model, src: Tensor, max_len_a: float, max_len_b: int, min_len: int) -> list[Hypothesis]:
    """`greedy` for a few rows: each step's best token of each row in lists."""
    memory, src_mask = model.encode(src)
    limits = max_lengths(src, max_len_a, max_len_b, model.cfg.max_len).tolist()
    n, steps = src.size(0), max(limits)
    cache = model.start_cache(memory, src_mask, steps)
    in_c = getattr(model.decode_step, "greedy", None)  # the whole search in one call, where the step is in C
    searched = in_c(cache, limits, min_len) if in_c is not None else None
    if searched is not None:
        return [Hypothesis(tokens, lp, lp) for tokens, lp in searched]
    active = list(range(n))  # the original sentence of each running one
    found: list[list[int]] = [[] for _ in range(n)]
    logprob = [0.0] * n
    last = torch.full((n,), BOS, dtype=torch.long, device=src.device)
    for step in range(steps):
        logits, cache = model.decode_step(last, cache)
        best, tokens = row_candidates(model, logits, 1, step < min_len, [limits[i] <= step + 1 for i in active])
        running = []
        for s, i in enumerate(active):
            logprob[i] += best[s][0]
            if tokens[s][0] != EOS:
                found[i].append(tokens[s][0])
                running.append(s)
        if not running:
            break
        if len(running) < len(active):
            keep = torch.tensor(running, device=src.device)
            active, cache = [active[s] for s in running], cache.select(keep, keep)
        last = torch.tensor([tokens[s][0] for s in running], device=src.device)
    return [Hypothesis(tokens, lp, lp) for tokens, lp in zip(found, logprob, strict=True)]


@torch.inference_mode()
def few_beam_search(model, src: Tensor, beam: int, len_penalty: float, max_len_a: float, max_len_b: int,
                    nbest: int, min_len: int) -> list[list[Hypothesis]]:
    """`beam_search` for a few rows: each step ranks the few dozen candidates of `Beams` and `Finished` in lists."""
    memory, src_mask = model.encode(src)
    limits = max_lengths(src, max_len_a, max_len_b, model.cfg.max_len).tolist()
    n, k, steps = src.size(0), beam, max(limits)
    cache = model.start_cache(memory, src_mask, steps, beam=k)
    in_c = getattr(model.decode_step, "beam_search", None) if n == 1 else None  # a lone sentence, all in C
    searched = in_c(cache, steps, len_penalty, nbest, min_len) if in_c is not None else None
    if searched is not None:
        return [[Hypothesis(tokens, score, logprob) for tokens, score, logprob in searched]]
    active = list(range(n))  # the original sentence of each running one
    scores = [[0.0] + [-math.inf] * (k - 1) for _ in range(n)]  # per running sentence, per slot
    prefixes: list[list[list[int]]] = [[[] for _ in range(k)] for _ in range(n)]
    hyps: list[list[Hypothesis]] = [[] for _ in range(n)]
    kth_best = [-math.inf] * n  # as Finished.kth_best
    last = torch.full((n * k,), BOS, dtype=torch.long, device=src.device)
    for step in range(steps):
        logits, cache = model.decode_step(last, cache)
        row_lp, row_tok = row_candidates(model, logits, min(2 * k, logits.size(1)), step < min_len,
                                         [limits[i] <= step + 1 for i in active for _ in range(k)])
        penalty = length_penalty(step + 1, len_penalty)
        kept, parents, tokens = [], [], []
        for s, i in enumerate(active):
            cand = sorted(((scores[s][j] + lp, j, tok) for j in range(k)
                           for lp, tok in zip(row_lp[s * k + j], row_tok[s * k + j], strict=True)),
                          key=lambda c: -c[0])[:2 * k]
            for score, j, tok in cand[:k]:  # Finished.add
                if tok == EOS and score > -math.inf:
                    hyps[i].append(Hypothesis(list(prefixes[s][j]), score / penalty, score))
                    if len(hyps[i]) >= nbest:
                        hyps[i] = sorted(hyps[i], key=lambda h: h.score, reverse=True)[:nbest]
                        kth_best[i] = hyps[i][-1].score
            live = sorted(((-math.inf if tok == EOS else score, j, tok) for score, j, tok in cand),
                          key=lambda c: -c[0])[:k]  # Beams.advance
            if not kth_best[i] < live[0][0] / penalty:
                continue  # done: no live beam can beat the nbest-th finished one
            slot = few_slot_order([j for _, j, _ in live])
            chosen = [live[c] for c in slot]
            kept.append(s)
            parents += [s * k + j for _, j, _ in chosen]
            tokens += [tok for _, _, tok in chosen]
            scores[s] = [score for score, _, _ in chosen]
            prefixes[s] = [prefixes[s][j] + [tok] for _, j, tok in chosen]
        if not kept:
            break
        sentences = None if len(kept) == len(active) else torch.tensor(kept, device=src.device)
        active, scores, prefixes = [active[s] for s in kept], [scores[s] for s in kept], [prefixes[s] for s in kept]
        last = torch.tensor(tokens, device=src.device)
        cache = cache.select(torch.tensor(parents, device=src.device), sentences)
    return [sorted(h, key=lambda h: h.score, reverse=True)[:nbest] for h in hyps]


def row_candidates(model, logits: Tensor, width: int, bar_eos: bool,
                   at_limit: list[bool]) -> tuple[list[list[float]], list[list[int]]]:
    """Each row's `width` best tokens and their log-probabilities, as `next_token_logprobs` and `top_tokens` give
    them, in lists: in one call into C where the model decodes there (`NativeRanking.top_logprobs`) and no row is
    at its length limit (its last step); with `bar_eos`, EOS is not among them."""
    top = getattr(getattr(model.decode_step, "rank", None), "top_logprobs", None)
    if top is None or logits.device.type != "cpu" or any(at_limit) or width + bar_eos > logits.size(1):
        logp = next_token_logprobs(logits, bar_eos, torch.tensor(at_limit, device=logits.device))
        return tuple(t.tolist() for t in top_tokens(logp, width))
    return top(logits, width, EOS if bar_eos else None)


def few_slot_order(parents: list[int]) -> list[int]:
    """`slot_order` of one sentence, in lists: for each slot, the index of the child (among `parents`, best first)
    that goes in it."""
    k = len(parents)
    first = [parents.index(p) == c for c, p in enumerate(parents)]
    childless = iter(j for j in range(k) if j not in parents)
    slot = [p if f else next(childless) for p, f in zip(parents, first, strict=True)]
    order = [0] * k
    for child, at in enumerate(slot):
        order[at] = child
    return order
