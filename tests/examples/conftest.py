"""Markers for the example-zoo tests: `slow` tests run only when QFUSE_SLOW=1."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: long-running test, skipped unless QFUSE_SLOW=1")
