"""cosine and step_diff, the comparison measures every test and table uses."""

from __future__ import annotations

import numpy as np
import pytest

from qfuse.runtime.numerics import StepDiff, cosine, step_diff


def test_cosine() -> None:
    a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    assert cosine(a, a) == pytest.approx(1.0)
    assert cosine(a, -a) == pytest.approx(-1.0)
    assert cosine([1.0, 0.0], [0.0, 1.0]) == 0.0
    assert cosine(np.zeros(3), np.zeros(3)) == 1.0
    assert cosine(np.zeros(3), np.ones(3)) == 0.0
    with pytest.raises(ValueError, match="cosine"):
        cosine(np.ones(3), np.ones(4))


def test_step_diff_integers_and_dequantized() -> None:
    a = np.array([0, 5, 255], np.uint8)
    b = np.array([0, 7, 254], np.uint8)
    assert step_diff(a, b) == StepDiff(max_steps=2, identical=pytest.approx(1 / 3))
    scale = 0.25
    assert step_diff(a * scale, b * scale, scale).max_steps == 2
    assert step_diff(a, a).identical == 1.0
    assert step_diff(np.zeros(0, np.int8), np.zeros(0, np.int8)) == StepDiff(0, 1.0)
