import random

import pytest
import sentencepiece as spm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mt.data.spm_proto import read_pieces
from mt.data.tokenizer import BOS, EOS, FEW, PAD, UNK, Tokenizer, train_sentencepiece
from mt.errors import MtError

LINES = ["the cat sat on the mat", "a dog runs under the big tree", "the small red cat jumps"]


def test_encode_gives_pieces_only_and_decode_inverts_it(tokenizer):
    ids = tokenizer.encode(LINES)
    assert all(ids) and not {PAD, BOS, EOS} & {i for seq in ids for i in seq}
    assert tokenizer.decode(ids) == LINES
    # Special ids (as search output may hold them) are not text.
    assert tokenizer.decode([[BOS, *ids[0], EOS, PAD, PAD]]) == LINES[:1]


def test_a_few_lines_and_many_are_encoded_and_decoded_alike(tokenizer):
    many = [*LINES, ""] * (FEW // 4 + 1)  # past FEW: SentencePiece's list calls; below it, a call per line
    ids = tokenizer.encode(many)
    assert ids == [tokenizer.encode([line])[0] for line in many] and ids[3] == []
    assert tokenizer.decode(ids) == many == [tokenizer.decode([seq])[0] for seq in ids]


def test_special_ids_are_fixed_whatever_the_training_text(tmp_path):
    rng = random.Random(1)
    lines = ["".join(rng.choice("xyzw ") for _ in range(rng.randint(3, 30))) for _ in range(300)]
    tok = Tokenizer.load(train_sentencepiece(lines, tmp_path / "other", vocab_size=20))
    sp = tok.sp
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (PAD, UNK, BOS, EOS)
    assert not (tmp_path / "other.vocab").exists()  # only the .model is kept


def test_sampled_segmentations_vary_repeatably_and_decode_to_the_text(tokenizer):
    lines = LINES * 20
    best = tokenizer.encode(lines)
    first, again, other = (tokenizer.encode(lines, alpha=0.1, seed=s) for s in (7, 7, 8))
    assert first == again and first != other
    assert sum(a != b for a, b in zip(first, best, strict=True)) > len(lines) // 4
    assert tokenizer.decode(first) == lines


def test_a_model_with_other_special_ids_is_refused(tmp_path):
    rng = random.Random(2)
    lines = [" ".join(rng.choice(["ab", "cd", "ef"]) for _ in range(5)) for _ in range(200)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(tmp_path / "foreign"),
                                   vocab_size=10, minloglevel=2)  # SentencePiece's own ids: unk 0, bos 1, eos 2
    with pytest.raises(MtError, match=r"special ids .* mt needs \(0, 1, 2, 3\)\. Train it with `mt prepare`"):
        Tokenizer.load(tmp_path / "foreign.model")


MUTATIONS = st.lists(st.tuples(st.sampled_from(["set", "cut", "insert"]), st.floats(0, 1, exclude_max=True),
                               st.binary(min_size=1, max_size=12)), min_size=1, max_size=6)


def mutated(proto: bytes, mutations: list) -> bytes:
    data = bytearray(proto)
    for kind, where, value in mutations:
        i = int(where * len(data))
        if kind == "set":
            data[i:i + len(value)] = value[:len(data) - i]
        elif kind == "cut":
            del data[i:i + len(value) * 8]
        else:
            data[i:i] = value
    return bytes(data)


@settings(max_examples=200, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(MUTATIONS)
def test_bytes_that_are_not_a_sentencepiece_model_are_one_error_naming_their_source(tokenizer, mutations):
    """A model's bytes with bytes set, cut or inserted anywhere: a tokenizer that encodes and decodes, or an
    MtError that names where the bytes came from; never a crash, for mt's own reader of the pieces neither."""
    data = mutated(tokenizer.model_proto, mutations)
    try:
        loaded = Tokenizer(data, "best.pt: spm.src")
    except MtError as e:
        assert str(e).startswith("best.pt: spm.src") and "\n" not in str(e)
    else:
        loaded.decode(loaded.encode(LINES))
    try:
        read_pieces(data)
    except ValueError:
        pass
