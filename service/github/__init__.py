"""GitHub integration: webhook signature checks, event parsing and commit-status reporting.

Nothing here runs jobs.  ``signature`` verifies deliveries, ``events`` turns a verified payload into
a :class:`~service.github.events.RunRequest` (or a reason to ignore/reject it), ``status`` posts
commit statuses with retry and backoff through a durable outbox.
"""

from __future__ import annotations
