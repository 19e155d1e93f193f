"""`mt export`: the exported model is the same model, token for token; bad input changes nothing."""

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mt import checkpoint
from mt.cli import app
from mt.data.tokenizer import BOS, EOS, PAD
from mt.decode.load import load_model
from mt.decode.search import beam_search
from mt.errors import MtError
from mt.export.convert import export

from ..conftest import assert_refused

pytestmark = pytest.mark.numerics

ctranslate2 = pytest.importorskip("ctranslate2")

MAX_OUTPUT = 30  # one output limit for every engine; the trained model ends its outputs well before it

VARIANTS = {
    "post-norm, relu, joint vocabulary, one shared table": dict(),
    "pre-norm, gelu, separate input and output tables": dict(norm="pre", activation="gelu", share_embeddings=False,
                                                             tie_output=False),
    "post-norm, separate vocabularies": dict(joint=False),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def trained(request, trained_tiny) -> tuple[Path, list[str]]:
    """A tiny model trained on the synthetic corpus until it translates it, and the sentences to translate."""
    best = trained_tiny(300, **VARIANTS[request.param])
    return best, (best.parents[1] / "corpus" / "valid.de").read_text(encoding="utf-8").splitlines()


def mt_ids(path: Path, lines: list[str], beam: int) -> list[list[int]]:
    loaded = load_model(path)
    outputs = []
    for ids in loaded.src_tok.encode(lines):
        best = beam_search(loaded.model, torch.tensor([ids + [EOS]]), beam=beam, len_penalty=0.0, max_len_a=0.0,
                           max_len_b=MAX_OUTPUT)[0][0]
        assert len(best.tokens) < MAX_OUTPUT - 1, "the model must end its outputs for the comparison to hold"
        outputs.append(best.tokens)
    return outputs


def ctranslate2_ids(directory: Path, lines: list[str], beam: int) -> list[list[int]]:
    src = ctranslate2_tokenizer(directory / "source.spm")
    tgt = ctranslate2_tokenizer(directory / "target.spm")
    results = ctranslate2.Translator(str(directory)).translate_batch(
        [src.encode(line, out_type=str) for line in lines], beam_size=beam, length_penalty=0.0,
        max_decoding_length=MAX_OUTPUT)
    return [[tgt.piece_to_id(piece) for piece in r.hypotheses[0]] for r in results]


def ctranslate2_tokenizer(path: Path):
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=str(path))


@pytest.mark.parametrize("beam", [1, 4])
def test_ctranslate2_translates_token_for_token_as_mt(trained, beam, tmp_path):
    path, lines = trained
    export(path, "ctranslate2", tmp_path / "ct2")
    assert ctranslate2_ids(tmp_path / "ct2", lines, beam) == mt_ids(path, lines, beam)


def test_the_export_says_how_to_load_it_and_records_its_source(trained, tmp_path):
    path, _ = trained
    out = export(path, "ctranslate2", tmp_path / "ct2", quantization="int8")
    manifest = json.loads((out / "mt_export.json").read_text())
    assert manifest["source"] == str(path) and manifest["quantization"] == "int8"
    assert manifest["langs"] == {"src": "de", "tgt": "en"}
    readme = (out / "README.md").read_text()
    assert "ctranslate2.Translator" in readme and "length penalty is not mt's" in readme
    assert (out / "source.spm").read_bytes() == checkpoint.load(path)["spm"]["src"]


def huggingface_ids(directory: Path, lines: list[str], beam: int) -> list[list[int]]:
    from transformers import MarianMTModel, MarianTokenizer

    tokenizer, model = MarianTokenizer.from_pretrained(directory), MarianMTModel.from_pretrained(directory)
    generated = model.generate(**tokenizer(lines, return_tensors="pt", padding=True), num_beams=beam,
                               length_penalty=0.0, max_length=MAX_OUTPUT + 1)  # + 1: the start token counts
    outputs = [row[1:] for row in generated.tolist()]  # after the start token, up to EOS (then padding)
    return [row[:row.index(EOS)] if EOS in row else row for row in outputs]


def is_pre_norm(path: Path) -> bool:
    return checkpoint.load(path)["config"]["model"]["norm"] == "pre"


@pytest.mark.parametrize("beam", [1, 4])
def test_hugging_face_generates_token_for_token_as_mt(trained, beam, tmp_path):
    path, lines = trained
    if is_pre_norm(path):
        pytest.skip("Marian is post-norm only: a pre-norm model is refused (tested below)")
    export(path, "huggingface", tmp_path / "hf")
    assert huggingface_ids(tmp_path / "hf", lines, beam) == mt_ids(path, lines, beam)


def test_hugging_face_logits_match_mts_on_a_padded_batch(trained, tmp_path):
    from transformers import MarianMTModel, MarianTokenizer

    from mt.data.batches import pad

    path, lines = trained
    if is_pre_norm(path):
        with pytest.raises(MtError, match="pre-norm model cannot be a Hugging Face MarianMTModel.*--to ctranslate2"):
            export(path, "huggingface", tmp_path / "hf")
        assert not (tmp_path / "hf").exists()
        return
    out = export(path, "huggingface", tmp_path / "hf")
    tokenizer, model = MarianTokenizer.from_pretrained(out), MarianMTModel.from_pretrained(out).eval()
    loaded = load_model(path, precision=None)
    batch = tokenizer(lines, return_tensors="pt", padding=True)
    assert torch.equal(batch["input_ids"], pad(loaded.src_tok.encode(lines), [], [EOS]))  # same ids, </s> added
    targets = pad(loaded.tgt_tok.encode([line.upper() for line in lines]), [BOS], [])  # any target, padded
    with torch.no_grad():
        mine = loaded.model(batch["input_ids"], targets)
        theirs = model(**batch, decoder_input_ids=targets).logits
    real = targets != PAD
    assert (mine - theirs)[real].abs().max() < 1e-4


def test_the_hugging_face_directory_is_complete_and_says_what_not_to_do(trained, tmp_path):
    path, _ = trained
    if is_pre_norm(path):
        pytest.skip("refused")
    out = export(path, "huggingface", tmp_path / "hf")
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["num_beams"] == checkpoint.load(path)["config"]["decode"]["beam"]
    assert generation["decoder_start_token_id"] == BOS and generation["max_length"] > 20
    card = (out / "README.md").read_text()
    assert "MarianMTModel.from_pretrained" in card and "ct2-transformers-converter" in card
    assert {"config.json", "model.safetensors", "source.spm", "target.spm", "vocab.json"} <= {
        p.name for p in out.iterdir()}


def cli(*args: str):
    return CliRunner().invoke(app, ["export", *map(str, args)])


def test_bad_input_is_refused_in_one_line_and_writes_nothing(trained, tmp_path):
    path, _ = trained
    junk = tmp_path / "notes.pt"
    junk.write_text("not a checkpoint\n")
    assert_refused(cli(junk, "--to", "ctranslate2", "--out", tmp_path / "a"), "not a readable mt checkpoint")
    assert_refused(cli(path, "--to", "onnx", "--out", tmp_path / "b"), "onnx")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine\n")
    assert_refused(cli(path, "--to", "ctranslate2", "--out", taken), f"{taken}: exists and is not empty", "--force")
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.pt", "taken"]
    replaced = cli(path, "--to", "ctranslate2", "--out", taken, "--force")
    assert replaced.exit_code == 0, replaced.output
    assert (taken / "model.bin").is_file() and not (taken / "keep.txt").exists()


def test_an_export_that_fails_midway_leaves_the_previous_directory_as_it_was(trained, tmp_path, monkeypatch):
    from mt.export import ctranslate2 as to_ctranslate2

    path, _ = trained
    out = export(path, "ctranslate2", tmp_path / "ct2")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def write_half(state, directory, quantization):
        directory.mkdir()
        (directory / "model.bin").write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(to_ctranslate2, "write", write_half)
    with pytest.raises(MtError, match="No space left on device"):
        export(path, "ctranslate2", out, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]


def test_mt_translates_and_scores_an_export_as_it_does_its_checkpoint(trained, tmp_path):
    path, lines = trained
    out = export(path, "ctranslate2", tmp_path / "ct2")
    source = tmp_path / "valid.de"
    source.write_text("\n".join(lines[:8] + ["", "   "] + lines[8:]) + "\n", encoding="utf-8")  # blank lines kept
    runner = CliRunner()
    same = ["--input", str(source), "--beam", "4", "--len-penalty", "0"]
    mine = runner.invoke(app, ["translate", "--checkpoint", str(path), *same])
    theirs = runner.invoke(app, ["translate", "--checkpoint", str(out), "--engine", "ctranslate2", *same])
    assert mine.exit_code == theirs.exit_code == 0, mine.output + theirs.output
    assert theirs.stdout == mine.stdout and len(theirs.stdout.splitlines()) == len(lines) + 2
    reference = tmp_path / "valid.en"
    reference.write_text(mine.stdout, encoding="utf-8")
    scored = runner.invoke(app, ["evaluate", "--checkpoint", str(out), "--src", str(source), "--ref", str(reference),
                                 "--len-penalty", "0", "--beam", "4", "--json"])
    assert json.loads(scored.stdout)["bleu"]["score"] == 100.0


def test_what_an_export_cannot_do_is_refused(trained, tmp_path):
    path, lines = trained
    out = export(path, "ctranslate2", tmp_path / "ct2")
    runner = CliRunner()
    assert_refused(runner.invoke(app, ["translate", "-c", str(path), "--engine", "ctranslate2"], input="x\n"),
                   "is not a CTranslate2 export", f"mt export {path} --to ctranslate2")
    assert_refused(runner.invoke(app, ["translate", "-c", str(out), "--alignments", str(tmp_path / "a.txt")],
                                 input="x\n"), "need mt's own model")
    assert_refused(runner.invoke(app, ["translate", "-c", str(out), "--precision", "int8"], input="x\n"),
                   "exported with (float32)", "--quantization")
    assert_refused(runner.invoke(app, ["info", str(out)]), "a model written by `mt export`, not a checkpoint")
    assert_refused(runner.invoke(app, ["export", str(out), "--to", "huggingface", "--out", str(tmp_path / "hf")]),
                   "mt_export.json names the checkpoint")
