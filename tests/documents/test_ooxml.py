"""Word and PowerPoint files in, translated files out (mt/documents/ooxml.py, runs.py): made with python-docx and
python-pptx, translated by a stand-in for the model (upper case), opened again by the same library: every
paragraph, cell, slide and note in its place with its text translated, inline formatting kept, nothing but text
changed."""

import copy
import io
import zipfile

import pytest
from lxml import etree

pytest.importorskip("sentencex")
docx = pytest.importorskip("docx")
pptx = pytest.importorskip("pptx")

from docx.opc.constants import CONTENT_TYPE, RELATIONSHIP_TYPE  # noqa: E402
from docx.opc.packuri import PackURI  # noqa: E402
from docx.opc.part import Part  # noqa: E402
from docx.oxml import parse_xml  # noqa: E402
from docx.oxml.ns import nsdecls, qn  # noqa: E402
from pptx.util import Inches  # noqa: E402

from .conftest import assert_only_text_changed, by_word, exactly, png, translated_file  # noqa: E402

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
URL = "https://example.com/manual"
FOOTNOTES = f"""<w:footnotes {nsdecls("w")}>
<w:footnote w:type="separator" w:id="-1"><w:p><w:r><w:separator/></w:r></w:p></w:footnote>
<w:footnote w:id="1"><w:p><w:r><w:t>A footnote. It has two sentences.</w:t></w:r></w:p></w:footnote>
</w:footnotes>"""
TEXT_BOX = f"""<w:r {nsdecls("w")} xmlns:v="urn:schemas-microsoft-com:vml"><w:pict>
<v:shape style="width:120pt;height:40pt"><v:textbox><w:txbxContent><w:p><w:r><w:t>Text in a box.</w:t></w:r></w:p>
</w:txbxContent></v:textbox></v:shape></w:pict></w:r>"""
TRACKED = f"""<w:p {nsdecls("w")}><w:r><w:t xml:space="preserve">Kept words. </w:t></w:r><w:del w:id="7" w:author="A">
<w:r><w:delText>deleted words</w:delText></w:r></w:del><w:r><w:fldChar w:fldCharType="begin"/></w:r>
<w:r><w:instrText xml:space="preserve"> DATE \\@ "d MMMM" </w:instrText></w:r><w:r><w:fldChar w:fldCharType="separate"/>
</w:r><w:r><w:t>today</w:t></w:r><w:r><w:fldChar w:fldCharType="end"/></w:r></w:p>"""


def hyperlink(paragraph, text: str) -> None:
    """A link to URL around a run of `text` at the end of `paragraph` (python-docx cannot add one)."""
    rid = paragraph.part.relate_to(URL, RELATIONSHIP_TYPE.HYPERLINK, is_external=True)
    link = parse_xml(f'<w:hyperlink {nsdecls("w", "r")} r:id="{rid}">'
                     f'<w:r><w:rPr><w:rStyle w:val="Hyperlink"/></w:rPr><w:t>{text}</w:t></w:r></w:hyperlink>')
    paragraph._p.append(link)


def word_file() -> bytes:
    """A report as people write them: a heading, formatting and a link inside sentences, a footnote, a tab,
    tracked changes and a field, nested tables, a text box, an image, a comment, a header and a footer."""
    d = docx.Document()
    d.add_heading("A short report", level=1)
    p = d.add_paragraph("The ")
    p.add_run("cat").bold = True
    p.add_run(" sat. See ")
    hyperlink(p, "the manual")
    p.add_run(" for more. Bye.")
    p = d.add_paragraph("This is true.")
    p._p.append(parse_xml(f'<w:r {nsdecls("w")}><w:footnoteReference w:id="1"/></w:r>'))
    p.add_run(" It is well known.")
    d.add_paragraph("Name:\tAnn Smith")
    d.element.body.insert(len(d.element.body) - 1, parse_xml(TRACKED))
    table = d.add_table(rows=2, cols=2)
    table.cell(0, 0).text = "A cell. Two sentences."
    table.cell(0, 1).text = "Another cell."
    table.cell(1, 0).add_table(rows=1, cols=2).cell(0, 1).text = "A nested cell."
    d.add_paragraph("Before the box. ")._p.append(parse_xml(TEXT_BOX))
    d.add_picture(io.BytesIO(png()))
    commented = d.add_paragraph("Check this sentence.")
    d.add_comment(commented.runs, text="A comment on it.", author="Ann")
    d.sections[0].header.paragraphs[0].text = "The header."
    d.sections[0].footer.paragraphs[0].text = "The footer."
    footnotes = Part(PackURI("/word/footnotes.xml"), CONTENT_TYPE.WML_FOOTNOTES, FOOTNOTES.encode(), d.part.package)
    d.part.relate_to(footnotes, RELATIONSHIP_TYPE.FOOTNOTES)
    out = io.BytesIO()
    d.save(out)
    return out.getvalue()


def texts(part: bytes, tag: str, inside: str = "") -> list[str]:
    root = etree.fromstring(part)
    return [node.text for node in root.iter(f"{{{W}}}{tag}") if not inside or any(
        a.tag == f"{{{W}}}{inside}" for a in node.iterancestors())]


def test_a_word_file_is_translated_in_every_place_and_keeps_everything_else():
    source = word_file()
    out = translated_file("docx", source)
    before, after = docx.Document(io.BytesIO(source)), docx.Document(io.BytesIO(out))
    assert len(after.paragraphs) == len(before.paragraphs) and len(after.tables) == len(before.tables) == 1
    assert [p.text for p in after.paragraphs] == [p.text.upper() for p in before.paragraphs]
    cells = [[c.text for c in row.cells] for row in after.tables[0].rows]
    assert cells == [[c.text.upper() for c in row.cells] for row in before.tables[0].rows]
    assert cells[0] == ["A CELL. TWO SENTENCES.", "ANOTHER CELL."]
    assert after.tables[0].cell(1, 0).tables[0].cell(0, 1).text == "A NESTED CELL."
    sections = after.sections[0]
    assert (sections.header.paragraphs[0].text, sections.footer.paragraphs[0].text) == ("THE HEADER.", "THE FOOTER.")
    assert [c.text for c in after.comments] == ["A COMMENT ON IT."]
    assert after.paragraphs[1].hyperlinks[0].address == URL
    assert len(after.inline_shapes) == 1

    changed = assert_only_text_changed(source, out)
    assert changed == {"word/document.xml", "word/header1.xml", "word/footer1.xml", "word/footnotes.xml",
                       "word/comments.xml"}  # styles, settings, the image: byte for byte
    with zipfile.ZipFile(io.BytesIO(out)) as translated:
        footnotes, document = translated.read("word/footnotes.xml"), translated.read("word/document.xml")
    assert texts(footnotes, "t") == ["A FOOTNOTE. IT HAS TWO SENTENCES."]
    assert texts(document, "t", inside="txbxContent") == ["TEXT IN A BOX."]
    # Deleted text and field codes are not text a reader sees; the field's shown value is.
    assert texts(document, "delText") == ["deleted words"]
    assert texts(document, "instrText") == [' DATE \\@ "d MMMM" ']
    assert "TODAY" in texts(document, "t")


def test_formatting_and_a_link_inside_a_sentence_stay_on_their_words():
    out = docx.Document(io.BytesIO(translated_file("docx", word_file())))
    runs = out.paragraphs[1]._p.xpath(".//w:r")
    # The bold "cat" and the link "the manual", each translated on its own too, found in their sentences'
    # translations: each run holds its own words; the footnote mark stays in place.
    assert [run.text for run in runs] == ["THE ", "CAT", " SAT. SEE ", "THE MANUAL", " FOR MORE. BYE."]
    assert runs[1].xpath("w:rPr/w:b") and out.paragraphs[1].hyperlinks[0].text == "THE MANUAL"
    marked = out.paragraphs[2]._p
    assert [child.tag.rpartition("}")[2] for child in marked.xpath("w:r/*")] == ["t", "footnoteReference", "t"]
    assert [p.text for p in out.paragraphs[3:4]] == ["NAME:\tANN SMITH"]  # each side of a tab on its own


def word_paragraph(*runs: tuple[str, str]) -> bytes:
    """A Word file of one paragraph of `runs`: (text, "" / "bold" / "italic" / "link")."""
    d = docx.Document()
    p = d.add_paragraph()
    for text, kind in runs:
        if kind == "link":
            hyperlink(p, text)
        else:
            run = p.add_run(text)
            run.bold, run.italic = kind == "bold", kind == "italic"
    data = io.BytesIO()
    d.save(data)
    return data.getvalue()


def formatted_runs(data: bytes) -> list[tuple[str, str]]:
    """The runs of the first paragraph, as python-docx reads them: (text, "" / "bold" / "italic" / "link")."""
    p = docx.Document(io.BytesIO(data)).paragraphs[0]
    return [(item.text, "link") if isinstance(item, docx.text.hyperlink.Hyperlink) else
            (item.text, "bold" if item.bold else "italic" if item.italic else "") for item in p.iter_inner_content()]


def test_a_bold_word_goes_to_its_translation_wherever_the_translation_puts_it():
    source = word_paragraph(("Ein ", ""), ("roter", "bold"), (" Ball rollt.", ""))
    translate = by_word({"Ein": "A", "roter": "red", "Ball": "ball", "rollt": "rolls"})
    assert formatted_runs(translated_file("docx", source, translate)) == [
        ("A ", ""), ("red", "bold"), (" ball rolls.", "")]
    # Another order: the bold words' translation is found at the end, so the end is bold, the runs in their order.
    source = word_paragraph(("Ich habe ", ""), ("den Hund", "bold"), (" gesehen.", ""))
    translate = exactly({"Ich habe den Hund gesehen.": "I have seen the dog.", "den Hund": "the dog"})
    assert formatted_runs(translated_file("docx", source, translate)) == [
        ("I have seen ", ""), ("the dog", "bold"), (".", "")]


def test_a_link_inside_a_sentence_becomes_its_texts_translation_else_wraps_the_whole_sentence():
    source = word_paragraph(("Lesen Sie ", ""), ("das Handbuch", "link"), (" zuerst.", ""))
    found = exactly({"Lesen Sie das Handbuch zuerst.": "Read the manual first.", "das Handbuch": "The manual."})
    assert formatted_runs(translated_file("docx", source, found)) == [
        ("Read ", ""), ("the manual", "link"), (" first.", "")]
    lost = exactly({"Lesen Sie das Handbuch zuerst.": "Read the handbook first.", "das Handbuch": "The manual."})
    out = translated_file("docx", source, lost)
    assert formatted_runs(out) == [("", ""), ("Read the handbook first.", "link"), ("", "")]
    assert docx.Document(io.BytesIO(out)).paragraphs[0].hyperlinks[0].address == URL


def test_a_span_not_found_keeps_its_formatting_where_it_stood():
    source = word_paragraph(("Der ", ""), ("alte", "italic"), (" Mann und der ", ""), ("Hund", "bold"),
                            (" schlafen.", ""))
    translate = exactly({"Der alte Mann und der Hund schlafen.": "The elderly man and the dog sleep.",
                 "alte": "old", "Hund": "dog"})
    # "old" is not in the translation: the italics go to the word standing where "alte" stood (by the letters
    # before it, the second of the five before "dog"); the bold to "dog", found.
    assert formatted_runs(translated_file("docx", source, translate)) == [
        ("The ", ""), ("elderly", "italic"), (" man and the ", ""), ("dog", "bold"), (" sleep.", "")]


def test_a_hyperlink_field_keeps_its_link_on_its_words():
    d = docx.Document()
    p = d.add_paragraph("Visit ")
    for xml in ['<w:fldChar w:fldCharType="begin"/>', f'<w:instrText> HYPERLINK "{URL}" </w:instrText>',
                '<w:fldChar w:fldCharType="separate"/>', "<w:t>us</w:t>", '<w:fldChar w:fldCharType="end"/>']:
        p._p.append(parse_xml(f"<w:r {nsdecls('w')}>{xml}</w:r>"))
    p.add_run(" again today.")
    data = io.BytesIO()
    d.save(data)
    out = docx.Document(io.BytesIO(translated_file("docx", data.getvalue())))
    # The field's shown text is the link: its translation goes there, though " again today." has more letters.
    assert [t.text or "" for t in out.paragraphs[0]._p.xpath(".//w:t")] == ["VISIT ", "US", " AGAIN TODAY."]
    lost = exactly({"Visit us again today.": "Come back today.", "us": "we"})
    out = docx.Document(io.BytesIO(translated_file("docx", data.getvalue(), lost)))
    assert [t.text or "" for t in out.paragraphs[0]._p.xpath(".//w:t")] == ["", "Come back today.", ""]


def test_spaces_a_run_gets_at_its_edges_are_kept_for_word():
    source = word_paragraph(("I like it. Yes", ""), (" sir.", "link"))
    translate = exactly({"I like it.": "Ich mag es.", "Yes sir.": "Jawohl, mein Herr.", "sir.": "Herrschaft."})
    out = docx.Document(io.BytesIO(translated_file("docx", source, translate)))
    t = out.paragraphs[0]._p.xpath(".//w:t")  # the link's text not found: the link wraps its whole sentence
    assert [x.text for x in t] == ["Ich mag es. ", "Jawohl, mein Herr."] and t[0].get(qn("xml:space")) == "preserve"


def powerpoint_file() -> bytes:
    """A deck: a title and bullet slide with bold inside a sentence, a text box with a link, a table and notes;
    a title-only slide; and a layout with its own text box (a company name shown on every slide of it)."""
    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[1])
    slide.shapes.title.text = "Quarterly results"
    body = slide.placeholders[1].text_frame
    body.text = "Sales grew. Costs fell."
    para = body.add_paragraph()
    for text, bold in [("I like ", False), ("red", True), (" cars.", False)]:
        run = para.add_run()
        run.text, run.font.bold = text, bold
    box = slide.shapes.add_textbox(Inches(1), Inches(5), Inches(4), Inches(1)).text_frame
    box.text = "See "
    link = box.paragraphs[0].add_run()
    link.text, link.hyperlink.address = "the website", URL
    box.paragraphs[0].add_run().text = " for details."
    table = slide.shapes.add_table(2, 2, Inches(5), Inches(5), Inches(3), Inches(1)).table
    for (row, col), text in {(0, 0): "Region", (0, 1): "Growth", (1, 0): "North", (1, 1): "Ten percent."}.items():
        table.cell(row, col).text = text
    slide.notes_slide.notes_text_frame.text = "Say this slowly. Then pause."
    last = deck.slides.add_slide(deck.slide_layouts[5])
    last.shapes.title.text = "Thank you"
    company = last.shapes.add_textbox(Inches(0), Inches(7), Inches(3), Inches(0.5))
    company.text_frame.text = "Example company"
    deck.slide_layouts[1].shapes._spTree.append(copy.deepcopy(company._element))
    company._element.getparent().remove(company._element)
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def frames(deck) -> list[list[list[str]]]:
    """Per slide, per shape with text, its paragraphs' texts (a table's cells, row by row)."""
    out = []
    for slide in deck.slides:
        shapes = []
        for shape in slide.shapes:
            if shape.has_text_frame:
                shapes.append([p.text for p in shape.text_frame.paragraphs])
            elif shape.has_table:
                shapes.append([cell.text for row in shape.table.rows for cell in row.cells])
        out.append(shapes)
    return out


def test_a_powerpoint_file_is_translated_slide_by_slide_with_its_notes_and_keeps_everything_else():
    source = powerpoint_file()
    out = translated_file("pptx", source)
    before, after = pptx.Presentation(io.BytesIO(source)), pptx.Presentation(io.BytesIO(out))
    assert len(after.slides) == len(before.slides) == 2
    assert frames(after) == [[[text.upper() for text in shape] for shape in slide] for slide in frames(before)]
    assert frames(after)[0][1] == ["SALES GREW. COSTS FELL.", "I LIKE RED CARS."]
    notes = [slide.notes_slide.notes_text_frame.text for slide in after.slides if slide.has_notes_slide]
    assert notes == ["SAY THIS SLOWLY. THEN PAUSE."]
    runs = after.slides[0].shapes[2].text_frame.paragraphs[0].runs
    assert [r.text for r in runs] == ["SEE ", "THE WEBSITE", " FOR DETAILS."] and runs[1].hyperlink.address == URL
    bold = [(r.text, r.font.bold) for r in after.slides[0].shapes[1].text_frame.paragraphs[1].runs]
    assert bold == [("I LIKE ", False), ("RED", True), (" CARS.", False)]

    # A layout's own text box is what every slide of it shows; its placeholders' text is the prompt of an empty
    # one, never shown: not translated. Masters, themes and the other layouts: byte for byte.
    layout = after.slide_layouts[1]
    assert [s.text_frame.text for s in layout.shapes if not s.is_placeholder] == ["EXAMPLE COMPANY"]
    prompts = [s.text_frame.text for s in layout.placeholders if s.has_text_frame and s.text_frame.text]
    assert prompts and all(p == before_p for p, before_p in zip(
        prompts, [s.text_frame.text for s in before.slide_layouts[1].placeholders if s.text_frame.text],
        strict=True))
    changed = assert_only_text_changed(source, out)
    assert changed == {"ppt/slides/slide1.xml", "ppt/slides/slide2.xml", "ppt/notesSlides/notesSlide1.xml",
                       "ppt/slideLayouts/slideLayout2.xml"}


def test_a_charts_title_is_translated_and_its_data_kept():
    """A chart's titles are visible text (DrawingML paragraphs in its own part); its categories and values are
    data, kept as they are."""
    from pptx.chart.data import CategoryChartData
    from pptx.enum.chart import XL_CHART_TYPE

    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[6])
    data = CategoryChartData()
    data.categories = ["Q1", "Q2"]
    data.add_series("Sales", (1.0, 2.0))
    chart = slide.shapes.add_chart(XL_CHART_TYPE.COLUMN_CLUSTERED, Inches(1), Inches(1), Inches(4), Inches(3),
                                   data).chart
    chart.has_title = True
    chart.chart_title.text_frame.text = "Sales grew in spring."
    buffer = io.BytesIO()
    deck.save(buffer)
    out = translated_file("pptx", buffer.getvalue())
    after = pptx.Presentation(io.BytesIO(out)).slides[0].shapes[0].chart
    assert after.chart_title.text_frame.text == "SALES GREW IN SPRING."
    assert list(after.plots[0].categories) == ["Q1", "Q2"] and after.series[0].name == "Sales"
    assert list(after.series[0].values) == [1.0, 2.0]
