"""gettext PO in, PO out (mt/documents/po.py): untranslated entries filled and marked fuzzy, every other line byte
for byte, read back by polib and checked by GNU msgfmt; placeholders kept or the entry left alone; bad files
refused naming the line."""

import difflib
import re
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("sentencex")
polib = pytest.importorskip("polib")

from mt.documents.formats import format_of, read_file  # noqa: E402
from mt.documents.sentences import finish, plan  # noqa: E402
from mt.errors import MtError  # noqa: E402


def bracketed(part: str) -> str:
    """A stand-in for the model that keeps every placeholder: each sentence in brackets."""
    return f"[{part}]"


def translated(data: bytes, translate=bracketed, name: str = "app.po") -> bytes:
    todo = plan([read_file("po", data, name)], "en", lambda texts: [len(t.split()) for t in texts], 100)
    return finish(todo, [translate(part) for part in todo.parts])[0]


PO = r'''# Czech translation of Example.
# Copyright (C) 2024 Example Inc.
#
msgid ""
msgstr ""
"Project-Id-Version: example 1.0\n"
"Language: cs\n"
"MIME-Version: 1.0\n"
"Content-Type: text/plain; charset=UTF-8\n"
"Content-Transfer-Encoding: 8bit\n"
"Plural-Forms: nplurals=3; plural=(n==1) ? 0 : (n>=2 && n<=4) ? 1 : 2;\n"

# A translator's note.
#. Shown on the start page.
#: src/app.py:10 src/app.py:14
msgid "The cat sleeps. The dog runs."
msgstr ""

#: src/app.py:20
#, python-format
msgid "Hello %(name)s, you have {0} new mails at 100%%."
msgstr ""

#: src/menu.py:3
msgctxt "menu"
msgid "Open the file."
msgstr "Otevřít soubor."

#: src/menu.py:4
msgctxt "button"
msgid "Open"
msgstr ""

#: src/app.py:30
#, c-format
#| msgid "One file deleted."
msgid "One file was deleted."
msgid_plural "%d files were deleted."
msgstr[0] ""
msgstr[1] ""

#: src/help.py:40
msgid ""
"A long help text that goes on over several lines, as help texts do, and it says "
"\"quoted\" things.\n"
"It has a second line.\n"
msgstr ""

#, fuzzy
#~ msgid "An old message."
#~ msgstr "Stará zpráva."

#~| msgid "Older."
#~ msgid "Old."
#~ msgstr ""
'''


def test_untranslated_entries_are_filled_and_marked_fuzzy_and_every_other_line_stays():
    out = translated(PO.encode())
    before, after = polib.pofile(PO), polib.pofile(out.decode())
    assert after.metadata == before.metadata and len(after) == len(before) == 8
    assert len(after.obsolete_entries()) == 2 and len(after.fuzzy_entries()) == 5
    for old, new in zip(before, after, strict=True):  # nothing but msgstr and the fuzzy flag changed
        assert (old.msgctxt, old.msgid, old.msgid_plural, old.obsolete) == \
               (new.msgctxt, new.msgid, new.msgid_plural, new.obsolete)
        assert (old.comment, old.tcomment, old.occurrences, old.previous_msgid) == \
               (new.comment, new.tcomment, new.occurrences, new.previous_msgid)
        filled = not old.obsolete and not old.translated()
        assert new.flags == ["fuzzy"] * filled + old.flags
        if not filled:
            assert (new.msgstr, new.msgstr_plural) == (old.msgstr, old.msgstr_plural)
    entries = {(e.msgctxt, e.msgid): e for e in after}
    assert entries[None, "The cat sleeps. The dog runs."].msgstr == "[The cat sleeps.] [The dog runs.]"
    assert entries[None, "Hello %(name)s, you have {0} new mails at 100%%."].msgstr == \
        "[Hello %(name)s, you have {0} new mails at 100%%.]"
    assert entries["button", "Open"].msgstr == "[Open]"
    # Every form the header's nplurals asks for: the first from msgid, the others from msgid_plural.
    assert entries[None, "One file was deleted."].msgstr_plural == {
        0: "[One file was deleted.]", 1: "[%d files were deleted.]", 2: "[%d files were deleted.]"}
    assert entries[None, before[5].msgid].msgstr == ('[A long help text that goes on over several lines, as help '
                                                     'texts do, and it says "quoted" things.]\n'
                                                     '[It has a second line.]\n')
    # In the file: only msgstr lines and flags lines changed, and each new flags line is where gettext puts it.
    changed = [line for line in difflib.ndiff(PO.split("\n"), out.decode().split("\n")) if line[:1] in "+-"]
    assert all(line[2:].startswith(("msgstr", '"', "#, ")) for line in changed), changed
    assert "#, fuzzy, c-format\n#| msgid" in out.decode()
    assert '#: src/menu.py:4\n#, fuzzy\nmsgctxt "button"' in out.decode()
    if shutil.which("msgfmt"):  # GNU gettext's own check: format strings, plural forms, line breaks, header
        checked = subprocess.run(["msgfmt", "--check", "--use-fuzzy", "-o", "/dev/null", "-"], input=out,
                                 capture_output=True)
        assert checked.returncode == 0, checked.stderr.decode()


def test_nothing_left_to_translate_leaves_the_file_byte_for_byte():
    done = translated(PO.encode())
    assert translated(done) == done
    assert format_of("app.pot") == format_of("app.po") == "po"


def test_a_translation_that_lost_a_placeholder_leaves_its_entry_untranslated_and_says_so(capsys):
    out = translated(PO.encode(), translate=lambda part: part.replace("%(name)s", "NAME").replace("%d", "N"))
    entries = {e.msgid: e for e in polib.pofile(out.decode())}
    assert entries["Hello %(name)s, you have {0} new mails at 100%%."].msgstr == ""
    assert "fuzzy" not in entries["One file was deleted."].flags
    assert entries["One file was deleted."].msgstr_plural == {0: "", 1: ""}
    assert entries["Open"].msgstr == "Open"  # the others are filled
    warnings = capsys.readouterr().err.strip().split("\n")
    assert warnings == [
        "warning: app.po:21: msgstr: the translation of 'Hello %(name)s, you have {0} new mails a' lost %(name)s of "
        "its source; the entry is left untranslated",
        "warning: app.po:37: msgstr[1]: the translation of '%d files were deleted.' lost %d of its source; the "
        "entry is left untranslated"]


def test_the_header_charset_decodes_and_encodes_and_a_pot_becomes_utf8(capsys):
    latin = PO.replace("charset=UTF-8", "charset=ISO-8859-1").replace("Otevřít soubor", "Ouvrir le fichier")
    out = translated(latin.encode("latin-1"), translate=lambda part: "café " + part)
    assert polib.pofile(out.decode("latin-1"))[0].msgstr == "café The cat sleeps. café The dog runs."
    out = translated(latin.encode("latin-1"), translate=lambda part: "€ " + part)
    assert out == latin.encode("latin-1") and "'€', which the file's charset cannot hold" in capsys.readouterr().err
    pot = PO.replace("charset=UTF-8", "charset=CHARSET").replace("Otevřít soubor.", "")
    out = translated(pot.encode(), translate=lambda part: "Žluťoučký " + part)
    assert '"Content-Type: text/plain; charset=UTF-8\\n"' in out.decode("utf-8")


def test_crlf_line_ends_and_a_bom_are_kept():
    source = ("\ufeff" + PO).replace("\n", "\r\n").encode()
    out = translated(source)
    assert out.startswith(b"\xef\xbb\xbf# Czech") and out.count(b"\r\n") == out.count(b"\n")
    assert polib.pofile(out.decode("utf-8-sig"))[0].msgstr == "[The cat sleeps.] [The dog runs.]"


@pytest.mark.parametrize("broken, line, phrase", [
    (PO.replace('msgstr "Otevřít soubor."', 'msgstr Otevřít soubor.'), 27, "expected a string in double quotes"),
    (PO.replace('msgid "Open"', 'msgid "O\\pen"'), 31, r"unknown escape \p"),
    (PO.replace('msgstr[1] ""', 'msgstr[2] ""'), 40, "expected msgstr[1]"),
    (PO.replace('msgctxt "button"\nmsgid "Open"\n', ''), 30, "a msgid must come before it"),
    (PO.replace('msgid_plural "%d files were deleted."', 'msgid "%d files were deleted."'), 38,
     "needs its msgstr first"),
    (PO.replace('#: src/menu.py:3', 'src/menu.py:3'), 24, "not PO syntax"),
    (PO.rsplit('msgstr ""', 1)[0], 54, "the file ends before it"),
    (PO.replace("Otevřít", "Otev\udcf8ít"), 27, "not UTF-8, the charset its header names"),
    (PO.replace("charset=UTF-8", "charset=KLINGON-8"), 5, "charset 'KLINGON-8' is not one mt (or gettext) reads"),
    ("PK\x03\x04\x14\x00 a zip file\n", 1, "not PO syntax"),
])
def test_a_file_that_is_not_po_is_refused_naming_the_line(broken, line, phrase):
    with pytest.raises(MtError, match=rf"^app.po:{line}: .*{re.escape(phrase)}"):
        read_file("po", broken.encode("utf-8", "surrogateescape"), "app.po")


# Any text polib itself reads back: no control characters or line separators, which polib's splitlines() splits on.
MSGID = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zl", "Zp"))
                | st.sampled_from("\n\t\"\\%{}"), min_size=1, max_size=120)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(MSGID, st.none() | MSGID, st.booleans(), st.booleans()), min_size=1, max_size=6,
                unique_by=lambda e: (e[0], e[1])))
def test_what_polib_writes_mt_reads_as_polib_does(entries):
    catalog = polib.POFile(wrapwidth=40)
    catalog.metadata = {"Content-Type": "text/plain; charset=UTF-8", "Plural-Forms": "nplurals=2; plural=n!=1;"}
    for msgid, msgctxt, plural, done in entries:
        catalog.append(polib.POEntry(msgid=msgid, msgctxt=msgctxt, msgid_plural=msgid + "s" if plural else "",
                                     msgstr="x" if done and not plural else "",
                                     msgstr_plural={0: "x", 1: "y"} if plural and done else {0: "", 1: ""}
                                     if plural else {}))
    source = str(catalog).encode()
    todo = [e for e in polib.pofile(source.decode()) if not e.translated()]
    assert read_file("po", source, "p.po").units == [t for e in todo for t in [e.msgid, e.msgid_plural] if t]
    out = translated(source, translate=lambda part: part)  # the source as its own translation
    assert [(e.msgid, e.msgstr, e.msgstr_plural) for e in polib.pofile(out.decode()) if (e.msgctxt, e.msgid) in
            {(t.msgctxt, t.msgid) for t in todo}] == [(e.msgid, "" if e.msgid_plural else e.msgid,
                                          {0: e.msgid, 1: e.msgid_plural} if e.msgid_plural else {}) for e in todo]
