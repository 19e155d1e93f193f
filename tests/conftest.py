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


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    from mt.tokenizer import Tokenizer, train_sentencepiece

    words = "the a cat dog sat ran on under mat tree red blue big small runs jumps".split()
    rng = __import__("random").Random(0)
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))) for _ in range(500)]
    path = train_sentencepiece(lines, tmp_path_factory.mktemp("spm") / "spm", vocab_size=60)
    return Tokenizer.load(path)


@pytest.fixture
def loaded(tokenizer):
    """A tiny untrained model with a real tokenizer, as `mt.checkpoint.load_model` would return it."""
    from mt.checkpoint import Loaded
    from mt.config import Config

    model = tiny_model(vocab=tokenizer.vocab_size)
    return Loaded(model, Config(model=model.cfg), tokenizer, tokenizer, {})
