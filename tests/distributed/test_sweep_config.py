"""Sweep configs: loading, validation with one-line errors, expansion into cells with overrides."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from service.orchestration.scheduler import SweepConfig, SweepConfigError, load_sweep, nightly_dedup_key

CATALOG = {"a": {"smoke", "cnn"}, "b": {"smoke"}, "c": {"big"}}


def _cfg(**kw: object) -> SweepConfig:
    data = {"name": "t", "models": ["tag:smoke"], "dtypes": ["fp16"], "policies": ["default"],
            "targets": ["cpu"], "repeats": 3}
    data.update(kw)
    return SweepConfig.from_dict(data, "t.toml")


def test_expand_tags_and_names_cross_product() -> None:
    cells = _cfg(models=["tag:smoke", "c"], dtypes=["fp16", "bf16"], targets=["cuda", "cpu"]).expand(CATALOG)
    assert len(cells) == 3 * 2 * 2
    assert {c.model for c in cells} == {"a", "b", "c"}
    assert all(c.repeats == 3 and c.timeout is None for c in cells)
    assert [c.cell for c in cells] == sorted(c.cell for c in cells)


def test_tag_star_selects_every_model() -> None:
    assert {c.model for c in _cfg(models=["tag:*"]).expand(CATALOG)} == {"a", "b", "c"}


def test_overrides_skip_repeats_timeout() -> None:
    cfg = _cfg(dtypes=["fp16", "bf16"], override=[
        {"match": {"model": "a", "dtype": "bf16"}, "skip": True},
        {"match": {"dtype": "bf16"}, "repeats": 7, "timeout": "2m"},
    ])
    cells = {c.cell: c for c in cfg.expand(CATALOG)}
    assert ("a", "bf16", "default", "cpu") not in cells
    assert cells[("b", "bf16", "default", "cpu")].repeats == 7
    assert cells[("b", "bf16", "default", "cpu")].timeout == 120.0
    assert cells[("a", "fp16", "default", "cpu")].repeats == 3


@pytest.mark.parametrize(("change", "message"), [
    ({"dtypes": ["fp8"]}, "unknown dtype"),
    ({"models": []}, "'models' must be a non-empty list"),
    ({"targets": ["cu da"]}, "not a valid queue name"),
    ({"repeats": 0}, "'repeats' must be a positive integer"),
    ({"bogus": 1}, "unknown key(s) bogus"),
    ({"override": [{"match": {"colour": "x"}}]}, "'match' must be a table"),
    ({"override": [{"timeout": "soon"}]}, "expected a duration"),
])
def test_bad_configs_are_one_line_user_errors(change: dict[str, object], message: str) -> None:
    with pytest.raises(SweepConfigError) as exc:
        _cfg(**change)
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert exc.value.exit_code == 2


def test_unknown_model_or_empty_tag_is_an_error() -> None:
    with pytest.raises(SweepConfigError, match="unknown zoo model 'zz'"):
        _cfg(models=["zz"]).expand(CATALOG)
    with pytest.raises(SweepConfigError, match="no zoo model has tag 'nope'"):
        _cfg(models=["tag:nope"]).expand(CATALOG)
    with pytest.raises(SweepConfigError, match="every cell is skipped"):
        _cfg(override=[{"skip": True}]).expand(CATALOG)


def test_builtin_sweeps_load_and_file_errors(tmp_path: Path) -> None:
    smoke, full = load_sweep(sweep="smoke"), load_sweep(sweep="full")
    assert smoke.name == "smoke" and full.name == "full"
    assert set(full.targets) == {"cuda", "cpu"}
    with pytest.raises(SweepConfigError, match="unknown sweep 'nightly'"):
        load_sweep(sweep="nightly")
    bad = tmp_path / "bad.toml"
    bad.write_text("models = [\n")
    with pytest.raises(SweepConfigError, match="invalid TOML"):
        load_sweep(config=bad)
    with pytest.raises(SweepConfigError, match="does not exist"):
        load_sweep(config=tmp_path / "missing.toml")


def test_builtin_sweeps_expand_over_the_real_zoo() -> None:
    zoo = pytest.importorskip("workers.zoo.manifest")
    if not zoo.DEFAULT_MANIFEST.exists():
        pytest.skip("zoo.toml not present")
    from service.orchestration.scheduler import zoo_catalog

    catalog = zoo_catalog()
    smoke = load_sweep(sweep="smoke").expand(catalog)
    full = load_sweep(sweep="full").expand(catalog)
    assert smoke and len(full) >= len(smoke)
    assert {c.model for c in full} == set(catalog)


def test_nightly_dedup_key() -> None:
    assert nightly_dedup_key(date(2026, 1, 2), "full") == "nightly:2026-01-02:full"


@pytest.mark.parametrize(("argv", "message"), [
    (["sweep", "--sweep", "nope"], "unknown sweep 'nope'"),
    (["sweep", "--revision", "main..x"], "not a valid revision name"),
    (["sweep", "--revision", "0" * 40], "is not in the pass repository"),
    (["sweep", "--no-wait"], "--no-wait needs AMPCI_BROKER_URL"),
    (["worker", "--queues", "cpu"], "AMPCI_BROKER_URL is required"),
])
def test_cli_errors_are_one_line_exit_2(argv: list[str], message: str, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli.main import main

    for var in ("AMPCI_BROKER_URL", "AMPCI_DATABASE_URL", "AMPCI_PASS_REPO"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AMPCI_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("AMPCI_CACHE_DIR", str(tmp_path / "cache"))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
