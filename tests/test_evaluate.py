import pytest

from mt.errors import MtError
from mt.evaluate import render, score, score_files
from mt.lines import read_text


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
    with pytest.raises(MtError, match=r"h has 2 lines but .*r has 1"):
        score_files(tmp_path / "h", tmp_path / "r")


def test_read_text_keeps_lines_exactly(tmp_path):
    path = tmp_path / "t"
    path.write_bytes("\ufeffone\r\n\r\nthree\x0bstill three\n".encode())
    assert read_text(path) == ["one", "", "three\x0bstill three"]
    path.write_bytes(b"ok\n\xff\n")
    with pytest.raises(MtError, match="line 2: not valid UTF-8"):
        read_text(path)
