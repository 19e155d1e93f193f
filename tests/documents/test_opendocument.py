"""OpenDocument text and presentations in, translated files out (mt/documents/opendocument.py, runs.py): made with
odfpy, translated by a stand-in for the model (upper case), loaded again by odfpy: every paragraph, cell, note,
header, slide and note in its place with its text translated, spans and links kept, nothing but text changed."""

import io

import pytest

pytest.importorskip("sentencex")
pytest.importorskip("odf")

from odf import teletype  # noqa: E402
from odf.dc import Creator  # noqa: E402
from odf.draw import Frame, Image, Page, TextBox  # noqa: E402
from odf.namespaces import PRESENTATIONNS  # noqa: E402
from odf.office import Annotation  # noqa: E402
from odf.opendocument import OpenDocumentPresentation, OpenDocumentText, load  # noqa: E402
from odf.presentation import Notes  # noqa: E402
from odf.style import Footer, Header, MasterPage, PageLayout, Style, TextProperties  # noqa: E402
from odf.table import Table, TableCell, TableColumn, TableRow  # noqa: E402
from odf.text import A, H, List, ListItem, Note, NoteBody, NoteCitation, P, PageNumber, S, Span  # noqa: E402

from .conftest import assert_only_text_changed, exactly, png, translated_file  # noqa: E402


def saved(doc) -> bytes:
    out = io.BytesIO()
    doc.save(out)
    return out.getvalue()


def table(rows: list[list[str]]) -> Table:
    grid = Table(name=f"t{len(rows)}")
    grid.addElement(TableColumn(numbercolumnsrepeated=len(rows[0])))
    for texts in rows:
        row = TableRow()
        for text in texts:
            cell = TableCell()
            cell.addElement(P(text=text))
            row.addElement(cell)
        grid.addElement(row)
    return grid


def text_file() -> bytes:
    """A report as people write them: a heading, bold and a link inside sentences, a footnote, spaces and a tab,
    a list, a table with a table in a cell, a text box, an image, a comment, a header and a footer with a page
    number."""
    doc = OpenDocumentText()
    layout = PageLayout(name="pm1")
    doc.automaticstyles.addElement(layout)
    master = MasterPage(name="Standard", pagelayoutname=layout)
    doc.masterstyles.addElement(master)
    header, footer, page = Header(), Footer(), P(text="Page ")
    header.addElement(P(text="The header."))
    page.addElement(PageNumber(selectpage="current", text="1"))
    footer.addElement(page)
    master.addElement(header)
    master.addElement(footer)

    doc.text.addElement(H(outlinelevel=1, text="A short report"))
    doc.text.addElement(bold_and_link(doc, "I like ", "red", " cars. See ", "the site", " now."))
    p = P(text="This is true.")
    note, body = Note(id="ftn1", noteclass="footnote"), NoteBody()
    note.addElement(NoteCitation(text="1"))
    body.addElement(P(text="A footnote. Two sentences."))
    note.addElement(body)
    p.addElement(note)
    teletype.addTextToElement(p, "  It is  well known.\tName:\tAnn Smith")
    doc.text.addElement(p)
    items = List()
    for text in ["First item.", "Second item."]:
        item = ListItem()
        item.addElement(P(text=text))
        items.addElement(item)
    doc.text.addElement(items)
    grid = table([["A cell. Two sentences.", "Another cell."], ["", ""]])
    grid.childNodes[-1].childNodes[0].addElement(table([["A nested cell."]]))
    doc.text.addElement(grid)
    p = P(text="Before the box. ")
    box, text_box = Frame(width="5cm", height="2cm", anchortype="as-char"), TextBox()
    text_box.addElement(P(text="Text in a box."))
    box.addElement(text_box)
    p.addElement(box)
    picture = Frame(width="1cm", height="1cm", anchortype="as-char")
    picture.addElement(Image(href=doc.addPicture("Pictures/cat.png", "image/png", png())))
    p.addElement(picture)
    doc.text.addElement(p)
    p = P(text="Check this sentence.")
    comment = Annotation()
    comment.addElement(Creator(text="Ann"))
    comment.addElement(P(text="A comment on it."))
    p.addElement(comment)
    doc.text.addElement(p)
    return saved(doc)


def bold_and_link(doc, before: str, bold: str, between: str, link: str, after: str) -> P:
    """A paragraph of `doc`: `before`, `bold` in bold (a style "Bold"), `between`, `link` linked, `after`."""
    style = Style(name="Bold", family="text")
    style.addElement(TextProperties(fontweight="bold"))
    doc.automaticstyles.addElement(style)
    p = P(text=before)
    p.addElement(Span(stylename=style, text=bold))
    p.addText(between)
    p.addElement(A(href="https://example.com", text=link))
    p.addText(after)
    return p


def paragraphs(data: bytes) -> list[str]:
    """The text of each paragraph and heading, as odfpy reads it (a note's or a box's inside its paragraph's)."""
    doc = load(io.BytesIO(data))
    return [teletype.extractText(p) for kind in (H, P) for p in doc.getElementsByType(kind)]


def test_a_text_document_is_translated_in_every_place_and_keeps_everything_else():
    source = text_file()
    out = translated_file("odt", source)
    before, after = paragraphs(source), paragraphs(out)
    assert len(after) == len(before) == 17
    # Every paragraph's text translated where it is; a comment's author is no text of the document.
    commented = before.index("Check this sentence.AnnA comment on it.")
    assert after[commented] == "CHECK THIS SENTENCE.AnnA COMMENT ON IT."
    assert [" ".join(t.split()) for t in after[:commented] + after[commented + 1:]] == [
        " ".join(t.upper().split()) for t in before[:commented] + before[commented + 1:]]
    assert after[-2:] == ["THE HEADER.", "PAGE 1"]
    # The <text:s/> spaces inside a translated sentence stay where they were, in front of the translation.
    assert "THIS IS TRUE.1A FOOTNOTE. TWO SENTENCES.   IT IS WELL KNOWN.\tNAME:\tANN SMITH" in after
    assert {"A NESTED CELL.", "TEXT IN A BOX.", "SECOND ITEM."} <= set(after)
    assert assert_only_text_changed(source, out) == {"content.xml", "styles.xml"}  # mimetype, image: as they were


def test_spans_and_links_inside_a_sentence_stay_on_their_words():
    doc = load(io.BytesIO(translated_file("odt", text_file())))
    p = doc.getElementsByType(P)[0]
    span, link = doc.getElementsByType(Span)[0], doc.getElementsByType(A)[0]
    # The bold "red" and the link "the site" were translated on their own too, and found in their sentences'
    # translations: each keeps its words; the rest is in the paragraph's own text, in order.
    assert (teletype.extractText(span), teletype.extractText(link)) == ("RED", "THE SITE")
    assert [str(node) for node in p.childNodes] == ["I LIKE ", "RED", " CARS. SEE ", "THE SITE", " NOW."]
    assert len(doc.getElementsByType(S)) == 2  # the spaces odfpy wrote as <text:s/>


def test_a_span_goes_to_its_translation_in_another_order_and_a_lost_link_wraps_its_sentence():
    doc = OpenDocumentText()
    p = bold_and_link(doc, "Ich habe ", "den Hund", " gesehen. Lies bitte ", "das Handbuch", " zuerst.")
    doc.text.addElement(p)
    translate = exactly({"Ich habe den Hund gesehen.": "I have seen the dog.", "den Hund": "the dog",
                         "Lies bitte das Handbuch zuerst.": "Please read the handbook first.",
                         "das Handbuch": "the manual"})
    out = load(io.BytesIO(translated_file("odt", saved(doc), translate)))
    assert [str(node) for node in out.getElementsByType(P)[0].childNodes] == [
        "I have seen ", "the dog", ". ", "Please read the handbook first."]  # the link's tail: empty
    span, link = out.getElementsByType(Span)[0], out.getElementsByType(A)[0]
    assert (span.getAttribute("stylename"), teletype.extractText(span)) == ("Bold", "the dog")
    assert teletype.extractText(link) == "Please read the handbook first."


def frame(parent, text: str, kind: str = "", placeholder: bool = False) -> None:
    box, text_box = Frame(width="20cm", height="3cm", x="1cm", y="1cm"), TextBox()
    if kind:
        box.setAttrNS(PRESENTATIONNS, "class", kind)
    if placeholder:
        box.setAttrNS(PRESENTATIONNS, "placeholder", "true")
    for line in text.split("\n"):
        text_box.addElement(P(text=line))
    box.addElement(text_box)
    parent.addElement(box)


def presentation_file() -> bytes:
    """Two slides with a title, bullets and notes; a master page with a title placeholder (the prompt an empty
    one shows) and a text box of its own (a company name shown on every slide)."""
    doc = OpenDocumentPresentation()
    layout = PageLayout(name="pl")
    doc.automaticstyles.addElement(layout)
    master = MasterPage(name="Default", pagelayoutname=layout)
    doc.masterstyles.addElement(master)
    frame(master, "Click to add a title", "title", placeholder=True)
    frame(master, "Example company")
    for title, bullets, said in [("Quarterly results", "Sales grew. Costs fell.\nA second point.", "Say it slowly."),
                                 ("Thank you", "Questions are welcome.", "Smile.")]:
        page = Page(masterpagename=master, name=title)
        doc.presentation.addElement(page)
        frame(page, title, "title")
        frame(page, bullets, "outline")
        notes = Notes()
        page.addElement(notes)
        frame(notes, said, "notes")
    return saved(doc)


def test_a_presentation_is_translated_slide_by_slide_with_its_notes_and_not_its_prompts():
    source = presentation_file()
    out = translated_file("odp", source)
    doc = load(io.BytesIO(out))
    assert len(doc.getElementsByType(Page)) == 2
    assert paragraphs(out) == ["QUARTERLY RESULTS", "SALES GREW. COSTS FELL.", "A SECOND POINT.", "SAY IT SLOWLY.",
                               "THANK YOU", "QUESTIONS ARE WELCOME.", "SMILE.", "Click to add a title",
                               "EXAMPLE COMPANY"]
    assert assert_only_text_changed(source, out) == {"content.xml", "styles.xml"}
