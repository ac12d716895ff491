"""git's failures reach the user as the one line that says what went wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.revision.git_commands import RevisionError, error_line, git


def test_a_missing_repository_is_named_not_the_advice_after_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-repo"
    with pytest.raises(RevisionError) as err:
        git(["clone", "--bare", f"file://{missing}", str(tmp_path / "clone")])
    message = str(err.value)
    assert message.startswith("git clone failed: fatal:"), message
    assert str(missing) in message and "repository exists" not in message


def test_the_line_picked_from_git_stderr() -> None:
    advice = "fatal: 'x' does not appear to be a git repository\nfatal: Could not read\n\nPlease make sure\nand it exists.\n"
    assert error_line(advice) == "fatal: 'x' does not appear to be a git repository"
    assert error_line("hint: try again\nerror: pathspec 'y' did not match\n") == "error: pathspec 'y' did not match"
    assert error_line("warning: something\nlast words\n") == "last words"
    assert error_line("  \n") == "(no message)"
