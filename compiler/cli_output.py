"""How every subcommand prints: text, or JSON with ``--json [PATH]`` (the same in each one).

``--json`` alone prints JSON on stdout instead of the text; ``--json PATH`` prints the text and
writes the JSON to PATH.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from qfuse.compiler.files import write_text

STDOUT = "-"  # the value of a bare --json


def json_default(value: object) -> object:
    """numpy scalars and arrays as plain JSON values; anything else (paths, enums) as text."""
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    return str(value)


def to_json(payload: Any) -> str:
    return json.dumps(payload, indent=1, default=json_default)


def emit(dest: str | None, payload: Any, text: str | Callable[[], str]) -> None:
    """Print ``text`` and write ``payload`` to ``dest``, or print only the JSON (``STDOUT``)."""
    if dest == STDOUT:
        print(to_json(payload))
        return
    print(text() if callable(text) else text)
    if dest:
        write_text(dest, to_json(payload) + "\n", "JSON")
        print(f"wrote {dest}")
