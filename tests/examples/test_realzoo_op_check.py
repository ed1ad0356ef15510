"""Op by op on the real-model zoo (compiler/op_check.py): every kernel of qfuse's fused plan,
fed exact QDQ's inputs (onnxruntime, ORT_DISABLE_ALL; a QOperator model's exact QDQ form,
examples/realzoo/exact.py), gives every integer tensor within 1 LSB of exact QDQ's, on the
first held-out input. The two small models run by default, the other three with QFUSE_SLOW=1.
Measured (docs/numerics.md, "Op by op"): one-step differences on at most 0.02 % of a
convolution's outputs, and at exact half-integer window averages of an AveragePool.
"""

from __future__ import annotations

import pytest

from qfuse.compiler.op_check import check_op_by_op, format_text
from qfuse.examples import realzoo
from qfuse.examples.realzoo.table import reference_model

FAST = ["ppocr_cls", "pplcnet_orientation"]
SLOW = ["ppocrv4_det", "ppocrv4_rec", "yolov8n_nudenet"]
QUANTIZERS = ["qdq", "qoperator", "nncf"]


def _check(name: str, quantizer: str) -> None:
    (entry,) = realzoo.models([name], [quantizer])
    if quantizer not in entry.quantized:
        pytest.skip(f"{name} {quantizer}: {entry.errors.get(quantizer)}")
    check = check_op_by_op(entry.quantized[quantizer], entry.evaluation[0],
                           reference_model=reference_model(entry, quantizer))
    print(format_text(check))
    assert len(check.ints) > 30
    assert check.max_lsb <= 1, format_text(check)
    assert all(why.startswith("not materialized") for why in check.skipped.values()), \
        check.skipped


@pytest.mark.parametrize("quantizer", QUANTIZERS)
@pytest.mark.parametrize("name", FAST)
def test_realzoo_within_one_lsb_op_by_op(name: str, quantizer: str) -> None:
    _check(name, quantizer)


@pytest.mark.slow
@pytest.mark.parametrize("quantizer", QUANTIZERS)
@pytest.mark.parametrize("name", SLOW)
def test_realzoo_within_one_lsb_op_by_op_large(name: str, quantizer: str) -> None:
    _check(name, quantizer)
