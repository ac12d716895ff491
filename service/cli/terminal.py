"""Text made safe for a terminal: what the CLI prints of stored data never drives the terminal.

Commit messages, author and branch names, finding details and delivery reasons come from outside
(webhook payloads, git, other tools writing the database).  An escape sequence in one could clear
the screen, retitle the window, fake a line of output or (with some terminals) answer back; a bell
rings.  :func:`printable` removes every C0 control character except newline and tab, DEL and every
C1 control character (``\\x9b`` is a one-byte CSI), and replaces a lone surrogate (which no UTF-8
stream can write) with U+FFFD.  The CLI's console applies it to all text it renders
(:func:`service.cli.query_cmd.console`), and commands that print lines themselves call it.
"""

from __future__ import annotations

import re

_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` without terminal control characters (newline and tab kept); lone surrogates replaced."""
    if _UNPRINTABLE.search(text):
        text = _UNPRINTABLE.sub("", text)
    if _SURROGATE.search(text):
        text = _SURROGATE.sub("\ufffd", text)
    return text
