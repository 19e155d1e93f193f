"""HTML in, HTML out (mt/documents/html.py, through mt/documents/sentences.py): tags kept, text translated and escaped,
inline tags kept in order around the sentences they were in, untouched elements untouched."""

from html.parser import HTMLParser

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("sentencex")

from mt.documents.formats import read_document  # noqa: E402
from mt.documents.sentences import finish, plan  # noqa: E402
from mt.errors import MtError  # noqa: E402


def translated(page: str, translate=str.upper) -> tuple[str, list[str]]:
    todo = plan([read_document("html", page.split("\n"), "page.html")], "en",
                lambda texts: [len(t.split()) for t in texts], 100)
    return finish(todo, [translate(part) for part in todo.parts])[0], todo.parts


class Tags(HTMLParser):
    """The tags of a page, in order, and its text."""

    def __init__(self, page: str):
        super().__init__(convert_charrefs=True)
        self.tags, self.text = [], []
        self.feed(page)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))

    def handle_endtag(self, tag):
        self.tags.append(("/" + tag, []))

    def handle_data(self, data):
        self.text.append(data)


PAGE = """<!DOCTYPE html>
<html><head><title>Cats &amp; dogs</title><style>p::after { content: "a < b" }</style></head>
<body class="main" data-x='1'>
<!-- a comment. -->
<p id="one">I like <b>red</b> cars. They are <i>very <em>fast</em></i>.</p>
<p><a href="/x?a=1&amp;b=2" title="Go there">Hello world.</a> Next one &lt;here&gt;.<br>After a break.</p>
<pre>keep   me.</pre><p>Run <code>make test</code> now.</p><div translate="no">Leave me.</div>
<p>The <b>cat sleeps. The dog</b> runs.</p><p>&nbsp;&copy; 2024</p>
<script>if (a < b && c) { document.write("<p>x</p>") }</script>
</body></html>"""


def test_tags_attributes_and_untouched_elements_stay_and_the_text_is_translated():
    out, parts = translated(PAGE)
    assert parts == ["Cats & dogs", "I like red cars.", "They are very fast.", "Hello world.", "Next one <here>.",
                     "After a break.", "Run", "now.", "The cat sleeps.", "The dog runs."]
    assert out == """<!DOCTYPE html>
<html><head><title>CATS &amp; DOGS</title><style>p::after { content: "a < b" }</style></head>
<body class="main" data-x='1'>
<!-- a comment. -->
<p id="one"><b>I LIKE RED CARS.</b> <i><em>THEY ARE VERY FAST.</em></i></p>
<p><a href="/x?a=1&amp;b=2" title="Go there">HELLO WORLD.</a> NEXT ONE &lt;HERE&gt;.<br>AFTER A BREAK.</p>
<pre>keep   me.</pre><p>RUN <code>make test</code> NOW.</p><div translate="no">Leave me.</div>
<p><b>THE CAT SLEEPS. THE DOG RUNS.</b></p><p>&nbsp;&copy; 2024</p>
<script>if (a < b && c) { document.write("<p>x</p>") }</script>
</body></html>"""


def test_what_the_model_says_can_only_be_text():
    evil = '<script>alert(1)</script><img src=x onerror="alert(2)"> & "quoted"'
    out, _ = translated(PAGE, translate=lambda part: evil)
    assert Tags(out).tags == Tags(PAGE).tags  # not one tag or attribute more
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=\"alert(2)\"&gt; &amp;" in out


def test_malformed_html_is_read_as_browsers_would_or_refused_in_one_line():
    out, _ = translated("<p>An unclosed <b>bold one. And <i>more</p></div> text")
    assert out == "<p><b>AN UNCLOSED BOLD ONE. <i>AND MORE</p></div> TEXT"  # <b> opened inside: before it
    with pytest.raises(MtError, match=r"^page.html:2: cannot read this as HTML \(.*\); is --format right\?$"):
        translated("<p>Fine.</p>\n<![bogus[ x ]]> after")


WORD = st.sampled_from("the cat dog sat ran on a big red mat & < café".split())
INLINE = st.sampled_from(["b", "i", "em", "a", "span"])


@st.composite
def inline_markup(draw, depth=0):
    """Sentences of words, some wrapped in (nested) inline tags, with <img> here and there: well-formed."""
    out = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["words", "words", "end", "tag", "img"] if depth < 2 else ["words", "end"]))
        if kind == "words":
            text = " ".join(draw(st.lists(WORD, min_size=1, max_size=4)))
            out.append(text.replace("&", "&amp;").replace("<", "&lt;"))
        elif kind == "end":
            out.append(draw(st.sampled_from([". ", "! ", "? "])))
        elif kind == "img":
            out.append('<img src="i.png">')
        else:
            tag = draw(INLINE)
            out.append(f'<{tag} class="c">{draw(inline_markup(depth + 1))}</{tag}>')
        out.append(draw(st.sampled_from(["", " ", "\n"])))
    return "".join(out)


def nests(tags: list[tuple[str, list]]) -> bool:
    stack = []
    for tag, _ in tags:
        if tag.startswith("/"):
            if not stack or stack.pop() != tag[1:]:
                return False
        elif tag != "img":
            stack.append(tag)
    return not stack


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(inline_markup(), min_size=1, max_size=3))
def test_inline_tags_stay_in_order_and_nested_around_the_sentences_and_the_text_is_all_there(paragraphs):
    page = "".join(f"<p>{p}</p>\n" for p in paragraphs)
    assert translated(page, translate=lambda part: part)[0] == page  # nothing translated: byte for byte
    out, parts = translated(page)
    before, after = Tags(page), Tags(out)
    assert sorted(map(str, after.tags)) == sorted(map(str, before.tags)) and nests(after.tags)
    assert "".join(after.text).split() == "".join(before.text).upper().split()
