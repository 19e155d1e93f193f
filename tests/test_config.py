import pytest

from mt.config import load_config, to_dict
from mt.errors import MtError


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_yaml_then_overrides_win(tmp_path):
    path = write(tmp_path, "data: d\nmodel:\n  d_model: 128\n  n_heads: 4\ntrain:\n  lr: 1.0e-3\n")
    cfg = load_config(path, ["train.lr=5e-4", "model.norm=pre", "train.valid_bleu=false"])
    assert cfg.data == "d"
    assert cfg.model.d_model == 128
    assert cfg.train.lr == 5e-4
    assert cfg.model.norm == "pre"
    assert cfg.train.valid_bleu is False
    assert cfg.model.d_ff == 2048  # untouched defaults stay


def test_unknown_key_lists_the_valid_ones(tmp_path):
    with pytest.raises(MtError, match=r"unknown config key 'train.lrr'.*\blr\b.*warmup"):
        load_config(write(tmp_path, "train:\n  lrr: 0.1\n"))
    with pytest.raises(MtError, match="sections are: .*model"):
        load_config(None, ["modle.d_model=4"])


def test_bad_values_name_the_key_and_what_is_allowed(tmp_path):
    with pytest.raises(MtError, match=r"model.d_model='big': expected int"):
        load_config(None, ["model.d_model=big"])
    with pytest.raises(MtError, match="model.activation='tanh': must be one of relu, gelu"):
        load_config(None, ["model.activation=tanh"])
    with pytest.raises(MtError, match="train.valid_bleu=1: expected bool"):
        load_config(None, ["train.valid_bleu=1"])
    with pytest.raises(MtError, match="expected key=value"):
        load_config(None, ["train.lr"])
    with pytest.raises(MtError, match="train.patience=-1: must be 0 .never stop early. or more"):
        load_config(None, ["train.patience=-1"])
    with pytest.raises(MtError, match="train.valid_beam=0: must be positive"):
        load_config(None, ["train.valid_beam=0"])


def test_heads_must_divide_d_model():
    with pytest.raises(MtError, match="d_model=100 is not divisible by model.n_heads=8"):
        load_config(None, ["model.d_model=100"])


def test_shipped_configs_load():
    from pathlib import Path

    for path in sorted((Path(__file__).parents[1] / "configs").glob("*.yaml")):
        cfg = load_config(path)
        assert to_dict(cfg)["model"]["d_model"] > 0, path
