import pytest
import torch
import torch.nn.functional as F

import mt.model.cache
from mt.config import ModelConfig
from mt.data.tokenizer import BOS, PAD
from mt.model.transformer import Transformer, count_parameters

from ..conftest import tiny_model


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


@pytest.mark.parametrize("chunk", [1, 2 ** 21], ids=["a-position-at-a-time", "at-once"])
@pytest.mark.parametrize("rows, sentences", [([5, 3, 3, 6, 8, 7], [1, 2]), ([2, 0, 1, 5, 3, 4, 8, 6, 7], [0, 1, 2])],
                         ids=["first-sentence-leaves", "every-beam-moves"])
def test_the_cache_of_the_sentences_kept_decodes_on_in_its_own_memory(chunk, rows, sentences, monkeypatch):
    """Dropping a finished sentence and reordering the other beams, or moving most beams, compacts the cache in
    place, position chunk by chunk: the rows kept decode on as if they had decoded those prefixes from the start."""
    monkeypatch.setattr(mt.model.cache, "CHUNK", chunk)
    model = tiny_model()
    src, _ = random_batch(b=3)
    _, tgt = random_batch(b=9, t=6, seed=2)  # every (sentence × beam) row its own prefix
    k, half = 3, 3
    rows, sentences = torch.tensor(rows), torch.tensor(sentences)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        cache = model.start_cache(memory, src_mask, beam=k)
        for i in range(half):
            _, cache = model.decode_step(tgt[:, i], cache)
        before = cache.self_k[0].data_ptr()
        cache = cache.select(rows, None if len(sentences) == 3 else sentences)
        assert cache.self_k[0].data_ptr() == before and cache.self_k[0].size(1) == rows.numel()
        kept = sentences.repeat_interleave(k) * k + torch.arange(k).repeat(len(sentences))
        followed = torch.cat([tgt[rows, :half], tgt[kept, half:]], dim=1)  # the prefixes the rows now hold
        steps = []
        for i in range(half, tgt.size(1)):
            logits, cache = model.decode_step(followed[:, i], cache)
            steps.append(logits)
        sentence = sentences.repeat_interleave(k)
        full = model.decode(followed, memory[sentence], src_mask[sentence])
    torch.testing.assert_close(torch.stack(steps, 1), full[:, half:], rtol=1e-5, atol=1e-5)


def test_a_cache_of_one_row_per_sentence_widens_to_beams_that_decode_on_as_if_each_had_decoded_from_the_start():
    model = tiny_model()
    src, _ = random_batch(b=2)
    _, tgt = random_batch(b=6, t=5, seed=2)
    k, shared = 3, 2  # the first two positions alike in a sentence's beams, then each beam its own
    rows = torch.arange(2).repeat_interleave(k)
    tgt[:, :shared] = tgt[rows * k, :shared]
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        cache = model.start_cache(memory, src_mask)
        for i in range(shared):
            _, cache = model.decode_step(tgt[::k, i], cache)
        cache = cache.widen(k)
        assert cache.beam == k and cache.self_k[0].size(1) == 2 * k
        steps = []
        for i in range(shared, tgt.size(1)):
            logits, cache = model.decode_step(tgt[:, i], cache)
            steps.append(logits)
        full = model.decode(tgt, memory[rows], src_mask[rows])
        torch.testing.assert_close(torch.stack(steps, 1), full[:, shared:], rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match="one row per sentence"):
            cache.widen(2)


# The checkpoint format: every parameter's name and shape, for a one-layer model (d_model 8, d_ff 16, vocabularies
# 10 and 12). Checkpoints written by every version of mt load only while this stays as it is.
CHECKPOINT_FORMAT = {
    "tgt_embed.weight": (12, 8), "src_embed.weight": (10, 8),
    "encoder.0.self_attn.qkv.weight": (24, 8), "encoder.0.self_attn.qkv.bias": (24,),
    "encoder.0.self_attn.out.weight": (8, 8), "encoder.0.self_attn.out.bias": (8,),
    "encoder.0.ffn.up.weight": (16, 8), "encoder.0.ffn.up.bias": (16,),
    "encoder.0.ffn.down.weight": (8, 16), "encoder.0.ffn.down.bias": (8,),
    "encoder.0.res_attn.norm.weight": (8,), "encoder.0.res_attn.norm.bias": (8,),
    "encoder.0.res_ffn.norm.weight": (8,), "encoder.0.res_ffn.norm.bias": (8,),
    "decoder.0.self_attn.qkv.weight": (24, 8), "decoder.0.self_attn.qkv.bias": (24,),
    "decoder.0.self_attn.out.weight": (8, 8), "decoder.0.self_attn.out.bias": (8,),
    "decoder.0.cross_attn.q.weight": (8, 8), "decoder.0.cross_attn.q.bias": (8,),
    "decoder.0.cross_attn.kv.weight": (16, 8), "decoder.0.cross_attn.kv.bias": (16,),
    "decoder.0.cross_attn.out.weight": (8, 8), "decoder.0.cross_attn.out.bias": (8,),
    "decoder.0.ffn.up.weight": (16, 8), "decoder.0.ffn.up.bias": (16,),
    "decoder.0.ffn.down.weight": (8, 16), "decoder.0.ffn.down.bias": (8,),
    "decoder.0.res_self.norm.weight": (8,), "decoder.0.res_self.norm.bias": (8,),
    "decoder.0.res_cross.norm.weight": (8,), "decoder.0.res_cross.norm.bias": (8,),
    "decoder.0.res_ffn.norm.weight": (8,), "decoder.0.res_ffn.norm.bias": (8,),
    "enc_norm.weight": (8,), "enc_norm.bias": (8,), "dec_norm.weight": (8,), "dec_norm.bias": (8,),  # pre-norm only
    "output.weight": (12, 8),
}


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_parameter_names_and_shapes_are_the_checkpoint_format(norm):
    cfg = ModelConfig(d_model=8, n_heads=2, n_enc_layers=1, n_dec_layers=1, d_ff=16, max_len=16, src_vocab_size=10,
                      tgt_vocab_size=12, norm=norm, share_embeddings=False, tie_output=False)
    shapes = {name: tuple(value.shape) for name, value in Transformer(cfg).state_dict().items()}
    expected = {name: shape for name, shape in CHECKPOINT_FORMAT.items() if norm == "pre" or "_norm." not in name}
    assert shapes == expected


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_training_loss_is_label_smoothed_cross_entropy_summed_over_real_target_tokens(smoothing):
    model = tiny_model()
    src, tgt = random_batch(t=7)
    tgt[1, 4:] = PAD
    tgt_in, target = tgt[:, :-1], tgt[:, 1:]
    loss = model(src, tgt_in, target, smoothing)
    logits = model(src, tgt_in)
    per_token = F.cross_entropy(logits.flatten(0, 1), target.flatten(), label_smoothing=smoothing, reduction="none")
    torch.testing.assert_close(loss, per_token[target.flatten() != PAD].sum())


@pytest.mark.parametrize("fast", [False, True], ids=["plain", "for_training"])
def test_an_output_bias_moves_the_logits_and_the_training_loss_with_them(fast):
    """model.output_bias (an imported Marian model's): the bias is added to every logit, and training sees it."""
    from mt.fast.paths import for_training

    plain = tiny_model(activation="swish")
    model = tiny_model(activation="swish", output_bias=True)
    missing, _ = model.load_state_dict(plain.state_dict(), strict=False)
    assert missing == ["output.bias"]  # the one new weight
    with torch.no_grad():
        model.output.bias.copy_(torch.randn(model.cfg.tgt_vocab_size, generator=torch.Generator().manual_seed(2)))
    model = for_training(model) if fast else model
    src, tgt = random_batch(t=7)
    tgt_in, target = tgt[:, :-1], tgt[:, 1:]
    logits = model(src, tgt_in)
    torch.testing.assert_close(logits, plain(src, tgt_in) + model.output.bias)
    loss = model(src, tgt_in, target, 0.1)
    expected = F.cross_entropy(logits.flatten(0, 1), target.flatten(), label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(loss, expected)
    (grad,) = torch.autograd.grad(loss, model.output.bias)
    (want,) = torch.autograd.grad(expected, model.output.bias)
    torch.testing.assert_close(grad, want)
