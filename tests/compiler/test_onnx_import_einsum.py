"""Einsum that is a batched matrix product imports as Transposes and Reshapes around a MatMul
(MaxViT's attention, MViTv2's relative positions); other equations stay a float island."""

from __future__ import annotations

import numpy as np
import pytest
from island_helpers import assert_island
from onnx import TensorProto, helper
from onnx_builders import init, model, qdq_pair, run_ort

from qfuse.compiler.api import compile_model
from qfuse.compiler.onnx_import import import_model
from qfuse.compiler.onnx_import.convert_math import _matmul_einsum
from qfuse.ir import Op
from tests.compiler.lower_helpers import computes_int8_node

F = np.float32


def _einsum(equation: str, a: tuple[int, ...], b: tuple[int, ...]):
    node = helper.make_node("Einsum", ["a", "b"], ["y"], name="n", equation=equation)
    return model([node], {"a": (a, TensorProto.FLOAT), "b": (b, TensorProto.FLOAT)}, ["y"])


def _feeds(a: tuple[int, ...], b: tuple[int, ...]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"a": rng.standard_normal(a).astype(F), "b": rng.standard_normal(b).astype(F)}


@pytest.mark.parametrize(("equation", "a", "b"), [
    ("B G H I D, B G H J D -> B G H I J", (1, 4, 2, 7, 8), (1, 4, 2, 5, 8)),  # q·kᵀ
    ("B G H I J, B G H J D -> B G H I D", (1, 4, 2, 7, 5), (1, 4, 2, 5, 8)),  # p·v
    ("ik,kj->ij", (6, 9), (9, 4)),
    ("bki,bkj->bji", (3, 9, 6), (3, 9, 4)),    # both operands and the output transposed
    ("bhqd,bhkd->bhqk", (2, 3, 5, 8), (2, 3, 6, 8)),
    ("byhwc,hkc->byhwk", (1, 2, 4, 3, 8), (4, 5, 8)),  # MViTv2: a batch letter inside A
    ("bij,bjk->ik", (2, 4, 5), (2, 5, 3)),  # a batch letter summed too
    ("ij,kl->ijkl", (2, 3), (4, 5)),  # an outer product: nothing summed
])
def test_a_batched_matrix_product_is_a_matmul(equation: str, a: tuple[int, ...],
                                              b: tuple[int, ...]) -> None:
    m = _einsum(equation, a, b)
    ops = [n.op for n in import_model(m)]
    assert Op.ISLAND not in ops and ops.count(Op.MATMUL) == 1, ops
    want = run_ort(m, _feeds(a, b))[0]
    for mode in ("reference", "fused"):
        got = compile_model(m, mode=mode).run(_feeds(a, b))["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("equation", "a", "b", "why"), [
    ("ii,ij->ij", (4, 4), (4, 3), "repeats"),
    ("ij,jk", (4, 5), (5, 3), "no explicit output"),
    ("...ij,...jk->...ik", (2, 4, 5), (2, 5, 3), "ellipsis"),
    ("ij,jk->k", (4, 5), (5, 3), "summed within one operand"),
])
def test_other_equations_stay_an_island(equation: str, a: tuple[int, ...], b: tuple[int, ...],
                                        why: str) -> None:
    assert_island(_einsum(equation, a, b), {"Einsum"}, why, feeds=_feeds(a, b))


def test_the_parse() -> None:
    plan = _matmul_einsum("bid,bjd->bij", [(3, 4, 8), (3, 5, 8)])
    assert (plan.perm_a, plan.perm_b, plan.perm_out) == ((0, 1, 2), (0, 2, 1), (0, 1, 2))
    assert plan.shape_a == (3, 4, 8) and plan.shape_b == (3, 8, 5)
    assert _matmul_einsum("ik,kj->ji", [(2, 3), (3, 4)]).perm_out == (1, 0)
    plan = _matmul_einsum("byhwc,hkc->byhwk", [(1, 2, 4, 3, 8), (4, 5, 8)])
    assert plan.perm_a == (2, 0, 1, 3, 4) and plan.shape_a == (4, 6, 8)  # [h, b·y·w, c]
    assert plan.perm_b == (0, 2, 1) and plan.shape_b == (4, 8, 5)  # [h, c, k]
    assert plan.matmul == (4, 6, 5) and plan.product == (4, 1, 2, 3, 5)
    assert plan.perm_out == (1, 2, 0, 3, 4)  # [h, b, y, w, k] → b y h w k


def test_quantized_operands_run_as_an_int8_matmul() -> None:
    """DQ(a), DQ(b) → Einsum → Q: an int8 matmul of two activations, within 1 LSB of the
    float32 Einsum on the dequantized values (the exact integer sum, rounded once)."""
    shape_a, shape_b = (1, 2, 7, 16), (1, 2, 5, 16)
    nodes = [*qdq_pair("a", "a", "ad"), *qdq_pair("b", "b", "bd"),
             helper.make_node("Einsum", ["ad", "bd"], ["e"], equation="bhid,bhjd->bhij"),
             *qdq_pair("e", "e", "y")]
    inits = [init("as", np.array(0.02, F)), init("az", np.array(128, np.uint8)),
             init("bs", np.array(0.03, F)), init("bz", np.array(128, np.uint8)),
             init("es", np.array(0.05, F)), init("ez", np.array(100, np.uint8))]
    m = model(nodes, {"a": (shape_a, TensorProto.FLOAT), "b": (shape_b, TensorProto.FLOAT)},
              ["y"], inits, opset=13)
    compiled = compile_model(m)
    assert [k for k in compiled.inspect()["kernels"]
            if k["primitive"] == "matmul" and computes_int8_node(k)]
    feeds = _feeds(shape_a, shape_b)
    steps = np.abs(compiled.run(feeds)["y"] - run_ort(m, feeds)[0]) / 0.05
    assert steps.max() <= 1 + 1e-4
