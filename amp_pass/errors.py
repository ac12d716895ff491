"""Error taxonomy of the pass: user errors (bad model, bad policy) versus our own bugs.

Every user error carries ``exit_code = 2``; the CLI prints it as one line.  Anything else that
escapes the pass is an internal error (exit 1 from ``python -m amp_pass``).
"""

from __future__ import annotations


class AmpPassError(Exception):
    """Base class of every error the pass raises on purpose."""

    exit_code: int = 1


class InvalidModelError(AmpPassError):
    """The input file is not a readable ONNX model or fails the ONNX checker."""

    exit_code = 2


class PolicyError(AmpPassError):
    """Unknown policy name, unreadable or malformed policy file, or a bad option value."""

    exit_code = 2


class OptionsError(AmpPassError):
    """Bad conversion options (dtype, target, paths)."""

    exit_code = 2


class OpsetError(OptionsError):
    """An explicit target opset the pass cannot honour: beyond the highest opset the installed onnx
    defines (the pass's ceiling; it never imports onnxruntime), or one the model cannot be converted to."""

    exit_code = 2


class OutputError(AmpPassError):
    """The converted model (or its report) cannot be written: a directory that cannot be created, no
    permission, a full disk.  Nothing is left at the destination."""

    exit_code = 2

    @classmethod
    def cannot_write(cls, what: object, exc: OSError) -> OutputError:
        """``cannot write WHAT: <the OS's reason>``."""
        return cls(f"cannot write {what}: {exc.strerror or exc}")
