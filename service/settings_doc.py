"""What each setting means: the rows of the guide's configuration table, one per field of :class:`Settings`.

The configuration page (``docs/configuration.md``) is rendered from :data:`SETTING_DOCS` when the guide is built
(``docs/hooks.py``), so it cannot drift from the code: ``tests/test_readme.py`` checks that every field has a row
and no row names a field that is gone, and that each default written here as a literal (the first
`` `value` `` of the default column) is what :meth:`Settings.from_env` makes of it, i.e. the field's real default.
A default that is computed or empty (``""``) is described in words instead.

    python -m service.settings_doc     # prints the table (Markdown)

A new setting: its field in ``service/settings.py`` and its row here, in the place where it reads best (the
table keeps this order).  Links are relative to ``docs/configuration.md``.
"""

from __future__ import annotations

from typing import NamedTuple

from service.settings import PREFIX


class SettingDoc(NamedTuple):
    """One row of the configuration table."""

    default: str   # Markdown; a literal default is written first in backticks, as it would be set in the environment
    meaning: str   # Markdown


SETTING_DOCS: dict[str, SettingDoc] = {
    "database_url": SettingDoc("SQLite file under `AMPCI_DATA_DIR`",
                               "`postgresql+psycopg://user@host/db` in production"),
    "broker_url": SettingDoc("empty: in-process local pool", "`redis://host:6379/0` dispatches jobs to Celery workers"),
    "data_dir": SettingDoc("user data dir (`~/.local/share/ampci`)", "embedded SQLite database"),
    "cache_dir": SettingDoc("user cache dir (`~/.cache/ampci`)", "model zoo cache, fp32 reference cache, pass worktrees"),
    "pass_repo": SettingDoc(
        "unset: a webhook run's own repository, else this repository",
        "git repository holding `amp_pass/` whose revisions are tested (a path or a URL; set, it is used for every "
        "run). Unset, a webhook run tests the repository that sent the webhook: workers clone its `clone_url` "
        "(https, at the delivery's `owner/name`; see [Pass repository](deployment.md#pass-repository)), and "
        "everything else (`ampci sweep`, nightly, runs of deliveries without a clone URL) uses this checkout"),
    "pass_repo_allow_file": SettingDoc(
        "`false`",
        "also accept `file:///path` clone URLs in deliveries (tests, a local mirror mounted into the workers); "
        "never `ext::`, `ssh`, plain `http` or anything starting with `-`"),
    "webhook_secret": SettingDoc("none (required by `ampci serve`)", "GitHub webhook HMAC secret"),
    "insecure_dev": SettingDoc("`false`", "allow `ampci serve` without a webhook secret (development only)"),
    "allowed_repos": SettingDoc("empty (none)", "comma-separated `owner/name` accepted by the webhook"),
    "tracked_branches": SettingDoc("`main,master`", "branches whose pushes start a smoke run"),
    "fork_policy": SettingDoc(
        "`approve`",
        "an *untrusted* pull request — from a fork (head repository not the repository itself, or unknown), or "
        "whose author's `author_association` is not `OWNER`, `MEMBER` or `COLLABORATOR` — `approve`: its run "
        "waits, without jobs, in the state `awaiting_approval` (commit status `pending`, \"waiting for a "
        "maintainer: add the label ampci:run\") until a maintainer adds the label `ampci:run` or comments "
        "`/ampci run` (first line; by an owner, member or collaborator), which starts the run of the head current "
        "then; each later push waits again. `always`: runs it at once; `never`: never runs it (status `error` "
        "says why; approvals are refused)"),
    "trusted_authors": SettingDoc("empty",
                                  "comma-separated GitHub logins whose pull requests run at once, even from forks"),
    "approvers": SettingDoc(
        "empty",
        "comma-separated GitHub logins who may approve an untrusted pull request's run (`/ampci run`, the "
        "`ampci:run` label) when ampci has no GitHub identity (no App, no token) to ask for their permission; "
        "ignored when it has one (GitHub's write, maintain or admin decides): see [Security](security.md)"),
    "github_token": SettingDoc(
        "none",
        "a personal or bot token for commit statuses and the PR comment, used when no App is configured (check "
        "runs need the App)"),
    "github_app_id": SettingDoc(
        "none", "the GitHub App's id (recommended way to connect: see [Connect to GitHub](github.md))"),
    "github_client_id": SettingDoc(
        "none",
        "the GitHub App's client ID (`Iv1.…`, `Iv23…`, on the App's settings page): when set, the issuer of the "
        "App's JWTs, as GitHub now recommends (it accepts the numeric id as well); may replace "
        "`AMPCI_GITHUB_APP_ID`, which a `check_suite` re-run filter still prefers when both are set"),
    "github_private_key": SettingDoc(
        "none", "the App's private key (PEM; this or `AMPCI_GITHUB_PRIVATE_KEY_FILE`; never logged, keep it out of "
                "images)"),
    "github_private_key_file": SettingDoc("none", "a file holding the App's private key (instead of "
                                                  "`AMPCI_GITHUB_PRIVATE_KEY`)"),
    "github_api_url": SettingDoc("`https://api.github.com`",
                                 "GitHub API base (tests point it at a loopback stand-in)"),
    "github_report": SettingDoc(
        "`status,comment`",
        "what webhook runs report, a comma list: `status` (commit status; token permission *Commit statuses: "
        "write*), `comment` (one PR comment, edited in place; *Pull requests: write*, or *Issues: write*), `check` "
        "(a live check run per run: queued, in progress, completed; *Checks: write*, which includes the read "
        "needed to list them and which only a GitHub App installation token can hold: with a token none is sent)"),
    "api_token": SettingDoc("none", "bearer token for write endpoints and dashboard triage buttons"),
    "read_token_required": SettingDoc("`false`", "also require the token for read endpoints"),
    "public_url": SettingDoc("`http://127.0.0.1:8000`", "base of links in commit statuses"),
    "max_body_bytes": SettingDoc(
        "`1M`",
        "largest request body on every route but the webhook (API, forms): a declared larger one is refused "
        "unread, a streamed one cut off at the limit (413)"),
    "webhook_max_body_bytes": SettingDoc(
        "`25M`",
        "largest webhook body (GitHub's cap is 25 MB): read only with a signature header (else 401 unread), fed "
        "into the HMAC as it arrives; larger is 413, nothing stored"),
    "http_header_timeout": SettingDoc(
        "`10s`", "`ampci serve`: a connection whose request headers are not complete after this is closed "
                 "(slowloris)"),
    "http_body_timeout": SettingDoc(
        "`30s`", "`ampci serve`: a request body not complete this long after its first byte was awaited is "
                 "answered 408"),
    "http_keepalive_timeout": SettingDoc("`5s`", "`ampci serve`: an idle kept-alive connection is closed after this"),
    "http_max_connections": SettingDoc(
        "`1000`", "`ampci serve`: concurrent connections per server process (beyond: 503)"),
    "http_client_connections": SettingDoc(
        "`64`", "`ampci serve`: concurrent connections one client address may hold (beyond: closed at once)"),
    "convert_timeout": SettingDoc("`600s`", "time limit of the conversion subprocess"),
    "convert_memory": SettingDoc("`8GiB`", "address-space limit of the conversion subprocess"),
    "job_timeout": SettingDoc("`1800s`", "hard time limit of one job (Celery visibility timeout is set above it)"),
    "max_attempts": SettingDoc("`3`", "deliveries before a job is marked `crashed` (poison job)"),
    "latency_runs": SettingDoc("`20`", "timed runs per latency measurement"),
    "latency_warmup": SettingDoc("`3`", "warm-up runs per latency measurement"),
    "latency_threads": SettingDoc(
        "`1`",
        "onnxruntime intra-op threads of the timed sessions (`0`: its default, one per core); part of the "
        "environment fingerprint. One thread because with the default pool a model's converted/fp32 latency ratio "
        "swung 2.4x between sessions on two cores (1.02x with one)"),
    "convert_repeats": SettingDoc(
        "`5`", "conversions timed per job for the conversion-time rule (repeats stop after ~5 s; the first "
               "conversion's model is used)"),
    "confirm_pairs": SettingDoc(
        "`8`",
        "a latency or conversion-time regression is *suspected* until a confirmation job times the baseline and "
        "the candidate revision interleaved this many pairs (per suspected cell and kind, on one worker; at least "
        "7, the fewest with which the paired test can reach p < 0.01); only a confirmed one fails the gate, the "
        "others are kept as `dismissed`; a timing *improvement* is suspected and confirmed the same way (mirrored: "
        "faster beyond the inverse of the ratio limit and the floor), and only a confirmed one is shown as a gain "
        "(the others: `dismissed`, or still suspected when a cap left them out; confirmed after slowdowns and "
        "recoveries); `0` turns confirmation off (timing regressions fail the gate and improvements show at once)"),
    "confirm_max_cells": SettingDoc(
        "`8`",
        "suspected cells one run's confirmation times at most (slowdowns before suspected recoveries, largest "
        "ratio first); the others stay *suspected*, noted `not confirmed: confirmation cap of 8 cells per run "
        "reached`, and do not fail the gate (see [Bounded work](#bounded-work) below); at least 1"),
    "confirm_max_per_pr": SettingDoc(
        "`16`",
        "cells all confirmations of one pull request (repository and number, across its runs) time at most; once "
        "spent, its later runs confirm nothing and say so (`not confirmed: confirmation budget of 16 cells for pull "
        "request owner/name#N spent`); push, nightly and manual runs have the per-run cap only; `0`: pull-request "
        "runs confirm nothing"),
    "baseline_runs": SettingDoc(
        "`true`",
        "a push or pull-request run whose baseline revision has no result for some of its cells first runs the "
        "baseline revision for those cells (a `manual` run, as `ampci sweep` does) and is judged — regressions, "
        "gate, commit status — only once they are in; `false`: those cells are reported as not compared"),
    "convergence_steps": SettingDoc("`64`", "steps a stateful model is rolled forward"),
    "accuracy_k": SettingDoc("`3`", "converted error must stay within k x the fp32 rerun noise plus tolerance"),
    "worktree_cache_size": SettingDoc("`8`", "pass worktrees kept per worker (least recently used evicted)"),
    "nightly_cron": SettingDoc("`0 2 * * *`", "UTC schedule of `ampci beat`'s nightly sweep"),
    "nightly_sweep": SettingDoc("`full`", "the sweep `ampci beat` runs nightly"),
    "extra_queues": SettingDoc("empty", "more target queues, e.g. `cuda-a100,cuda-h100`"),
    "thresholds_file": SettingDoc("built-in", "JSON/YAML overriding regression thresholds"),
    "auto_bisect": SettingDoc(
        "`false`", "a `push`/`nightly` regression with untested commits since its baseline starts a bisection by "
                   "itself"),
    "reconcile_every": SettingDoc(
        "`300s`", "how often `ampci beat` re-sends jobs whose broker message was lost (`ampci.reconcile` on the "
                  "`control` queue); `0` or `off` disables"),
    "reconcile_grace": SettingDoc(
        "`300s`", "a queued job younger than this is never re-sent by reconcile (its message may be being sent "
                  "right now)"),
    "db_pool_size": SettingDoc(
        "`5`", "PostgreSQL connections one engine keeps open (SQLite: unused); a request finding all busy waits "
               "30 s, then 503"),
    "db_max_overflow": SettingDoc("`10`", "PostgreSQL connections one engine may add under load (SQLite: unused)"),
    "local_workers": SettingDoc("`0` (the CPU count)", "embedded mode: job subprocesses of the one local pool per "
                                                        "process"),
    "sandbox": SettingDoc(
        "`require` for `ampci serve`/`worker` and any deployment with a broker or database URL; `auto` for the "
        "embedded commands",
        "how the pass under test is isolated (see [Security model](security.md)): `require` refuses to start (one "
        "line saying what to enable) where the namespaces cannot be made; `best-effort` runs it without "
        "namespaces -- as an unprivileged uid of its own (never root), with the environment allowlist, closed "
        "descriptors, the system-call filter and limits; what that does not protect is in the security model "
        "-- and says so (each result's "
        "`environment.sandbox`, the run page's *Pass sandbox* row, a footnote of the PR comment and check run; "
        "`/healthz`'s `sandbox` is the embedded pool's mode, `workers` when Celery workers run the pass); `auto`: "
        "the full sandbox where the machine allows it, else best-effort with one warning line (embedded commands only: "
        "`ampci serve`/`worker` take `auto` as `require`, they never fall back)"),
    "sandbox_max_procs": SettingDoc(
        "`64`", "processes and threads the sandboxed pass (its uid) may have at once (`RLIMIT_NPROC`)"),
    "sandbox_max_file": SettingDoc(
        "`4GiB`", "largest file the pass may write (`RLIMIT_FSIZE`), and largest output copied out of its sandbox "
                  "(a larger one: `convert_error`)"),
    "sandbox_scratch": SettingDoc(
        "`8GiB`", "size of the pass's scratch tmpfs (`/tmp` inside the sandbox, its outputs included; "
                  "memory-backed)"),
    "log_level": SettingDoc("`INFO`", "log level"),
}


def variable(name: str) -> str:
    """The environment variable of field ``name`` (``AMPCI_`` + upper case)."""
    return PREFIX + name.upper()


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_table() -> str:
    """The configuration table in Markdown, one row per entry of :data:`SETTING_DOCS`, in its order."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for name, doc in SETTING_DOCS.items():
        lines.append(f"| `{variable(name)}` | {_cell(doc.default)} | {_cell(doc.meaning)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_table(), end="")
