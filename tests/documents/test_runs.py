"""Translations placed in runs (mt/documents/runs.py), for any runs and sentences: the runs together read as the
translated unit, each translation whole in one run, a linked one where the sentence covers a link."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

lxml = pytest.importorskip("lxml")

from lxml import etree  # noqa: E402

from mt.documents.runs import Run, place  # noqa: E402
from mt.documents.sentences import Sentence, join  # noqa: E402

RUNS = st.lists(st.tuples(st.text("ab .", max_size=6), st.booleans()), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(runs=RUNS, cuts=st.lists(st.integers(0, 48), max_size=6), data=st.data())
def test_the_runs_read_as_the_translated_unit_and_each_translation_is_in_one_run(runs, cuts, data):
    paragraph = etree.Element("p")
    pieces = [Run(etree.SubElement(paragraph, "r"), "text", text, linked) for text, linked in runs]
    for run in pieces:
        run.node.text = run.text
    text = "".join(t for t, _ in runs)
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    sentences = [Sentence(s, e, f"<{k}>" if data.draw(st.booleans()) else text[s:e])
                 for k, (s, e) in enumerate(zip(bounds, bounds[1:], strict=False)) if e > s]
    place(pieces, sentences)
    written = [run.node.text or "" for run in pieces]
    assert "".join(written) == join(text, sentences)  # nothing lost, nothing repeated, all in order
    starts = [0]
    for t, _ in runs:
        starts.append(starts[-1] + len(t))
    for s in sentences:
        if s.text != text[s.start:s.end]:
            [owner] = [i for i, w in enumerate(written) if s.text in w]
            covered = [i for i in range(len(runs)) if starts[i] < s.end and starts[i + 1] > s.start]
            assert owner in covered and (runs[owner][1] or not any(runs[i][1] for i in covered))
