"""The shipped configs load, and the WMT14 recipes build the paper's models and train."""

from pathlib import Path

import pytest
import torch

from mt.config import load_config
from mt.data.batches import Batch, pad, shift_targets
from mt.data.tokenizer import EOS, PAD
from mt.model.transformer import Transformer, count_parameters
from mt.train.loop import train_step

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PAPER_PARAMETERS = {"base": 65e6, "big": 213e6}  # Vaswani et al. (2017), table 3


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_config_loads(path):
    load_config(path)


def tiny_batch(vocab: int, seed: int = 0) -> Batch:
    """Four short sentence pairs of random pieces."""
    g = torch.Generator().manual_seed(seed)
    srcs = [torch.randint(4, vocab, (n,), generator=g).tolist() for n in (5, 7, 4, 6)]
    tgts = [torch.randint(4, vocab, (n,), generator=g).tolist() for n in (6, 5, 7, 4)]
    tgt_in, tgt_out = shift_targets(tgts)
    return Batch(pad(srcs, [], [EOS]), tgt_in, tgt_out, int((tgt_out != PAD).sum()))


def papers_config(name: str):
    """The recipe's config, with the paper's shared vocabulary of ~37k pieces."""
    cfg = load_config(CONFIGS / f"wmt14_en_de_{name}.yaml")
    cfg.model.src_vocab_size = cfg.model.tgt_vocab_size = 37_000
    return cfg


@pytest.mark.parametrize("name", ["base", "big"])
def test_wmt14_recipe_builds_the_papers_model(name):
    cfg = papers_config(name)
    train_cfg = cfg.train
    # The paper's schedule: peak = d_model^-0.5 × warmup^-0.5, and ~25k tokens a step on 8 GPUs (plus ~10% for
    # padding and the longer side, which max_tokens also counts).
    assert train_cfg.lr == pytest.approx((cfg.model.d_model * train_cfg.warmup) ** -0.5, rel=0.01)
    assert 25_000 <= 8 * train_cfg.max_tokens * train_cfg.accumulate <= 30_000

    # 63.1M (base) and 214.2M (big) parameters. The paper says 65M and 213M without saying how it counts; ours has
    # one table for source, target and output, biases in every linear layer but the output. Base is 3% under the
    # paper: within what a different count explains. Counted without memory (the meta device).
    with torch.device("meta"):
        model = Transformer(cfg.model)
    assert count_parameters(model) == pytest.approx(PAPER_PARAMETERS[name], rel=0.04)


# big is base at other sizes, and takes three times as long to build and step: out of CI
@pytest.mark.parametrize("name", ["base", pytest.param("big", marks=pytest.mark.slow)])
def test_wmt14_recipe_trains(name):
    """Two training steps on one tiny batch, with the recipe's loss settings and its dropout, drawing the same
    dropout masks both times: the second step sees a lower loss, the first update having fitted the batch. Plain SGD
    keeps this to seconds and half the memory of Adam's state (Adam is the loop's, tested elsewhere)."""
    cfg = papers_config(name)
    torch.manual_seed(0)
    model = Transformer(cfg.model).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    batch = tiny_batch(37_000)
    losses = []
    for _ in range(2):
        torch.manual_seed(1)
        loss, applied = train_step(model, optimizer, scaler, [batch], cfg, torch.device("cpu"), None, 0.1)
        assert applied
        losses.append(loss.item() / batch.n_tgt_tokens)
    assert losses[1] < losses[0] - 1.0
