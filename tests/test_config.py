from pathlib import Path

import pytest

from mt.config import flatten, from_dict, load_config, to_dict
from mt.errors import MtError
from mt.train.resume import resume_config


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
    with pytest.raises(MtError, match="train.max_bad_steps=0: must be at least 1"):
        load_config(None, ["train.max_bad_steps=0"])
    with pytest.raises(MtError, match="train.keep_checkpoints=-1: must be at least 0"):
        load_config(None, ["train.keep_checkpoints=-1"])


def test_heads_must_divide_d_model():
    with pytest.raises(MtError, match="d_model=100 is not divisible by model.n_heads=8"):
        load_config(None, ["model.d_model=100"])


@pytest.mark.parametrize("key, on", [("train.ema", 0.999), ("train.rdrop", 1.0), ("train.word_dropout", 0.1),
                                     ("train.both_ways_epochs", 9), ("train.shared", 0.5)])
def test_a_stored_config_with_a_retired_key_still_loads_but_a_file_or_set_cannot_turn_it_on(tmp_path, key, on):
    section, name = key.split(".")
    stored = to_dict(load_config(None, ["train.lr=5e-4"]))
    stored[section][name] = on  # written by an earlier version
    assert from_dict(stored) == load_config(None, ["train.lr=5e-4"])
    assert load_config(write(tmp_path, f"{section}:\n  {name}: 0\n"), [f"{key}=0"]) == load_config()  # off: harmless
    with pytest.raises(MtError, match=rf"c.yaml: {key}={on}: .*; delete the key"):
        load_config(write(tmp_path, f"{section}:\n  {name}: {on}\n"))
    with pytest.raises(MtError, match=rf"--set: {key}={on}: .*; delete the key"):
        load_config(None, [f"{key}={on}"])


def run_with_checkpoint(tmp_path, cfg, tokenizer) -> Path:
    """A run whose last.pt holds a model of `cfg` (its vocabulary `tokenizer`'s), as every checkpoint must."""
    from mt import checkpoint
    from mt.model.transformer import Transformer

    run = tmp_path / "run"
    cfg.model.src_vocab_size = cfg.model.tgt_vocab_size = tokenizer.vocab_size
    spm = {"src": tokenizer.model_proto, "tgt": tokenizer.model_proto}
    checkpoint.save_last({"model": Transformer(cfg.model).state_dict(), "config": to_dict(cfg), "spm": spm, "step": 1,
                          "train": {}}, run, keep=0)
    return run


def test_a_resumed_run_keeps_its_config_and_model_and_takes_the_same_overrides(tmp_path, tokenizer):
    run = run_with_checkpoint(tmp_path, load_config(None, ["model.d_model=128", "model.n_heads=4", "train.lr=1",
                                                           "model.n_enc_layers=1", "model.n_dec_layers=1"]), tokenizer)
    cfg = resume_config(run, ["train.max_steps=7", "decode.beam=2"])
    assert (cfg.model.d_model, cfg.train.lr, cfg.train.max_steps, cfg.decode.beam) == (128, 1.0, 7, 2)
    with pytest.raises(MtError, match="the model of a resumed run cannot change"):
        resume_config(run, ["model.d_model=256"])
    with pytest.raises(MtError, match="expected key=value"):
        resume_config(run, ["train.lr"])
    with pytest.raises(MtError, match="unknown config key 'train.lrr'"):
        resume_config(run, ["train.lrr=1"])
    with pytest.raises(MtError, match="nothing to resume; drop --resume"):
        resume_config(tmp_path / "empty", [])


def test_flatten_gives_dotted_keys():
    assert flatten({"data": "d", "train": {"lr": 1, "x": {"y": 2}}}) == {"data": "d", "train.lr": 1, "train.x.y": 2}


def test_zero_heads_is_an_error_naming_the_key_not_a_division_by_zero():
    with pytest.raises(MtError, match="model.n_heads=0: must be positive"):
        load_config(overrides=["model.n_heads=0"])


def test_yaml_aliases_are_refused_before_they_expand(tmp_path):
    # "Billion laughs": ten levels of ten aliases each would be 10^10 strings in flatten() or an error's repr.
    levels = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    path = write(tmp_path, "data: d\n" + "\n".join(levels) + "\n")
    with pytest.raises(MtError, match=rf"^{path}:3: YAML alias \*a0 refused: .*write the value out$"):
        load_config(path)
    with pytest.raises(MtError, match=r"^--set data=\[&x \[1\], \*x\]:1: YAML alias \*x refused"):
        load_config(None, ["data=[&x [1], *x]"])


def test_invalid_yaml_is_one_line_naming_the_file_and_line(tmp_path):
    path = write(tmp_path, "data: d\ntrain:\n  lr: [1, 2\n")
    with pytest.raises(MtError, match=rf"^{path}:4: not valid YAML \(expected ',' or '\]', but got '<stream end>'\)$"):
        load_config(path)

