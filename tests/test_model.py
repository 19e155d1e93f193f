import pytest
import torch

from mt.config import ModelConfig
from mt.model import Transformer, count_parameters
from mt.tokenizer import BOS, PAD

from .conftest import tiny_model


def random_batch(vocab=40, b=3, s=7, t=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (b, s), generator=g)
    tgt = torch.randint(4, vocab, (b, t), generator=g)
    tgt[:, 0] = BOS
    return src, tgt


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_cached_decoding_equals_full_decoding(norm):
    model = tiny_model(norm=norm)
    src, tgt = random_batch()
    src[0, 5:] = PAD  # a padded row, so the cache must carry the source mask
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        full = model.decode(tgt, memory, src_mask)  # (B, T, V)
        cache = model.start_cache(memory, src_mask)
        steps = []
        for i in range(tgt.size(1)):
            logits, cache = model.decode_step(tgt[:, i], cache)
            steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), full, rtol=1e-5, atol=1e-5)


def test_source_padding_changes_no_output():
    model = tiny_model()
    src, tgt = random_batch(b=1)
    padded = torch.cat([src, torch.full((1, 5), PAD)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, tgt), model(src, tgt), rtol=1e-5, atol=1e-5)


def test_target_padding_changes_no_output_at_real_positions():
    model = tiny_model()
    src, tgt = random_batch(b=1)
    padded = torch.cat([tgt, torch.full((1, 4), PAD)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(src, padded)[:, :tgt.size(1)], model(src, tgt), rtol=1e-5, atol=1e-5)


def test_decoder_is_causal():
    model = tiny_model()
    src, tgt = random_batch(b=1)
    changed = tgt.clone()
    changed[0, -1] = (tgt[0, -1] + 1) % 40
    with torch.no_grad():
        torch.testing.assert_close(model(src, changed)[:, :-1], model(src, tgt)[:, :-1])


def test_tied_embeddings_share_one_table():
    model = tiny_model()
    assert model.src_embed.weight is model.tgt_embed.weight is model.output.weight
    untied = tiny_model(share_embeddings=False, tie_output=False)
    assert count_parameters(untied) == count_parameters(model) + 2 * 40 * 32


def test_base_model_parameter_count_matches_the_paper():
    # Vaswani et al. report 65M parameters for the base model with a ~37k shared vocabulary.
    cfg = ModelConfig(src_vocab_size=37000, tgt_vocab_size=37000)
    assert 60e6 < count_parameters(Transformer(cfg)) < 66e6


def test_too_long_input_is_a_clear_error():
    model = tiny_model()
    with pytest.raises(ValueError, match="max_len"):
        model.encode(torch.full((1, 65), 5))


def test_beams_share_the_encoder_memory_and_follow_reordering():
    model = tiny_model()
    src, tgt = random_batch(b=2)
    k = 3
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        full = model.decode(tgt, memory, src_mask)  # (2, T, V)
        cache = model.start_cache(memory, src_mask, beam=k)
        rows = torch.arange(2).repeat_interleave(k)  # sentence of each (sentence × beam) row
        for i in range(tgt.size(1)):
            logits, cache = model.decode_step(tgt[rows, i], cache)
            torch.testing.assert_close(logits, full[rows, i], rtol=1e-5, atol=1e-5)
            perm = torch.tensor([2, 0, 1, 4, 5, 3])  # shuffle beams within each sentence: all identical rows
            cache = cache.select(perm)
        # Dropping the first sentence keeps the second one's state intact.
        cache = cache.select(torch.tensor([3, 4, 5]), torch.tensor([1]))
        assert cache.mem_k[0].size(0) == 1 and cache.self_k[0].size(1) == 3


@pytest.mark.parametrize("rows", [[2, 0, 1, 5, 3, 4], [0, 0, 2, 3, 3, 5]], ids=["all-moved", "few-moved-in-place"])
def test_cache_follows_its_rows_when_beams_are_reordered(rows):
    model = tiny_model()
    src, _ = random_batch(b=2)
    _, tgt = random_batch(b=6, t=6, seed=2)  # every (sentence × beam) row its own prefix
    k, half, rows = 3, 3, torch.tensor(rows)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        cache = model.start_cache(memory, src_mask, beam=k)
        for i in range(half):
            _, cache = model.decode_step(tgt[:, i], cache)
        cache = cache.select(rows)
        followed = torch.cat([tgt[rows, :half], tgt[:, half:]], dim=1)  # the prefixes the rows now hold
        steps = []
        for i in range(half, tgt.size(1)):
            logits, cache = model.decode_step(followed[:, i], cache)
            steps.append(logits)
        sentence = torch.arange(2).repeat_interleave(k)
        full = model.decode(followed, memory[sentence], src_mask[sentence])
    torch.testing.assert_close(torch.stack(steps, 1), full[:, half:], rtol=1e-5, atol=1e-5)
