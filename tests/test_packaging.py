"""The install is one package, qfuse: every folder with an __init__.py is listed in pyproject.toml,
and the public API the README shows is importable."""

from __future__ import annotations

import tomllib
from pathlib import Path

import qfuse

ROOT = Path(__file__).resolve().parents[1]
NOT_INSTALLED = {"tests", "benchmarks", "docs", ".venv", "build"}


def test_every_subpackage_is_listed_in_pyproject() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"qfuse"}
    for init in ROOT.rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT)
        if rel.parts and (rel.parts[0] in NOT_INSTALLED or rel.parts[0].startswith(".")):
            continue
        found.add(".".join(("qfuse", *rel.parts)) if rel.parts else "qfuse")
    assert listed == found


def test_public_api() -> None:
    assert qfuse.__version__ and qfuse.__version__ != "0+unknown"
    assert callable(qfuse.compile_model)
    assert qfuse.compile_model.__module__ == "qfuse.compiler.api"
