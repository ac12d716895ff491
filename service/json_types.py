"""The one place ``Any`` is allowed in ``service/``: a value that really is arbitrary JSON.

A webhook delivery, a run's or a job's ``meta``, a stored result's ``payload`` and an API answer are JSON
documents whose shape the code checks where it reads them; their static type says only that.  Everything
else in ``service/`` has a precise type: mypy runs strict with ``disallow_any_explicit`` over the whole
package (``python3 dev.py typecheck``, in ``.ci/run``), this module alone excepted, and
``tests/test_typing.py`` fails on an ``Any`` written anywhere else.
"""

from __future__ import annotations

from typing import Any, TypeAlias

#: any JSON value, as :func:`json.loads` returns it (a dict, list, str, int, float, bool or None)
JsonValue: TypeAlias = Any
#: a JSON object, as :func:`json.loads` returns it: string keys, arbitrary JSON values
JsonObject: TypeAlias = dict[str, Any]
#: a JSON array
JsonList: TypeAlias = list[Any]
