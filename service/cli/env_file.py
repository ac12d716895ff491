"""Writing a deployment's secrets where docker compose reads them: the ``.env`` file next to
docker-compose.yml and a secret file it mounts.

Guarantees (what ``ampci github create-app`` relies on):

* :func:`check_targets` refuses, before anything is asked of GitHub, a target whose directory is missing
  or not writable, an ``.env`` that is not a readable UTF-8 file, and a key file that already exists (the
  key of another App is never overwritten);
* :func:`write_secrets` writes all or nothing: the key file and the new ``.env`` are each written in full
  to a temporary file beside their target (created mode 600, so no other user can read them at any
  time), flushed to disk, then renamed over the target (the key first); when the ``.env`` rename fails,
  the key is removed again and the old ``.env`` is untouched.  The new ``.env`` keeps every other line
  (comments, order, other variables) and the mode and owner of the old one;
* the values written never appear in an exception message.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from service.errors import UserError

#: An .env value compose reads back verbatim (no quotes, no ``$`` expansion, no comment, no space).
ENV_VALUE = re.compile(r"[A-Za-z0-9._~+/=:@,-]*", re.ASCII)
_ASSIGNMENT = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=(.*)")


class TargetError(UserError):
    """A target file cannot be written (one line naming it; exit 2)."""


@dataclass(frozen=True)
class Targets:
    """Where the secrets go: the compose ``.env`` and the private key file (absolute paths)."""

    env_file: Path
    key_file: Path


def read_env(path: Path) -> dict[str, str]:
    """The ``NAME=value`` assignments of an .env file (the last one of a name wins, as in compose); empty
    when it does not exist.  Values are taken after the ``=`` without surrounding blanks and, as compose
    reads them, without one pair of surrounding quotes."""
    if not path.exists():
        return {}
    out: dict[str, str] = {}
    for line in _text(path).splitlines():
        match = _ASSIGNMENT.fullmatch(line)
        if match and not line.lstrip().startswith("#"):
            value = match.group(2).strip()
            quoted = len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""
            out[match.group(1)] = value[1:-1] if quoted else value
    return out


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TargetError(f"{path}: cannot read it ({type(exc).__name__})") from None


def check_targets(env_file: Path, key_file: Path) -> Targets:
    """The targets as absolute paths, once each is known writable (module docstring); TargetError else."""
    env_file, key_file = env_file.expanduser().absolute(), key_file.expanduser().absolute()
    for path in (env_file, key_file):
        folder = path.parent
        if not folder.is_dir():
            raise TargetError(f"{path}: its directory {folder} does not exist")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise TargetError(f"{path}: its directory {folder} is not writable")
        if path.is_dir():
            raise TargetError(f"{path}: is a directory")
    if env_file.exists():
        _text(env_file)
    if key_file.exists() or key_file.is_symlink():
        raise TargetError(f"{key_file} exists (the key of an App made before?): move it away or name another "
                          "file with --key-file")
    if env_file == key_file:
        raise TargetError(f"{env_file}: the .env file and the key file must differ")
    return Targets(env_file, key_file)


def updated_env(old: str, values: Mapping[str, str]) -> str:
    """``old`` (.env text) with each name of ``values`` assigned its value: its first assignment rewritten in
    place, later ones of that name dropped, a missing name appended; every other line kept as it was."""
    for name, value in values.items():
        if not ENV_VALUE.fullmatch(value):
            raise TargetError(f"{name}: its value has characters an .env line cannot hold verbatim")
    lines, seen = [], set()
    for line in old.splitlines():
        match = _ASSIGNMENT.fullmatch(line)
        assigned = match.group(1) if match and not line.lstrip().startswith("#") else None
        if assigned is not None and assigned in values:
            if assigned not in seen:
                lines.append(f"{assigned}={values[assigned]}")
                seen.add(assigned)
            continue
        lines.append(line)
    lines += [f"{name}={value}" for name, value in values.items() if name not in seen]
    return "\n".join(lines) + "\n"


def _staged(target: Path, content: str, owner: tuple[int, int] | None, mode: int) -> Path:
    """``content`` written in full, flushed, to a new file beside ``target`` (created mode 600, then ``mode``
    and ``owner`` when given); TargetError (the file removed) when that fails."""
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise TargetError(f"{target}: cannot write beside it ({exc.strerror or type(exc).__name__})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        if owner is not None:
            with contextlib.suppress(PermissionError):
                os.chown(temp, *owner)
        os.chmod(temp, mode)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise TargetError(f"{target}: cannot write it ({exc.strerror or type(exc).__name__})") from None
    return temp


def write_secrets(targets: Targets, *, pem: str, env_values: Mapping[str, str], key_uid: int | None) -> bool:
    """Write ``pem`` to the key file (mode 600, owned by ``key_uid`` when given and this process may give
    it) and ``env_values`` into the .env file, all or nothing (module docstring).  True when the key file
    is owned by ``key_uid`` (or none was asked), False when it could not be given to it."""
    old = _text(targets.env_file) if targets.env_file.exists() else ""
    new_env = updated_env(old, env_values)
    if targets.env_file.exists():
        info = targets.env_file.stat()
        env_owner: tuple[int, int] | None = (info.st_uid, info.st_gid)
        env_mode = info.st_mode & 0o777
    else:
        env_owner, env_mode = None, 0o600
    key_owner = (key_uid, -1) if key_uid is not None else None
    key_temp = _staged(targets.key_file, pem, key_owner, 0o600)
    try:
        env_temp = _staged(targets.env_file, new_env, env_owner, env_mode)
    except TargetError:
        key_temp.unlink(missing_ok=True)
        raise
    try:
        os.replace(key_temp, targets.key_file)
    except OSError as exc:
        key_temp.unlink(missing_ok=True)
        env_temp.unlink(missing_ok=True)
        raise TargetError(f"{targets.key_file}: cannot write it ({exc.strerror or type(exc).__name__})") from None
    try:
        os.replace(env_temp, targets.env_file)
    except OSError as exc:
        targets.key_file.unlink(missing_ok=True)
        env_temp.unlink(missing_ok=True)
        raise TargetError(f"{targets.env_file}: cannot write it ({exc.strerror or type(exc).__name__}); "
                          f"nothing was written") from None
    return key_uid is None or targets.key_file.stat().st_uid == key_uid
