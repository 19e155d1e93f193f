"""Beam search's ranking in C (mt/fast/native_rank.py) finds what PyTorch's log-softmax and top-k find: each row's
best tokens and their log-probabilities, for a few rows in lists and for a batch in tensors on any threads, and so
the same hypotheses."""

from types import SimpleNamespace

import pytest
import torch

import mt.fast.choose
from mt.data.batches import pad
from mt.data.tokenizer import EOS
from mt.decode.few_rows import row_candidates
from mt.decode.hypotheses import best_tokens, plain_best_tokens
from mt.decode.search import beam_search
from mt.fast.native_step import library

from .test_native_step import SOURCES, models, threads  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.numerics,
              pytest.mark.skipif(library() is None, reason="no C compiler, or a CPU without AVX2 and FMA")]


@pytest.mark.parametrize("vocab", [8000, 45, 5])  # a whole number of lanes, not, and fewer tokens than asked
def test_candidates_ranked_in_c_are_pytorch_s(vocab):
    native, _ = models("fp32")
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(vocab)) * 4
    logits[1, 3] = 30.0  # one token takes almost all of a row's probability
    values, tokens = (torch.tensor(t) for t in native.decode_step.rank.top_logprobs(logits, 8))
    expected = torch.log_softmax(logits, dim=-1).topk(min(8, vocab), dim=1)
    assert torch.equal(tokens[:, :vocab], expected.indices)
    torch.testing.assert_close(values[:, :vocab], expected.values, rtol=1e-5, atol=1e-5)
    assert (values[:, vocab:] == -torch.inf).all()
    with pytest.raises(ValueError, match="width >= 1"):
        native.decode_step.rank.top_logprobs(logits, 0)


def test_beam_candidates_from_c_are_those_of_pytorch_with_and_without_eos():
    native, _ = models("fp32")
    in_torch = SimpleNamespace(decode_step=None)  # a model without the C step's ranking
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(1))
    logits[0, EOS] = 9.0  # EOS the best token of one row
    for bar_eos, at_limit in ((False, [False] * 4), (True, [False] * 4), (True, [False, True, False, False])):
        ours = row_candidates(native, logits, 8, bar_eos, at_limit)
        theirs = row_candidates(in_torch, logits, 8, bar_eos, at_limit)
        assert ours[1] == theirs[1]
        torch.testing.assert_close(torch.tensor(ours[0]), torch.tensor(theirs[0]), rtol=1e-5, atol=1e-5)
        assert (EOS in ours[1][0]) != bar_eos  # the row whose best token is EOS


def test_a_batch_s_candidates_ranked_in_c_on_any_threads_are_pytorch_s(threads):  # noqa: F811
    native, _ = models("fp32")
    vocab = native.cfg.tgt_vocab_size
    logits = torch.randn(7, vocab, generator=torch.Generator().manual_seed(2)) * 4
    logits[0, EOS] = 20.0  # EOS the best token of one row
    ran = []
    real = native.decode_step.rank.ranked
    native.decode_step.rank.ranked = lambda *args: ran.append(args[-1]) or real(*args)
    for bar_eos in (False, True):
        for at_limit in (torch.zeros(7, dtype=torch.bool), torch.tensor([0, 1, 0, 0, 0, 0, 1], dtype=torch.bool)):
            values, tokens = best_tokens(native, logits, 8, bar_eos, at_limit)
            expected_values, expected_tokens = plain_best_tokens(logits, 8, bar_eos, at_limit)
            live = ~at_limit
            assert torch.equal(tokens[live], expected_tokens[live])
            torch.testing.assert_close(values, expected_values, rtol=1e-5, atol=1e-5)
            assert (tokens[at_limit, 0] == EOS).all()  # a row at its limit may only end
            assert (EOS in tokens[0].tolist()) != (bar_eos and not at_limit[0])
    assert ran == [threads] * 4  # every ranking in C, on PyTorch's threads


def test_beam_search_over_a_batch_ranked_in_c_finds_what_pytorch_s_ranking_finds():
    native, _ = models("fp32")
    in_torch, _ = models("fp32")
    in_torch.decode_step.rank.max_rows = 0
    src = pad(SOURCES * 3, [], [])  # 9 sentences of 4 beams: the batched search
    for beam, nbest, alpha, min_len in ((4, 1, 0.6, 0), (4, 4, 1.0, 0), (2, 2, 0.0, 3)):
        ours, theirs = (beam_search(m, src, beam, alpha, 1.0, 4, nbest, min_len) for m in (native, in_torch))
        for mine, other in zip(ours, theirs, strict=True):
            assert [h.tokens for h in mine] == [h.tokens for h in other]
            assert [h.score for h in mine] == pytest.approx([h.score for h in other], abs=1e-5)


def test_the_c_ranking_takes_as_many_rows_as_it_is_measured_faster_for(monkeypatch):
    asked = []

    def choice(question: str, candidates: dict) -> str:
        asked.append(question)
        return "c" if int(question.rpartition(", ")[2]) <= 64 else "pytorch"

    monkeypatch.setattr(mt.fast.choose, "choice", choice)
    native, _ = models("fp32")
    rank = native.decode_step.rank
    rank.max_rows = None
    ran = []
    real = rank.ranked
    rank.ranked = lambda logits, *args: ran.append(logits.size(0)) or real(logits, *args)
    for rows in (64, 65):
        best_tokens(native, torch.randn(rows, native.cfg.tgt_vocab_size), 8, False, torch.zeros(rows, dtype=torch.bool))
    assert ran == [64]  # 65 rows: PyTorch's
    assert [q.rpartition(", ")[2] for q in asked] == ["16", "64", "256"]  # asked once, up to the first PyTorch wins
    assert asked[0].startswith(f"beam candidates in C or PyTorch, vocabulary {native.cfg.tgt_vocab_size}, ")
