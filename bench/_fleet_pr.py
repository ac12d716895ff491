"""Push-to-verdict of ``bench/bench_fleet.py``: a pull request's webhook POSTed to the real API (uvicorn on
loopback, ``create_app`` with its real intake, Celery dispatch and GitHub App reporter) until the loopback
GitHub stand-in (``tests/service/github/github_standin.py``) holds its check run ``completed``.

The API process is :func:`pr_app` under uvicorn (``factory=True``), configured by ``BENCH_*`` environment
variables; its planner answers the pull request's sweep with :data:`PR_CELLS` stub cells (the first cells of
the nightly the bench ran, so their baseline revision has results and no baseline run is needed).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PR_CELLS = 6
SECRET = "bench-fleet-secret"


def pr_config(models: list[str]) -> Any:
    from service.orchestration.sweeps import SweepConfig

    return SweepConfig.from_dict({"name": "smoke", "models": models, "dtypes": ["fp16"], "policies": ["default"],
                                  "targets": ["cpu"], "repeats": 6})


def pr_app() -> Any:
    """The API under test: the real app, store, intake, Celery dispatch and App reporter (its post interval
    at the default, its watch interval too unless ``BENCH_WATCH_INTERVAL`` says, for a what-if); only the sweep
    plan is the bench's (``BENCH_PR_MODELS``)."""
    from service.api.app import create_app
    from service.api.dispatch import RunDispatcher
    from service.db import Store
    from service.github.reporter import StatusReporter
    from service.settings import Settings
    from tests.service.api.helpers import REPO
    from tests.service.github.github_standin import APP_ID

    models = json.loads(os.environ["BENCH_PR_MODELS"])
    settings = Settings(database_url=os.environ["BENCH_DATABASE_URL"], broker_url=os.environ["BENCH_BROKER_URL"],
                        webhook_secret=SECRET, allowed_repos=REPO, api_token="bench", log_level="WARNING",
                        github_app_id=APP_ID, github_private_key=os.environ["BENCH_APP_KEY"],
                        github_api_url=os.environ["BENCH_GITHUB_URL"], github_report="status,comment,check",
                        public_url="https://ci.example.com")
    cells = pr_config(models).expand({m: {"bench"} for m in models})
    store = Store.from_url(settings.database_url)
    watch = os.environ.get("BENCH_WATCH_INTERVAL")
    reporter = StatusReporter.from_settings(settings, store=store, **({"watch_interval": float(watch)} if watch else {}))
    return create_app(settings, store=store, reporter=reporter,
                      dispatcher=RunDispatcher(settings, store, planner=lambda sweep: cells))


@dataclass(frozen=True)
class Verdict:
    """One pull request's timeline, seconds from the webhook POST (wall clock)."""

    answered_s: float       # the API's 202
    created_s: float        # run row created (DB)
    first_start_s: float    # first job started (DB)
    finished_s: float       # run finished (DB)
    completed_s: float      # check run completed at the stand-in
    conclusion: str


def _stamping_standin(server: Any) -> Any:
    """A GitHub stand-in that stamps (``completed_at``: head sha -> wall time) each check run completed."""
    from tests.service.github.github_standin import APP_ID as _APP
    from tests.service.github.github_standin import GitHubStandIn, app_key

    class Stamping(GitHubStandIn):
        completed_at: dict[str, tuple[float, str]] = {}

        def handle(self, request: Any) -> Any:
            answer = super().handle(request)
            if "check-runs" in request.path and request.method in ("POST", "PATCH"):
                with self._lock:
                    for c in self.checks:
                        if c.get("status") == "completed" and c["head_sha"] not in self.completed_at:
                            self.completed_at[c["head_sha"]] = (time.time(), str(c.get("conclusion")))
            return answer

    return Stamping(server, app_id=_APP, public_key=app_key()[1])


def push_to_verdict(env: dict[str, str], db_url: str, base_sha: str, models: list[str], tries: int,
                    log: Path, watch_interval: float | None = None, timeout_s: float = 60.0) -> tuple[list[Verdict], float]:
    """Start the API and the stand-in, send ``tries`` pull requests one after the other (each waits for its
    completed check run), stop both; the timelines and the API process's CPU seconds over them."""
    import logging

    import psutil
    from pytest_httpserver import HTTPServer

    from bench._fleet_control import free_port, kill_tree
    from service.db import Store
    from tests.service.api.helpers import encode, pr_payload, sha, webhook_headers
    from tests.service.github.github_standin import app_key

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    gh = _stamping_standin(server)
    port = free_port()
    api_env = {**env, "BENCH_DATABASE_URL": db_url, "BENCH_BROKER_URL": env["AMPCI_BROKER_URL"],
               "BENCH_GITHUB_URL": server.url_for("/").rstrip("/"), "BENCH_PR_MODELS": json.dumps(models),
               "BENCH_APP_KEY": app_key()[0]}  # the stand-in's App key (made in this process)
    if watch_interval is not None:
        api_env["BENCH_WATCH_INTERVAL"] = str(watch_interval)
    code = ("import uvicorn; uvicorn.run('bench._fleet_pr:pr_app', factory=True, host='127.0.0.1', "
            f"port={port}, log_level='warning', access_log=False)")
    api = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=api_env, stdout=open(log, "wb"),
                           stderr=subprocess.STDOUT, start_new_session=True)
    store = Store.from_url(db_url)
    out: list[Verdict] = []
    api_cpu = 0.0
    try:
        _wait_http(f"http://127.0.0.1:{port}/healthz", api, 60)
        time.sleep(1.0)  # the app's start-up work (warm-up, recovery) is not a pull request's
        cpu0 = psutil.Process(api.pid).cpu_times()
        for i in range(tries):
            head = sha(f"bench-fleet-pr-{i}-{time.time()}")
            body = encode(pr_payload(head, base_sha, number=100 + i))
            req = urllib.request.Request(f"http://127.0.0.1:{port}/webhooks/github", data=body, method="POST",
                                         headers=webhook_headers(body, "pull_request", secret=SECRET))
            t0 = time.time()
            with urllib.request.urlopen(req, timeout=30) as resp:
                answered = time.time()
                if resp.status != 202:
                    raise RuntimeError(f"webhook answered {resp.status}")
                delivery = json.loads(resp.read())["delivery"]
            while head not in gh.completed_at:
                if time.time() - t0 > timeout_s or api.poll() is not None:
                    raise RuntimeError(f"no completed check run within {timeout_s:.0f} s (see {log})")
                time.sleep(0.005)
            done, conclusion = gh.completed_at[head]
            stored = store.get_delivery(delivery)
            if stored is None or stored.run_id is None:
                raise RuntimeError(f"delivery {delivery} has no run")
            run_id = int(stored.run_id)
            run, jobs = store.get_run(run_id), store.jobs(run_id)
            starts = [j.started_at for j in jobs if j.started_at is not None]

            def at(stamp: datetime | None, t0: float = t0) -> float:
                return stamp.timestamp() - t0 if stamp is not None else math.nan

            out.append(Verdict(answered - t0, at(run.created_at), at(min(starts) if starts else None),
                               at(run.finished_at), done - t0, conclusion))
        cpu1 = psutil.Process(api.pid).cpu_times()
        api_cpu = cpu1.user + cpu1.system - cpu0.user - cpu0.system
    finally:
        store.dispose()
        kill_tree(api.pid)
        server.clear()
        if server.is_running():
            server.stop()
    return out, api_cpu


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the API exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the API did not answer {url} within {timeout_s:.0f} s")


def model_work_s(stub_s: float, workers: int, cells: int = PR_CELLS) -> float:
    """The critical path of the cells' model work on ``workers`` idle workers: ceil(cells / workers) stubs."""
    return math.ceil(cells / max(1, workers)) * stub_s

