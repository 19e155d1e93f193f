"""Shared fixtures: tiny models and the real Multi30k mirror (tests that need it skip where it is absent)."""

from pathlib import Path

import pytest
import torch

from mt.config import ModelConfig
from mt.model import Transformer

MIRROR = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture
def mirror() -> Path:
    if not (MIRROR / "multi30k" / "train.de.gz").is_file():
        pytest.skip(f"Multi30k mirror not found at {MIRROR}")
    return MIRROR


def tiny_model(seed: int = 0, vocab: int = 40, norm: str = "post", **changes) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, n_heads=4, n_enc_layers=2, n_dec_layers=2, d_ff=64, dropout=0.0, max_len=64,
                      src_vocab_size=vocab, tgt_vocab_size=vocab, norm=norm, **changes)
    return Transformer(cfg).eval()
