"""compiler/op_blame.py (``qfuse check --blame``): which kernels' differences move the output.

- cutting the reference at a tensor and feeding it the reference's own value gives the
  reference's output bit for bit (so an injected difference is the only difference);
- on the issue-13 repro compiled in oneDNN's level form (189 of 768 values one step off in
  ``q``), the injected cosine of ``q`` is the plan's own cosine (nothing after ``q`` but an
  exact DequantizeLinear), and forcing ``q`` to the reference's makes the output identical;
  in the ONNX form nothing differs and no row is listed;
- the sensitivity draws are one-step changes: reproducible by seed, and below 1.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from qfuse import compile_model
from qfuse.compiler.cli import main
from qfuse.compiler.op_blame import blame, format_blame, reference_with, sensitivity
from qfuse.compiler.op_check import reference_values
from qfuse.examples import zoo
from qfuse.ir.postops import ComposerOptions
from tests.compiler.onnx_builders import image_repro

F32 = np.float32


def test_reference_cut_at_its_own_value_is_the_reference() -> None:
    m = zoo.quantized_model("vgg")
    feeds = zoo.sample_inputs(zoo.float_model("vgg"), n=1, seed=3)[0]
    reference = reference_values(m, feeds)
    out = m.graph.output[0].name
    middle = [n.output[0] for n in m.graph.node if n.op_type == "QuantizeLinear"]
    tensor = middle[len(middle) // 2]
    got = reference_with(m, feeds, {tensor: reference[tensor]}, out)
    assert np.array_equal(got, reference[out])
    bumped = np.clip(reference[tensor].astype(np.int64) + 3, 0, 255).astype(
        reference[tensor].dtype)
    assert not np.array_equal(reference_with(m, feeds, {tensor: bumped}, out), reference[out])


def test_blame_names_the_differing_tensor() -> None:
    m, feeds = image_repro()
    level = compile_model(m, composer=ComposerOptions().with_("zero_point_before_round"))
    found = blame(m, feeds, compiled=level, draws=4)
    rows = {r.tensor: r for r in found.rows}
    assert rows["q"].differing == 189 and rows["q"].elements == 768
    assert found.cos_plan < 1.0
    assert abs(rows["q"].injected - found.cos_plan) < 1e-12
    assert rows["q"].fixed == 1.0 and found.cos_all_fixed == 1.0
    assert found.sensitivity is not None and found.sensitivity["tensor"] == "q"
    assert found.sensitivity["k"] == 189 and found.sensitivity["max"] < 1.0
    assert "injected" in format_blame(found)
    onnx_form = blame(m, feeds)
    assert onnx_form.rows == [] and onnx_form.cos_plan == 1.0
    assert onnx_form.sensitivity is None


def test_sensitivity_is_one_step_changes() -> None:
    m, feeds = image_repro()
    a = sensitivity(m, feeds, "q", 1, 5, seed=7)
    b = sensitivity(m, feeds, "q", 1, 5, seed=7)
    assert np.array_equal(a, b) and a.shape == (5,)
    assert np.all(a < 1.0) and np.all(a > 0.99)  # one value of 768 moved by one step


def test_cli_check_blame(tmp_path, capsys) -> None:
    m, feeds = image_repro()
    path, inputs = tmp_path / "repro.onnx", tmp_path / "x.npy"
    onnx.save(m, str(path))
    np.save(inputs, feeds["x"])
    assert main(["check", str(path), "--inputs", str(inputs), "--blame", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["blame"]["rows"] == [] and result["blame"]["cos_plan"] == 1.0
    assert main(["check", str(path), "--inputs", str(inputs), "--blame",
                 "--blame-draws", "0"]) == 0
    assert "plan cosine 1.00000" in capsys.readouterr().out


def test_an_s8_tensor_held_as_u8_is_compared_and_injected_shifted() -> None:
    """Where the plan decomposes an s8 activation as u8 + 128 (unsigned activations, CPUs
    without VNNI), blame still forces and injects it: shifted into the plan's type and back."""
    from qfuse.compiler.lower.no_vnni import isa_is_exact
    from qfuse.compiler.op_blame import _forceable
    from qfuse.compiler.op_check import in_reference_type
    from tests.passes.test_unsigned_activations import _nncf_like

    if isa_is_exact():
        pytest.skip("VNNI / AMX: s8 activations stay s8")
    m = _nncf_like()
    compiled = compile_model(m)
    feeds = {"x": np.random.default_rng(1).normal(0, 2, (1, 8, 12, 12)).astype(F32)}
    reference = reference_values(m, feeds)
    forced = _forceable(compiled, reference)
    assert reference["aq"].dtype == np.int8 and forced["aq"].dtype == np.uint8
    assert np.array_equal(forced["aq"].astype(np.int16) - 128, reference["aq"])
    assert np.array_equal(in_reference_type(forced["aq"], np.int8), reference["aq"])
    assert blame(m, feeds, compiled=compiled).cos_plan > 0.99
