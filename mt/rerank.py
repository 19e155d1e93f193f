"""Reranking: a right-to-left model rescores the K best translations of a left-to-right model (or ensemble).

A model trained with `model.right_to_left` reads each target from its other end, so its mistakes are not the
left-to-right model's; scoring the beam's K best with both and keeping the best agreement is Liu et al. 2016's
and Sennrich et al. 2016's reranking. `mt ensemble L2R.pt [...] R2L.pt` stores the right-to-left model as the
checkpoint's `reranker` (mt/ensemble.py), as the recipes' `train.rerank` does for their last member. Every command
that searches (translate, tune, report, serve, bench) then ranks the K best by

    (log P_l2r + w · log P_r2l) / (1 + w) / lp(length),

w the checkpoint's `decode.rerank_weight` (`mt tune` chooses it) and lp the search's length penalty. Greedy
search (beam 1) has nothing to rerank; it, forced scoring (`mt score`) and attention use the left-to-right model.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mt.score import score_ids
from mt.search import Hypothesis, length_penalty


class Reranked(nn.Module):
    """The decoding interface of `mt.model.Transformer`, served by the left-to-right model `left`; `right`, a
    right-to-left model of the same vocabulary, is there to `rerank` what searching `left` finds."""

    def __init__(self, left: nn.Module, right: nn.Module):
        super().__init__()
        self.left, self.right = left, right
        self.cfg = left.cfg

    def encode(self, src: Tensor):
        return self.left.encode(src)

    def start_cache(self, memory, src_mask: Tensor, max_steps: int | None = None, beam: int = 1):
        return self.left.start_cache(memory, src_mask, max_steps, beam=beam)

    def decode_step(self, tokens: Tensor, cache):
        return self.left.decode_step(tokens, cache)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        return self.left(src, tgt)


def backward_logprobs(right: nn.Module, srcs: list[list[int] | None], found: list[list[Hypothesis]],
                      batch_tokens: int, device: torch.device) -> list[list[float]]:
    """log P_r2l of each hypothesis in `found` (each source's left-to-right K best; none for a None source)."""
    flat = [(i, h) for i, hyps in enumerate(found) for h in hyps]
    scores = iter(score_ids(right, [srcs[i] for i, _ in flat], [h.tokens for _, h in flat], device, batch_tokens))
    return [[next(scores) for _ in hyps] for hyps in found]


def rerank(found: list[list[Hypothesis]], backward: list[list[float]], weight: float, len_penalty: float,
           nbest: int) -> list[list[Hypothesis]]:
    """The `nbest` of each source's hypotheses `found`, best first by the score above, which each returned
    hypothesis carries; `logprob` stays the left-to-right model's."""
    ranked = [[Hypothesis(h.tokens, (h.logprob + weight * back) / (1 + weight)
                          / length_penalty(len(h.tokens) + 1, len_penalty), h.logprob)
               for h, back in zip(hyps, backs, strict=True)] for hyps, backs in zip(found, backward, strict=True)]
    return [sorted(hyps, key=lambda h: -h.score)[:nbest] for hyps in ranked]
