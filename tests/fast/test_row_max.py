"""Each row's maximum by blocks is `Tensor.max(dim=-1)`'s: the same values and first indices, ties, a short last
block, rows of -inf and every width a vocabulary may have; greedy search finds the same tokens either way."""

import pytest
import torch

import mt.fast.row_max as row_max_module
from mt.fast.row_max import BLOCK, by_blocks, row_max

from ..conftest import tiny_model


@pytest.mark.parametrize("width", [2 * BLOCK, 2 * BLOCK + 1, 8000, 8003, 32000])
def test_by_blocks_finds_the_first_maximum_of_each_row(width):
    g = torch.Generator().manual_seed(width)
    x = torch.randn(37, width, generator=g)
    x[1] = 0.0  # every entry a tie: the first
    x[2, [5, width - 1]] = 100.0  # a tie across blocks: the first block's
    x[3, width - 1] = 100.0  # in the short last block
    x[4] = -torch.inf  # a row that may only end
    x[5, BLOCK - 1: BLOCK + 1] = 50.0  # a tie across a block's edge
    x[6] = torch.randint(0, 3, (width,), generator=g).float()  # many ties everywhere
    best, index = by_blocks(x)
    expected_best, expected_index = x.max(dim=-1)
    assert torch.equal(best, expected_best) and torch.equal(index, expected_index)


@pytest.mark.parametrize("faster", [True, False])
def test_greedy_search_finds_the_same_tokens_whichever_is_chosen(faster, monkeypatch):
    from mt.decode.search import greedy

    model = tiny_model(vocab=300)
    src = torch.randint(4, 300, (12, 7), generator=torch.Generator().manual_seed(0))
    expected = [(h.tokens, h.logprob) for h in greedy(model, src, 1.0, 6)]
    monkeypatch.setattr(row_max_module, "blocks_faster", lambda x: faster)
    found = [(h.tokens, h.logprob) for h in greedy(model, src, 1.0, 6)]
    assert [t for t, _ in found] == [t for t, _ in expected]
    assert [lp for _, lp in found] == pytest.approx([lp for _, lp in expected], abs=1e-6)


def test_rows_too_short_for_blocks_and_other_devices_take_torchs_own(monkeypatch):
    monkeypatch.setattr(row_max_module, "by_blocks", lambda x: pytest.fail("took blocks"))
    x = torch.randn(4, 2 * BLOCK - 1)
    assert all(torch.equal(a, b) for a, b in zip(row_max(x), x.max(dim=-1), strict=True))
