"""The stack of open elements, as the HTML standard's tree builder keeps it, for mt/documents/html.py: which
elements a tag closes without saying so (a `<p>` left open ends at the next block, an `<li>` at the next `<li>` or
the list's end, a `<td>` at the next cell), so that an element marked translate="no" ends where a browser ends it.

The rules are those of "in body" and the table modes (HTML Living Standard, 13.2.6.4.7 ff.) for where elements end,
without what only builds the tree (reparenting, reopening formatting elements). Every operation is constant time,
amortized: where an element is on the stack, and where each scope's innermost boundary is, are kept as it changes.
"""

from __future__ import annotations

import functools
from collections import defaultdict

SCOPE = frozenset("applet caption html table td th marquee object template".split())
SCOPES = {"default": SCOPE, "button": SCOPE | {"button"}, "list": SCOPE | {"ol", "ul"},
          "table": frozenset("html table template".split())}
SPECIAL = frozenset("""address applet area article aside base basefont bgsound blockquote body br button caption
    center col colgroup dd details dir div dl dt embed fieldset figcaption figure footer form frame frameset h1 h2 h3
    h4 h5 h6 head header hgroup hr html iframe img input keygen li link listing main marquee menu meta nav noembed
    noframes noscript object ol p param plaintext pre script search section select source style summary table tbody
    td template textarea tfoot th thead title tr track ul wbr xmp""".split())
SCOPES["special"] = SPECIAL  # the "any other end tag" rule stops at these
SCOPES["item"] = SPECIAL - {"address", "div", "p"}  # an <li> (<dd>, <dt>) ends an open one, but not across these
HEADINGS = frozenset("h1 h2 h3 h4 h5 h6".split())
CLOSES_P = frozenset("""address article aside blockquote center details dialog dir div dl fieldset figcaption figure
    footer form header hgroup hr listing main menu nav ol p plaintext pre search section summary table ul xmp
    li dd dt""".split()) | HEADINGS
BLOCK_ENDS = frozenset("""address article aside blockquote button center details dialog dir div dl fieldset
    figcaption figure footer form header hgroup listing main menu nav ol pre search section select summary ul
    applet marquee object template dd dt a b big code em font i nobr s small strike strong tt u""".split())
DEFINITIONS = frozenset({"dd", "dt"})
CELLS = frozenset({"td", "th"})
SECTIONS = frozenset({"tbody", "thead", "tfoot"})
TABLE_PARTS = CELLS | SECTIONS | {"tr", "table", "caption", "colgroup"}
RUBY = frozenset({"rb", "rt", "rp", "rtc"})


class OpenElements:
    """The names of the open elements, outermost first; `lowest`: the fewest that were open since `mark()`."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.where: dict[str, list[int]] = defaultdict(list)  # a name's places on the stack, innermost last
        self.bounds: dict[str, list[int]] = {scope: [] for scope in SCOPES}  # each scope's boundaries' places
        self.lowest = 0

    def __len__(self) -> int:
        return len(self.names)

    def mark(self) -> None:
        self.lowest = len(self.names)

    def start(self, name: str, void: bool) -> None:
        """A start tag: the elements it ends, closed, then it open (unless it is void: <hr>, <img>)."""
        self.close_implied(name)
        if void:
            return
        for scope in scopes_of(name):
            self.bounds[scope].append(len(self.names))
        self.where[name].append(len(self.names))
        self.names.append(name)

    def end(self, name: str) -> None:
        """An end tag: the element it ends and all open inside it closed; an end tag that ends nothing, ignored."""
        if name in ("body", "html"):
            return  # what follows `</body>` is still the body's
        if name == "p":
            self.close("p", "button")
        elif name == "li":
            self.close("li", "list")
        elif name in HEADINGS:
            self.close(HEADINGS, "default")
        elif name in TABLE_PARTS:
            self.close(name, "table")
        elif name in BLOCK_ENDS:
            self.close(name, "default")
        else:
            self.close(name, "special")

    def close_implied(self, name: str) -> None:
        if name in ("li", "dd", "dt"):
            self.close("li" if name == "li" else DEFINITIONS, "item")
        if name in CLOSES_P:
            self.close("p", "button")
        if name in HEADINGS and self.names and self.names[-1] in HEADINGS:
            self.pop_to(len(self.names) - 1)
        elif name == "body":
            self.close("head", "default")
        elif name in ("option", "optgroup") and self.names and self.names[-1] == "option":
            self.pop_to(len(self.names) - 1)
        elif name == "optgroup" and self.names and self.names[-1] == "optgroup":
            self.pop_to(len(self.names) - 1)
        elif name in RUBY and self.names and self.names[-1] in (RUBY if name in ("rb", "rtc") else RUBY - {"rtc"}):
            self.pop_to(len(self.names) - 1)
        elif name in ("a", "nobr", "button"):
            self.close(name, "default")  # an <a> inside an <a> ends the first
        elif name in TABLE_PARTS - {"table"}:  # a cell, a row, a section or a caption: what is open of the last
            self.close(CELLS, "table")
            if name not in CELLS:
                self.close("tr", "table")
            if name not in CELLS | {"tr"}:
                self.close(SECTIONS, "table")

    def close(self, names: str | set[str] | frozenset[str], scope: str) -> None:
        """The innermost element of `names` closed, with all open inside it, where it is in `scope`."""
        if isinstance(names, str):
            places = self.where.get(names)
            at = places[-1] if places else -1
        else:
            at = max((self.where[n][-1] for n in names if self.where.get(n)), default=-1)
        bounds = self.bounds[scope]
        if at >= 0 and at >= (bounds[-1] if bounds else 0):  # equal: the element is itself a boundary
            self.pop_to(at)

    def pop_to(self, size: int) -> None:
        while len(self.names) > size:
            name = self.names.pop()
            self.where[name].pop()
            for scope in scopes_of(name):
                self.bounds[scope].pop()
        self.lowest = min(self.lowest, size)


@functools.cache
def scopes_of(name: str) -> tuple[str, ...]:
    """The scopes an element bounds."""
    return tuple(scope for scope, names in SCOPES.items() if name in names)
