"""Serve the app with the dashboard on 127.0.0.1:PORT (the browser tests start this as a subprocess).

    AMPCI_DATABASE_URL=... AMPCI_WEBHOOK_SECRET=... AMPCI_API_TOKEN=... python -m tests.service.dashboard.server PORT
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    """Build ``create_app`` from the environment with the dashboard router and run uvicorn."""
    import uvicorn

    from service.api.app import create_app
    from service.dashboard import dashboard_router
    from service.db import Store
    from service.settings import Settings

    settings = Settings.from_env()
    store = Store.from_url(settings.effective_database_url)
    app = create_app(settings, store=store, dashboard=dashboard_router(), background=False)
    uvicorn.run(app, host="127.0.0.1", port=int(argv[0]), log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
