"""A pass root is converted by itself alone: modules it lacks are not filled in from this checkout.

With an editable install, setuptools puts a finder on ``sys.meta_path`` that maps every
``amp_pass.*`` name to this checkout; a revision that lacks a module would then silently run this
checkout's copy of it.  The conversion subprocess (warm and cold) must remove that finder.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from workers.revision.convert import convert_in_subprocess
from workers.zoo.synthetic import synthetic_model_path

MAIN = textwrap.dedent('''
    import sys
    try:
        import amp_pass.converter  # present in this checkout's amp_pass, absent from this pass root
    except ModuleNotFoundError:
        print("amp_pass: error: isolated: converter module missing at this revision", file=sys.stderr)
        sys.exit(2)
    print("amp_pass: error: leaked: converter imported from " + amp_pass.converter.__file__, file=sys.stderr)
    sys.exit(2)
''')


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_module_missing_from_the_revision_is_not_taken_from_this_checkout(tmp_path: Path, warm: bool) -> None:
    assert (Path(__file__).resolve().parents[3] / "amp_pass" / "converter.py").is_file()
    root = tmp_path / "rev"
    (root / "amp_pass").mkdir(parents=True)
    (root / "amp_pass" / "__init__.py").write_text('"""An old revision of the pass."""\n')
    (root / "amp_pass" / "__main__.py").write_text(MAIN)
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    out = convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16", "default", "cpu",
                                root, timeout_s=60.0, memory_bytes=1024**3, warm=warm)
    assert out.status == "convert_error", out
    assert "isolated" in out.message, out.message
