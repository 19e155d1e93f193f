"""A SentencePiece model's pieces, read and written back in another order: how `mt import` gives a Marian model's
SentencePiece models mt's special ids (PAD, UNK, BOS, EOS = 0, 1, 2, 3; mt/data/tokenizer.py).

A model file is a protobuf `ModelProto` (sentencepiece_model.proto): the pieces in id order (field 1, each a text,
a score and a type), the trainer's settings (field 2, which name the special pieces and their ids), the normalizer
and the rest. Segmentation depends on the pieces' texts, scores and types, not on their ids, so the pieces may be
put in any order. protobuf is no dependency of mt, and these few fields are read and written here by hand (the
wire format: https://protobuf.dev/programming-guides/encoding/); every other field is copied byte for byte.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# SentencePiece's piece types (ModelProto.SentencePiece.Type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5  # the wire types a ModelProto uses
PIECES, TRAINER_SPEC = 1, 2  # fields of ModelProto
TEXT, SCORE, TYPE = 1, 2, 3  # fields of a piece
# Fields of TrainerSpec: the special ids (unk, bos, eos, pad) and their pieces' texts, in the same order.
SPECIAL_IDS, SPECIAL_PIECES = (40, 41, 42, 43), (45, 46, 47, 48)


@dataclass(frozen=True)
class Piece:
    text: str
    score: float
    type: int = NORMAL


def read_pieces(proto: bytes) -> list[Piece]:
    """The pieces of a serialized SentencePiece model, in id order; ValueError for bytes that are not one."""
    pieces = []
    for number, _, value in fields(proto):
        if number == PIECES:
            piece = {n: v for n, _, v in fields(value)}
            if TEXT not in piece or len(piece.get(SCORE, bytes(4))) != 4:
                raise ValueError(f"not a SentencePiece model: piece {len(pieces)} has no text or a score that is "
                                 f"not a float")
            pieces.append(Piece(piece[TEXT].decode("utf-8"), struct.unpack("<f", piece.get(SCORE, bytes(4)))[0],
                                read_varint(piece[TYPE], 0)[0] if TYPE in piece else NORMAL))
    return pieces


def with_pieces(proto: bytes, pieces: list[Piece]) -> bytes:
    """`proto` with `pieces` in place of its own, in that order. The first four are mt's pad, unk, bos and eos, in
    that order: the trainer's settings are made to say so."""
    pad, unk, bos, eos = pieces[:4]
    if (pad.type, unk.type, bos.type, eos.type) != (CONTROL, UNKNOWN, CONTROL, CONTROL):
        raise ValueError("the first four pieces must be pad, unk, bos and eos: control, unknown, control, control")
    special = dict(zip(SPECIAL_IDS, (1, 2, 3, 0), strict=True))  # unk, bos, eos, pad
    texts = dict(zip(SPECIAL_PIECES, (unk.text, bos.text, eos.text, pad.text), strict=True))
    out = [field(PIECES, LENGTH, piece_message(piece)) for piece in pieces]
    for number, wire, value in fields(proto):
        if number == TRAINER_SPEC:
            value = b"".join([field(n, w, v) for n, w, v in fields(value) if n not in special and n not in texts]
                             + [field(n, VARINT, varint(i)) for n, i in special.items()]
                             + [field(n, LENGTH, text.encode("utf-8")) for n, text in texts.items()])
        if number != PIECES:
            out.append(field(number, wire, value))
    return b"".join(out)


def piece_message(piece: Piece) -> bytes:
    return (field(TEXT, LENGTH, piece.text.encode("utf-8")) + field(SCORE, FIXED32, struct.pack("<f", piece.score))
            + field(TYPE, VARINT, varint(piece.type)))


def fields(message: bytes) -> list[tuple[int, int, bytes]]:
    """A message's fields in order: (number, wire type, value), the value as its raw bytes."""
    out, i = [], 0
    while i < len(message):
        key, i = read_varint(message, i)
        number, wire = key >> 3, key & 7
        start = i
        if wire == VARINT:
            _, i = read_varint(message, i)
        elif wire in (FIXED64, FIXED32):
            i += 8 if wire == FIXED64 else 4
        elif wire == LENGTH:
            size, start = read_varint(message, i)
            i = start + size
        else:
            raise ValueError(f"not a SentencePiece model: wire type {wire} at byte {i}")
        out.append((number, wire, message[start:i]))
    if i != len(message):
        raise ValueError("not a SentencePiece model: its last field is cut short")
    return out


def read_varint(data: bytes, i: int) -> tuple[int, int]:
    """The varint at data[i:] and the index after it."""
    value = shift = 0
    while True:
        if i >= len(data):
            raise ValueError("not a SentencePiece model: a number is cut short")
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if byte < 0x80:
            return value, i


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # a negative int32 is written as its 64-bit two's complement, as protobuf does
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def field(number: int, wire: int, value: bytes) -> bytes:
    return varint(number << 3 | wire) + (varint(len(value)) if wire == LENGTH else b"") + value
