"""SentencePiece subword models: train, load, encode, decode.

Every model `mt` trains reserves the same four ids (mt/vocab.py), so data on disk, the Transformer and search agree
on them without asking the tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from mt.errors import MtError
from mt.vocab import BOS, EOS, PAD, UNK, read_sentencepiece

FEW = 256  # below this many lines, a call per line: each list call of SentencePiece starts a thread pool


def tag(lang: str) -> str:
    """The piece that asks a two-way model for `lang` (Marian's spelling, as OPUS-MT's multi-target models)."""
    return f">>{lang}<<"


class Tokenizer:
    """A loaded SentencePiece model. Holds the serialized model so a checkpoint can carry it."""

    def __init__(self, model_proto: bytes, source: str = "SentencePiece model"):
        """`source` names where the bytes come from ("best.pt: spm.src") in the error that refuses them."""
        self.model_proto = model_proto
        self.sp = read_sentencepiece(model_proto, source)

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        return cls(Path(path).read_bytes(), str(path))

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def pieces(self) -> list[str]:
        """Every piece, in id order: the vocabulary as other engines' files list it."""
        return [self.sp.id_to_piece(i) for i in range(self.vocab_size)]

    def encode(self, lines: Sequence[str], alpha: float | None = None, seed: int = 0) -> list[list[int]]:
        """Pieces' ids only: BOS/EOS are added where a sequence is batched, not here.

        With `alpha`, each line's segmentation is sampled instead of the best one (subword regularization, Kudo
        2018): the lower alpha, the more varied and the longer. The draw is a function of `seed`: SentencePiece
        seeds each call's sampler from its global seed, set here, and samples on one thread to keep it so.
        """
        if alpha is None:
            lines = list(lines)
            if len(lines) < FEW:
                return [self.sp.encode(line, out_type=int) for line in lines]
            return self.sp.encode(lines, out_type=int)
        spm.set_random_generator_seed(seed)
        return self.sp.encode(list(lines), out_type=int, enable_sampling=True, alpha=alpha, nbest_size=-1,
                              num_threads=1)

    def tag_id(self, lang: str) -> int:
        """The id of `lang`'s target tag (`tag`), which leads a two-way model's sources; an error if it has none."""
        piece = tag(lang)
        if self.sp.piece_to_id(piece) == UNK:
            raise MtError(f"the vocabulary has no {piece} tag; prepare the data with `mt prepare --two-way`")
        return self.sp.piece_to_id(piece)

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        seqs = [[i for i in seq if i > EOS] for seq in ids]
        return [self.sp.decode(seq) for seq in seqs] if len(seqs) < FEW else self.sp.decode(seqs)


def train_sentencepiece(
    lines: Iterable[str],
    model_prefix: str | Path,
    vocab_size: int,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    seed_sentences: int = 1_000_000,
    user_symbols: Sequence[str] = (),
) -> Path:
    """Train a SentencePiece model on `lines` (an iterator, streamed) and write `<model_prefix>.model`.

    The training sample is capped at `seed_sentences` lines, chosen by SentencePiece itself, so memory is
    bounded whatever the corpus size. `user_symbols` are pieces of their own (e.g. the tags of `tag`).
    """
    model_prefix = Path(model_prefix)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(model_prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        input_sentence_size=seed_sentences,
        shuffle_input_sentence=True,
        pad_id=PAD,
        unk_id=UNK,
        bos_id=BOS,
        eos_id=EOS,
        user_defined_symbols=list(user_symbols),
        hard_vocab_limit=False,  # a small corpus may not support the requested size; take what it has
        minloglevel=2,
        num_threads=2,
    )
    (model_prefix.parent / f"{model_prefix.name}.vocab").unlink(missing_ok=True)
    return model_prefix.parent / f"{model_prefix.name}.model"


def same_pieces(a: Tokenizer, b: Tokenizer) -> bool:
    """Whether every id means the same piece (piece scores may differ: they only steer segmentation)."""
    if a.model_proto == b.model_proto:
        return True
    return a.vocab_size == b.vocab_size and all(a.sp.id_to_piece(i) == b.sp.id_to_piece(i)
                                                 for i in range(a.vocab_size))
