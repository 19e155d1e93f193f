"""`mt import`: a Hugging Face MarianMTModel with OPUS-MT's conventions (its own SentencePiece models, ids from
vocab.json, decoding from <pad>, an output bias) becomes an mt checkpoint of the same model: the same pieces, the
same logits, the same translations token for token; what mt cannot compute is refused and nothing is written.

The Marian models are built here (no download): random, with a random output bias, then trained for a few
seconds with transformers on the synthetic corpus, so that their outputs end at lengths of their own (or run to the
limit) as a trained model's do."""

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from mt import checkpoint
from mt.cli import app
from mt.config import Config, to_dict
from mt.data.batches import pad
from mt.data.tokenizer import BOS, EOS, PAD
from mt.decode.load import load_model
from mt.decode.search import beam_search
from mt.export.convert import export
from mt.export.from_marian import import_marian

from ..conftest import assert_refused, made_once, tiny_model, write_corpus

transformers = pytest.importorskip("transformers")

MAX_OUTPUT = 30  # output tokens, EOS included, for mt and for generate alike


@dataclass(frozen=True)
class Variant:
    separate: bool = False  # vocab.json and target_vocab.json (else one vocab.json for both SentencePiece models)
    shared: bool = True  # one embedding table for encoder and decoder
    tied: bool = True  # the output layer is the decoder's table
    activation: str = "swish"
    layers: tuple[int, int] = (2, 2)
    model_type: str = "unigram"
    lacking: int = 0  # pieces of the SentencePiece models left out of vocab.json (Marian reads them as <unk>)
    scale_embedding: bool = True


VARIANTS = {
    "OPUS-MT: one vocab.json for two SentencePiece models, one tied table, swish, pieces it lacks": Variant(lacking=3),
    "separate vocabularies, untied output, unscaled embeddings, relu, 1+3 layers": Variant(
        separate=True, shared=False, tied=False, activation="relu", layers=(1, 3), scale_embedding=False),
    "separate vocabularies, tied output, gelu, 3+1 layers, BPE": Variant(
        separate=True, shared=False, activation="gelu", layers=(3, 1), model_type="bpe"),
}


def train_spm(lines: list[str], prefix: Path, size: int, model_type: str = "unigram") -> Path:
    """A SentencePiece model as Marian's are: SentencePiece's own special ids (unk 0, bos 1, eos 2, no pad)."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(prefix), vocab_size=size,
                                   model_type=model_type, hard_vocab_limit=False, minloglevel=2, num_threads=1)
    return prefix.parent / f"{prefix.name}.model"


def ordinary_pieces(path: Path) -> list[str]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(path))
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]


def marian_vocab(pieces: list[str], rng: random.Random, pad_last: bool) -> dict[str, int]:
    """vocab.json as OPUS-MT's: </s> 0, <unk> 1, the pieces in an order not the SentencePiece model's, <pad> last
    (or third)."""
    pieces = list(dict.fromkeys(pieces))
    rng.shuffle(pieces)
    order = ["</s>", "<unk>"] + ([] if pad_last else ["<pad>"]) + pieces + (["<pad>"] if pad_last else [])
    return {piece: i for i, piece in enumerate(order)}


def write_marian(root: Path, v: Variant, src_lines: list[str], tgt_lines: list[str], vocab_size: int = 40,
                 d_model: int = 32, train_steps: int = 0, seed: int = 0) -> Path:
    """A MarianMTModel directory as OPUS-MT ships one, with SentencePiece models trained on the lines: a random
    model, trained on the lines for `train_steps`."""
    from transformers import MarianConfig, MarianMTModel

    root.mkdir(parents=True, exist_ok=True)
    src_spm = train_spm(src_lines, root / "source", vocab_size, v.model_type)
    tgt_spm = train_spm(tgt_lines, root / "target", vocab_size, v.model_type)
    rng = random.Random(seed)
    directory = root / "marian"
    directory.mkdir()
    if v.separate:
        vocabs = [marian_vocab(ordinary_pieces(path), rng, False) for path in (src_spm, tgt_spm)]
        (directory / "target_vocab.json").write_text(json.dumps(vocabs[1]), encoding="utf-8")
    else:
        pieces = ordinary_pieces(src_spm) + ordinary_pieces(tgt_spm)
        vocabs = [marian_vocab([p for p in pieces if p not in pieces[5:5 + v.lacking]], rng, True)] * 2
    (directory / "vocab.json").write_text(json.dumps(vocabs[0]), encoding="utf-8")
    shutil.copy(src_spm, directory / "source.spm")
    shutil.copy(tgt_spm, directory / "target.spm")
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"source_lang": "de", "target_lang": "en", "separate_vocabs": v.separate}), encoding="utf-8")
    pad_id = vocabs[1]["<pad>"]
    config = MarianConfig(
        vocab_size=len(vocabs[0]), decoder_vocab_size=len(vocabs[1]), d_model=d_model, encoder_layers=v.layers[0],
        decoder_layers=v.layers[1], encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model, activation_function=v.activation, max_position_embeddings=64,
        pad_token_id=pad_id, decoder_start_token_id=pad_id, eos_token_id=0, forced_eos_token_id=0,
        scale_embedding=v.scale_embedding, share_encoder_decoder_embeddings=v.shared, tie_word_embeddings=v.tied)
    torch.manual_seed(seed)
    model = MarianMTModel(config)
    model.final_logits_bias.normal_()  # a buffer: trained by Marian, not by transformers
    model.save_pretrained(directory)
    if train_steps:
        train_marian(directory, src_lines, tgt_lines, train_steps, seed)
    return directory


def train_marian(directory: Path, src_lines: list[str], tgt_lines: list[str], steps: int, seed: int) -> None:
    from transformers import MarianMTModel, MarianTokenizer

    tokenizer, model = MarianTokenizer.from_pretrained(directory), MarianMTModel.from_pretrained(directory)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        pairs = torch.randint(len(src_lines), (32,), generator=g).tolist()
        batch = tokenizer([src_lines[i] for i in pairs], text_target=[tgt_lines[i] for i in pairs], padding=True,
                          return_tensors="pt")
        batch["labels"] = batch["labels"].masked_fill(batch["labels"] == model.config.pad_token_id, -100)
        optimizer.zero_grad()
        model.train()(**batch).loss.backward()
        optimizer.step()
    model.eval().save_pretrained(directory)


@pytest.fixture(scope="module", params=list(VARIANTS))
def marian(request, tmp_path_factory) -> tuple[Path, Path, list[str], list[str]]:
    """A Marian directory (its model trained for a moment), its import, and sentences to translate and score."""
    def make(root: Path) -> None:
        corpus = write_corpus(root / "corpus")
        read = lambda name: (corpus / name).read_text(encoding="utf-8").splitlines()  # noqa: E731
        write_marian(root, VARIANTS[request.param], read("train.de"), read("train.en"), train_steps=150)

    root = made_once(tmp_path_factory, f"marian-{list(VARIANTS).index(request.param)}", make)
    model = tmp_path_factory.mktemp("imported") / "model.pt"  # imported as this pass computes
    import_marian(root / "marian", model)
    read = lambda name: (root / "corpus" / name).read_text(encoding="utf-8").splitlines()  # noqa: E731
    return root / "marian", model, read("valid.de"), read("valid.en")


def marian_generates(directory: Path, lines: list[str], beam: int) -> list[list[int]]:
    from transformers import MarianMTModel, MarianTokenizer

    tokenizer, model = MarianTokenizer.from_pretrained(directory), MarianMTModel.from_pretrained(directory)
    generated = model.generate(**tokenizer(lines, return_tensors="pt", padding=True), num_beams=beam, do_sample=False,
                               length_penalty=0.0, max_length=MAX_OUTPUT + 1)  # + 1: the start token counts
    outputs = [row[1:] for row in generated.tolist()]  # after the start token, up to EOS (then padding)
    eos = model.config.eos_token_id
    return [row[:row.index(eos)] if eos in row else row for row in outputs]


def mt_translates(path: Path, lines: list[str], beam: int) -> list[list[int]]:
    """mt's translations, as Marian's ids."""
    loaded = load_model(path)
    marian_ids = loaded.state["imported"]["marian_ids"]["tgt"]
    outputs = []
    for ids in loaded.src_tok.encode(lines):
        best = beam_search(loaded.model, torch.tensor([ids + [EOS]]), beam=beam, len_penalty=0.0, max_len_a=0.0,
                           max_len_b=MAX_OUTPUT)[0][0]
        outputs.append([marian_ids[i] for i in best.tokens])
    return outputs


@pytest.mark.numerics
@pytest.mark.parametrize("beam", [1, 4])
def test_mt_translates_token_for_token_as_marian_generates(marian, beam):
    directory, path, lines, _ = marian
    assert mt_translates(path, lines, beam) == marian_generates(directory, lines, beam)


@pytest.mark.numerics
def test_logits_are_marians_on_a_padded_batch(marian):
    from transformers import MarianMTModel, MarianTokenizer

    directory, path, lines, targets = marian
    tokenizer, model = MarianTokenizer.from_pretrained(directory), MarianMTModel.from_pretrained(directory).eval()
    loaded = load_model(path, precision=None)
    ids = loaded.state["imported"]["marian_ids"]
    batch = tokenizer(lines, return_tensors="pt", padding=True)
    src = pad(loaded.src_tok.encode(lines), [], [EOS])
    src_ids = torch.tensor(ids["src"])[src]  # a piece vocab.json lacks: Marian reads it as <unk>
    as_marian = src_ids.where(src_ids >= 0, tokenizer.convert_tokens_to_ids("<unk>"))
    assert torch.equal(batch["input_ids"], as_marian.masked_fill(src == PAD, model.config.pad_token_id))
    tgt = pad(loaded.tgt_tok.encode(targets), [BOS], [])
    real, present = tgt != PAD, torch.tensor([i for i, marian in enumerate(ids["tgt"]) if marian >= 0])
    marian_tgt = torch.tensor(ids["tgt"])[tgt].masked_fill(~real, model.config.pad_token_id)  # BOS: Marian's start
    with torch.no_grad():
        mine = loaded.model(src, tgt)[..., present]
        theirs = model(**batch, decoder_input_ids=marian_tgt, decoder_attention_mask=real.long()).logits
    assert (mine - theirs[..., torch.tensor(ids["tgt"])[present]])[real].abs().max() < 1e-4
    assert (loaded.model.output.bias[[i for i, marian in enumerate(ids["tgt"]) if marian < 0]] < -100).all()


@pytest.mark.numerics
def test_its_ctranslate2_export_translates_as_mt_does(marian, tmp_path):
    """Swish and the output bias reach CTranslate2 too."""
    pytest.importorskip("ctranslate2")
    _, path, lines, _ = marian
    source = tmp_path / "valid.de"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert cli("export", path, "--to", "ctranslate2", "--out", tmp_path / "ct2").exit_code == 0
    same = ["--input", source, "--beam", "4", "--len-penalty", "0"]
    mine, theirs = cli("translate", "-c", path, *same), cli("translate", "-c", tmp_path / "ct2", *same)
    assert mine.exit_code == theirs.exit_code == 0 and theirs.stdout == mine.stdout, mine.output + theirs.output


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_the_pieces_are_marians_piece_for_piece_on_real_text(mirror, tmp_path, model_type):
    """Multi30k, 12,000 sentences a side: both SentencePiece models, rewritten to mt's ids, cut the text into
    MarianTokenizer's pieces, and mt's decoding of them is MarianTokenizer's. But where SentencePiece finds a run of
    characters it does not know, Marian looks the run up in vocab.json (<unk> when it is not there), and mt, which
    cannot, cuts out the parts of the run that vocab.json has: a line or two in a thousand here (SentencePiece
    models trained on 3,000 lines, which leave out rare characters), each holding a <unk> of Marian's."""
    import gzip

    from transformers import MarianTokenizer

    def read(name: str) -> list[str]:
        return gzip.decompress((mirror / "multi30k" / name).read_bytes()).decode("utf-8").splitlines()

    train_de, train_en = read("train.de.gz"), read("train.en.gz")
    directory = write_marian(tmp_path, Variant(model_type=model_type), train_de[:3000], train_en[:3000],
                             vocab_size=1000, d_model=8)
    import_marian(directory, tmp_path / "model.pt")
    loaded, tokenizer = load_model(tmp_path / "model.pt", precision=None), MarianTokenizer.from_pretrained(directory)
    for tok, lines, target in ((loaded.src_tok, read("val.de.gz") + train_de[3000:13000], False),
                               (loaded.tgt_tok, read("val.en.gz") + train_en[3000:13000], True)):
        marian_ids = [ids[:-1] for ids in tokenizer(**{"text_target" if target else "text": lines})["input_ids"]]
        theirs = [tokenizer.convert_ids_to_tokens(ids) for ids in marian_ids]
        mine = tok.encode(lines)
        differ = [line for line, (ids, pieces) in enumerate(zip(mine, theirs, strict=True))
                  if [tok.sp.id_to_piece(i) for i in ids] != pieces]
        assert all("<unk>" in theirs[line] for line in differ) and len(differ) <= len(lines) / 500, differ
        same = [line for line in range(len(lines)) if line not in set(differ)]
        assert len(same) > 11_000 and sum(len(mine[line]) for line in same) > 100_000
        if target:  # the ids too, and mt's decoding
            marian = loaded.state["imported"]["marian_ids"]["tgt"]
            assert all([marian[i] for i in mine[line]] == marian_ids[line] for line in same)
            assert tok.decode([mine[i] for i in same]) == tokenizer.batch_decode(
                [marian_ids[i] for i in same], skip_special_tokens=True)


ROUND_TRIPS = {
    "joint vocabulary, one table": dict(),
    "swish, an output bias": dict(activation="swish", output_bias=True),
    "separate vocabularies and tables, gelu": dict(activation="gelu", share_embeddings=False, tie_output=False),
}


@pytest.mark.parametrize("changes", list(ROUND_TRIPS))
def test_an_mt_model_exported_to_hugging_face_imports_back_bit_for_bit(tokenizer, tmp_path, changes):
    from mt.data.tokenizer import Tokenizer, train_sentencepiece

    changes = ROUND_TRIPS[changes]
    target = tokenizer
    if not changes.get("share_embeddings", True):  # a target vocabulary of its own
        lines = [" ".join(random.Random(i).choices(list("abcdefghijklmnop"), k=9)) for i in range(300)]
        target = Tokenizer.load(train_sentencepiece(lines, tmp_path / "target", vocab_size=30))
    model = tiny_model(src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=target.vocab_size, **changes)
    if model.cfg.output_bias:
        torch.nn.init.normal_(model.output.bias)
    state = {"model": model.state_dict(), "config": to_dict(Config(model=model.cfg)), "step": 7, "metrics": {},
             "spm": {"src": tokenizer.model_proto, "tgt": target.model_proto}, "langs": {"src": "de", "tgt": "en"}}
    checkpoint.save(state, tmp_path / "mt.pt")
    export(tmp_path / "mt.pt", "huggingface", tmp_path / "hf")
    back = import_marian(tmp_path / "hf", tmp_path / "back.pt")
    assert back["spm"] == state["spm"] and back["langs"] == state["langs"]  # the SentencePiece models, byte for byte
    assert back["config"]["model"] == state["config"]["model"]
    assert back["model"].keys() == state["model"].keys()
    assert all(torch.equal(back["model"][name], weight) for name, weight in state["model"].items())
    assert back["imported"]["marian_ids"]["tgt"] == list(range(target.vocab_size))


def cli(*args) -> object:
    return CliRunner().invoke(app, [str(arg) for arg in args])


@pytest.fixture(scope="module")
def opus(tmp_path_factory) -> Path:
    """The OPUS-MT variant's directory, for the tests that change it."""
    root = tmp_path_factory.mktemp("opus")
    corpus = write_corpus(root / "corpus")
    read = lambda name: (corpus / name).read_text(encoding="utf-8").splitlines()  # noqa: E731
    return write_marian(root, Variant(), read("train.de"), read("train.en"))


def changed(opus: Path, tmp_path: Path, config: dict | None = None, weights: dict | None = None,
            vocab: dict | None = None) -> Path:
    """A copy of the directory with config.json's keys, the weights and vocab.json's pieces (by id) changed."""
    from safetensors.torch import load_file, save_file

    directory = shutil.copytree(opus, tmp_path / "changed")
    pieces = json.loads((directory / "vocab.json").read_text())
    (directory / "vocab.json").write_text(json.dumps({(vocab or {}).get(i, p): i for p, i in pieces.items()}))
    raw = json.loads((directory / "config.json").read_text()) | (config or {})
    (directory / "config.json").write_text(json.dumps({k: v for k, v in raw.items() if v is not None}))
    tensors = load_file(str(directory / "model.safetensors")) | (weights or {})
    save_file({k: v.contiguous() for k, v in tensors.items() if v is not None}, str(directory / "model.safetensors"))
    return directory


def marian_positions(n: int, d_model: int) -> torch.Tensor:
    from mt.export.huggingface import permutation
    from mt.model.transformer import sinusoids

    return sinusoids(n, d_model)[:, permutation(d_model)]


REFUSED = {
    "another activation": (dict(activation_function="gelu_new"), {}, "activation_function 'gelu_new'"),
    "pre-norm": (dict(normalize_before=True), {}, "normalize_before true"),
    "a final layer norm": (dict(add_final_layer_norm=True), {}, "add_final_layer_norm true"),
    "a layer norm on the embeddings": (dict(normalize_embedding=True), {}, "normalize_embedding true"),
    "its weights": ({}, {"model.encoder.layernorm_embedding.weight": torch.ones(32)},
                    "model.encoder.layernorm_embedding.weight"),
    "a learned position table": ({}, {"model.encoder.embed_positions.weight": torch.randn(64, 32)},
                                 "a learned position table"),
    "heads per side": (dict(decoder_attention_heads=2), {}, "encoder_attention_heads 4 and decoder_attention_heads 2"),
    "unscaled tied embeddings": (dict(scale_embedding=False), {}, "scale_embedding false"),
    "a missing layer": (dict(encoder_layers=3), {}, "model.encoder.layers.2"),
    "a multi-target model": ({}, {}, "a multi-target model", {5: ">>fra<<"}),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_mt_cannot_compute_is_refused_in_one_line_and_nothing_is_written(opus, tmp_path, case):
    config, weights, phrase, *vocab = REFUSED[case]
    directory = changed(opus, tmp_path, config, weights, *vocab)
    assert_refused(cli("import", directory, "--out", tmp_path / "out" / "model.pt"), phrase)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.numerics
def test_a_stored_sinusoid_table_in_float16_is_marians_own(opus, tmp_path):
    """Older files (OPUS-MT's pytorch_model.bin) keep the position table, and in float16: it is the sinusoids."""
    table = marian_positions(64, 32).half()
    directory = changed(opus, tmp_path, weights={f"model.{side}.embed_positions.weight": table.clone()
                                                 for side in ("encoder", "decoder")})
    result = cli("import", directory, "--out", tmp_path / "model.pt")
    assert result.exit_code == 0, result.output


def test_an_output_that_is_an_input_or_inside_the_directory_is_refused(opus, tmp_path):
    directory = shutil.copytree(opus, tmp_path / "marian")
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    assert_refused(cli("import", directory, "--out", directory / "model.pt"), "is inside", str(directory))
    assert_refused(cli("import", directory, "--out", directory / "vocab.json"), "is the input")
    assert_refused(cli("import", directory, "--out", directory), "is the input")
    (directory / "vocab.json").unlink()
    assert_refused(cli("import", directory, "--out", tmp_path / "model.pt"), "no vocab.json")
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == {k: v for k, v in before.items()
                                                                     if k != "vocab.json"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["marian"]


def test_every_command_takes_an_imported_model_and_it_fine_tunes(opus, tmp_path):
    """The commands of docs/finetune.md, on a random OPUS-MT-like model and the synthetic corpus."""
    corpus = write_corpus(tmp_path / "corpus", n_train=200, n_valid=10)
    model, valid = tmp_path / "model.pt", corpus / "valid.de"
    result = cli("import", opus, "--out", model)
    assert result.exit_code == 0 and result.stdout.startswith(f"wrote {model}: de→en"), result.output
    assert f"imported from {opus} (a Marian model" in cli("info", model).stdout
    for args in (["score", "-c", model, "--src", valid, "--tgt", corpus / "valid.en", "-q"],
                 ["evaluate", "-c", model, "--src", valid, "--ref", corpus / "valid.en", "--beam", "2"],
                 ["tune", "-c", model, "--src", valid, "--ref", corpus / "valid.en", "--out", tmp_path / "tuned.pt",
                  "--beams", "1,2", "--len-penalties", "0,1", "-q"]):
        result = cli(*args)
        assert result.exit_code == 0, f"{args[0]}: {result.output}"
    translated = cli("translate", "-c", model, "--input", valid, "--beam", "2")
    assert translated.exit_code == 0 and len(translated.stdout.splitlines()) == 10, translated.output
    assert cli("ensemble", model, model, "--out", tmp_path / "twice.pt").exit_code == 0
    assert cli("translate", "-c", tmp_path / "twice.pt", "--input", valid, "--beam", "2").stdout == translated.stdout
    assert cli("export", model, "--to", "huggingface", "--out", tmp_path / "hf").exit_code == 0
    from transformers import MarianMTModel, MarianTokenizer

    def marian_text(directory: Path) -> list[str]:
        tokenizer, marian = MarianTokenizer.from_pretrained(directory), MarianMTModel.from_pretrained(directory)
        generated = marian.generate(**tokenizer(valid.read_text().splitlines(), return_tensors="pt", padding=True),
                                    num_beams=2, max_length=MAX_OUTPUT + 1, bad_words_ids=None)
        return tokenizer.batch_decode(generated, skip_special_tokens=True)

    assert marian_text(tmp_path / "hf") == marian_text(opus)  # mt's export of it is Marian's model again
    result = cli("prepare", "--train", corpus / "train", "--valid", corpus / "valid", "--src", "de", "--tgt", "en",
                 "--tokenizer", model, "--out", tmp_path / "data", "-q")
    assert result.exit_code == 0, result.output
    saved = checkpoint.load(model)["config"]
    config = {"model": {k: v for k, v in saved["model"].items() if not k.endswith("vocab_size")}}
    (tmp_path / "finetune.yaml").write_text(yaml.safe_dump(config))
    result = cli("train", tmp_path / "finetune.yaml", "--init", model, "--out", tmp_path / "run", "-q",
                 "--set", f"data={tmp_path / 'data'}", "--set", "train.max_steps=3", "--set", "train.valid_every=3",
                 "--set", "train.max_tokens=512", "--set", "train.valid_bleu=false", "--set", "train.lr=1e-4",
                 "--set", "train.warmup=1", "--set", "train.precision=fp32")
    assert result.exit_code == 0, result.output
    tuned = checkpoint.load(tmp_path / "run" / "best.pt")
    assert tuned["init"]["from"] == str(model) and tuned["config"]["model"] == saved["model"]


def test_mt_serve_serves_an_imported_model(opus, tmp_path):
    pytest.importorskip("fastapi")
    import asyncio

    import httpx

    from mt.options import ServeOptions
    from mt.serve.app import create_app, load_models

    import_marian(opus, tmp_path / "model.pt")
    options = ServeOptions()
    server = create_app(load_models([tmp_path / "model.pt"], [], options), options)
    lines = ["der hund sitzt", "die katze läuft unter dem baum"]

    async def translate() -> list[str]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=server), base_url="http://mt") as client:
            response = await client.post("/translate", json={"q": lines, "source": "de", "target": "en"})
            assert response.status_code == 200, response.text
            return response.json()["translatedText"]

    source = tmp_path / "input.de"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    translated = cli("translate", "-c", tmp_path / "model.pt", "--input", source)
    assert asyncio.run(translate()) == translated.stdout.splitlines()
