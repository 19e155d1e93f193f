"""Translations placed in runs (mt/documents/runs.py, projection.py), for any runs and sentences: the runs together
read as the translated unit; a sentence in runs of one formatting whole in one of them; in runs formatted
differently, every formatting it had kept on part of its translation (or a link wrapping all of it), each span's
translation in a run of its formatting where it is found."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

lxml = pytest.importorskip("lxml")

from lxml import etree  # noqa: E402

from mt.documents.projection import cut, find  # noqa: E402
from mt.documents.runs import Run, place, spans  # noqa: E402
from mt.documents.sentences import Sentence, join  # noqa: E402

STYLES = ["", "bold", "italic", "link"]
RUNS = st.lists(st.tuples(st.text("ab .", max_size=6), st.sampled_from(STYLES)), min_size=1, max_size=8)


def paragraph(runs: list[tuple[str, str]]) -> list[Run]:
    """Runs of (text, style) in a paragraph of their own, "link" linked."""
    p = etree.Element("p")
    pieces = [Run(etree.SubElement(p, "r"), "text", text, style == "link", style=style) for text, style in runs]
    for run in pieces:
        run.node.text = run.text
    return pieces


def cuts(text: str, at: list[int]) -> list[tuple[int, int]]:
    bounds = sorted({0, len(text), *(c for c in at if c <= len(text))})
    return [(s, e) for s, e in zip(bounds, bounds[1:], strict=False) if e > s]


def alphabet(k: int) -> dict[str, str]:
    """Sentence k's own letters in translation (CJK, without case), so that each written letter tells its sentence."""
    return {"a": chr(0x4E00 + 2 * k), "b": chr(0x4E01 + 2 * k)}


def translated(text: str, k: int) -> str:
    return " ".join("".join(alphabet(k).get(c, c) for c in word) for word in text.split())


@settings(max_examples=200, deadline=None)
@given(runs=st.lists(st.text("ab .", max_size=6), min_size=1, max_size=8), style=st.sampled_from(STYLES),
       at=st.lists(st.integers(0, 48), max_size=6), data=st.data())
def test_a_sentence_in_runs_of_one_formatting_goes_whole_into_one_of_them(runs, style, at, data):
    pieces = paragraph([(text, style) for text in runs])
    text = "".join(runs)
    sentences = [Sentence(s, e, f"<{k}>" if data.draw(st.booleans()) else text[s:e])
                 for k, (s, e) in enumerate(cuts(text, at))]
    place(pieces, sentences)
    written = [run.node.text or "" for run in pieces]
    assert "".join(written) == join(text, sentences)  # nothing lost, nothing repeated, all in order
    starts = [0]
    for t in runs:
        starts.append(starts[-1] + len(t))
    for s in sentences:
        if s.text != text[s.start:s.end]:
            [owner] = [i for i, w in enumerate(written) if s.text in w]
            assert starts[owner] < s.end and starts[owner + 1] > s.start  # one of the runs it covered


@settings(max_examples=200, deadline=None)
@given(runs=RUNS, at=st.lists(st.integers(0, 48), max_size=6), data=st.data())
def test_no_formatting_a_sentence_had_letters_in_is_dropped(runs, at, data):
    pieces = paragraph(runs)
    text, starts = "".join(t for t, _ in runs), [0]
    for t, _ in runs:
        starts.append(starts[-1] + len(t))
    sentences = []
    for k, (s, e) in enumerate(cuts(text, at)):
        source = text[s:e]
        if not any(c.isalpha() for c in source) or not data.draw(st.booleans()):
            sentences.append(Sentence(s, e, source))
            continue
        order = data.draw(st.sampled_from(["same", "reversed", "other"]))
        words = translated(source, k).split()
        sentence = {"same": words, "reversed": words[::-1],
                    "other": [alphabet(k)["a"]] * data.draw(st.integers(1, 4))}[order]
        inline = [Sentence(a, b, translated(text[a:b], k) if data.draw(st.booleans()) else "あ")
                  for a, b in spans(pieces, [(s, e)])[0]]  # あ: a translation not in the sentence's
        sentences.append(Sentence(s, e, " ".join(sentence), spans=inline))
    place(pieces, sentences)
    written = [run.node.text or "" for run in pieces]
    assert "".join(written) == join(text, sentences)
    for k, s in enumerate(sentences):
        if s.text == text[s.start:s.end]:
            continue
        had = [i for i, (t, _) in enumerate(runs) if any(c.isalpha() for c in text[max(s.start, starts[i]):
                                                                                      min(s.end, starts[i + 1])])]
        groups = sum(1 for j, i in enumerate(had) if j == 0 or runs[i][1] != runs[had[j - 1]][1] or i != had[j - 1] + 1)
        holding = [i for i, w in enumerate(written) if set(w) & set(alphabet(k).values())]
        kept = {runs[i][1] for i in holding}
        whole_in_a_link = len(holding) == 1 and runs[holding[0]][1] == "link" and s.text in written[holding[0]]
        if sum(any(c.isalpha() for c in w) for w in s.text.split()) >= groups:  # a word for each: all kept
            assert kept >= {runs[i][1] for i in had} or whole_in_a_link, (kept, written)


def test_each_span_found_gets_exactly_its_translation_in_its_own_run():
    pieces = paragraph([("Ein ", ""), ("roter", "bold"), (" Ball und ", ""), ("ein Hund", "italic"), (".", "")])
    text = "Ein roter Ball und ein Hund."
    assert [text[a:b] for a, b in spans(pieces, [(0, len(text))])[0]] == ["roter", "ein Hund"]
    inline = [Sentence(4, 9, "red"), Sentence(19, 27, "A dog.")]  # a stop the model added to a fragment
    place(pieces, [Sentence(0, len(text), "A dog and a red ball.", spans=inline)])
    # In the runs' order "roter" is found, then "ein Hund" is searched after it, not found there, and placed by
    # position (the words after "red": one, so it): the runs keep their order, each formatting keeps a word.
    assert [run.node.text for run in pieces] == ["A dog and a ", "red", " ", "ball.", ""]
    place(pieces := paragraph([("Ein ", ""), ("roter", "bold"), (" Ball und ", ""), ("ein Hund", "italic"), (".", "")]),
          [Sentence(0, len(text), "A red ball and a dog.", spans=inline)])
    assert [run.node.text for run in pieces] == ["A ", "red", " ball and ", "a dog", "."]


def test_the_projection_finds_stretches_in_order_on_word_boundaries_in_any_case():
    assert find("The Red ball, the reddish dog.", [["red"], ["red"]]) == [(4, 7), None]  # "reddish" is no "red"
    found = find("The Red ball, the reddish dog.", [["rot", "red"], ["dog."]])  # a stop the fragment got: not needed
    assert found == [(4, 7), (26, 29)]
    groups = ["Der ", "rote", " Ball, der rötliche ", "Hund", "."]
    assert cut("The Red ball, the reddish dog.", found, groups, ["", "b", "", "i", ""]) == [
        "The ", "Red", " ball, the reddish ", "dog", "."]
    # Too few words between two found stretches for a span not found there: the one before is let go.
    found = find("C XX A", [["A"], ["C"]])
    assert found == [(5, 6), None]
    assert cut("C XX A", found, ["", "a", " xx ", "c", ""], ["", "b", "", "i", ""]) == ["", "C", " XX ", "A", ""]
