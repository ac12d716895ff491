"""One typed settings object per process, built from ``AMPCI_*`` environment variables.

Build it once at an entry point with :meth:`Settings.from_env` and pass it down.  Parsing of
booleans, durations and sizes goes through the helpers below (tested in tests/service/test_settings.py).
Secrets have no defaults: code that needs one calls :meth:`Settings.require`, which fails with a
message naming the variable.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Protocol

from service.errors import ConfigError
from workers.revision.config import WorkerConfig

PREFIX = "AMPCI_"

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|k|kb|kib|m|mb|mib|g|gb|gib)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {None: 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2,
               "mib": 1024**2, "g": 1024**3, "gb": 1024**3, "gib": 1024**3}


def parse_bool(name: str, raw: str) -> bool:
    """Parse a boolean the way people write it in env files; anything else is a ConfigError."""
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}: expected a boolean (true/false/1/0), got {raw!r}")


def parse_duration(name: str, raw: str) -> float:
    """Parse ``90``, ``1.5s``, ``250ms``, ``10m``, ``2h`` or ``1d`` into seconds (> 0)."""
    m = _DURATION.match(raw)
    if not m:
        raise ConfigError(f"{name}: expected a duration like 30s, 10m or 250ms, got {raw!r}")
    seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    if seconds <= 0:
        raise ConfigError(f"{name}: duration must be positive, got {raw!r}")
    return seconds


def parse_interval(name: str, raw: str) -> float:
    """Parse a period like :func:`parse_duration` (``300``, ``5m``), where ``0``/``off`` means disabled (0.0)."""
    if raw.strip().lower() in {"0", "off", "false", "no", "never"}:
        return 0.0
    return parse_duration(name, raw)


def parse_size(name: str, raw: str) -> int:
    """Parse ``512``, ``64k``, ``4MiB``, ``2G`` into bytes (> 0)."""
    m = _SIZE.match(raw)
    if not m:
        raise ConfigError(f"{name}: expected a size like 512M or 4GiB, got {raw!r}")
    unit = m.group(2).lower() if m.group(2) else None
    size = int(float(m.group(1)) * _SIZE_UNITS[unit])
    if size <= 0:
        raise ConfigError(f"{name}: size must be positive, got {raw!r}")
    return size


def parse_int(name: str, raw: str, minimum: int = 0) -> int:
    """Parse an integer >= minimum."""
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}: expected an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name}: must be >= {minimum}, got {value}")
    return value


def _default_data_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("ampci"))


def _default_cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("ampci"))


def redact_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***`` (for error messages and logs), also
    one without a user name (``redis://:PASSWORD@host``)."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


#: The settings that are credentials (their AMPCI_ names): held by the API process alone (compose passes them to the
#: api service only), never given to the pass, and their values redacted from any stored error text.
CREDENTIALS = ("AMPCI_WEBHOOK_SECRET", "AMPCI_API_TOKEN", "AMPCI_GITHUB_TOKEN", "AMPCI_GITHUB_PRIVATE_KEY",
               "AMPCI_GITHUB_PRIVATE_KEY_FILE")
#: AMPCI_SANDBOX: how the pass under test is isolated (:mod:`workers.sandbox.policy`).
SANDBOX_MODES = ("require", "best-effort", "auto")
#: What a GitHub run can report: the commit status, the PR comment, a check run (AMPCI_GITHUB_REPORT).
GITHUB_REPORTS = frozenset({"status", "comment", "check"})
#: AMPCI_FORK_POLICY: what becomes of an untrusted pull request (from a fork, or by a non-member):
#: ``approve`` waits for a maintainer's approval, ``always`` runs it at once, ``never`` never runs it.
FORK_POLICIES = ("approve", "always", "never")
# a GitHub login: letters, digits and single inner hyphens, at most 39; an app's account ends in [bot]
_LOGIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38}(?:\[bot\])?$")


def parse_choice(name: str, raw: str, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (case-insensitive, surrounding blanks ignored), lower-cased; else a ConfigError."""
    value = raw.strip().lower()
    if value not in choices:
        raise ConfigError(f"{name}: expected one of {', '.join(choices)}, got {raw!r}")
    return value


def parse_logins(name: str, raw: str) -> str:
    """A comma list of GitHub logins, normalised (blanks and empty items dropped); a malformed login is a
    ConfigError naming the variable."""
    logins = [item.strip() for item in raw.split(",") if item.strip()]
    for login in logins:
        if not _LOGIN.match(login):
            raise ConfigError(f"{name}: not a GitHub login: {login[:60]!r} (expected a comma list of logins)")
    return ",".join(logins)

_MAY_BE_ZERO = frozenset({"db_max_overflow", "local_workers", "latency_threads", "confirm_pairs", "confirm_max_per_pr"})


class _Replace(Protocol):
    """:func:`dataclasses.replace` of a Settings, with values whose types were checked at run time."""

    def __call__(self, obj: Settings, /, **changes: object) -> Settings: ...


@dataclass(frozen=True)
class Settings:
    """All configuration of one ampci process.  Field ``foo`` comes from ``AMPCI_FOO``."""

    database_url: str = ""            # empty: SQLite file under data_dir (embedded default)
    broker_url: str = ""              # empty: jobs run in-process on a local pool (embedded default)
    data_dir: Path = field(default_factory=_default_data_dir)
    cache_dir: Path = field(default_factory=_default_cache_dir)
    pass_repo: str = ""               # empty: a webhook run's own repository (its clone URL), else this checkout
    pass_repo_allow_file: bool = False  # also clone file:// URLs a delivery names (tests, a local mirror)
    webhook_secret: str = ""
    github_token: str = ""           # a personal/bot token: statuses and comments (used when no App is set)
    github_app_id: str = ""          # a GitHub App (recommended; check runs need one): its id ...
    github_client_id: str = ""       # ... or its client ID (Iv1.…, Iv23…): the JWT's issuer when set
    github_private_key: str = field(default="", repr=False)  # ... and its PEM key (or the file below)
    github_private_key_file: str = ""
    github_api_url: str = "https://api.github.com"
    github_report: str = "status,comment"  # what runs of webhooks report: status, comment, check (comma list)
    api_token: str = ""
    public_url: str = "http://127.0.0.1:8000"
    insecure_dev: bool = False        # allow the webhook without a secret (development only)
    read_token_required: bool = False
    allowed_repos: str = ""           # comma-separated owner/name list for webhooks
    tracked_branches: str = "main,master"
    trusted_authors: str = ""         # comma list of GitHub logins whose pull requests run at once, even from forks
    approvers: str = ""               # comma list of logins who may approve when ampci has no GitHub identity to ask
    fork_policy: str = "approve"      # untrusted pull requests: approve (wait for a maintainer), always, never
    convert_timeout: float = 600.0    # seconds for the conversion subprocess
    convert_memory: int = 8 * 1024**3  # bytes (RLIMIT_AS) for the conversion subprocess
    job_timeout: float = 1800.0       # hard time limit of one job
    max_attempts: int = 3             # deliveries before a job is marked crashed
    latency_runs: int = 20
    latency_warmup: int = 3
    convergence_steps: int = 64
    accuracy_k: float = 3.0
    worktree_cache_size: int = 8
    convert_repeats: int = 5          # conversions per job timed for the conversion-time rule
    confirm_pairs: int = 8            # interleaved baseline/candidate pairs that confirm a timing regression (0: off)
    confirm_max_cells: int = 8        # suspected cells one run's confirmation times at most (largest effect first)
    confirm_max_per_pr: int = 16      # cells all confirmations of one pull request time at most (0: none)
    latency_threads: int = 1          # intra-op threads of the timed sessions (0: onnxruntime's default)
    max_body_bytes: int = 1024 * 1024
    webhook_max_body_bytes: int = 25 * 1024 * 1024  # GitHub sends webhook payloads up to 25 MB
    http_header_timeout: float = 10.0   # a request's headers must arrive within this (else the connection is closed)
    http_body_timeout: float = 30.0     # a request's body must arrive within this of its first read (else 408)
    http_keepalive_timeout: float = 5.0  # an idle kept-alive connection is closed after this
    http_max_connections: int = 1000    # concurrent connections of one server process (beyond: 503)
    http_client_connections: int = 64   # concurrent connections one client address may hold (beyond: closed)
    nightly_cron: str = "0 2 * * *"
    nightly_sweep: str = "full"      # sweep name the nightly beat runs
    extra_queues: str = ""           # comma-separated extra target queues (e.g. GPU types)
    thresholds_file: str = ""        # JSON/YAML overriding regression thresholds (empty: built-in)
    auto_bisect: bool = False        # push/nightly regressions start a bisection by themselves
    baseline_runs: bool = True       # push/PR runs run their baseline revision's missing cells before judging
    reconcile_every: float = 300.0   # seconds between beat runs re-sending lost job messages (0: off)
    reconcile_grace: float = 300.0   # a queued job younger than this is never re-sent
    db_pool_size: int = 5            # PostgreSQL connections each engine keeps open (SQLite: unused)
    db_max_overflow: int = 10        # extra connections an engine may open under load, closed after use
    local_workers: int = 0           # embedded-mode job subprocesses per process (0: the CPU count)
    sandbox: str = ""                # pass sandbox: require | best-effort | auto (empty: require served, auto embedded)
    sandbox_max_procs: int = 64      # processes/threads the sandboxed pass may have at once
    sandbox_max_file: int = 4 * 1024**3  # bytes of any one file the pass writes (and of each output copied out)
    sandbox_scratch: int = 8 * 1024**3   # size of the pass's scratch tmpfs (its outputs included)
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        """Check the values :meth:`from_env` cannot type (also for settings built directly)."""
        parse_choice(f"{PREFIX}FORK_POLICY", self.fork_policy, FORK_POLICIES)
        if self.sandbox:
            parse_choice(f"{PREFIX}SANDBOX", self.sandbox, SANDBOX_MODES)
        parse_logins(f"{PREFIX}TRUSTED_AUTHORS", self.trusted_authors)
        parse_logins(f"{PREFIX}APPROVERS", self.approvers)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``env`` (default ``os.environ``); malformed values raise ConfigError."""
        env = os.environ if env is None else env
        kwargs: dict[str, object] = {}
        for f in fields(cls):
            var = PREFIX + f.name.upper()
            if var not in env:
                continue
            raw = env[var]
            kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            if kind == "bool":
                kwargs[f.name] = parse_bool(var, raw)
            elif kind == "int" and f.name in {"convert_memory", "max_body_bytes", "webhook_max_body_bytes", "sandbox_max_file",
                                              "sandbox_scratch"}:
                kwargs[f.name] = parse_size(var, raw)
            elif kind == "int":
                kwargs[f.name] = parse_int(var, raw, minimum=0 if f.name in _MAY_BE_ZERO else 1)
            elif kind == "float" and f.name.endswith(("timeout", "_grace")):
                kwargs[f.name] = parse_duration(var, raw)
            elif kind == "float" and f.name.endswith("_every"):
                kwargs[f.name] = parse_interval(var, raw)
            elif kind == "float":
                try:
                    kwargs[f.name] = float(raw)
                except ValueError:
                    raise ConfigError(f"{var}: expected a number, got {raw!r}") from None
            elif kind == "Path":
                kwargs[f.name] = Path(raw).expanduser()
            elif f.name == "sandbox":
                kwargs[f.name] = parse_choice(var, raw, SANDBOX_MODES)
            elif f.name == "fork_policy":
                kwargs[f.name] = parse_choice(var, raw, FORK_POLICIES)
            elif f.name in ("trusted_authors", "approvers"):
                kwargs[f.name] = parse_logins(var, raw)
            else:
                kwargs[f.name] = raw.strip()
        # each value was parsed to its field's type above; mypy checks replace() field by field, which values
        # keyed by a loop variable cannot satisfy (the defaults are valid, __post_init__ checks the result)
        with_values: _Replace = replace
        return with_values(cls(), **kwargs)

    def require(self, name: str) -> str:
        """Return a required string setting or raise ConfigError naming ``AMPCI_<NAME>``."""
        value: str = getattr(self, name)
        if not value:
            raise ConfigError(f"{PREFIX}{name.upper()} is required here but not set")
        return value

    @property
    def effective_database_url(self) -> str:
        """The configured database URL, or the embedded SQLite file under ``data_dir``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'ampci.sqlite3'}"

    @property
    def embedded(self) -> bool:
        """True when no broker is configured: jobs run in-process on a local pool."""
        return not self.broker_url

    def worker_config(self) -> WorkerConfig:
        """What the worker layer needs of these settings (:class:`workers.revision.config.WorkerConfig`)."""
        return WorkerConfig(cache_dir=self.cache_dir, data_dir=self.data_dir, pass_repo=self.pass_repo,
                            pass_repo_allow_file=self.pass_repo_allow_file,
                            convert_timeout=self.convert_timeout, convert_memory=self.convert_memory,
                            job_timeout=self.job_timeout, latency_runs=self.latency_runs,
                            latency_warmup=self.latency_warmup, convergence_steps=self.convergence_steps,
                            accuracy_k=self.accuracy_k, worktree_cache_size=self.worktree_cache_size,
                            convert_repeats=self.convert_repeats, latency_threads=self.latency_threads,
                            sandbox=self.sandbox_mode(), sandbox_max_procs=self.sandbox_max_procs,
                            sandbox_max_file=self.sandbox_max_file, sandbox_scratch=self.sandbox_scratch)

    def sandbox_mode(self) -> str:
        """``AMPCI_SANDBOX``, or its default: ``require`` for a served deployment (a broker or a database URL
        configured), ``auto`` for the embedded commands."""
        if self.sandbox:
            return self.sandbox
        return "require" if (self.broker_url or self.database_url) else "auto"

    def db_pool(self) -> dict[str, int]:
        """The connection bounds of one engine (``make_engine(url, **settings.db_pool())``): at most
        ``pool_size + max_overflow`` connections to PostgreSQL."""
        return {"pool_size": self.db_pool_size, "max_overflow": self.db_max_overflow}

    def allowed_repo_set(self) -> set[str]:
        """The webhook repository allowlist as a set of lower-case ``owner/name``."""
        return {r.strip().lower() for r in self.allowed_repos.split(",") if r.strip()}

    def github_report_set(self) -> frozenset[str]:
        """What GitHub runs report (:data:`GITHUB_REPORTS`); an unknown word is a ConfigError."""
        chosen = frozenset(r.strip().lower() for r in self.github_report.split(",") if r.strip())
        unknown = sorted(chosen - GITHUB_REPORTS)
        if unknown:
            raise ConfigError(f"AMPCI_GITHUB_REPORT: unknown report {unknown[0]!r}; expected a comma list of "
                              f"{', '.join(sorted(GITHUB_REPORTS))}")
        return chosen

    def trusted_author_set(self) -> frozenset[str]:
        """Lower-cased GitHub logins (``AMPCI_TRUSTED_AUTHORS``) whose pull requests are trusted even from forks
        (GitHub logins are case-insensitive)."""
        return frozenset(login.lower() for login in self.trusted_authors.split(",") if login)

    def approver_set(self) -> frozenset[str]:
        """Lower-cased GitHub logins (``AMPCI_APPROVERS``) who may approve a pull request's run when ampci has no
        GitHub identity to ask for permissions with (:mod:`service.github.permissions`)."""
        return frozenset(login.strip().lower() for login in self.approvers.split(",") if login.strip())

    def tracked_branch_set(self) -> set[str]:
        """Branches whose pushes trigger a run."""
        return {b.strip() for b in self.tracked_branches.split(",") if b.strip()}
