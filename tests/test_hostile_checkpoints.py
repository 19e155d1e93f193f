"""Checkpoints that lie (a config that disagrees with its weights, a missing, extra or misshapen weight, sizes no
file holds, SentencePiece bytes that are no model, entries that unpack or unfold into gigabytes): every command
that loads one refuses it in the same one line, naming the file, the part and what was expected, before it builds
anything. The checkpoints are built here by hand from a tiny model."""

import copy
import time
import zipfile

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import mt.decode.load
from mt import checkpoint
from mt.cli import app
from mt.config import ModelConfig
from mt.data.tokenizer import Tokenizer
from mt.decode.load import load_model
from mt.errors import MtError
from mt.model.transformer import Transformer
from mt.shapes import shapes

from .conftest import assert_refused, prepare_corpus, record_builds, tiny_model
from .test_checkpoint import state_for


@pytest.fixture(scope="module")
def sound(tmp_path_factory) -> dict:
    """A tiny model's checkpoint state, untied (every table its own) so that each weight can be spoilt alone."""
    from mt.data.tokenizer import train_sentencepiece

    words = "the a cat dog sat ran on under mat tree red blue big small".split()
    lines = [" ".join(words[(i * 5 + j) % len(words)] for j in range(1 + i % 6)) for i in range(300)]
    tokenizer = Tokenizer.load(train_sentencepiece(lines, tmp_path_factory.mktemp("spm") / "spm", vocab_size=40))
    return state_for(tiny_model(vocab=tokenizer.vocab_size, share_embeddings=False, tie_output=False), tokenizer)


def spoilt(sound: dict, change) -> dict:
    state = copy.deepcopy(sound)
    change(state)
    return state


def model_of(**changes):
    return lambda state: state["config"]["model"].update(changes)


def weight(name: str, value):
    return lambda state: state["model"].update({name: value}) if value is not None else state["model"].pop(name)


HOSTILE = {
    "a missing weight": (weight("encoder.1.ffn.up.weight", None), "model: no encoder.1.ffn.up.weight"),
    "an extra weight": (weight("encoder.0.gate", torch.zeros(2)), "model: encoder.0.gate is no weight"),
    "a weight of the wrong shape": (weight("decoder.0.cross_attn.kv.weight", torch.zeros(3, 3)),
                                    "decoder.0.cross_attn.kv.weight is (3, 3); model.d_model=32 makes it (64, 32)"),
    "a weight of integers": (weight("encoder.0.ffn.up.bias", torch.zeros(64, dtype=torch.int64)),
                             "encoder.0.ffn.up.bias holds torch.int64 values"),
    "a weight that is a number": (weight("encoder.0.ffn.up.bias", 3), "encoder.0.ffn.up.bias is int"),
    "weights that are a list": (lambda s: s.update(model=[1, 2]), "model: not a state dict"),
    "a d_model the weights lack": (model_of(d_model=64), "model.tgt_vocab_size={vocab} and model.d_model=64 make"),
    "a d_model of 2^20": (model_of(d_model=2**20, n_heads=1), "model.d_model=1048576"),
    "an FFN of 10^9": (model_of(d_ff=10**9), "model.d_ff=1000000000"),
    "a vocabulary of 2^33": (model_of(src_vocab_size=2**33, tgt_vocab_size=2**33),
                             "spm.src has {vocab} pieces, but model.src_vocab_size=8,589,934,592"),
    "a target vocabulary the joint model lacks": (model_of(tgt_vocab_size=50),
                                                  "spm.tgt has {vocab} pieces, but model.tgt_vocab_size=50"),
    "10^6 layers": (model_of(n_enc_layers=10**6), "model.n_enc_layers=1000000, but the weights lack encoder.2"),
    "a layer fewer": (model_of(n_dec_layers=1), "model.n_dec_layers=1, but the weights hold decoder layers 0-1"),
    "a position table larger than the weights": (model_of(max_len=60_000), "model.max_len=60000 makes a position "
                                                                           "table of 1,920,000 values"),
    "2^31 positions": (model_of(max_len=2**31), "config: model.max_len=2147483648: at most 65,536 positions"),
    "zero heads": (model_of(n_heads=0), "config: model.n_heads=0: must be positive"),
    "heads that do not divide d_model": (model_of(n_heads=5), "not divisible by model.n_heads=5"),
    "a width in a string": (model_of(d_model="32"), "config: model.d_model='32': expected int"),
    "a width of 2^5000": (model_of(d_model=2**5000), "not a readable mt checkpoint"),  # torch refuses such ints
    "a dropout of infinity": (model_of(dropout=float("inf")), "model.dropout=inf: expected a finite number"),
    "tied tables that differ": (lambda s: s["config"]["model"].update(tie_output=True),
                                "model.tie_output is true, but output.weight and tgt_embed.weight differ"),
    "a config that is a list": (lambda s: s.update(config=[1]), "config: not a mapping of sections"),
    "a section that is a list": (lambda s: s["config"].update(model=[1]), "config: model=[1]: a section"),
    "SentencePiece bytes of garbage": (lambda s: s["spm"].update(src=b"\x0a\xff\xff garbage"),
                                       "spm.src: not a SentencePiece model (its bytes do not parse)"),
    "SentencePiece bytes cut short": (lambda s: s["spm"].update(tgt=s["spm"]["tgt"][:500]),
                                      "spm.tgt: not a SentencePiece model"),
    "a SentencePiece model that is text": (lambda s: s["spm"].update(src="the model"), "spm.src: str, not a"),
    "no target SentencePiece model": (lambda s: s["spm"].pop("tgt"), "spm.tgt: NoneType, not a"),
    "a step that is text": (lambda s: s.update(step="x"), "step: expected a count of steps"),
    "languages that are a number": (lambda s: s.update(langs=5), "langs: expected {{src: LANG, tgt: LANG}}"),
    "metrics that are a list": (lambda s: s.update(metrics=[1]), "metrics: expected a mapping"),
    "a list nested 50 deep": (lambda s: s.update(metrics={"x": eval("[" * 50 + "]" * 50)}),
                              "nests deeper than 16 levels"),
    "a list referenced 2^40 times": (lambda s: s.update(metrics={"x": unfolding(40, 2)}),
                                     "nests deeper than 16 levels"),
    "a list referenced 100^10 times": (lambda s: s.update(metrics={"x": unfolding(10, 100)}),
                                       "holds more than 100,000 entries"),
    "an ensemble member of another shape": (lambda s: s.update(members=[s.pop("model"), {"w": torch.zeros(2)}],
                                                               metrics={"ensemble": [{"path": "a.pt", "step": 1}] * 2}),
                                            "members[1]: model.n_enc_layers=2, but the weights lack encoder.0"),
    "a reranker missing a weight": (lambda s: s.update(reranker={k: v for k, v in s["model"].items()
                                                                 if k != "output.weight"}),
                                    "reranker: no output.weight"),
}


def unfolding(levels: int, width: int) -> list:
    """A list that holds one list `width` times, that one another `width` times, ...: pickled once each, but
    width^levels entries to any walk over it."""
    value: list = []
    for _ in range(levels):
        value = [value] * width
    return value


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_checkpoint_that_lies_is_one_line_naming_the_file_and_part(sound, tmp_path, case):
    change, phrase = HOSTILE[case]
    path = tmp_path / "hostile.pt"
    checkpoint.save(spoilt(sound, change), path)
    started = time.perf_counter()
    assert_refused(CliRunner().invoke(app, ["info", str(path)]), f"{path}: ",
                   phrase.format(vocab=len(sound["model"]["src_embed.weight"])))
    assert time.perf_counter() - started < 5  # nothing of the claimed sizes was made


def test_every_command_that_loads_a_checkpoint_refuses_it_in_the_same_line(sound, tmp_path):
    """They all load through mt.checkpoint.load, which checks before anything is built."""
    path = tmp_path / "hostile.pt"
    checkpoint.save(spoilt(sound, model_of(d_ff=128)), path)
    line = CliRunner().invoke(app, ["info", str(path)]).output.strip()
    assert "encoder.0.ffn.up.weight is (64, 32); model.d_ff=128 and model.d_model=32 make it (128, 32)" in line
    prepared = prepare_corpus(tmp_path / "corpus", n_train=40, n_valid=5)
    corpus = tmp_path / "corpus"
    src, ref = corpus / "valid.de", corpus / "valid.en"
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint-1.pt").write_bytes(path.read_bytes())
    data, config = tmp_path / "data", tmp_path / "fine.yaml"
    config.write_text(f"data: {prepared}\n", encoding="utf-8")
    commands = {
        "translate": ["translate", "-c", path, "--input", src],
        "evaluate": ["evaluate", "-c", path, "-s", src, "-r", ref],
        "score": ["score", "-c", path, "-s", src, "-t", ref],
        "tune": ["tune", "-c", path, "-o", tmp_path / "tuned.pt", "-s", src, "-r", ref],
        "export": ["export", path, "--to", "ctranslate2", "--out", tmp_path / "ct2"],
        "ensemble": ["ensemble", path, path, "-o", tmp_path / "ensemble.pt"],
        "average": ["average", run, "-o", tmp_path / "average.pt", "--last", "1"],
        "prepare --tokenizer": ["prepare", "--src", "de", "--tgt", "en", "--train", corpus / "train", "--valid",
                                corpus / "valid", "--tokenizer", path, "--out", data],
        "train --init": ["train", config, "--init", path, "--out", tmp_path / "fine"],
    }
    for command, args in commands.items():
        result = CliRunner().invoke(app, [str(arg) for arg in args])
        said = result.output.strip().replace(str(run / "checkpoint-1.pt"), str(path))  # average's: the run's copy
        assert result.exit_code == 2 and said == line, (command, result.output)
    assert not any((tmp_path / name).exists() for name in ("tuned.pt", "ct2", "ensemble.pt", "average.pt", "data",
                                                           "fine"))


def test_a_checkpoint_whose_entries_would_unpack_into_gigabytes_is_refused_unread(sound, tmp_path):
    """torch.save stores its zip entries as they are; a compressed one could hold gigabytes in kilobytes."""
    plain, packed = tmp_path / "plain.pt", tmp_path / "packed.pt"
    checkpoint.save(sound, plain)
    with zipfile.ZipFile(plain) as source, zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as out:
        for entry in source.infolist():
            out.writestr(entry.filename, source.read(entry.filename))
    assert_refused(CliRunner().invoke(app, ["info", str(packed)]), f"{packed}: its entry ", "is compressed",
                   "refused unread")
    assert load_model(plain).parameters > 0  # the same entries, stored: loaded


MODEL_KEYS = ["d_model", "n_heads", "n_enc_layers", "n_dec_layers", "d_ff", "max_len", "src_vocab_size",
              "tgt_vocab_size", "share_embeddings", "tie_output", "output_bias", "norm", "activation", "dropout"]
VALUES = st.one_of(st.sampled_from([0, 1, 2, 4, 32, 64, 128, 39, 40, True, False, "pre", "post", "gelu", 0.1]),
                   st.integers(-2**70, 2**70), st.floats(), st.text(max_size=4), st.none(), st.lists(st.integers()))


@settings(max_examples=80, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(MODEL_KEYS), VALUES, min_size=1, max_size=3),
       st.sampled_from([None, "drop", "reshape", "add"]), st.integers(0, 10_000))
def test_any_config_or_weights_are_refused_in_one_line_or_loaded_and_nothing_is_built_first(
        sound, tmp_path_factory, monkeypatch, changes, damage, which):
    """Whatever a checkpoint's model config says, and whichever weight is dropped, reshaped or added, loading it
    ends in an MtError of one line or a model that runs; within seconds, and a model is built only for a
    checkpoint that loads."""
    built = record_builds(monkeypatch, mt.decode.load)
    state = spoilt(sound, model_of(**changes))
    names = sorted(state["model"])
    name = names[which % len(names)]
    if damage == "drop":
        del state["model"][name]
    elif damage == "reshape":
        state["model"][name] = torch.zeros(*[n + 1 for n in state["model"][name].shape])
    elif damage == "add":
        state["model"][f"{name}.extra"] = torch.zeros(1)
    path = tmp_path_factory.mktemp("any") / "c.pt"
    checkpoint.save(state, path)
    started = time.perf_counter()
    try:
        loaded = load_model(path)
    except MtError as e:
        assert "\n" not in str(e) and str(path) in str(e) and not built, (changes, damage, str(e))
    else:
        src = torch.tensor([[5, 6, 3]])
        assert loaded.model(src, torch.tensor([[2, 7]])).shape[-1] == loaded.config.model.tgt_vocab_size
    assert time.perf_counter() - started < 10, (changes, damage)


@settings(max_examples=50, derandomize=True, deadline=None)
@given(st.integers(0, 2), st.integers(0, 2), st.booleans(), st.booleans(), st.booleans(), st.booleans(),
       st.sampled_from(["pre", "post"]), st.integers(1, 3), st.integers(1, 9))
def test_the_shapes_written_out_are_the_models_own(enc, dec, share, tie, bias, r2l, norm, heads, vocab):
    """mt/shapes.py names every weight of the Transformer, each in its shape: its check is the model's own."""
    m = ModelConfig(d_model=8 * heads, n_heads=heads, n_enc_layers=enc, n_dec_layers=dec, d_ff=24, norm=norm,
                    src_vocab_size=vocab + (0 if share else 3), tgt_vocab_size=vocab, share_embeddings=share,
                    tie_output=tie, output_bias=bias, right_to_left=r2l, max_len=16)
    assert shapes(m) == {name: tuple(t.shape) for name, t in Transformer(m).state_dict().items()}
