import pytest
import torch
from matplotlib.image import imread

from mt.data.batches import pad, shift_targets
from mt.data.tokenizer import EOS, PAD
from mt.decode.alignments import alignments, cross_attention, heatmap, pair_attention, pharaoh, select
from mt.model.transformer import merge_heads

from ..conftest import tiny_model

SRCS = [[5, 6, 7, 8, 9], [10, 11]]
TGTS = [[12, 13], [14, 15, 16, 17]]


def batch():
    return pad(SRCS, [], [EOS]), shift_targets(TGTS)[0]


def test_rows_sum_to_one_over_the_source_and_are_zero_on_padding():
    model = tiny_model()
    src, tgt = batch()
    weights = cross_attention(model, src, tgt)
    assert weights.shape == (2, 2, 4, 5, 6)  # (B, L, H, T, S)
    short = weights[1]  # source of 2 pieces + EOS: positions 3.. are padding; target of 4 fills all 5 rows
    torch.testing.assert_close(short[..., :3].sum(-1), torch.ones(2, 4, 5))
    assert (short[..., 3:] == 0).all()
    long = weights[0]  # target of 2 pieces: rows 3.. are padding
    torch.testing.assert_close(long[:, :, :3].sum(-1), torch.ones(2, 4, 3))
    assert (long[:, :, 3:] == 0).all()


def test_weights_are_the_ones_the_model_uses():
    """Recombining the values with the captured weights gives exactly each layer's cross-attention output."""
    model = tiny_model()
    src, tgt = batch()
    seen = []
    hooks = [layer.cross_attn.register_forward_hook(lambda m, args, out: seen.append((m, args, out)))
             for layer in model.decoder]
    weights = cross_attention(model, src, tgt)
    for hook in hooks:
        hook.remove()
    for layer, (module, (_, _, v, _), out) in enumerate(seen):
        recombined = module.out(merge_heads(weights[:, layer] @ v))
        real_rows = tgt != PAD
        torch.testing.assert_close(recombined[real_rows], out[real_rows], atol=1e-5, rtol=1e-4)


def test_pairs_are_trimmed_and_batching_does_not_change_them():
    model = tiny_model()
    together = pair_attention(model, SRCS, TGTS)
    apart = pair_attention(model, SRCS, TGTS, batch_tokens=1)  # one pair per batch
    for w, a, s, t in zip(together, apart, SRCS, TGTS, strict=True):
        assert w.shape == (2, 4, len(t) + 1, len(s) + 1)
        torch.testing.assert_close(w, a)


def test_alignments_pick_the_most_attended_source_piece_for_each_target_piece():
    weights = torch.zeros(2, 3, 4, 5)  # (L, H, T, S): 3 pieces + EOS row, 4 source pieces + EOS column
    for t, s in enumerate([2, 0, 3]):
        weights[:, :, t, s] = 1.0
    weights[:, :, :, 4] = 0.9  # attention resting on the source's EOS never becomes an alignment
    weights[0, 0, 0, 1] = 5.0  # one head of one layer disagrees: the average still says 2, layer 0 head 0 says 1
    assert alignments(weights) == [(2, 0), (0, 1), (3, 2)]
    assert alignments(weights, layer=0, head=0)[0] == (1, 0)
    assert pharaoh(alignments(weights)) == "2-0 0-1 3-2"


def test_alignments_of_a_real_model_have_one_pair_per_target_piece():
    model = tiny_model()
    for w, s, t in zip(pair_attention(model, SRCS, TGTS), SRCS, TGTS, strict=True):
        pairs = alignments(w)
        assert [tgt for _, tgt in pairs] == list(range(len(t)))
        assert all(0 <= src < len(s) for src, _ in pairs)


def test_a_head_needs_a_layer():
    with pytest.raises(ValueError, match="layer"):
        select(torch.zeros(2, 4, 3, 3), head=1)


def test_heatmap_is_a_png_that_grows_with_the_sentence(tmp_path):
    model = tiny_model()
    short, long = pair_attention(model, [[5, 6], [5] * 20], [[7, 8], [7, 8]])
    a = imread(heatmap(short, ["▁a", "$x$", "</s>"], ["▁b", "c", "</s>"], tmp_path / "a.png"))
    b = imread(heatmap(long, [f"p{i}" for i in range(20)] + ["</s>"], ["▁b", "c", "</s>"], tmp_path / "b.png",
                       layer=1, head=3))
    assert a.ndim == 3 and a.shape[0] > 100 and a.shape[1] > 100
    assert b.shape[1] > a.shape[1] and b.shape[0] == a.shape[0]

