"""gettext PO files (and POT templates) for mt/documents/sentences.py: each untranslated entry's msgid (and
msgid_plural) out as units to translate, their translations back in as its msgstr, the entry marked `fuzzy`.

The file is edited line by line, not rewritten: every line but the msgstr lines mt fills and the flags line it
marks stays byte for byte, so that a PO file under version control shows in a diff only what mt did (polib and
msgcat rewrap every entry). Kept as they are: the header entry, obsolete entries (`#~`), every entry that has a
msgstr already, comments, references, flags, contexts, previous msgids. A plural entry gets every msgstr[n] that
the header's nplurals asks for: msgstr[0] from msgid, the others from msgid_plural. A translation that lost a
placeholder of its source (`%s`, `%(name)s`, `{0}`), or has a character the file's charset cannot hold, is not
written: the entry stays untranslated and a warning on stderr names it. The header's charset decodes the file; a
POT's placeholder, `charset=CHARSET`, is read and written as UTF-8 (and says so once mt has filled an entry).
"""

from __future__ import annotations

import codecs
import re
import sys
from collections import Counter
from dataclasses import dataclass, field

from mt.documents.safe import check_size
from mt.documents.sentences import Document, Sentence, join
from mt.errors import MtError

KEYWORD = re.compile(r"(msgctxt|msgid_plural|msgid|msgstr(?:\[(\d+)\])?)(?=[\s\"])\s*(.*)$")
STRING = re.compile(r'"((?:[^"\\]|\\.)*)"\s*$')
ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{1,2}|[0-7]{1,3}|.)")
UNESCAPED = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", '"': '"', "\\": "\\"}
ESCAPED = {v: "\\" + k for k, v in UNESCAPED.items()}
CHARSET = re.compile(r"charset=([^\s;]+)", re.IGNORECASE)
NPLURALS = re.compile(r"nplurals\s*=\s*(\d+)")
# printf's and Python's %-formats (%s, %5.2f, %1$s, %(name)s, %%), without the space flag ("50% of"), and
# Python's and C#'s braces ({0}, {name!r:>10}).
PLACEHOLDER = re.compile(r"%(?:\d+\$)?(?:\([^)\s]*\))?[-+#0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|t)?"
                         r"[diouxXeEfFgGaAcsrp%]|\{[\w.\[\]]*(?:![rsa])?(?::[^{}\s]*)?\}")
WIDTH = 79  # gettext's: a msgstr line mt writes is wrapped as msgmerge would wrap it


@dataclass
class Field:
    """A msgctxt, msgid or msgstr: its text (unescaped) and its lines, [start, end) of the file's."""

    text: str
    start: int
    end: int


@dataclass
class Entry:
    """One entry of a PO file: its comment lines, its fields, and whether it is obsolete (`#~`)."""

    comments: list[int]
    first: int  # the line of its msgctxt, else msgid: a new flags line goes before it (or before a `#|` line)
    obsolete: bool
    msgctxt: Field | None = None
    msgid: Field | None = None
    msgid_plural: Field | None = None
    msgstr: list[Field] = field(default_factory=list)  # msgstr, or msgstr[0], msgstr[1], ...


def po_document(data: bytes, name: str) -> Document:
    """The untranslated entries of the PO (or POT) file `data`, and what writes the file back with them filled.
    Raises MtError, naming `name` and the line, for what is not a PO file."""
    check_size(data, name)
    charset, codec = header_charset(data, name)
    try:
        lines = data.decode(codec).split("\n")
    except UnicodeDecodeError as error:
        line = data[:error.start].count(b"\n") + 1
        raise MtError(f"{name}:{line}: not {charset}, the charset its header names ({error.reason}); convert it "
                      f"with iconv, or correct the header's charset") from None
    raw = data.split(b"\n")
    if len(raw) != len(lines):  # a codec that spells a line break otherwise: not one gettext reads
        raise MtError(f"{name}: charset {charset} breaks lines where gettext does not; convert the file to UTF-8 "
                      f"(msgconv -t UTF-8)")
    entries = list(read_entries(lines, name))
    header = entries[0] if entries and is_header(entries[0]) else None
    found = NPLURALS.search(header.msgstr[0].text) if header else None
    nplurals = int(found.group(1)) if found else 0  # none, or a POT's nplurals=INTEGER: as many as each entry has
    todo = [e for e in entries if e is not header and not e.obsolete and e.msgid.text and untranslated(e, nplurals)]
    units = [text for e in todo for text in (e.msgid.text, *([e.msgid_plural.text] if e.msgid_plural else []))]

    def render(sentences: list[list[Sentence]]) -> bytes:
        edits: dict[int, list[bytes]] = {}
        translated = iter(join(unit, s) for unit, s in zip(units, sentences, strict=True))
        for entry in todo:
            singular = next(translated)
            plural = next(translated) if entry.msgid_plural else None
            forms = max(len(entry.msgstr), nplurals if plural is not None else 0)
            block = fill(entry, lines, raw, [singular] + [plural] * (forms - 1), codec, name)
            if block is not None:
                edits[entry.msgstr[0].start] = block
                edits.update({i: [] for i in range(entry.msgstr[0].start + 1, entry.msgstr[-1].end)})
                edits.update(fuzzy(entry, lines, raw))
        if edits and charset == "CHARSET":  # a POT filled in: it is a PO in UTF-8 now
            line = next(i for i in range(header.msgstr[0].start, header.msgstr[0].end) if "charset=" in lines[i])
            edits[line] = [lines[line].replace("charset=CHARSET", "charset=UTF-8").encode(codec)]
        return b"\n".join(b for i, line in enumerate(raw) for b in edits.get(i, [line]))
    return Document(units, render)


def header_charset(data: bytes, name: str) -> tuple[str, str]:
    """The charset the header names (UTF-8 without one), and Python's codec for it. Only the header is read, as
    Latin-1, which any charset gettext reads spells as ASCII."""
    first = next(read_entries(data.removeprefix(codecs.BOM_UTF8).decode("latin-1").split("\n"), name), None)
    found = CHARSET.search(first.msgstr[0].text) if first and is_header(first) else None
    charset = found.group(1) if found else "UTF-8"
    if charset == "CHARSET":  # a POT's placeholder
        return charset, "utf-8"
    try:
        codec = codecs.lookup(charset).name
    except LookupError:
        codec = ""
    if not codec or "\n".encode(codec) != b"\n" or '"\\'.encode(codec) != b'"\\':
        raise MtError(f"{name}:{first.msgstr[0].start + 1}: charset {charset!r} is not one mt (or gettext) reads; "
                      f"convert the file to UTF-8 (msgconv -t UTF-8)")
    return charset, codec


def is_header(entry: Entry) -> bool:
    return not entry.obsolete and entry.msgctxt is None and entry.msgid.text == "" and not entry.msgid_plural


def untranslated(entry: Entry, nplurals: int) -> bool:
    """Whether mt fills `entry`: a msgstr (or one of the plural forms the header asks for) is empty."""
    forms = max(len(entry.msgstr), nplurals if entry.msgid_plural else 0)
    return len(entry.msgstr) < forms or any(not s.text for s in entry.msgstr)


def fill(entry: Entry, lines: list[str], raw: list[bytes], translations: list[str], codec: str, name: str
         ) -> list[bytes] | None:
    """The lines of `entry`'s msgstr block with its empty forms filled by `translations` (one a form), or None,
    with a warning, where a translation lost a placeholder or the charset cannot hold it."""
    eol = "\r" if lines[entry.first].endswith("\r") else ""
    block: list[bytes] = []
    for n, text in enumerate(translations):
        if n < len(entry.msgstr) and entry.msgstr[n].text:
            block += raw[entry.msgstr[n].start:entry.msgstr[n].end]  # a form translated already
            continue
        source = entry.msgid.text if n == 0 else entry.msgid_plural.text
        lost = Counter(PLACEHOLDER.findall(source)) - Counter(PLACEHOLDER.findall(text))
        keyword = f"msgstr[{n}]" if entry.msgid_plural else "msgstr"
        problem = f"lost {', '.join(lost)} of its source" if lost else None
        try:
            block += [line.encode(codec) + eol.encode() for line in quoted(keyword, text)]
        except UnicodeEncodeError as error:
            problem = f"has {error.object[error.start]!r}, which the file's charset cannot hold (msgconv -t UTF-8 " \
                      f"converts the file)"
        if problem:
            print(f"warning: {name}:{entry.first + 1}: {keyword}: the translation of {source[:40]!r} {problem}; the "
                  f"entry is left untranslated", file=sys.stderr)
            return None
    return block


def fuzzy(entry: Entry, lines: list[str], raw: list[bytes]) -> dict[int, list[bytes]]:
    """The edit that marks `entry` fuzzy: `fuzzy` first in its flags, or a flags line of its own before its
    previous msgid (`#|`) or its msgctxt/msgid: where gettext puts it."""
    flags = [i for i in entry.comments if lines[i].lstrip().startswith("#,")]
    if flags:
        if "fuzzy" in re.split(r"[\s,]+", lines[flags[0]]):
            return {}
        line = lines[flags[0]]
        return {flags[0]: [line.replace("#,", "#, fuzzy,", 1).encode("ascii")]}  # first, as gettext writes it
    before = min([i for i in entry.comments if lines[i].lstrip().startswith("#|")] + [entry.first])
    return {before: [b"#, fuzzy" + (b"\r" if lines[before].endswith("\r") else b""), raw[before]]}


def quoted(keyword: str, text: str) -> list[str]:
    """`keyword "text"` as gettext writes it: on one line where it fits and has no line break inside, else
    `keyword ""` and the text on lines of its own, a line after each \\n, wrapped at spaces."""
    escaped = escape(text)
    if len(keyword) + len(escaped) + 3 <= WIDTH and "\n" not in text.rstrip("\n"):
        return [f'{keyword} "{escaped}"']
    out = [f'{keyword} ""']
    for piece in re.findall(r"[^\n]*\n|[^\n]+$", text):
        rest = escape(piece)
        while len(rest) > WIDTH - 2:
            cut = rest.rfind(" ", 0, WIDTH - 2) + 1 or rest.find(" ") + 1  # after a space
            if cut <= 0 or cut == len(rest):
                break
            out.append(f'"{rest[:cut]}"')
            rest = rest[cut:]
        out.append(f'"{rest}"')
    return out


def escape(text: str) -> str:
    return "".join(ESCAPED.get(c) or (f"\\{ord(c):03o}" if ord(c) < 32 else c) for c in text)


def unquote(rest: str, where: str) -> str:
    """The text of a quoted PO string (`"..."`, escapes as C's), or MtError naming `where` (the file and line)."""
    found = STRING.match(rest)
    if not found:
        raise MtError(f"{where}: expected a string in double quotes, found {rest[:40]!r}; is this a PO file?")

    def unescaped(m: re.Match) -> str:
        code = m.group(1)
        if code in UNESCAPED:
            return UNESCAPED[code]
        if code[0] == "x" or code[0] in "01234567":
            return chr(int(code[1:], 16) if code[0] == "x" else int(code, 8))
        raise MtError(f"{where}: unknown escape \\{code} in a string; write \\\\ for a backslash")
    return ESCAPE.sub(unescaped, found.group(1))


def read_entries(lines: list[str], name: str):
    """Each entry of a PO file's `lines` in turn (a generator: the header can be read alone). Raises MtError,
    naming the file and line, where the lines do not follow PO's grammar."""
    comments: list[int] = []
    entry: Entry | None = None
    current: Field | None = None  # the field a string on a line of its own continues
    for i, line in enumerate(lines):
        where = f"{name}:{i + 1}"
        text = line.removeprefix("\ufeff").strip() if i == 0 else line.strip()
        obsolete = text.startswith("#~")
        if obsolete:  # an obsolete entry's lines: `#~ msgid ...`, and `#~| msgid ...` for its previous msgid
            text = "#" + text[2:] if text.startswith("#~|") else text[2:].strip()
        if not text:
            continue
        if text.startswith("#"):
            if entry is not None and entry.msgstr:
                yield entry
                entry = None
            comments.append(i)
            current = None
            continue
        keyword = KEYWORD.match(text)
        if keyword is None:
            if text.startswith('"') and current is not None:
                current.text += unquote(text, where)
                current.end = i + 1
                continue
            raise MtError(f"{where}: not PO syntax, {text[:40]!r}: expected msgctxt, msgid, msgstr, a string or a "
                          f"# comment{' after a keyword' if text.startswith(chr(34)) else ''}; is this a PO file?")
        word, index, rest = keyword.groups()
        current = Field(unquote(rest, where), i, i + 1)
        if word in ("msgctxt", "msgid"):
            if entry is not None and entry.msgstr:
                yield entry
                entry = None
            if entry is None:
                entry = Entry(comments, i, obsolete)
                comments = []
            elif word == "msgctxt" or entry.msgid is not None:
                raise MtError(f"{where}: {word} where the entry of line {entry.first + 1} needs its "
                              f"{'msgid' if entry.msgid is None else 'msgstr'} first; is this a PO file?")
            setattr(entry, word, current)
            continue
        wrong = misplaced(word, index, entry)
        if wrong:
            raise MtError(f"{where}: {word} out of place: {wrong}; is this a PO file?")
        if word == "msgid_plural":
            entry.msgid_plural = current
        else:
            entry.msgstr.append(current)
    if entry is not None:
        if not entry.msgstr:
            raise MtError(f"{name}:{entry.first + 1}: this entry has no msgstr: the file ends before it; is it cut "
                          f"short?")
        yield entry


def misplaced(word: str, index: str | None, entry: Entry | None) -> str | None:
    """What is wrong with a msgid_plural or msgstr (msgstr[`index`]) coming next in `entry`, or None."""
    if entry is None or entry.msgid is None:
        return "a msgid must come before it"
    if word == "msgid_plural" and (entry.msgid_plural or entry.msgstr):
        return "an entry has one msgid_plural, after its msgid"
    if word == "msgstr" and entry.msgstr:
        return f"the entry of line {entry.first + 1} has its msgstr already"
    if word == "msgstr" and entry.msgid_plural:
        return "an entry with a msgid_plural has msgstr[0], msgstr[1], ..."
    if index is not None and not entry.msgid_plural:
        return "msgstr[n] goes with a msgid_plural; an entry without one has a msgstr"
    if index is not None and int(index) != len(entry.msgstr):
        return f"expected msgstr[{len(entry.msgstr)}]"
    return None
