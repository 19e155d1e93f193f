import pytest

from mt.decode.evaluate import evaluate, render, score
from mt.errors import MtError


def test_scores_come_with_signatures():
    report = score(["the cat sat on the mat", "a dog"], ["the cat sat on the mat", "a dog barks"])
    assert 0 < report["bleu"]["score"] < 100
    assert report["bleu"]["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert "nc:6" in report["chrf"]["signature"]
    assert "tok:tercom" in report["ter"]["signature"]
    text = render(report)
    assert "BLEU" in text and report["bleu"]["signature"] in text


def test_identical_output_scores_100_and_lowercase_ignores_case():
    assert score(["A b c d e"], ["A b c d e"])["bleu"]["score"] == 100.0
    assert score(["a b c d e"], ["A B C D E"])["bleu"]["score"] < 100.0
    report = score(["a b c d e"], ["A B C D E"], lowercase=True)
    assert report["bleu"]["score"] == 100.0 and "case:lc" in report["bleu"]["signature"]


def test_mismatched_files_are_an_error_naming_both(tmp_path):
    (tmp_path / "h").write_text("a\nb\n")
    (tmp_path / "r").write_text("a\n")
    with pytest.raises(MtError, match=r"h has 2 lines but .*r has 1; they must be line-aligned"):
        evaluate(tmp_path / "r", hyp=tmp_path / "h")
    with pytest.raises(MtError, match="hypothesis list has 2 lines but the reference list has 1"):
        score(["a", "b"], ["a"])


def test_a_hypothesis_file_is_scored_as_its_lines(tmp_path):
    (tmp_path / "h").write_bytes(b"\xef\xbb\xbfthe cat sat\r\na dog\r\n")
    (tmp_path / "r").write_text("the cat sat\na dog barks\n")
    assert evaluate(tmp_path / "r", hyp=tmp_path / "h") == score(["the cat sat", "a dog"],
                                                                 ["the cat sat", "a dog barks"])


def test_give_either_a_hypothesis_file_or_a_checkpoint_with_its_source(tmp_path):
    (tmp_path / "r").write_text("a\n")
    with pytest.raises(MtError, match="give either --hyp FILE, or --checkpoint C with --src FILE"):
        evaluate(tmp_path / "r")
    with pytest.raises(MtError, match="--checkpoint needs --src FILE"):
        evaluate(tmp_path / "r", checkpoint=tmp_path / "c.pt")
