"""The four ids every mt vocabulary reserves, and SentencePiece bytes read into a model that keeps them: the one
reading that mt/data/tokenizer.py's `Tokenizer` and the checkpoint's checks (mt/checkpoint.py) share, so that
bytes that are no SentencePiece model, or one numbered otherwise, are one error naming where they came from.
"""

from __future__ import annotations

import sentencepiece as spm

from mt.errors import MtError

PAD, UNK, BOS, EOS = 0, 1, 2, 3


def read_sentencepiece(model_proto: bytes, source: str) -> spm.SentencePieceProcessor:
    """The SentencePiece model serialized in `model_proto`, with mt's special ids; `source` names where the bytes
    come from ("best.pt: spm.src") in the error that refuses them."""
    if not isinstance(model_proto, bytes) or not model_proto:
        raise MtError(f"{source}: {type(model_proto).__name__ if model_proto != b'' else 'no bytes'}, not a "
                      f"SentencePiece model")
    try:
        sp = spm.SentencePieceProcessor(model_proto=model_proto)
    except RuntimeError as e:  # SentencePiece's own refusal: bytes that do not parse, or a model it cannot use
        reason = str(e).strip().splitlines()[0].removeprefix("INTERNAL: ") if str(e).strip() else ""
        reason = "its bytes do not parse" if "ParseFromArray" in reason or not reason else reason
        raise MtError(f"{source}: not a SentencePiece model ({reason})") from None
    ids = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
    if ids != (PAD, UNK, BOS, EOS):
        raise MtError(f"{source} has special ids (pad, unk, bos, eos) = {ids}; mt needs {(PAD, UNK, BOS, EOS)}. "
                      "Train it with `mt prepare`.")
    return sp
