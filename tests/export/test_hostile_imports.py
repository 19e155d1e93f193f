"""`mt import` of a Marian directory whose files lie or disagree (config.json's sizes, vocab.json's ids, the
weights, the SentencePiece models, the tokenizer's and generation's settings): one `error:` line naming the file
and the key, nothing written, and nothing built or allocated before config.json is held to the weights.

The directories are built here by hand, without transformers: a tiny model's weights under Marian's names (the
Hugging Face export's mapping), small enough that every import takes milliseconds."""

import json
import shutil
import time
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import mt.export.from_marian
import mt.export.marian_files
from mt.cli import app
from mt.config import ModelConfig
from mt.decode.load import load_model
from mt.errors import MtError
from mt.export.from_marian import import_marian
from mt.export.huggingface import marian_weights
from mt.model.transformer import Transformer

from ..conftest import assert_refused, record_builds

safetensors = pytest.importorskip("safetensors.torch")

D_MODEL, FFN, HEADS, POSITIONS = 16, 32, 2, 32


@pytest.fixture(scope="module")
def marian_spm(tmp_path_factory) -> Path:
    """A SentencePiece model with Marian's special ids (unk 0, bos 1, eos 2, no pad)."""
    import sentencepiece as spm

    words = "der die das hund katze baum rot blau sitzt läuft unter auf".split()
    lines = [" ".join(words[(i * 7 + j) % len(words)] for j in range(1 + i % 5)) for i in range(200)]
    prefix = tmp_path_factory.mktemp("spm") / "marian"
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(prefix), vocab_size=30,
                                   hard_vocab_limit=False, minloglevel=2, num_threads=1)
    return prefix.with_suffix(".model")


@pytest.fixture(scope="module")
def directory(marian_spm, tmp_path_factory) -> Path:
    """A tiny OPUS-MT-like directory: one vocab.json for both sides (</s> 0, <unk> 1, ..., <pad> last), tied tables,
    swish, 1+1 layers; its weights random."""
    import sentencepiece as spm

    root = tmp_path_factory.mktemp("marian")
    sp = spm.SentencePieceProcessor(model_file=str(marian_spm))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]
    vocab = {piece: i for i, piece in enumerate(["</s>", "<unk>", *pieces, "<pad>"])}
    (root / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    shutil.copy(marian_spm, root / "source.spm")
    shutil.copy(marian_spm, root / "target.spm")
    (root / "tokenizer_config.json").write_text(json.dumps({"source_lang": "de", "target_lang": "en"}))
    pad = len(vocab) - 1
    config = dict(model_type="marian", vocab_size=len(vocab), d_model=D_MODEL, encoder_layers=1, decoder_layers=1,
                  encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=FFN,
                  decoder_ffn_dim=FFN, activation_function="swish", max_position_embeddings=POSITIONS,
                  pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0, scale_embedding=True,
                  share_encoder_decoder_embeddings=True, tie_word_embeddings=True)
    (root / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (root / "generation_config.json").write_text(json.dumps({"num_beams": 3, "bad_words_ids": [[pad]]}))
    torch.manual_seed(0)
    m = ModelConfig(d_model=D_MODEL, n_heads=HEADS, n_enc_layers=1, n_dec_layers=1, d_ff=FFN, max_len=POSITIONS,
                    src_vocab_size=len(vocab), tgt_vocab_size=len(vocab), activation="swish")
    weights = marian_weights(Transformer(m).state_dict(), m)  # Marian's names and shapes
    del weights["final_logits_bias"]  # an all-zero bias, as a file may leave out
    safetensors.save_file(weights, str(root / "model.safetensors"))
    return root


def changed(directory: Path, tmp_path: Path, files: dict[str, object]) -> Path:
    """A copy of the directory with some files replaced: a dict is written as JSON, bytes as they are; a dict of
    tensors (values of torch.Tensor, or None to drop one) changes model.safetensors."""
    copy = shutil.copytree(directory, tmp_path / f"changed-{len(list(tmp_path.iterdir()))}")
    for name, content in files.items():
        if isinstance(content, bytes):
            (copy / name).write_bytes(content)
        elif name == "model.safetensors":
            tensors = safetensors.load_file(str(copy / name)) | content
            safetensors.save_file({k: v for k, v in tensors.items() if v is not None}, str(copy / name))
        else:
            (copy / name).write_text(json.dumps(content), encoding="utf-8")
    return copy


def config_with(directory: Path, **changes) -> dict:
    return json.loads((directory / "config.json").read_text()) | changes


def cli(*args):
    return CliRunner().invoke(app, [str(arg) for arg in args])


def test_the_hand_built_directory_imports_and_every_loader_takes_it(directory, tmp_path):
    """The directory the other tests spoil is itself sound, or their refusals would prove nothing."""
    result = cli("import", directory, "--out", tmp_path / "model.pt")
    assert result.exit_code == 0, result.output
    assert "generation_config.json" not in result.output  # its beam and barred pad are mt's too
    loaded = load_model(tmp_path / "model.pt")
    assert loaded.config.model.d_model == D_MODEL and loaded.config.decode.beam == 3
    assert cli("info", tmp_path / "model.pt").exit_code == 0


HOSTILE_CONFIGS = {
    "a vocabulary of 10^12 rows": (dict(vocab_size=10**12), "vocab_size 1000000000000"),
    "a vocabulary of 2^70 rows": (dict(vocab_size=2**70), "vocab_size"),
    "d_model of 2^20": (dict(d_model=2**20, encoder_attention_heads=1, decoder_attention_heads=1),
                        "model.shared.weight is ({rows}, 16); config.json's vocab_size {rows} and d_model 1048576"),
    "an FFN of 10^9": (dict(encoder_ffn_dim=10**9, decoder_ffn_dim=10**9), "encoder_ffn_dim 1000000000"),
    "10^6 layers": (dict(encoder_layers=10**6), "encoder_layers 1000000"),
    "10^9 positions": (dict(max_position_embeddings=10**9), "max_position_embeddings 1000000000"),
    "zero heads": (dict(encoder_attention_heads=0, decoder_attention_heads=0), "encoder_attention_heads 0"),
    "a negative width": (dict(d_model=-16), "d_model -16"),
    "a width in a string": (dict(d_model="16"), "d_model '16'"),
    "a width of true": (dict(d_model=True), "d_model True"),
    "a fractional width": (dict(d_model=16.5), "d_model 16.5"),
    "no vocabulary size": (dict(vocab_size=None), "vocab_size None"),
    "a list of layers": (dict(decoder_layers=[1]), "decoder_layers [1]"),
    "a pad id beyond the vocabulary": (dict(pad_token_id=99, decoder_start_token_id=99), "pad_token_id 99"),
    "an activation that is a list": (dict(activation_function=["swish"]), "activation_function ['swish']"),
    "a flag that is a string": (dict(scale_embedding="yes"), "scale_embedding 'yes'"),
    "a dropout of 2": (dict(dropout=2), "dropout 2"),
    "heads that do not divide d_model": (dict(encoder_attention_heads=3, decoder_attention_heads=3), "divisible"),
    "another decoder vocabulary, one vocab.json": (dict(decoder_vocab_size=12), "decoder_vocab_size 12"),
}


@pytest.mark.parametrize("case", list(HOSTILE_CONFIGS))
def test_a_config_that_lies_about_sizes_or_types_is_one_line_naming_the_key(directory, tmp_path, case):
    changes, phrase = HOSTILE_CONFIGS[case]
    spoilt = changed(directory, tmp_path, {"config.json": config_with(directory, **changes)})
    rows = len(json.loads((directory / "vocab.json").read_text()))
    started = time.perf_counter()
    assert_refused(cli("import", spoilt, "--out", tmp_path / "out" / "model.pt"), phrase.format(rows=rows))
    assert time.perf_counter() - started < 5  # refused before anything of the claimed size was made
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def vocab_with(directory: Path, **changes) -> dict:
    return json.loads((directory / "vocab.json").read_text()) | changes


HOSTILE_FILES = {
    "an id in a string": (lambda d: {"vocab.json": vocab_with(d, **{"</s>": "0"})}, "'</s>' has the id '0'"),
    "an id of true": (lambda d: {"vocab.json": vocab_with(d, **{"<unk>": True})}, "'<unk>' has the id True"),
    "an id of 1.0": (lambda d: {"vocab.json": vocab_with(d, **{"<unk>": 1.0})}, "'<unk>' has the id 1.0"),
    "an id twice": (lambda d: {"vocab.json": vocab_with(d, **{"<unk>": 0})}, "each once"),
    "a vocabulary nested 100,000 deep": (lambda d: {"vocab.json": b"[" * 100_000}, "vocab.json: not readable JSON"),
    "a SentencePiece model of garbage": (lambda d: {"source.spm": b"\x0a\xff\xff garbage"},
                                         "source.spm: not a SentencePiece model"),
    "an empty SentencePiece model": (lambda d: {"target.spm": b""}, "target.spm: not a SentencePiece model"),
    "a truncated SentencePiece model": (lambda d: {"source.spm": (d / "source.spm").read_bytes()[:300]},
                                        "source.spm: not a SentencePiece model"),
    "a missing weight": (lambda d: {"model.safetensors": {"model.decoder.layers.0.fc2.weight": None}},
                         "model.decoder.layers.0.fc2.weight"),
    "a weight of the wrong shape": (lambda d: {"model.safetensors": {"model.encoder.layers.0.fc1.weight":
                                                                     torch.zeros(3, 3)}},
                                    "model.encoder.layers.0.fc1.weight is (3, 3); config.json's d_model 16 and "
                                    "encoder_ffn_dim 32 make it (32, 16)"),
    "a weight of integers": (lambda d: {"model.safetensors": {"model.encoder.layers.0.fc1.bias":
                                                              torch.zeros(FFN, dtype=torch.int64)}},
                             "model.encoder.layers.0.fc1.bias holds no floating-point values"),
    "an output bias of two rows": (lambda d: {"model.safetensors": {"final_logits_bias": torch.zeros(2, 5)}},
                                   "final_logits_bias is (2, 5); config.json's vocab_size {rows} and d_model 16 make "
                                   "it (1, {rows})"),
    "a layer beyond the config's": (lambda d: {"model.safetensors": {"model.encoder.layers.1.fc1.bias":
                                                                     torch.zeros(FFN)}},
                                    "config.json's encoder_layers 1, but the weights hold encoder layers 0-1"),
    "an output layer that is not the table it is tied to": (
        lambda d: {"model.safetensors": {"lm_head.weight": torch.randn(len(vocab_with(d)), D_MODEL)}},
        "lm_head.weight is not the decoder's table, but config.json's tie_word_embeddings makes it that table"),
    "weights that are not safetensors": (lambda d: {"model.safetensors": b"\x10\x00\x00\x00\x00\x00\x00\x00{}"},
                                         "not readable weights"),
    "an unk token that is a list": (lambda d: {"tokenizer_config.json": {"unk_token": ["<unk>"]}},
                                    "unk_token ['<unk>']"),
    "a language that is a number": (lambda d: {"tokenizer_config.json": {"source_lang": 7}}, "source_lang 7"),
    "a beam in a string": (lambda d: {"generation_config.json": {"num_beams": "4"}}, "num_beams '4'"),
    "a beam of 10^9": (lambda d: {"generation_config.json": {"num_beams": 10**9}}, "num_beams 1000000000"),
}


@pytest.mark.parametrize("case", list(HOSTILE_FILES))
def test_a_file_that_lies_is_one_line_naming_it_and_nothing_is_written(directory, tmp_path, case):
    files, phrase = HOSTILE_FILES[case]
    spoilt = changed(directory, tmp_path, files(directory))
    rows = len(json.loads((directory / "vocab.json").read_text()))
    assert_refused(cli("import", spoilt, "--out", tmp_path / "model.pt"), phrase.format(rows=rows))
    assert not (tmp_path / "model.pt").exists()


def test_a_json_file_of_gigabytes_is_refused_unread(directory, tmp_path, monkeypatch):
    monkeypatch.setattr(mt.export.marian_files, "MAX_FILE", 10_000)  # gigabytes, as the test can afford them
    spoilt = changed(directory, tmp_path, {"config.json": (directory / "config.json").read_bytes() + b" " * 10_000})
    assert_refused(cli("import", spoilt, "--out", tmp_path / "model.pt"), "config.json", "refused unread")


def test_pytorch_model_bin_that_would_unpack_into_gigabytes_is_refused_unread(directory, tmp_path):
    """A zip whose entries are compressed (torch.save never writes one) could hold gigabytes of zeros in kilobytes."""
    spoilt = shutil.copytree(directory, tmp_path / "bin")
    weights = safetensors.load_file(str(spoilt / "model.safetensors"))
    (spoilt / "model.safetensors").unlink()
    torch.save(weights, spoilt / "plain.bin")
    with zipfile.ZipFile(spoilt / "plain.bin") as plain, \
            zipfile.ZipFile(spoilt / "pytorch_model.bin", "w", zipfile.ZIP_DEFLATED) as packed:
        for entry in plain.infolist():
            packed.writestr(entry.filename, plain.read(entry.filename))
    assert_refused(cli("import", spoilt, "--out", tmp_path / "model.pt"), "pytorch_model.bin", "compressed",
                   "refused unread")
    (spoilt / "pytorch_model.bin").unlink()
    (spoilt / "plain.bin").rename(spoilt / "pytorch_model.bin")  # as torch writes it: imported
    assert cli("import", spoilt, "--out", tmp_path / "model.pt").exit_code == 0


def test_what_generation_config_asks_and_mt_does_not_do_is_named(directory, tmp_path):
    spoilt = changed(directory, tmp_path, {"generation_config.json": {"num_beams": 4, "max_length": 512,
                                                                      "length_penalty": 1.2}})
    result = cli("import", spoilt, "--out", tmp_path / "model.pt")
    assert result.exit_code == 0, result.output
    assert "generation_config.json's max_length 512, length_penalty 1.2: not carried over" in result.output


SIZE_KEYS = ["vocab_size", "decoder_vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_ffn_dim",
             "decoder_ffn_dim", "encoder_attention_heads", "decoder_attention_heads", "max_position_embeddings",
             "pad_token_id", "decoder_start_token_id", "eos_token_id", "scale_embedding", "dropout",
             "activation_function", "tie_word_embeddings", "share_encoder_decoder_embeddings"]
VALUES = st.one_of(  # half of them values a MarianConfig may hold, half anything
    st.sampled_from([D_MODEL, FFN, POSITIONS, HEADS, 1, 0, 0.1, "relu", "gelu", "silu", True, False]),
    st.one_of(st.integers(-2, 70), st.sampled_from([10**6, 10**12, 2**63, 2**80]), st.booleans(), st.none(),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
              st.lists(st.integers(0, 3), max_size=2)))


@settings(max_examples=60, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(SIZE_KEYS), VALUES, min_size=1, max_size=3))
def test_any_config_values_are_refused_in_one_line_or_imported_and_nothing_is_built_first(
        directory, tmp_path_factory, monkeypatch, changes):
    """Whatever config.json says, the import refuses it with an MtError or writes a checkpoint that loads; within
    seconds, and a model is built only once the config has been held to the weights (then it imports)."""
    built = record_builds(monkeypatch, mt.export.from_marian)
    tmp_path = tmp_path_factory.mktemp("any")
    spoilt = changed(directory, tmp_path, {"config.json": config_with(directory, **changes)})
    started = time.perf_counter()
    try:
        import_marian(spoilt, tmp_path / "model.pt")
    except MtError as e:
        assert "\n" not in str(e) and not built, (changes, str(e))
        assert not (tmp_path / "model.pt").exists()
    else:
        assert load_model(tmp_path / "model.pt").config.model.d_model == built[0].d_model
    assert time.perf_counter() - started < 10, changes
