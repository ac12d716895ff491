"""Conversion zygote: imports a pass once, then forks one isolated child per conversion.

Run as a *script* (``python workers/_zygote.py PASS_ROOT``, never as ``-m workers...``) so that a
pass root holding another revision of this repository cannot shadow the zygote's own code; it
imports nothing from ``workers``.  Protocol, one JSON object per line:

- zygote -> worker at start: ``{"ready": true}`` or ``{"ready": false, "error": "..."}``;
- worker -> zygote: ``{"argv": [...], "stdout": PATH, "stderr": PATH, "memory": BYTES}``;
- zygote -> worker: ``{"pid": CHILD}`` at once, then ``{"pid": CHILD, "code": N}`` or
  ``{"pid": CHILD, "signal": N}`` when the child ends.

The child runs in its own session (the worker kills its process group on timeout) with
``RLIMIT_AS`` set, stdout/stderr redirected to the given files, and executes ``amp_pass`` as
``python -m amp_pass ARGV`` would, so the pass sees the same contract as a fresh subprocess.
"""

import json
import os
import resource
import runpy
import sys
import traceback


def _child(req):
    os.setsid()
    limit = int(req["memory"])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.argv = ["python -m amp_pass", *req["argv"]]
    code = 0
    try:
        runpy.run_module("amp_pass", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - report like the interpreter would, then exit 1
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _send(obj):
    sys.__stdout__.write(json.dumps(obj) + "\n")
    sys.__stdout__.flush()


def _drop_editable_finders():
    """Remove setuptools' editable-install finders: they would fill modules missing from the pass
    root's ``amp_pass`` with this checkout's, so a revision would not be converted by itself alone."""
    sys.meta_path[:] = [f for f in sys.meta_path
                        if not (getattr(f, "__module__", "") or "").startswith("__editable__")]


def main():
    root = sys.argv[1]
    sys.path[0] = root  # replaces this script's directory: nothing of workers/ is importable here
    _drop_editable_finders()
    try:
        import amp_pass  # noqa: F401 - the point: import once, fork many times
        try:
            import amp_pass.cli  # noqa: F401 - the real pass's heavy imports live here
        except ImportError:
            pass
    except BaseException as exc:  # noqa: BLE001
        _send({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    _send({"ready": True})
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req)
        _send({"pid": pid})
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            _send({"pid": pid, "signal": os.WTERMSIG(status)})
        else:
            _send({"pid": pid, "code": os.WEXITSTATUS(status)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
