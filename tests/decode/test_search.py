import math

import pytest
import torch
from torch import nn

from mt.config import ModelConfig
from mt.data.tokenizer import BOS, EOS, PAD
from mt.decode.search import beam_search, greedy, length_penalty

from ..conftest import tiny_model


def sources(n=5, vocab=40, seed=3):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 9, (n,), generator=g)
    src = torch.full((n, int(lengths.max()) + 1), PAD)
    for i, L in enumerate(lengths.tolist()):
        src[i, :L] = torch.randint(4, vocab, (L,), generator=g)
        src[i, L] = EOS
    return src


def test_beam_one_equals_greedy():
    model = tiny_model(seed=2)
    src = sources()
    g = greedy(model, src, max_len_a=1.0, max_len_b=5)
    b = beam_search(model, src, beam=1, len_penalty=0.6, max_len_a=1.0, max_len_b=5)
    assert [h.tokens for h in g] == [hs[0].tokens for hs in b]
    for gh, bh in zip(g, b, strict=True):
        assert gh.logprob == pytest.approx(bh[0].logprob, abs=1e-4)


def test_batch_equals_one_by_one():
    model = tiny_model(seed=4)
    src = sources(n=6)
    batched = beam_search(model, src, beam=3, max_len_a=1.0, max_len_b=4, nbest=2)
    for i in range(src.size(0)):
        row = src[i:i + 1, : int((src[i] != PAD).sum())]
        alone = beam_search(model, row, beam=3, max_len_a=1.0, max_len_b=4, nbest=2)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in batched[i]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in batched[i]], abs=1e-4)
    g_batched = greedy(model, src, 1.0, 4)
    g_alone = [greedy(model, src[i:i + 1, : int((src[i] != PAD).sum())], 1.0, 4)[0] for i in range(src.size(0))]
    assert [h.tokens for h in g_batched] == [h.tokens for h in g_alone]


class PrefixCache:
    """The fake model's decoding state: each row's prefix, reordered by `select` and widened to beams by `widen`
    like a real cache."""

    def __init__(self, prefix: torch.Tensor):
        self.prefix = prefix

    def select(self, rows, sentences=None):
        return PrefixCache(self.prefix.index_select(0, rows))

    def widen(self, beam):
        return PrefixCache(self.prefix.repeat_interleave(beam, 0))


class FixedModel(nn.Module):
    """A stand-in decoder whose next-token distribution depends only on the prefix, from a hand-made table."""

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]], vocab: int = 8):
        super().__init__()
        self.table, self.vocab = table, vocab
        self.cfg = ModelConfig(max_len=32, src_vocab_size=vocab, tgt_vocab_size=vocab)

    def encode(self, src):
        return torch.zeros(src.size(0), src.size(1), 1), (src != PAD)[:, None, None, :]

    def start_cache(self, memory, src_mask, max_steps=None, beam=1):
        return PrefixCache(torch.zeros(memory.size(0) * beam, 0, dtype=torch.long))

    def decode_step(self, tokens, cache):
        started = cache.prefix.size(1) > 0 or bool((tokens != BOS).any())
        prefix = torch.cat([cache.prefix, tokens[:, None]], 1) if started else cache.prefix
        logits = torch.full((tokens.size(0), self.vocab), -1e9)
        for row, p in enumerate(prefix.tolist()):
            for tok, prob in self.table.get(tuple(p), {EOS: 1.0}).items():
                logits[row, tok] = math.log(prob)
        return logits, PrefixCache(prefix)


@pytest.mark.parametrize("few_rows", [8, 0])  # a lone sentence's books in lists, or in tensors as any batch's
def test_hand_made_distribution_gives_the_expected_beams_and_scores(few_rows, monkeypatch):
    monkeypatch.setattr("mt.decode.search.FEW_ROWS", few_rows)
    # Step 1: A=4 (0.6) or B=5 (0.4). After A: EOS 0.52 or C=6 0.48. After B: EOS 0.9 or C 0.1. After AC: EOS 1.
    table = {(): {4: 0.6, 5: 0.4}, (4,): {EOS: 0.52, 6: 0.48}, (5,): {EOS: 0.9, 6: 0.1}, (4, 6): {EOS: 1.0},
             (5, 6): {EOS: 1.0}}
    model = FixedModel(table)
    src = torch.tensor([[4, 5, EOS]])
    # Greedy follows A then EOS (0.6 * 0.52 = 0.312), missing B EOS (0.4 * 0.9 = 0.36), which beam 2 finds.
    assert greedy(model, src, 1.0, 5)[0].tokens == [4]
    hyps = beam_search(model, src, beam=2, len_penalty=0.0, max_len_a=1.0, max_len_b=5, nbest=2)[0]
    assert [h.tokens for h in hyps] == [[5], [4]]
    assert [h.logprob for h in hyps] == pytest.approx([math.log(0.36), math.log(0.312)])
    # With a length penalty the longer A C (0.288) outranks A (0.312): scores are divided by ((5 + len) / 6) ** alpha.
    hyps = beam_search(model, src, beam=3, len_penalty=1.0, max_len_a=1.0, max_len_b=5, nbest=3)[0]
    expected = sorted([([5], math.log(0.36) / length_penalty(2, 1.0)), ([4], math.log(0.312) / length_penalty(2, 1.0)),
                       ([4, 6], math.log(0.288) / length_penalty(3, 1.0))], key=lambda x: -x[1])
    assert [h.tokens for h in hyps] == [tokens for tokens, _ in expected]
    assert [h.score for h in hyps] == pytest.approx([score for _, score in expected])


def test_output_length_is_limited():
    model = tiny_model(seed=5)
    src = sources(n=3)
    for h in greedy(model, src, max_len_a=0.0, max_len_b=3):
        assert len(h.tokens) <= 2  # 3 tokens including EOS
    for hs in beam_search(model, src, beam=2, max_len_a=0.0, max_len_b=3):
        assert len(hs[0].tokens) <= 2


def test_beams_keep_their_parents_slot_so_the_cache_moves_few_rows():
    from mt.decode.search import slot_order
    parents = torch.tensor([[1, 1, 1, 0], [0, 0, 2, 2], [3, 2, 1, 0]])  # the beam each next beam continues
    at = slot_order(parents)
    assert sorted(at[0].tolist()) == [0, 1, 2, 3]
    # Every parent with a child keeps one in its own slot; the other children take the childless slots.
    assert parents.gather(1, at).tolist() == [[0, 1, 1, 1], [0, 0, 2, 2], [0, 1, 2, 3]]
    assert at.tolist() == [[3, 0, 1, 2], [0, 1, 2, 3], [3, 2, 1, 0]]


@pytest.mark.parametrize("vocab", [8000, 8003, 100])
def test_top_tokens_are_those_of_topk(vocab):
    from mt.decode.hypotheses import top_tokens
    logp = torch.randn(6, vocab, generator=torch.Generator().manual_seed(vocab)).log_softmax(-1)
    logp[1] = -torch.inf  # a row that may only end
    logp[1, EOS] = 0.0
    logp[2, -2] = 5.0  # the best token in the tail that fills no chunk
    values, tokens = top_tokens(logp, 8)
    expected = logp.topk(8, dim=1)
    torch.testing.assert_close(values, expected.values)
    finite = values.isfinite()
    assert torch.equal(tokens[finite], expected.indices[finite])


def test_no_hypothesis_ends_before_min_len():
    # A model that would end at once: EOS 0.9 after any prefix, else token 4 (or 5 at the start).
    table = {(): {EOS: 0.9, 4: 0.06, 5: 0.04}}
    model = FixedModel(table)
    src = torch.tensor([[4, 5, 6, EOS]])
    assert greedy(model, src, 0.0, 8)[0].tokens == []
    for min_len in (1, 3):
        assert len(greedy(model, src, 0.0, 8, min_len=min_len)[0].tokens) == min_len
        hyps = beam_search(model, src, beam=2, max_len_a=0.0, max_len_b=8, nbest=2, min_len=min_len)[0]
        assert [len(h.tokens) for h in hyps] == [min_len, min_len]


@pytest.mark.parametrize("seed,eos_bias", [(0, 0.0), (1, 0.0), (2, 3.0), (3, 3.0)])
def test_few_rows_keep_their_books_in_lists_and_find_the_same_hypotheses(seed, eos_bias, monkeypatch):
    import mt.decode.search as search
    model = tiny_model(seed=seed)
    step = model.decode_step

    def ending(tokens, cache):  # with a bias, most hypotheses end before the limit, on EOS's own probability
        logits, cache = step(tokens, cache)
        logits[:, EOS] += eos_bias
        return logits, cache

    model.decode_step = ending
    src = sources(n=2, seed=seed)
    rows = [src[i:i + 1, : int((src[i] != PAD).sum())] for i in range(src.size(0))] + [src]
    for beam, nbest, alpha, min_len in ((4, 1, 0.6, 0), (3, 3, 1.0, 0), (2, 2, 0.0, 3), (8, 2, 0.6, 0), (1, 1, 0.6, 0)):
        found = {}
        for few in (8, 0):  # lists, then the tensors of any batch
            monkeypatch.setattr(search, "FEW_ROWS", few)
            found[few] = ([search.beam_search(model, r, beam, alpha, 1.0, 6, nbest, min_len) for r in rows],
                          [[search.greedy(model, r, 1.0, 6, min_len)] for r in rows])
        for listed, tensors in zip(found[8], found[0], strict=True):
            assert [[[h.tokens for h in hs] for hs in r] for r in listed] == \
                [[[h.tokens for h in hs] for hs in r] for r in tensors]
            for a, b in zip(listed, tensors, strict=True):
                for ha, hb in zip(a, b, strict=True):
                    assert [h.score for h in ha] == pytest.approx([h.score for h in hb], abs=1e-5)
                    assert [h.logprob for h in ha] == pytest.approx([h.logprob for h in hb], abs=1e-5)


def test_few_slot_order_is_slot_order():
    from mt.decode.few_rows import few_slot_order
    from mt.decode.search import slot_order
    g = torch.Generator().manual_seed(0)
    parents = torch.randint(0, 5, (200, 5), generator=g)
    expected = slot_order(parents).tolist()
    assert [few_slot_order(p) for p in parents.tolist()] == expected


@pytest.mark.parametrize("alpha", [0.6, 2.0])
def test_finished_sentences_leave_the_batch_together_and_change_no_translation(alpha, monkeypatch):
    """Finished sentences decode on, ignored, until they are COMPACT_AT of the batch's rows and leave it in one copy
    of the cache: every sentence's hypotheses are those it gets when each leaves at once (COMPACT_AT 0) or alone."""
    import mt.decode.search as search
    from mt.model.cache import DecoderCache

    model = tiny_model(seed=5)
    step = model.decode_step

    def ending(tokens, cache):
        """EOS becomes likely two pieces short of the source's length, so sentences end at different steps, some
        beams before others; a row fed its own EOS would go on, as a finished row left to decode must not."""
        length = cache.length
        logits, cache = step(tokens, cache)
        src_len = cache.src_mask.sum((1, 2, 3)).repeat_interleave(tokens.size(0) // cache.src_mask.size(0))
        logits[src_len - 2 <= length, EOS] += 4.0
        logits[tokens == EOS, EOS] -= 20.0
        return logits, cache

    model.decode_step = ending
    monkeypatch.setattr(search, "FEW_ROWS", 0)
    select, leavings = DecoderCache.select, []
    monkeypatch.setattr(DecoderCache, "select", lambda self, rows, sentences=None: (  # rows before and after
        leavings.append((self.self_k[0].size(1), rows.numel())) if sentences is not None else None) or select(
        self, rows, sentences))
    src = sources(n=12, seed=7)
    found, left = {}, {}
    for compact_at in (0.0, 0.25, 1.0):
        monkeypatch.setattr(search, "COMPACT_AT", compact_at)
        leavings.clear()
        found[compact_at] = (search.beam_search(model, src, 3, alpha, 1.0, 6, nbest=2),
                             search.greedy(model, src, 1.0, 6))
        left[compact_at] = list(leavings)
    alone = [(search.beam_search(model, src[i:i + 1], 3, alpha, 1.0, 6, nbest=2)[0],
              search.greedy(model, src[i:i + 1], 1.0, 6)[0]) for i in range(src.size(0))]
    assert len({len(one.tokens) for _, one in alone}) > 3  # sentences end at several steps
    for beams, ones in found.values():
        for i, (hyps, one) in enumerate(zip(beams, ones, strict=True)):
            assert [h.tokens for h in hyps] == [h.tokens for h in alone[i][0]], i
            assert [h.score for h in hyps] == pytest.approx([h.score for h in alone[i][0]], abs=1e-5)
            assert one.tokens == alone[i][1].tokens and one.logprob == pytest.approx(alone[i][1].logprob, abs=1e-5)
    assert left[1.0] == [] and left[0.25] and len(left[0.25]) < len(left[0.0])
    assert all(after <= 0.75 * before for before, after in left[0.25]), left[0.25]


class HostReads:
    """Counts the reads of tensor values by the host (item, tolist, a tensor's truth or number, nonzero, indexing by a
    mask): each would wait for a GPU to finish all the work queued before it, a CPU stand-in for CUDA's sync check."""

    READS = ("item", "tolist", "nonzero", "__bool__", "__int__", "__float__", "__index__")

    def __init__(self, monkeypatch):
        self.count = 0
        for name in self.READS:
            monkeypatch.setattr(torch.Tensor, name, self.counted(getattr(torch.Tensor, name)))
        for name in ("__getitem__", "__setitem__"):
            monkeypatch.setattr(torch.Tensor, name, self.counted(getattr(torch.Tensor, name), masks_only=True))

    def counted(self, method, masks_only=False):
        def read(tensor, *args, **kwargs):
            index = args[0] if args else None
            parts = index if isinstance(index, tuple) else (index,)
            if not masks_only or any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts):
                self.count += 1
            return method(tensor, *args, **kwargs)
        return read


@pytest.mark.parametrize("beam", [0, 1, 4], ids=["greedy", "beam 1", "beam 4"])
def test_a_search_step_waits_for_the_device_once(beam, monkeypatch):
    """On a device whose reads wait (a GPU, here stood in for by the CPU), a step of greedy or beam search reads
    one number back (whether to stop or to let finished sentences leave); finished hypotheses stay on the device
    until the end. The translations are those found with reads free."""
    import mt.decode.hypotheses
    import mt.decode.search as search
    import mt.model.cache

    model, src, steps = tiny_model(seed=6), sources(n=16, seed=2), 7

    def search_all():
        if beam == 0:
            return [[h] for h in search.greedy(model, src, 0.0, steps, min_len=steps - 1)]
        return search.beam_search(model, src, beam, 0.6, 0.0, steps, nbest=min(beam, 2), min_len=steps - 1)

    free = search_all()
    for module in (mt.decode.hypotheses, mt.model.cache):
        monkeypatch.setattr(module, "reads_wait", lambda t: True)
    reads = HostReads(monkeypatch)
    waited = search_all()
    # one read of the length limit before the steps, one a step, the finished books' at the end
    assert reads.count <= 1 + steps + 4
    assert [[h.tokens for h in hyps] for hyps in waited] == [[h.tokens for h in hyps] for hyps in free]
    assert [[h.score for h in hyps] for hyps in waited] == [[h.score for h in hyps] for hyps in free]
