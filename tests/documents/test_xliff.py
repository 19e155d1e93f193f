"""XLIFF in, XLIFF out (mt/documents/xliff.py): targets added to the untranslated units and marked for review,
everything else as it was, inline codes all kept; read back by lxml and by translate-toolkit (Weblate's reader);
entity attacks and other versions refused. And `mt translate --format po|xliff` end to end on a tiny model."""


import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree

pytest.importorskip("sentencex")
toolkit_xliff = pytest.importorskip("translate.storage.xliff")
toolkit_xliff2 = pytest.importorskip("translate.storage.xliff2")
polib = pytest.importorskip("polib")

from mt.documents.formats import format_of, read_file  # noqa: E402
from mt.documents.sentences import finish, plan  # noqa: E402
from mt.errors import MtError  # noqa: E402

from ..conftest import assert_refused  # noqa: E402
from .test_documents import model_path, mt_translate  # noqa: E402, F401  (model_path: a fixture)
from .test_html import inline_markup  # noqa: E402
from .test_po import PO  # noqa: E402

V1 = "urn:oasis:names:tc:xliff:document:1.2"
V2 = "urn:oasis:names:tc:xliff:document:2.0"


def translated(data: bytes, translate=str.upper) -> bytes:
    todo = plan([read_file("xliff", data, "app.xlf")], "en", lambda texts: [len(t.split()) for t in texts], 100)
    return finish(todo, [translate(part) for part in todo.parts])[0]


XLIFF_1 = f"""<?xml version="1.0" encoding="UTF-8"?>
<xliff version="1.2" xmlns="{V1}" xmlns:my="urn:example:mine">
  <file original="app.html" source-language="en" target-language="de" datatype="html">
    <header><note>Made by hand.</note></header>
    <body>
      <group id="menu" resname="menu">
        <trans-unit id="1" resname="greeting" my:extra="kept">
          <source>The cat sleeps. Click <g id="b1" ctype="bold">here</g> to wake it.</source>
          <note from="developer">A cat.</note>
        </trans-unit>
        <trans-unit id="2" translate="no"><source>Acme Inc.</source></trans-unit>
      </group>
      <group id="legal" translate="no">
        <trans-unit id="3"><source>All rights reserved.</source></trans-unit>
        <trans-unit id="4" translate="yes"><source>Read the terms.</source></trans-unit>
      </group>
      <trans-unit id="5">
        <source>Page <x id="p1" ctype="x-page"/> of <x id="p2"/>. <bx id="l1"/>Next<ex id="l2"/> page.</source>
        <target/>
      </trans-unit>
      <trans-unit id="6">
        <source>Done.</source>
        <target state="translated">Fertig.</target>
      </trans-unit>
    </body>
  </file>
  <file original="b.txt" source-language="en" datatype="plaintext">
    <body>
      <trans-unit id="1"><source>Hello <mrk mtype="protected">Acme</mrk> world. <ph id="1">&lt;br/&gt;</ph>Bye.</source>
      </trans-unit>
    </body>
  </file>
</xliff>
"""

XLIFF_2 = f"""<?xml version="1.0" encoding="UTF-8"?>
<xliff xmlns="{V2}" version="2.0" srcLang="en" trgLang="de">
  <file id="f1">
    <notes><note id="n1">A file note.</note></notes>
    <unit id="u1" name="welcome">
      <originalData>
        <data id="d1">&lt;b&gt;</data><data id="d2">&lt;/b&gt;</data><data id="d3">&lt;br/&gt;</data>
      </originalData>
      <segment id="s1">
        <source>The <pc id="1" dataRefStart="d1" dataRefEnd="d2">cat</pc> sleeps.</source>
      </segment>
      <ignorable>
        <source> </source>
      </ignorable>
      <segment id="s2">
        <source>A dog<ph id="2" dataRef="d3"/> runs <mrk id="m1" translate="no">Acme</mrk> now.</source>
      </segment>
      <segment id="s3" state="final">
        <source>It barks.</source>
        <target>Er bellt.</target>
      </segment>
    </unit>
    <group id="g1" translate="no">
      <unit id="u2"><segment><source>Acme</source></segment></unit>
    </group>
    <unit id="u3">
      <notes><note>Keep it short.</note></notes>
      <segment><source>Save the file.</source><target/></segment>
    </unit>
  </file>
</xliff>
"""


def without_targets(data: bytes) -> bytes:
    """The file as XML with every target, each segment's state and whitespace between elements left out."""
    tree = etree.fromstring(data)
    for target in tree.iter(f"{{{V1}}}target", f"{{{V2}}}target"):
        target.getparent().remove(target)
    for segment in tree.iter(f"{{{V2}}}segment"):
        segment.attrib.pop("state", None)
    for element in tree.iter():
        element.tail = element.tail if (element.tail or "").strip() else None
        element.text = element.text if (element.text or "").strip() or len(element) == 0 else None
    return etree.tostring(tree, method="c14n")


def codes(element: etree._Element) -> list[tuple[str, dict]]:
    return sorted((child.tag, sorted(child.attrib.items())) for child in element.iter() if child is not element)


def words(element: etree._Element) -> list[str]:
    return "".join(element.itertext()).split()


def letters(element: etree._Element) -> list[str]:
    """The characters of an element's text, codes' text included, in any order and case: what must all be there."""
    return sorted("".join("".join(element.itertext()).upper().split()))


def inner(element: etree._Element) -> str:
    """An element's content as XML, namespace declarations left out."""
    return etree.tostring(element, encoding="unicode", with_tail=False).split(">", 1)[1].rsplit("</", 1)[0] \
        .replace(f' xmlns="{V1}"', "").replace(f' xmlns="{V2}"', "")


def test_xliff_1_2_targets_added_marked_for_review_and_nothing_else_changed():
    out = translated(XLIFF_1.encode())
    assert without_targets(out) == without_targets(XLIFF_1.encode())
    tree = etree.fromstring(out)
    units = {(u.getparent().getparent().get("original") if u.getparent().tag.endswith("body") else "app.html",
              u.get("id")): u for u in tree.iter(f"{{{V1}}}trans-unit")}
    targets = {key: unit.find(f"{{{V1}}}target") for key, unit in units.items()}
    mt = {("app.html", "1"), ("app.html", "4"), ("app.html", "5"), ("b.txt", "1")}
    assert {key for key, target in targets.items() if target is not None and target.get("state") ==
            "needs-review-translation" and target.get("state-qualifier") == "mt-suggestion"} == mt
    assert targets["app.html", "2"] is None and targets["app.html", "3"] is None  # translate="no", or its group's
    assert targets["app.html", "6"].attrib == {"state": "translated"} and inner(targets["app.html", "6"]) == "Fertig."
    for key in mt:  # every inline code of the source, with its attributes, and all of its text
        source = units[key].find(f"{{{V1}}}source")
        assert codes(targets[key]) == codes(source) and letters(targets[key]) == letters(source)
    assert inner(targets["app.html", "1"]) == 'THE CAT SLEEPS. <g id="b1" ctype="bold">CLICK HERE TO WAKE IT.</g>'
    assert inner(targets["b.txt", "1"]) == ('<mrk mtype="protected">Acme</mrk>HELLO WORLD. <ph id="1">&lt;br/&gt;'
                                            '</ph>BYE.')  # a code inside a sentence goes before it
    # translate-toolkit (what Weblate reads XLIFF with) sees the same units, the new targets as fuzzy.
    before, after = (toolkit_xliff.xlifffile.parsestring(data) for data in (XLIFF_1.encode(), out))
    assert [u.getid() for u in after.units] == [u.getid() for u in before.units] and len(after.units) == 7
    assert [u.source for u in after.units] == [u.source for u in before.units]
    fuzzy = [u.getid().split("\x04")[1] for u in after.units if u.target and u.get_state_n() ==
             toolkit_xliff.xliffunit.S_NEEDS_REVIEW]
    assert fuzzy == ["1", "4", "5", "1"]
    # translate-toolkit reads translate="no" on a unit only; mt also honours its group's (unit 3).
    assert [u.istranslatable() for u in after.units] == [True, False, True, True, True, True, True]


def test_xliff_2_segments_get_targets_in_state_initial_and_nothing_else_changed():
    out = translated(XLIFF_2.encode())
    assert without_targets(out) == without_targets(XLIFF_2.encode())
    tree = etree.fromstring(out)
    segments = list(tree.iter(f"{{{V2}}}segment"))
    assert [(s.get("state"), words(s.find(f"{{{V2}}}target")) if s.find(f"{{{V2}}}target") is not None else None)
            for s in segments] == [("initial", ["THE", "CAT", "SLEEPS."]),
                                   ("initial", ["AcmeA", "DOG", "RUNS", "NOW."]),
                                   ("final", ["Er", "bellt."]), (None, None), ("initial", ["SAVE", "THE", "FILE."])]
    for segment in (segments[0], segments[1]):
        assert codes(segment.find(f"{{{V2}}}target")) == codes(segment.find(f"{{{V2}}}source"))
    assert inner(segments[1].find(f"{{{V2}}}target")) == \
        '<ph id="2" dataRef="d3"/><mrk id="m1" translate="no">Acme</mrk>A DOG RUNS NOW.'
    assert inner(segments[0].find(f"{{{V2}}}target")) == \
        '<pc id="1" dataRefStart="d1" dataRefEnd="d2">THE CAT SLEEPS.</pc>'
    assert tree.find(f".//{{{V2}}}ignorable").find(f"{{{V2}}}target") is None
    before, after = (toolkit_xliff2.Xliff2File.parsestring(data) for data in (XLIFF_2.encode(), out))
    assert [u.getid() for u in after.units] == [u.getid() for u in before.units] == \
        ["u1::s1", "u1::s2", "u1::s3", "u2", "u3"]
    assert [(u.isfuzzy(), u.istranslated(), u.istranslatable()) for u in after.units] == [
        (True, False, True), (True, False, True), (False, True, True), (False, False, True), (True, False, True)]


def test_nothing_left_to_translate_leaves_the_file_as_it_was():
    for source in (XLIFF_1.encode(), XLIFF_2.encode()):
        done = translated(source)
        assert translated(done) == done
    assert format_of("a.xlf") == format_of("a.XLIFF") == "xliff"


def test_a_segmented_trans_unit_gets_its_target_segmented_alike():
    source = (f'<xliff version="1.2" xmlns="{V1}"><file><body><trans-unit id="1"><source>One cat. Two dogs.</source>'
              '<seg-source><mrk mtype="seg" mid="1">One cat.</mrk> <mrk mtype="seg" mid="2">Two dogs.</mrk>'
              '</seg-source></trans-unit></body></file></xliff>').encode()
    unit = etree.fromstring(translated(source)).find(f".//{{{V1}}}trans-unit")
    assert [etree.QName(child).localname for child in unit] == ["source", "seg-source", "target"]
    assert inner(unit[2]) == '<mrk mtype="seg" mid="1">ONE CAT.</mrk> <mrk mtype="seg" mid="2">TWO DOGS.</mrk>'


def as_codes(markup: str) -> str:
    """test_html's inline markup as XLIFF 1.2 codes: each element a <g>, each image an <x/> or a <ph> in turn."""
    count = iter(range(10_000))

    def code(m: re.Match) -> str:
        i = next(count)
        if m.group(1) == "/":
            return "</g>"
        if m.group(2) != "img":
            return f'<g id="g{i}">'
        return f'<x id="x{i}"/>' if i % 2 else f'<ph id="p{i}">&lt;br&gt;</ph>'
    return re.sub(r"<(/?)(\w+)[^>]*>", code, markup)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.builds(as_codes, inline_markup()))
def test_inline_codes_are_never_dropped_and_the_text_is_all_there(content):
    source = (f'<xliff version="1.2" xmlns="{V1}"><file><body><trans-unit id="1"><source>{content}</source>'
              f'</trans-unit></body></file></xliff>').encode()
    unit = etree.fromstring(translated(source, translate=lambda part: part)).find(f".//{{{V1}}}trans-unit")
    source_element, target = unit  # nothing translated: the target is the source's content, as it was
    assert inner(target) == inner(source_element)
    target = etree.fromstring(translated(source)).find(f".//{{{V1}}}target")
    assert codes(target) == codes(source_element) and letters(target) == letters(source_element)


SECRET = "TOP-SECRET-LINE"


@pytest.mark.parametrize("xml, phrase", [
    ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;">]>'
     f'<xliff version="1.2" xmlns="{V1}"><file><body><trans-unit id="1"><source>&lol2;</source></trans-unit>'
     '</body></file></xliff>', "declares XML entities"),
    ('<?xml version="1.0"?><!DOCTYPE xliff [<!ENTITY xxe SYSTEM "file://{secret}">]>'
     f'<xliff version="1.2" xmlns="{V1}"><file><body><trans-unit id="1"><source>A &xxe;</source></trans-unit>'
     '</body></file></xliff>', "declares XML entities"),
    ('<?xml version="1.0"?><!DOCTYPE xliff [<!ENTITY % pe SYSTEM "file://{secret}"> %pe;]>'
     f'<xliff version="1.2" xmlns="{V1}"><file/></xliff>', "declares XML entities"),
    ('<xliff version="1.1" xmlns="urn:oasis:names:tc:xliff:document:1.1"><file/></xliff>',
     "XLIFF version '1.1' in namespace 'urn:oasis:names:tc:xliff:document:1.1': mt reads XLIFF 1.2"),
    (f'<xliff version="2.0" xmlns="{V1}"><file/></xliff>', "XLIFF version '2.0' in namespace"),
    ('<html><body><p>Hello.</p></body></html>', "app.xlf:1: not XLIFF: the root element is <html>"),
    ("PK\x03\x04 a zip file", "not well-formed XML"),
    (f'<xliff version="1.2" xmlns="{V1}"><file><body>\n<trans-unit id="7"><target/></trans-unit></body></file>'
     '</xliff>', "app.xlf:2: <trans-unit id='7'> has no <source>"),
])
def test_entity_attacks_other_versions_and_broken_files_are_refused_in_one_line(xml, phrase, tmp_path):
    (tmp_path / "secret.txt").write_text(SECRET)
    with pytest.raises(MtError, match="^app.xlf") as refused:
        translated(xml.replace("{secret}", str(tmp_path / "secret.txt")).encode())
    assert phrase in str(refused.value) and SECRET not in str(refused.value)


def test_an_external_dtd_is_never_read(tmp_path):
    (tmp_path / "x.dtd").write_text(f'<!ENTITY secret "{SECRET}">')
    xml = (f'<?xml version="1.0"?><!DOCTYPE xliff SYSTEM "{tmp_path / "x.dtd"}"><xliff version="1.2" xmlns="{V1}">'
           '<file><body><trans-unit id="1"><source>A &secret; cat.</source></trans-unit></body></file></xliff>')
    out = translated(xml.encode())
    assert SECRET not in out.decode() and b"&secret;A CAT.</target>" in out  # the reference kept, never expanded


def test_translate_format_po_and_xliff_end_to_end(model_path, tmp_path):  # noqa: F811
    for name, source in (("in.po", PO), ("in.xlf", XLIFF_1), ("in.xliff", XLIFF_2)):
        (tmp_path / name).write_text(source, encoding="utf-8")
        out = tmp_path / ("out." + name.split(".")[1])
        fmt = format_of(name)
        result = mt_translate("-c", model_path, "-i", tmp_path / name, "-o", out, "--format", fmt, "--beam", "1")
        assert result.exit_code == 0, result.output
        if fmt == "po":  # whatever the untrained model says: every entry there, the untranslated ones fuzzy
            before, after = polib.pofile(source), polib.pofile(str(out))
            assert [e.msgid for e in after] == [e.msgid for e in before]
            assert {e.msgid for e in after.fuzzy_entries()} >= {e.msgid for e in before.untranslated_entries()
                                                                 if e.msgid_plural == "" and "%" not in e.msgid}
        else:
            assert without_targets(out.read_bytes()) == without_targets(source.encode())
    (tmp_path / "bad.po").write_text(PO.replace('msgstr[1] ""', 'msgstr[2] ""'), encoding="utf-8")
    assert_refused(mt_translate("-c", model_path, "-i", tmp_path / "bad.po", "-o", tmp_path / "o.po", "--format",
                                "po"), f"{tmp_path / 'bad.po'}:40: msgstr[2] out of place: expected msgstr[1]")
    assert not (tmp_path / "o.po").exists()
