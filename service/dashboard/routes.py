"""The dashboard's pages: server-rendered HTML (Jinja2) with inline SVG plots, readable without JavaScript.

Routes (not in the OpenAPI schema):

- ``GET /`` and ``GET /runs`` — recent runs, filter by ``branch`` and ``trigger``;
- ``GET /runs/{id}`` — the run matrix, its findings and the diff against the baseline (the page
  commit statuses link to).  Content-negotiated: a client whose ``Accept`` header does not name
  HTML (curl, scripts) is redirected (307) to the JSON at ``/api/runs/{id}``, as before the
  dashboard existed; browsers get the page;
- ``GET /history?model=&dtype=&policy=&target=[&branch=main|all|NAME][&limit=50]`` — a cell across
  revisions.  Without ``branch`` it shows ``main``, or every branch when ``main`` has no result of the
  cell (a run started from the CLI has no branch); ``branch=all`` (or empty) is every branch.  Without
  ``policy`` or ``target`` it lists every policy/target of the model and dtype that has results (one
  of them: that cell's history).  Matrix and diff links of a run keep the run's branch;
- ``GET /regressions[?state=open|all|STATE&kind=&category=&model=&dtype=&since=7d|DATE&limit=200]`` — findings across
  runs, newest first (the open ones unless ``state`` says otherwise), each linking to its run and its
  cell's history;
- ``GET /regressions/{id}`` — one finding, baseline vs offending numbers, bisection state;
- ``POST /regressions/{id}/triage`` — the acknowledge / false-positive form (fields ``token``,
  ``action``, ``by``, ``note``).  The token is the API bearer token (``AMPCI_API_TOKEN``), compared
  in constant time; without it the request is refused (401) and nothing changes; without a
  configured token triage is disabled (403) unless ``AMPCI_INSECURE_DEV`` is set.
- ``GET /dashboard.css``.

Read pages need the bearer token only when ``AMPCI_READ_TOKEN_REQUIRED`` is set (as the JSON API).
Unknown ids and bad parameters get an HTML error page with a 404/400 status: ids and limits are read
by :mod:`service.web.params` (ASCII digits only, bounded), so a malformed id is a 404 and a malformed
``limit`` a 400 (an empty one is the default).
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Callable
from dataclasses import replace
from functools import wraps
from pathlib import Path
from typing import ParamSpec
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from service.dashboard import bisection, plots, views
from service.db import dashboard as queries
from service.db.deliveries import DELIVERY_STATES
from service.db.records import RegressionInfo
from service.db.result_queries import REG_STATES
from service.db.store import Store
from service.db.tails import stderr_tails
from service.errors import NotFoundError, UserError
from service.github.approval import AWAITING_DESCRIPTION
from service.github.reporter import StatusReporter
from service.orchestration.judge import listed_verdicts, record_verdict, run_verdict
from service.regressions.kinds.registry import all_kinds
from service.regressions.rules import CATEGORIES
from service.settings import Settings
from service.vocabulary import AWAITING_APPROVAL, TRIGGERS
from service.web.auth import require_read
from service.web.params import path_id, query_int, query_since

HERE = Path(__file__).parent
CSS = views.stylesheet((HERE / "static" / "dashboard.css").read_text(encoding="utf-8"))  # with the kinds' styles
MAX_FORM_BYTES = 16_384
HISTORY_DEFAULT = 40  # revisions plotted unless ?limit= (2..200) asks otherwise
_NAME = re.compile(r"^[\w.:+/-]{1,200}$")

env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]),
                  trim_blocks=True, lstrip_blocks=True)
env.globals.update(fmt=views.fmt, fmt_cosine=views.fmt_cosine, pct=views.pct, duration=views.duration,
                   states=views.STATES, finding_state=views.finding_state,
                   category_titles=views.CATEGORY_TITLES, urlencode=urlencode, run_verdict_badge=views.run_verdict_badge)


ALL_BRANCHES = "all"
P = ParamSpec("P")


def history_href(cell: tuple[str, str, str, str], **extra: str | None) -> str:
    """The history page of a cell (``branch=None`` in ``extra``: every branch)."""
    if "branch" in extra and not extra["branch"]:
        extra["branch"] = ALL_BRANCHES
    return "/history?" + urlencode({"model": cell[0], "dtype": cell[1], "policy": cell[2], "target": cell[3],
                                    **extra})


def _branch_filter(branch: str) -> str | None:
    """The branch a page filters on: None for every branch (``all`` or empty)."""
    if branch in ("", ALL_BRANCHES):
        return None
    if not _NAME.match(branch):
        raise UserError("branch: letters, digits and ._:+/- only")
    return branch


env.globals["history_href"] = history_href


def render(name: str, status_code: int = 200, **context: object) -> HTMLResponse:
    """Render a template into an HTML response."""
    return HTMLResponse(env.get_template(name).render(**context), status_code=status_code)


def html_errors(fn: Callable[P, Response]) -> Callable[P, Response]:
    """Turn NotFoundError / UserError raised by a page into an HTML error page (404 / 400)."""

    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Response:
        try:
            return fn(*args, **kwargs)
        except NotFoundError as exc:
            return render("error.html", 404, title="Not found", message=str(exc))
        except UserError as exc:
            return render("error.html", 400, title="Bad request", message=str(exc))

    return wrapper


def _store(request: Request) -> Store:
    store: Store = request.app.state.ctx.store  # the AppContext's (service.api.context); starlette: app is Any
    return store


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.ctx.settings
    return settings


def _reporter(request: Request) -> StatusReporter:
    reporter: StatusReporter = request.app.state.ctx.reporter
    return reporter


router = APIRouter(include_in_schema=False)
read = APIRouter(include_in_schema=False, dependencies=[Depends(require_read)])


@router.get("/dashboard.css")
def stylesheet() -> Response:
    """The dashboard's stylesheet (the only asset; no fonts or scripts are loaded)."""
    return Response(CSS, media_type="text/css", headers={"Cache-Control": "public, max-age=3600"})


@read.get("/", response_class=HTMLResponse)
@read.get("/runs", response_class=HTMLResponse)
@html_errors
def runs_page(request: Request, branch: str = "", trigger: str = "", limit: str = "50") -> Response:
    """Recent runs with revision, trigger, status, counts and duration."""
    if trigger and trigger not in TRIGGERS:
        raise UserError(f"unknown trigger {trigger!r}; expected one of {', '.join(TRIGGERS)}")
    chosen = _branch_filter(branch)
    n = query_int(limit, "limit", 1, 1000, 50)
    store = _store(request)
    rows = queries.runs_overview(store, limit=n, branch=chosen, trigger=trigger or None)
    runs, resolved = listed_verdicts(store, [r.run for r in rows])  # stored verdicts; resolutions beside them
    rows = [replace(r, run=run) for r, run in zip(rows, runs, strict=True)]
    return render("runs.html", rows=rows, resolved=resolved, branches=queries.branches(store), branch=chosen or "", trigger=trigger,
                  triggers=TRIGGERS, limit=n)


@read.get("/deliveries", response_class=HTMLResponse)
@html_errors
def deliveries_page(request: Request, status: str = "", limit: str = "100") -> Response:
    """Recorded webhook deliveries, newest first; rejected and failed ones show the reason."""
    n = query_int(limit, "limit", 1, 1000, 100)
    rows = _store(request).list_deliveries(status=status or None, limit=n)  # UserError for an unknown status
    return render("deliveries.html", rows=rows, states=DELIVERY_STATES, status=status, limit=n)


@read.get("/regressions", response_class=HTMLResponse)
@html_errors
def regressions_page(request: Request, state: str = "open", kind: str = "", category: str = "", model: str = "",
                     dtype: str = "", since: str = "", limit: str = "200") -> Response:
    """Findings across runs, newest first (default: the open ones; ``state=all`` every state), filtered by
    kind, category, model, dtype and ``since`` (found at or after: ``7d``/``12h`` ago or an ISO date, as
    ``ampci regressions --since``; anything else a 400 page); each links to its finding page, its run and
    its cell's history."""
    chosen = None if state in ("", "all") else state
    kinds = [k.name for k in all_kinds()]
    if kind and kind not in kinds:
        raise UserError(f"unknown finding kind {kind!r}; expected one of {', '.join(kinds)}")
    if category and category not in CATEGORIES:
        raise UserError(f"unknown category {category!r}; expected one of {', '.join(CATEGORIES)}")
    for name, value in (("model", model), ("dtype", dtype)):
        if value and not _NAME.match(value):
            raise UserError(f"{name}: letters, digits and ._:+/- only")
    n = query_int(limit, "limit", 1, 1000, 200)
    after = query_since(since)
    rows = queries.findings(_store(request), state=chosen, kind=kind or None, category=category or None,
                            model=model or None, dtype=dtype or None, since=after, limit=n)
    return render("regressions.html", rows=rows, state=chosen or "", kind=kind, category=category, model=model,
                  dtype=dtype, since=since.strip() if after else "", limit=n, states_all=REG_STATES, kinds=kinds,
                  categories=CATEGORIES, magnitude=views.magnitude)


@read.get("/runs/{run_id}", response_class=HTMLResponse)
@html_errors
def run_page(request: Request, run_id: str, diff: str = "changed") -> Response:
    """The run matrix with its findings and the diff against the baseline (JSON clients: a redirect)."""
    accept = request.headers.get("accept", "")
    if "text/html" not in accept and "application/xhtml" not in accept:
        return RedirectResponse(f"/api/runs/{path_id(run_id, 'run')}", status_code=307)
    store = _store(request)
    run = store.get_run(path_id(run_id, "run"))
    revision = store.get_revision(run.revision_sha)
    jobs = store.jobs(run.id)
    results = store.results(run_id=run.id)
    findings = store.regressions(run_id=run.id)
    baselines = queries.baseline_results(store, run, [r.cell for r in results])
    matrix = views.build_matrix(jobs, results, findings, baselines)
    rows = views.diff_rows(results, baselines)
    base_sha, base_cells = views.main_baseline(baselines)
    summary = store.run_summary(run.id)
    by_cat = views.finding_lists(findings, CATEGORIES)
    verdict = run_verdict(store, run.id)
    tails = stderr_tails(store, [r.id for r in results if r.status != "pass"])
    awaiting = AWAITING_DESCRIPTION if run.status == AWAITING_APPROVAL else None  # no jobs, so no verdict yet
    return render("run.html", run=run, revision=revision, matrix=matrix, findings=by_cat, summary=summary,
                  verdict=verdict, awaiting=awaiting, sandbox=views.sandbox_line(store.sandbox_modes(run.id)),
                  line=summary.describe(), diff_all=diff == "all", diff=[r for r in rows if r.changed or diff == "all"],
                  diff_changed=sum(r.changed for r in rows), diff_total=len(rows), base_sha=base_sha,
                  base_cells=base_cells, no_baseline=sum(r.base_sha is None for r in rows),
                  failed_output=[(r, tails[r.id]) for r in results if r.id in tails])


@read.get("/history", response_class=HTMLResponse)
@html_errors
def history_page(request: Request, model: str = "", dtype: str = "", policy: str = "", target: str = "",
                 branch: str | None = None, limit: str = "") -> Response:
    """A cell's metrics across revisions of a branch, with findings marked and points linking to runs
    (branch and missing policy/target: see the module docstring)."""
    for name, value in (("model", model), ("dtype", dtype), ("policy", policy or "x"), ("target", target or "x")):
        if not _NAME.match(value):
            raise UserError(f"{name}: give a name (letters, digits and ._:+/- only)")
    chosen = "main" if branch is None else _branch_filter(branch)
    n = query_int(limit, "limit", 2, 200, HISTORY_DEFAULT)
    store = _store(request)
    if not policy or not target:
        cells = queries.cells_of(store, model, dtype, policy or None, target or None)
        if not cells:
            raise NotFoundError(f"no results for {model} {dtype}" + "".join(f" {v}" for v in (policy, target) if v))
        if len(cells) > 1:
            return render("history_cells.html", model=model, dtype=dtype, cells=cells,
                          branch=branch if branch is not None else "")
        policy, target = cells[0][2], cells[0][3]
    cell = (model, dtype, policy, target)
    points, total = queries.cell_history(store, cell, chosen, n)
    fell_back = not points and branch is None
    if fell_back:  # no branch asked for and nothing on main: every branch
        chosen = None
        points, total = queries.cell_history(store, cell, None, n)
    if not points and not store.results(model=model, dtype=dtype, policy=policy, target=target, limit=1):
        raise NotFoundError(f"no results for cell {'/'.join(cell)}")
    branch = chosen or ""
    found = queries.cell_findings(store, cell, [p.run_id for p in points])
    by_result: dict[int, list[RegressionInfo]] = {}
    for f in found:
        if f.result_id is not None:
            by_result.setdefault(f.result_id, []).append(f)
    charts = plots.history_charts(points, by_result, lambda run_id: f"/runs/{run_id}") if points else []
    drifts = {m.key: plots.chart_drifts(points, by_result, m) for m, _ in charts}
    charts, empty = plots.chart_order(charts, points, by_result)  # what moved first; no empty panels
    return render("history.html", cell=cell, points=points, total=total, limit=n, branch=branch, charts=charts,
                  empty=empty, fell_back=fell_back, drifts=drifts,
                  findings=list(reversed(found)), by_result=by_result, branches=queries.branches(store))


@read.get("/regressions/{regression_id}", response_class=HTMLResponse)
@html_errors
def regression_page(request: Request, regression_id: str, done: str = "") -> Response:
    """One finding: details, baseline vs offending numbers, bisection state, triage form."""
    store = _store(request)
    reg = store.get_regression(path_id(regression_id, "regression"))
    offending = store.get_result(reg.result_id) if reg.result_id else None
    baseline = store.get_result(reg.baseline_result_id) if reg.baseline_result_id else None
    settings = _settings(request)
    return render("regression.html", reg=reg, offending=offending, baseline=baseline,
                  numbers=views.result_numbers(baseline, offending),
                  bisect=bisection.bisect_view(store, reg), done=done,
                  triage_enabled=bool(settings.api_token) or settings.insecure_dev)


@router.post("/regressions/{regression_id}/triage", response_class=HTMLResponse)
async def triage(request: Request, regression_id: str) -> Response:
    """Acknowledge or mark a false positive, given the API token in the form (see module docstring)."""
    from starlette.concurrency import run_in_threadpool

    try:
        rid = path_id(regression_id, "regression")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                return render("error.html", 413, title="Too large", message="form body too large")
        form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True).items()}
        refused = _check_form_token(_settings(request), form.get("token", ""))
        if refused is not None:
            return render("error.html", refused[0], title="Refused", message=refused[1],
                          back=f"/regressions/{rid}")
        action = form.get("action", "")
        if action not in ("ack", "false_positive"):
            raise UserError("action: expected 'ack' or 'false_positive'")
        by = form.get("by", "").strip()[:200].replace("\x00", "") or None
        note = form.get("note", "").strip()[:2000].replace("\x00", "") or None
        found = await run_in_threadpool(_store(request).ack, rid, by=by,
                                        false_positive=action == "false_positive", note=note)
        await run_in_threadpool(record_verdict, _store(request), found.run_id)  # the runs page follows
        await run_in_threadpool(_reporter(request).refresh, _store(request), found.run_id)
    except NotFoundError as exc:
        return render("error.html", 404, title="Not found", message=str(exc))
    except UserError as exc:
        return render("error.html", 400, title="Bad request", message=str(exc))
    return RedirectResponse(f"/regressions/{rid}?done={action}", status_code=303)


def _check_form_token(settings: Settings, given: str) -> tuple[int, str] | None:
    """None when the token is accepted, else (status, reason) — the rules of the API's write endpoints."""
    if not settings.api_token:
        if settings.insecure_dev:
            return None
        return 403, "triage is disabled: AMPCI_API_TOKEN is not set on the server"
    if not given:
        return 401, "an API token is required to acknowledge or mark a false positive"
    if not hmac.compare_digest(given.encode("utf-8", "replace"), settings.api_token.encode("utf-8")):
        return 401, "invalid API token; nothing was changed"
    return None


router.include_router(read)
