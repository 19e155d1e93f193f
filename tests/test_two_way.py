"""One model for both directions (`mt prepare --two-way`, train.two_way): each source led by the tag of the
language it goes to, both ways trained, either way translated (`--to`), tuned and reported."""

import json
import shutil

import numpy as np
import pytest
import sacrebleu
import torch
from typer.testing import CliRunner

from mt import checkpoint
from mt.cli import app
from mt.config import Config, ModelConfig
from mt.data.batches import BothWays, fit_vocab, load_tokenizers, train_splits, valid_split
from mt.data.lines import read_text
from mt.data.prepare import prepare, summary
from mt.decode.evaluate import score
from mt.decode.load import load_model
from mt.decode.search import SearchOptions
from mt.decode.translate import translate_stream
from mt.decode.tune import tune_checkpoint
from mt.errors import MtError
from mt.export.convert import export
from mt.report import report_run

from .conftest import LEXICON, assert_refused, made_once, train_until, write_corpus
from .test_makefile import dry_run, needs_make

GERMAN, ENGLISH = set(LEXICON), set(LEXICON.values())

pytestmark = pytest.mark.numerics  # the model is trained here: make test runs this again as an AVX2-only CPU would


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The synthetic corpus, with data/ (prepared two-way) and run/ (a tiny de↔en model trained on it until it
    translates it both ways) inside: made once for both passes of make test (`made_once`); tests only read it."""
    return made_once(tmp_path_factory, "two-way", make_run, lambda root: both_ways(root / "run", root))


@pytest.fixture(scope="module")
def data(corpus):
    return corpus / "data"


@pytest.fixture(scope="module")
def run(corpus):
    return corpus / "run"


def make_run(root) -> None:
    write_corpus(root, n_train=400, n_valid=20)
    prepare(root / "data", "de", "en", train=str(root / "train"), valid=str(root / "valid"), test=str(root / "valid"),
            vocab_size=40, two_way=True, progress=False)
    cfg = Config(data=str(root / "data"), model=ModelConfig(d_model=32, n_heads=4, n_enc_layers=2, n_dec_layers=2,
                                                            d_ff=64, dropout=0.0, max_len=64))
    cfg.train.max_tokens, cfg.train.warmup, cfg.train.lr = 256, 20, 5e-3
    cfg.train.valid_bleu, cfg.train.threads, cfg.train.valid_every, cfg.train.two_way = False, 1, 500, True
    train_until(cfg, root / "run", 250, lambda run: both_ways(run, root), f"translate both ways past {BLEU} BLEU, "
                "into the language asked for", rounds=12)


def both_ways(run, corpus) -> bool:
    """What the tests ask of the model: the BLEU, and not a word of the source language, either way."""
    german, english = read_text(corpus / "valid.de"), read_text(corpus / "valid.en")
    return all(translates(translated(run / "last.pt", lines, to), refs, wrong)
               for lines, to, refs, wrong in ((german, None, english, GERMAN), (english, "de", german, ENGLISH)))


BLEU = 25  # on the synthetic valid set, greedy: "the" is der, die or das, so never all right


def translated(path, lines: list[str], to: str | None) -> list[str]:
    loaded = load_model(path, to=to)
    opts = SearchOptions.from_config(loaded.config.decode, beam=1)
    return list(translate_stream(loaded, lines, opts, torch.device("cpu")))


def test_prepare_two_way_gives_each_language_a_tag_of_its_own(data):
    meta = json.loads((data / "meta.json").read_text(encoding="utf-8"))
    tok, _, _ = load_tokenizers(data)
    assert meta["tokenizer"]["tags"] == {"en": tok.tag_id("en"), "de": tok.tag_id("de")}
    assert tok.sp.id_to_piece(meta["tokenizer"]["tags"]["en"]) == ">>en<<"
    assert ">>en<< >>de<< for a model of both directions" in summary(meta)
    assert set(meta["tokenizer"]["tags"].values()).isdisjoint(np.load(data / "train.src.ids.npy"))  # sources untagged


def test_two_way_needs_one_joint_vocabulary(corpus, tmp_path):
    with pytest.raises(MtError, match="--two-way .*one joint vocabulary: drop --separate-vocab"):
        prepare(tmp_path / "data", "de", "en", train=str(corpus / "train"), joint=False, two_way=True,
                progress=False)


def test_every_epoch_reads_each_pair_both_ways_led_by_the_tag_of_its_target(data):
    tok, _, _ = load_tokenizers(data)
    (both,) = train_splits(data, two_way=True)
    split = both.split
    assert isinstance(both, BothWays) and len(both) == 2 * len(split)
    for i in (0, len(split) - 1):
        assert both.src(i).tolist() == [tok.tag_id("en"), *split.src(i)] and np.array_equal(both.tgt(i), split.tgt(i))
        j = len(split) + i
        assert both.src(j).tolist() == [tok.tag_id("de"), *split.tgt(i)] and np.array_equal(both.tgt(j), split.src(i))
        assert both.src_lens[j] == len(both.src(j)) and both.tgt_lens[j] == len(both.tgt(j))
    valid = valid_split(data, two_way=True)  # validation: the direction the data was prepared in
    assert valid.src(0).tolist() == [tok.tag_id("en"), *valid.split.src(0)] and valid.src_lens[0] == len(valid.src(0))


def test_two_way_training_on_data_without_tags_says_how_to_prepare_it(tmp_path, corpus):
    prepare(tmp_path / "plain", "de", "en", train=str(corpus / "train"), vocab_size=40, progress=False)
    cfg = Config(data=str(tmp_path / "plain"))
    cfg.train.two_way = True
    src_tok, tgt_tok, _ = load_tokenizers(tmp_path / "plain")
    with pytest.raises(MtError, match="no language tags; prepare it with `mt prepare ... --two-way`"):
        fit_vocab(cfg, src_tok, tgt_tok, joint=True)


def translates(lines: list[str], refs: list[str], wrong_language: set[str]) -> bool:
    """Past BLEU against `refs`, without a word of `wrong_language`."""
    words = {w for line in lines for w in line.split()}
    return sacrebleu.corpus_bleu(lines, [refs]).score > BLEU and words.isdisjoint(wrong_language)


def test_the_model_translates_both_ways_and_into_the_language_asked_for(run, corpus, tmp_path):
    german, english = read_text(corpus / "valid.de"), read_text(corpus / "valid.en")
    (tmp_path / "en.txt").write_text("\n".join(english) + "\n", encoding="utf-8")
    runner = CliRunner()
    to_german = runner.invoke(app, ["translate", "-c", str(run / "last.pt"), "-i", str(tmp_path / "en.txt"),
                                    "--to", "de", "--beam", "1"])
    assert to_german.exit_code == 0, to_german.output
    assert translates(to_german.output.splitlines(), german, ENGLISH)
    assert translates(translated(run / "last.pt", german, None), english, GERMAN)  # as trained: de→en


def test_a_direction_the_model_has_not_learned_is_refused_naming_those_it_has(run, tmp_path):
    result = CliRunner().invoke(app, ["translate", "-c", str(run / "last.pt"), "--to", "fr"])
    assert_refused(result, "translates de→en and en→de, not into 'fr'")
    one_way = checkpoint.load(run / "last.pt")
    one_way["config"] = {**one_way["config"], "train": {**one_way["config"]["train"], "two_way": False}}
    checkpoint.save(one_way, tmp_path / "one_way.pt")
    with pytest.raises(MtError, match=r"translates de→en, not into 'de'; train one model of both directions"):
        load_model(tmp_path / "one_way.pt", to="de")


def test_tune_to_writes_a_checkpoint_of_the_other_direction_that_report_scores_on_the_swapped_test(run, data,
                                                                                                    tmp_path):
    run = shutil.copytree(run, tmp_path / "run")  # the shared run stays as trained
    results = tune_checkpoint(run / "last.pt", run / "final.en-de.pt", None, None, "1", "1.0", "cpu",
                              progress=False, to="de")
    turned = checkpoint.load(run / "final.en-de.pt")
    assert turned["langs"] == {"src": "en", "tgt": "de"} and turned["metrics"]["tuned"] == results
    report = report_run(run, run / "final.en-de.pt", "cpu")
    assert json.loads((run / "report.en-de.json").read_text(encoding="utf-8")) == report
    assert report["languages"] == {"src": "en", "tgt": "de"}
    assert report["test"]["source"].endswith("test.tgt.txt") and report["test"]["reference"].endswith("test.src.txt")
    hyps = read_text(run / "test.en-de.hyp.txt")
    assert report["bleu"] == score(hyps, read_text(data / "test.src.txt"))["bleu"]["score"]
    assert {w for h in hyps for w in h.split()}.isdisjoint(ENGLISH)
    assert report["valid_bleu"] == results[0]["bleu"] > 25  # tuned on the valid split, swapped
    assert not (run / "report.json").exists()  # the direction as prepared is reported under its own name


def test_export_refuses_a_two_way_model_rather_than_write_one_that_ignores_the_tag(run, tmp_path):
    with pytest.raises(MtError, match="a two-way model .*export a model of one direction"):
        export(run / "last.pt", "ctranslate2", tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()


@needs_make
def test_make_recipe_of_a_both_ways_name_prepares_tags_and_tunes_and_reports_each_direction():
    commands = "\n".join(dry_run("recipe", "NAME=multi30k_en_de_both", "PROCS=1"))
    assert "--tgt de --two-way --out data/prepared/multi30k_en_de_both" in commands
    assert "mt tune --checkpoint runs/multi30k_en_de_both/final.pt --out runs/multi30k_en_de_both/final.pt" in commands
    assert ("mt tune --checkpoint runs/multi30k_en_de_both/final.pt --to en --out "
            "runs/multi30k_en_de_both/final.de-en.pt") in commands
    assert "mt report runs/multi30k_en_de_both --checkpoint runs/multi30k_en_de_both/final.de-en.pt" in commands
