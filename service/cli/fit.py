"""Tables that fit the terminal without breaking a word.

:func:`fit_table` lays out rows of text in a given width (the console's: 80, 120, ...) and guarantees:

* no line is wider than ``width`` (unless one word alone is: a name longer than the terminal);
* an ``id``/``num`` cell (numbers, counts) is never wrapped; a ``token`` cell (a model name, a cell
  ``model dtype/policy/target``, a status, a revision, a date) wraps only at its spaces, so every word
  in it is printed whole on one line -- never ``transformer_bl|ock`` or ``fp16/default/c|pu``;
* a ``text`` cell (a message, a finding's detail, a verdict) wraps at word boundaries to at most
  :data:`TEXT_LINES` lines in a table (:data:`RECORD_LINES` in the record layout); what does not fit is
  cut with ``…`` and a caption points to ``--json`` for the whole text.

When the table with every token whole is wider than ``width``, the rows are printed as records instead:
a heading line per row (its ids and tokens), its numbers as ``name value`` pairs on the next lines, then
its text columns, each indented.  ``width`` None means unbounded: the plain table, nothing wrapped.
Stored text is printed as text (never rich markup).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal

from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from rich.console import RenderableType

ColumnKind = Literal["id", "num", "token", "text"]
#: A column: its header and kind (see the module docstring).
Column = tuple[str, ColumnKind]

#: The most lines a ``text`` cell takes in a table, and in the record layout.
TEXT_LINES = 4
RECORD_LINES = 6
#: The narrowest a ``text`` column is made before the record layout is used instead.
TEXT_MIN = 16
#: A token column at most this wide is widened to hold its cells on one line before text columns grow.
SHORT_TOKEN = 32
#: The indent of a record's lines under its heading.
INDENT = 4
CUT_NOTE = "… marks text cut to fit; --json prints all of it"


def _overhead(n: int) -> int:
    """Columns a rich table of ``n`` columns spends on borders and padding (default box, padding 1)."""
    return 3 * n + 1


def _longest_word(text: str) -> int:
    return max((len(w) for w in text.split()), default=0)


def _cut_word(word: str, width: int) -> str:
    return word if len(word) <= width else word[:max(0, width - 1)] + "…"


def wrap_words(text: str, width: int, max_lines: int | None = None) -> tuple[list[str], bool]:
    """``text`` wrapped at its spaces into lines of at most ``width`` characters; a word longer than
    ``width`` is cut with ``…`` when ``max_lines`` is given (a bounded text), else put whole on its own
    line(s), broken only when it cannot fit any line.  At most ``max_lines`` lines, the last ending in
    ``…`` when text was left out.  Returns the lines and whether anything was cut."""
    width = max(1, width)
    words = text.split()
    cut = False
    if max_lines is not None:
        shortened = [_cut_word(w, width) for w in words]
        cut = shortened != words
        words = shortened
    lines = textwrap.wrap(" ".join(words), width=width, break_long_words=True, break_on_hyphens=False) or [""]
    if max_lines is not None and len(lines) > max_lines:
        cut = True
        lines = lines[:max_lines]
        last = lines[-1]
        while len(last) + 2 > width and " " in last:  # words are dropped whole to make room for the mark
            last = last.rsplit(" ", 1)[0]
        lines[-1] = (last if len(last) + 2 <= width else last[:max(0, width - 2)]) + " …"
    return lines, cut


def wrap_lines(text: str, width: int) -> str:
    """Each line of ``text`` wrapped at its spaces to ``width`` columns, continuation lines under the
    line's own indent; a word is broken only when it is wider than a whole line."""
    out = []
    for line in text.split("\n"):
        indent = line[:len(line) - len(line.lstrip(" "))]
        if len(line) <= width or len(indent) >= width // 2:
            out.append(line)
            continue
        out.extend(textwrap.wrap(line, width=width, initial_indent="", subsequent_indent=indent,
                                 break_long_words=True, break_on_hyphens=False, drop_whitespace=True))
    return "\n".join(out)


def _natural(name: str, values: Iterable[str]) -> int:
    return max([len(name), *(len(v) for v in values)])


def _minimum(name: str, kind: ColumnKind, values: Sequence[str], natural: int) -> int:
    if kind in ("id", "num"):
        return natural
    head = _longest_word(name)
    if kind == "token":
        return max([head, *(_longest_word(v) for v in values)])
    return min(natural, max(head, TEXT_MIN))


def _grows(phase: str, kind: ColumnKind, natural: int) -> bool:
    """Whether a column of ``kind`` and ``natural`` width grows in ``phase`` (short tokens, text, tokens)."""
    if phase == "short":
        return kind == "token" and natural <= SHORT_TOKEN
    return kind == phase


def _widths(columns: Sequence[Column], rows: Sequence[Mapping[str, str]], width: int | None) -> list[int] | None:
    """Each column's width, or None when the table cannot fit ``width`` with every token whole."""
    values = [[row[name] for row in rows] for name, _ in columns]
    natural = [_natural(name, vals) for (name, _), vals in zip(columns, values, strict=True)]
    if width is None or sum(natural) + _overhead(len(columns)) <= width:
        return natural
    least = [_minimum(name, kind, vals, nat)
             for (name, kind), vals, nat in zip(columns, values, natural, strict=True)]
    spare = width - _overhead(len(columns)) - sum(least)
    if spare < 0:
        return None
    widths = list(least)
    # short tokens first (whole on one line: "tiny_mlp fp16/default/cpu"), then text (it wraps most), then
    # long tokens, each to its natural width
    for phase in ("short", "text", "token"):
        want = [n - w if _grows(phase, kind, n) else 0
                for (_, kind), n, w in zip(columns, natural, widths, strict=True)]
        total = sum(want)
        if total <= spare:
            widths = [w + x for w, x in zip(widths, want, strict=True)]
            spare -= total
            continue
        for i, w in enumerate(want):  # not enough for all: shared in proportion to what each lacks
            widths[i] += spare * w // total
        break
    return widths


def _table(title: str, columns: Sequence[Column], rows: Sequence[Mapping[str, str]],
           widths: Sequence[int]) -> Table:
    cut = False
    t = Table(title=title)
    for (name, kind), w in zip(columns, widths, strict=True):
        head, _ = wrap_words(name, w) if kind in ("token", "text") else ([name], False)
        t.add_column(Text("\n".join(head)), justify="right" if kind == "id" else "left", no_wrap=True,
                     width=w, overflow="fold")  # never used: every cell is already as narrow as w
    for row in rows:
        cells = []
        for (name, kind), w in zip(columns, widths, strict=True):
            value = row[name]
            if kind in ("id", "num") or len(value) <= w:
                cells.append(Text(value))
                continue
            lines, was_cut = wrap_words(value, w, TEXT_LINES if kind == "text" else None)
            cut = cut or was_cut
            cells.append(Text("\n".join(lines)))
        t.add_row(*cells)
    if cut:
        t.caption = CUT_NOTE
    return t


def _joined(parts: Sequence[str]) -> str:
    """``parts`` joined by `` · `` (each dot stays on the line of the part before it when wrapped)."""
    return " ".join(p + " ·" for p in parts[:-1]) + (" " + parts[-1] if len(parts) > 1 else "".join(parts))


def _records(title: str, columns: Sequence[Column], rows: Sequence[Mapping[str, str]], width: int) -> Text:
    """The record layout: per row a heading (the first column and ids as ``name value``, tokens as they
    are), its other numbers as ``name value`` pairs packed onto indented lines, then each text column as
    ``name: text``."""
    inner = max(1, width - INDENT)
    pad = " " * INDENT
    lines = [title.center(width).rstrip()] if len(title) <= width else wrap_words(title, width)[0]
    cut = False
    nbsp = "\u00a0"  # keeps a pair's name and value on one line through the wrapping
    for row in rows:
        head = [f"{name} {row[name]}" if kind in ("id", "num") else row[name] for i, (name, kind)
                in enumerate(columns) if (kind in ("id", "token") or i == 0) and row[name] not in ("", "-")]
        lines.extend(wrap_words(_joined(head), width)[0])
        pairs = [f"{name} {row[name]}".replace(" ", nbsp) for i, (name, kind) in enumerate(columns)
                 if kind == "num" and i > 0]
        if pairs:
            lines.extend(pad + ln.replace(nbsp, " ") for ln in wrap_words(_joined(pairs), inner)[0])
        for name, kind in columns:
            if kind == "text" and row[name]:
                body, was_cut = wrap_words(f"{name}: {row[name]}", inner, RECORD_LINES)
                cut = cut or was_cut
                lines.extend(pad + ln for ln in body)
    if cut:
        lines.append(CUT_NOTE)
    return Text("\n".join(lines), no_wrap=True, overflow="ignore")


def fit_table(title: str, layouts: Sequence[Sequence[Column]], rows: Iterable[Mapping[str, str]],
              width: int | None) -> RenderableType:
    """``rows`` (column name -> text) as a table no wider than ``width`` in the first of ``layouts`` (column
    sets, most columns first) that fits with every token whole, else as records of the last layout (see
    the module docstring)."""
    rows = list(rows)
    for columns in layouts:
        widths = _widths(columns, rows, width)
        if widths is not None:
            return _table(title, columns, rows, widths)
    assert width is not None  # an unbounded width always fits
    return _records(title, layouts[-1], rows, width)
