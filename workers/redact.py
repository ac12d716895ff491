"""Credentials removed from text that untrusted code wrote before ampci stores or shows it.

The pass under test's error text becomes a job's stored message, shown on the run page, in the API and in the
pull-request comment.  :func:`redact` replaces anything that looks like a credential with ``[redacted]``:

* GitHub tokens (``ghp_``, ``gho_``, ``ghu_``, ``ghs_``, ``ghr_``, ``github_pat_``), JWTs (``eyJ….eyJ….…``),
  AWS access key ids, PEM private key blocks, Slack-style ``xox?-`` tokens;
* the password of a URL (``scheme://user:PASSWORD@host``) and ``Bearer``/``token``/``Basic`` authorization values;
* the value of any ``NAME=value`` or ``NAME: value`` whose name ends in secret, token, password, pwd,
  credential(s), api/private/access key or authorization (``tokenizer=`` is not one), and of every ``AMPCI_*`` setting;
* any of the ``known`` strings (the service passes its own secrets' values; :func:`encoded_forms` adds their
  base64, URL-safe base64 and hex spellings).

:func:`redact_tree` applies it to every string (and key) of a JSON-like value: a job result's report fields
(``kept_fp32`` entries, notes, names), not only its error text.

It never raises and is idempotent; it is a second line: the sandbox already keeps secrets away from the pass.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable

MARK = "[redacted]"
_PATTERNS = (
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S),
    re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{16,}|github_pat_[A-Za-z0-9_]{20,})"),
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
)
_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@]*:)[^\s@/]+(@)")
_AUTH_VALUE = re.compile(r"(?i)\b(bearer|token|basic)(\s+)[A-Za-z0-9._~+/=-]{8,}")
_NAMED = re.compile(r"(?i)(\b[A-Za-z0-9_.-]*?(?:secret|token|passw(?:or)?d|pwd|credentials?|api[_-]?key|"
                    r"private[_-]?key|access[_-]?key|authorization)(?:[_-][A-Za-z0-9]+)*[\"']?\s*[:=]\s*[\"']?)"
                    r"([^\s\"',;}]+)")
_AMPCI = re.compile(r"(\bAMPCI_[A-Z0-9_]+[\"']?\s*[:=]\s*[\"']?)([^\s\"',;}]+)")


def redact(text: str, known: Iterable[str] = ()) -> str:
    """``text`` with every credential-looking part (see the module doc) and every ``known`` value of 6 or more
    characters replaced by :data:`MARK`."""
    if not text:
        return text
    return _redact(text, _longest_first(known))


def _longest_first(known: Iterable[str]) -> tuple[str, ...]:
    """The ``known`` values :func:`redact` replaces (6 or more characters), longest first, each once."""
    return tuple(sorted({k for k in known if k and len(k) >= 6}, key=len, reverse=True))


def _redact(text: str, values: tuple[str, ...]) -> str:
    """:func:`redact` with its known ``values`` prepared by :func:`_longest_first`."""
    if not text:
        return text
    out = str(text)
    for value in values:
        out = out.replace(value, MARK)
    for pattern in _PATTERNS:
        out = pattern.sub(MARK, out)
    out = _URL_PASSWORD.sub(lambda m: m.group(1) + MARK + m.group(2), out)
    out = _AUTH_VALUE.sub(lambda m: m.group(1) + m.group(2) + MARK, out)
    out = _NAMED.sub(lambda m: m.group(1) + MARK, out)
    out = _AMPCI.sub(lambda m: m.group(1) + MARK, out)
    return out


def encoded_forms(values: Iterable[str]) -> list[str]:
    """``values`` and their base64 (standard and URL-safe, with and without padding) and hex (lower and upper
    case) spellings: a pass that read a secret may print it encoded."""
    out = []
    for v in values:
        if not v:
            continue
        raw = v.encode()
        b64 = base64.b64encode(raw).decode()
        url = base64.urlsafe_b64encode(raw).decode()
        out += [v, b64, b64.rstrip("="), url, url.rstrip("="), raw.hex(), raw.hex().upper()]
    return out


def redact_tree(value: object, known: Iterable[str] = ()) -> object:
    """``value`` (str, list, tuple, dict: JSON-like) with :func:`redact` applied to every string in it, keys
    included; other values are returned as they are."""
    return _tree(value, _longest_first(known))


def _tree(value: object, values: tuple[str, ...]) -> object:
    """:func:`redact_tree` with its known ``values`` prepared once for the whole tree."""
    if isinstance(value, str):
        return _redact(value, values)
    if isinstance(value, list | tuple):
        return [_tree(v, values) for v in value]
    if isinstance(value, dict):
        return {(_redact(k, values) if isinstance(k, str) else k): _tree(v, values) for k, v in value.items()}
    return value
