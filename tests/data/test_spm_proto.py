"""A SentencePiece model's pieces, reordered: the same text, the same pieces; mt's special ids where it puts them."""

import random

import pytest
import sentencepiece as spm

from mt.data.spm_proto import CONTROL, UNKNOWN, UNUSED, USER_DEFINED, Piece, read_pieces, with_pieces
from mt.data.tokenizer import BOS, EOS, PAD, UNK, Tokenizer

WORDS = "the a cat dog sat ran on under mat tree red blue big small runs jumps quietly".split()


def lines(seed: int = 0, n: int = 400) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) for _ in range(n)]


@pytest.fixture(params=["unigram", "bpe"])
def marian_spm(request, tmp_path) -> bytes:
    """A model with SentencePiece's own special ids (unk 0, bos 1, eos 2, no pad), as Marian's are."""
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines()), model_prefix=str(tmp_path / "m"), vocab_size=60,
                                   model_type=request.param, hard_vocab_limit=False, minloglevel=2, num_threads=1)
    return (tmp_path / "m.model").read_bytes()


def reordered(proto: bytes, extra: list[Piece] = ()) -> bytes:
    """`proto` with mt's specials first and its other pieces in reverse, `extra` among them."""
    sp = spm.SentencePieceProcessor(model_proto=proto)
    pieces = read_pieces(proto)
    head = [Piece("<pad>", 0.0, CONTROL), pieces[sp.unk_id()], pieces[sp.bos_id()], pieces[sp.eos_id()]]
    rest = [p for i, p in enumerate(pieces) if i not in (sp.unk_id(), sp.bos_id(), sp.eos_id())][::-1]
    return with_pieces(proto, head + rest[:5] + list(extra) + rest[5:])


def test_the_pieces_are_read_as_sentencepiece_numbers_them(marian_spm):
    sp = spm.SentencePieceProcessor(model_proto=marian_spm)
    pieces = read_pieces(marian_spm)
    assert [p.text for p in pieces] == [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    assert [p.score for p in pieces] == pytest.approx([sp.get_score(i) for i in range(sp.get_piece_size())])
    assert pieces[0].type == UNKNOWN and pieces[1].type == pieces[2].type == CONTROL


def test_reordered_pieces_cut_text_as_before_with_mts_special_ids(marian_spm):
    before, after = spm.SentencePieceProcessor(model_proto=marian_spm), Tokenizer(reordered(marian_spm))
    assert (after.sp.pad_id(), after.sp.unk_id(), after.sp.bos_id(), after.sp.eos_id()) == (PAD, UNK, BOS, EOS)
    text = lines(seed=1) + ["quietly, the ZEBRA runs!", ""]  # unknown characters too
    assert after.sp.encode(text, out_type=str) == before.encode(text, out_type=str)
    assert after.encode(text) == [[after.sp.piece_to_id(before.id_to_piece(i)) for i in ids]
                                  for ids in before.encode(text)]  # the same pieces, by their new ids
    assert after.sp.decode(after.encode(text)) == before.decode(before.encode(text))


def test_unused_pieces_are_never_cut_and_user_defined_ones_always_are(marian_spm):
    """Another model's pieces, unused (scored below all, so that BPE merges them last), change nothing; a
    user-defined piece is cut out wherever it stands; both decode to their text."""
    pieces = read_pieces(marian_spm)
    lowest, own = min(p.score for p in pieces) - 1, {p.text for p in pieces}
    texts = [text for text in ("▁the▁cat", "at▁", "un", "▁ru", "ie", "▁rund") if text not in own]
    assert len(texts) >= 4
    extra = [Piece(text, lowest, UNUSED) for text in texts] + [Piece("Z", 0.0, USER_DEFINED)]
    before, after = spm.SentencePieceProcessor(model_proto=marian_spm), Tokenizer(reordered(marian_spm, extra))
    text = lines(seed=2)
    assert after.sp.encode(text, out_type=str) == before.encode(text, out_type=str)
    assert after.sp.encode("aZb", out_type=str) == ["▁a", "Z", "b"]
    ids = [after.sp.piece_to_id(p.text) for p in extra]
    assert after.sp.decode(ids) == "".join(texts + ["Z"]).replace("▁", " ").lstrip()
