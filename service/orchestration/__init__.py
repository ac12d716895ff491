"""Queueing and executing jobs: the scheduler, the local pool, the Celery app and tasks, the broker, reconcile and sweep plans."""
