"""Shared test configuration: markers.

- ``slow``: long-running (ResNet-50-size models, the long fuzz campaign); skipped unless
  ``QFUSE_SLOW=1``.

Shared helpers live beside the tests that use them (``tests/compiler/lower_helpers.py``,
``tests/passes/quant_helpers.py``, ``tests/ort_int8.py``); the comparison measures (cosine, steps
apart) are the package's own, ``qfuse.runtime.numerics``. No test module imports another.
"""

from __future__ import annotations

import os

import pytest

SLOW = os.environ.get("QFUSE_SLOW") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: long-running test, skipped unless QFUSE_SLOW=1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SLOW:
        return
    skip = pytest.mark.skip(reason="slow: set QFUSE_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
