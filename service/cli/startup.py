"""The console script's start-up runs with the cyclic garbage collector paused (issue 25).

Start-up -- importing the layers a command needs (SQLAlchemy and its PostgreSQL dialect, psycopg, the
store), building the parser, opening the store -- allocates a few hundred thousand objects that live as
long as the process, and no garbage.  With the collector on, each young collection and every promotion
traverses them again: a third of a query command's start-up CPU (``ampci runs --json`` on PostgreSQL,
measured alternated with ``bench/bench_cli.py``).  :func:`pause_gc` (called by
:func:`service.cli.main.entry` only) turns it off; :func:`startup_complete` freezes what start-up
allocated (:func:`gc.freeze`: never traversed again) and turns it back on, so what the command itself
allocates is collected as usual.  ``main()`` ends start-up just before a command runs, unless the command
says it ends start-up itself (``startup_in_command``: the query commands, once their store is open, so
their store and driver imports are part of start-up).  Called as a library (tests, ``bench``) nothing is
paused and both functions change nothing.
"""

from __future__ import annotations

import gc

_paused = False


def pause_gc() -> None:
    """Turn the cyclic garbage collector off for start-up, if it is on (:func:`startup_complete` turns it on)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def startup_complete() -> None:
    """End start-up: if :func:`pause_gc` turned the collector off, freeze every object alive now out of it
    and turn it on again.  Idempotent; nothing when nothing was paused."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()


def paused() -> bool:
    """Whether start-up is still running with the collector paused."""
    return _paused
