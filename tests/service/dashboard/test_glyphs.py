"""Icons that every browser draws (issue 43: some rendered as missing-glyph boxes): every character the
dashboard's pages hold outside ASCII, and every state's and finding kind's icon, is in the Windows Glyph
List 4 repertoire (:data:`SAFE`), which the default fonts of every desktop carry (Arial, Helvetica,
DejaVu Sans, Liberation Sans).  The boxes were ⏱ (only in colour-emoji fonts), ✓ ✖ ◷ ◔ ⬤ ↗ ↻ ▽ ◆ ⚠."""

from __future__ import annotations

from typing import Any

import pytest

from service.dashboard import views
from service.regressions.kinds.registry import all_kinds
from tests.service.dashboard.conftest import BROWSER
from tests.service.dashboard.seed import ACC_CELL, Seeded

#: Outside ASCII: Latin-1 and the WGL4 punctuation, arrows, maths and shapes the dashboard may use.
SAFE = frozenset(chr(c) for c in range(0xA0, 0x100)) | frozenset(
    "ΔΣμ–—‘’“”•…‰←↑→↓↔∆−√∞≈≠≡≤≥■□▪▫▬▲►▼◄○●◊♦")


def _unsafe(text: str) -> set[str]:
    return {ch for ch in text if ord(ch) > 0x7F and ch not in SAFE}


def test_every_state_and_kind_icon_is_safe() -> None:
    for state in views.STATES.values():
        assert not _unsafe(state.icon), (state.css, state.icon)
    for k in all_kinds():
        assert not _unsafe(k.display.icon), (k.name, k.display.icon)
    for css, icon in views.VERDICT_BADGES.values():
        assert not _unsafe(icon), (css, icon)


@pytest.mark.postgres
def test_every_page_uses_safe_characters_only(client: Any, seeded_db: tuple[str, Any, Seeded]) -> None:
    _, store, s = seeded_db
    reg = s.regressions[ACC_CELL]
    cell = "&".join(f"{k}={v}" for k, v in zip(("model", "dtype", "policy", "target"), ACC_CELL, strict=True))
    pages = ["/", "/runs", f"/runs/{s.main_runs[-1]}", f"/runs/{s.main_runs[-1]}?diff=all", f"/history?{cell}",
             f"/history?model={ACC_CELL[0]}&dtype={ACC_CELL[1]}", f"/regressions/{reg}", "/regressions",
             "/regressions?state=all", "/deliveries", "/runs/999999"]
    for page in pages:
        r = client.get(page, headers=BROWSER)
        assert r.status_code in (200, 404), page
        assert not _unsafe(r.text), (page, sorted(_unsafe(r.text)))
    assert not _unsafe(client.get("/dashboard.css").text)
