"""Reranking (mt/decode/rerank.py): a right-to-left model, stored beside a left-to-right one by `mt ensemble` or trained
as an ensemble run's last member (`train.rerank`), and a channel model of the reverse direction reorder the
left-to-right model's K best."""

import json
import shutil
from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from mt import checkpoint
from mt.cli import app
from mt.config import Config, from_dict
from mt.data.prepare import prepare
from mt.decode.ensemble import combine
from mt.decode.forced import score_pairs
from mt.decode.load import from_state, load_model
from mt.decode.rerank import Explained, rerank
from mt.decode.search import Hypothesis, SearchOptions, length_penalty, score_ids
from mt.decode.translate import translate_lines
from mt.errors import MtError
from mt.report import report_run
from mt.train.loop import train
from mt.train.members import member_config

from ..conftest import assert_refused
from ..train.test_loop import small_config
from ..train.test_members import data  # noqa: F401  (a fixture)

SOURCES = ["der hund sitzt unter dem baum", "die katze", "", "rot blau groß klein läuft auf das",
           "ein mann und eine frau gehen", "zwei kinder spielen im park", "der rote ball"]
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def pair(tmp_path_factory, trained_tiny):
    """A tiny left-to-right model, and a right-to-left one trained on the same prepared data."""
    root = tmp_path_factory.mktemp("rerank")
    l2r = trained_tiny(200)
    cfg = from_dict(checkpoint.load(l2r)["config"])
    cfg.model.right_to_left = True
    threads = torch.get_num_threads()
    train(cfg, root / "r2l", progress=False)
    torch.set_num_threads(threads)
    return l2r, root / "r2l" / "best.pt"


def test_the_pair_translates_the_best_of_both_models_k_best_by_both_models_scores(pair):
    reranked, left, right = from_state(combine(list(pair))), load_model(pair[0]), load_model(pair[1])
    opts = SearchOptions.from_config(left.config.decode, beam=4, nbest=4, len_penalty=1.0, rerank_weight=1.0)
    found, theirs = (translate_lines(m, SOURCES, opts, CPU) for m in (left, right))
    new = [[h for h in b if h.tokens not in [a.tokens for a in hyps]] for hyps, b in zip(found, theirs, strict=True)]
    assert any(new), "the right-to-left model should find a translation the left-to-right beam missed"
    srcs = [left.src_tok.encode([SOURCES[i]])[0] for i, hyps in enumerate(new) for _ in hyps]
    logprobs = iter(score_ids(left.model, srcs, [h.tokens for hyps in new for h in hyps]))
    joint = [hyps + [Hypothesis(h.tokens, 0.0, next(logprobs)) for h in extra] for hyps, extra in zip(found, new,
                                                                                                     strict=True)]
    ours = translate_lines(reranked, SOURCES, replace(opts, nbest=8), CPU)
    srcs = left.src_tok.encode([SOURCES[i] for i, hyps in enumerate(joint) for _ in hyps])
    assert_ordered_at_weight_1(ours, joint, score_ids(right.model, srcs, [h.tokens for hyps in joint for h in hyps]))


def assert_ordered_at_weight_1(ours, found, other: list[float], source_lengths: list[int] | None = None) -> None:
    """`ours` is `found` (the left-to-right K best) ordered by (log P_l2r + other) / 2 / lp(length, 1.0), `other` the
    second model's score of each hypothesis in turn, with at least one choice changed; with `source_lengths` (a
    channel's scores, one length per source), by (log P_l2r / lp(length) + other / lp(source length)) / 2."""
    scores = iter(other)

    def combined(i, h):
        if source_lengths is None:
            return (h.logprob + next(scores)) / 2 / length_penalty(len(h.tokens) + 1, 1.0)
        return (h.logprob / length_penalty(len(h.tokens) + 1, 1.0)
                + next(scores) / length_penalty(source_lengths[i], 1.0)) / 2

    expected = [sorted((combined(i, h), h.tokens) for h in hyps)[::-1] for i, hyps in enumerate(found)]
    assert [[h.tokens for h in hyps] for hyps in ours] == [[tokens for _, tokens in hyps] for hyps in expected]
    assert [h.score for hyps in ours for h in hyps] == pytest.approx([s for hyps in expected for s, _ in hyps],
                                                                     abs=1e-4)
    assert any(a[0].tokens != b[0].tokens for a, b in zip(ours, found, strict=True) if a), \
        "the second model's scores should change a choice, or the test proves nothing"


@pytest.fixture(scope="module")
def channel(pair):
    """An en→de model of the pair's corpus, reversed, with a vocabulary of its own: a channel for the de→en pair."""
    root, corpus = pair[1].parent.parent, pair[0].parent.parent / "corpus"  # the shared l2r model's corpus, read
    prepare(root / "rev", "en", "de", train=str(corpus / "train"), valid=str(corpus / "valid"), vocab_size=48,
            progress=False)
    cfg = from_dict(checkpoint.load(pair[0])["config"])
    cfg.data = str(root / "rev")
    cfg.model.src_vocab_size = cfg.model.tgt_vocab_size = 0
    threads = torch.get_num_threads()
    train(cfg, root / "en-de", progress=False)
    torch.set_num_threads(threads)
    return root / "en-de" / "best.pt"


def test_a_channel_model_reorders_the_k_best_by_how_well_each_explains_its_source(pair, channel):
    both, left, reverse = from_state(combine([pair[0], channel])), load_model(pair[0]), load_model(channel)
    assert checkpoint.load(channel)["spm"] != checkpoint.load(pair[0])["spm"]  # text, not pieces, crosses over
    opts = SearchOptions.from_config(left.config.decode, beam=4, nbest=4, len_penalty=1.0, channel_weight=1.0)
    ours, found = (translate_lines(m, SOURCES, opts, CPU) for m in (both, left))
    read = left.src_tok.decode(left.src_tok.encode(SOURCES))  # the source as the model read it (40 pieces)
    flat = [(i, h) for i, hyps in enumerate(found) for h in hyps]
    explains = score_pairs(reverse, left.tgt_tok.decode([h.tokens for _, h in flat]), [read[i] for i, _ in flat])
    assert_ordered_at_weight_1(ours, found, explains, [len(t) + 1 for t in reverse.tgt_tok.encode(read)])


def test_a_channel_does_not_prefer_a_translation_for_being_longer():
    """The channel scores the source, whatever the translation's length: a translation that repeats itself and
    explains the source no better must not win by the length that divides the left-to-right score."""
    short = Hypothesis([5, 6, 7, 8], -2.4, -4.0)  # score: log P / lp(length)
    repeated = Hypothesis([5, 6, 7, 8, 6, 7, 8, 6, 7], -2.6, -6.5)  # behind on its own model's score
    explained = Explained([[-20.0, -20.0]], [12])
    for weight in (0.1, 1.0):
        best = rerank([[short, repeated]], (None, explained), 0.0, weight, 1.0, 1)[0][0]
        assert best.tokens == short.tokens


def test_tune_chooses_the_channel_weight_that_translate_then_uses(pair, channel, tmp_path):
    runner = CliRunner()
    joined, tuned = tmp_path / "three.pt", tmp_path / "tuned.pt"
    result = runner.invoke(app, ["ensemble", str(pair[0]), str(channel), str(pair[1]), "--out", str(joined)])
    assert result.exit_code == 0, result.output
    assert "a model and a right-to-left model and a channel model (en→de) to rerank with" in result.output
    result = runner.invoke(app, ["info", str(joined)])
    assert result.exit_code == 0 and f"{channel} (step 200; the reverse direction)" in result.output, result.output
    result = runner.invoke(app, ["tune", "-c", str(joined), "--out", str(tuned), "--beams", "3",
                                 "--len-penalties", "1.0", "--rerank-weights", "0.5", "--channel-weights", "0,2",
                                 "--quiet"])
    assert result.exit_code == 0, result.output
    results = checkpoint.load(tuned)["metrics"]["tuned"]
    assert sorted((r["rerank_weight"], r["channel_weight"]) for r in results) == [(0.5, 0.0), (0.5, 2.0)]
    decode = checkpoint.load(tuned)["config"]["decode"]
    assert decode["channel_weight"] == results[0]["channel_weight"]
    assert f"channel_weight {results[0]['channel_weight']}" in result.output.splitlines()[-1]
    src = tmp_path / "src.txt"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    loaded, outputs = load_model(joined), []
    for weight in (0.0, 2.0):  # the checkpoint's channel weight, set to each in turn, is what translate uses
        state = checkpoint.load(tuned)
        state["config"]["decode"]["channel_weight"] = weight
        checkpoint.save(state, tmp_path / "set.pt")
        result = runner.invoke(app, ["translate", "-c", str(tmp_path / "set.pt"), "--input", str(src), "--beam", "3"])
        assert result.exit_code == 0, result.output
        opts = SearchOptions.from_config(loaded.config.decode, beam=3, len_penalty=decode["len_penalty"],
                                   rerank_weight=0.5, channel_weight=weight)
        expected = loaded.tgt_tok.decode([h[0].tokens if h else []
                                          for h in translate_lines(loaded, SOURCES, opts, CPU)])
        assert result.output.splitlines() == expected
        outputs.append(expected)
    assert outputs[0] != outputs[1], "the two weights should translate differently, or the test proves nothing"
    with pytest.raises(MtError, match="a second model of the reverse direction"):
        combine([pair[0], channel, channel])
    result = runner.invoke(app, ["export", str(joined), "--to", "ctranslate2", "--out", str(tmp_path / "ct2")])
    assert_refused(result, "a channel model (en→de) to rerank with", "needs one model")


def test_an_ensemble_checkpoint_given_a_channel_keeps_its_models_and_gains_the_channel(pair, channel, tmp_path):
    checkpoint.save(combine(list(pair)), tmp_path / "pair.pt")  # e.g. a recipe's final.pt
    state = combine([tmp_path / "pair.pt", channel])
    assert state["members"][0].keys() == checkpoint.load(pair[0])["model"].keys() and "reranker" in state
    assert state["metrics"]["channel"]["path"] == str(channel)
    both, paired = from_state(state), load_model(tmp_path / "pair.pt")
    opts = SearchOptions.from_config(paired.config.decode, beam=4, rerank_weight=1.0, channel_weight=0.0)
    assert [[h.tokens for h in hyps] for hyps in translate_lines(both, SOURCES, opts, CPU)] == \
           [[h.tokens for h in hyps] for hyps in translate_lines(paired, SOURCES, opts, CPU)]
    with pytest.raises(MtError, match="already an ensemble"):
        combine([tmp_path / "pair.pt", pair[0], channel])


def test_reported_with_its_channel_beside_the_run_s_own_report_with_both_runs_training(pair, channel, tmp_path):
    run, prepared = tmp_path / "run", tmp_path / "data"  # the de→en run, and its data with a test split
    shutil.copytree(pair[0].parent, run)
    shutil.copytree(checkpoint.load(pair[0])["config"]["data"], prepared)
    for side in ("src", "tgt"):
        shutil.copy(prepared / f"valid.{side}.txt", prepared / f"test.{side}.txt")
    one_way = checkpoint.load(run / "best.pt")
    one_way["config"]["data"] = str(prepared)
    checkpoint.save(one_way, run / "final.pt")
    own = report_run(run, None, "cpu")
    state = combine([run / "final.pt", channel])
    state["config"]["decode"] |= {"beam": 4, "channel_weight": 1.0}
    checkpoint.save(state, run / "final.channel.pt")
    report = report_run(run, run / "final.channel.pt", "cpu")
    assert json.loads((run / "report.json").read_text(encoding="utf-8")) == own  # the one-way report stays
    assert json.loads((run / "report.channel.json").read_text(encoding="utf-8")) == report
    assert (run / "test.channel.hyp.txt").is_file() and report["decode"]["channel_weight"] == 1.0
    channel_steps = checkpoint.load(channel.parent / "last.pt")["train"]["position"]["step"]
    assert (report["steps"], report["channel"]["steps"], report["channel"]["run"]) == \
           (own["steps"], channel_steps, str(channel.parent))
    assert report["system_train_minutes"] == round(report["train_minutes"] + report["channel"]["train_minutes"], 1)


def test_at_weight_0_or_greedy_it_translates_as_the_left_to_right_model(pair):
    reranked, left = from_state(combine(list(pair))), load_model(pair[0])
    for opts in (SearchOptions.from_config(left.config.decode, beam=4, rerank_weight=0.0),
                 SearchOptions.from_config(left.config.decode, beam=1, rerank_weight=1.0)):
        ours, theirs = (translate_lines(m, SOURCES, opts, CPU) for m in (reranked, left))
        assert [[h.tokens for h in hyps] for hyps in ours] == [[h.tokens for h in hyps] for hyps in theirs]


def test_tune_chooses_the_weight_that_translate_then_uses(pair, tmp_path):
    runner = CliRunner()
    joined, tuned = tmp_path / "pair.pt", tmp_path / "tuned.pt"
    result = runner.invoke(app, ["ensemble", *map(str, pair), "--out", str(joined)])
    assert result.exit_code == 0, result.output
    assert "a model and a right-to-left model to rerank with" in result.output
    result = runner.invoke(app, ["info", str(joined)])
    assert result.exit_code == 0 and f"{pair[1]} (step 200; right to left)" in result.output, result.output
    result = runner.invoke(app, ["tune", "-c", str(joined), "--out", str(tuned), "--beams", "3",
                                 "--len-penalties", "1.0", "--rerank-weights", "0,2", "--quiet"])
    assert result.exit_code == 0, result.output
    results = checkpoint.load(tuned)["metrics"]["tuned"]
    assert sorted(r["rerank_weight"] for r in results) == [0.0, 2.0]
    default = runner.invoke(app, ["tune", "-c", str(joined), "--out", str(tmp_path / "default.pt"),
                                  "--len-penalties", "1.0", "--rerank-weights", "1", "--quiet"])
    assert default.exit_code == 0, default.output  # a reranker's default grid reaches beam 12
    assert sorted(r["beam"] for r in checkpoint.load(tmp_path / "default.pt")["metrics"]["tuned"]) == [1, 5, 8, 12]
    decode = checkpoint.load(tuned)["config"]["decode"]
    assert decode["rerank_weight"] == results[0]["rerank_weight"]
    assert f"rerank_weight {results[0]['rerank_weight']}" in result.output.splitlines()[-1]
    src = tmp_path / "src.txt"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    result = runner.invoke(app, ["translate", "-c", str(tuned), "--input", str(src), "--beam", "3"])
    assert result.exit_code == 0, result.output
    loaded = load_model(joined)
    opts = SearchOptions.from_config(loaded.config.decode, beam=3, rerank_weight=decode["rerank_weight"],
                               len_penalty=decode["len_penalty"])
    expected = loaded.tgt_tok.decode([h[0].tokens if h else [] for h in translate_lines(loaded, SOURCES, opts, CPU)])
    assert result.output.splitlines() == expected


def test_what_needs_one_model_refuses_the_pair_and_two_rerankers_are_refused(pair, tmp_path):
    joined = tmp_path / "pair.pt"
    checkpoint.save(combine(list(pair)), joined)
    result = CliRunner().invoke(app, ["export", str(joined), "--to", "ctranslate2", "--out", str(tmp_path / "ct2")])
    assert_refused(result, "a model and a right-to-left model to rerank with", "needs one model", str(pair[0]))
    with pytest.raises(MtError, match="a second right-to-left model"):
        combine([pair[0], pair[1], pair[1]])
    with pytest.raises(MtError, match="all right to left"):
        combine([pair[1]])


def test_an_ensemble_run_with_train_rerank_trains_its_last_member_right_to_left(data, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    train(small_config(data, max_steps=12, valid_every=6, members=2, rerank=True, seed=3), run, progress=False)
    assert [checkpoint.load(run / m / "last.pt")["config"]["model"]["right_to_left"]
            for m in ("member-1", "member-2")] == [False, True]
    result = CliRunner().invoke(app, ["average", str(run), "--last", "2", "--out", str(run / "final.pt")])
    assert result.exit_code == 0, result.output
    final = checkpoint.load(run / "final.pt")
    assert len(final["members"]) == 1 and final["metrics"]["reranker"]["path"].endswith("member-2/final.pt")
    assert not final["config"]["model"]["right_to_left"]
    report = report_run(run, None, "cpu")
    assert [m["seed"] for m in report["members"]] == [3, 1003]
    assert report["decode"]["rerank_weight"] == final["config"]["decode"]["rerank_weight"]


def test_train_rerank_needs_members_to_rerank_with():
    cfg = Config()
    cfg.train.members, cfg.train.rerank = 3, True
    assert [member_config(cfg, i).model.right_to_left for i in (1, 2, 3)] == [False, False, True]
    with pytest.raises(MtError, match="train.rerank .* train.members of 2 or more"):
        from_dict({"train": {"rerank": True}})


def test_served_the_pair_translates_as_mt_translate_does(pair, tmp_path):
    from ..serve.test_app import client, mt_translate, run, serve_app

    joined = tmp_path / "pair.pt"
    state = combine(list(pair))
    state["config"]["decode"] |= {"beam": 4, "rerank_weight": 2.0}  # a setting where reranking changes outputs
    checkpoint.save(state, joined)
    app = serve_app(joined)

    async def go():
        async with client(app) as c:
            return (await c.post("/v1/translate", json={"text": SOURCES})).json()

    served = [t["text"] for t in run(go())["translations"]]
    assert served == mt_translate(joined, SOURCES, tmp_path)
    assert served != mt_translate(pair[0], SOURCES, tmp_path, "--beam", "4")
