"""The `qfuse` command line end to end on a zoo model: compile, inspect (text and JSON), run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from qfuse.compiler.cli import main
from qfuse.examples.zoo import model_path
from tests.compiler.lower_helpers import float_matmul_copy, one_primitive_per_int8_node


@pytest.fixture(scope="module")
def resnet() -> Path:
    return model_path("resnet", quantized=True)


@one_primitive_per_int8_node
def test_compile_prints_summary_and_writes_plan(resnet: Path, tmp_path: Path, capsys) -> None:
    plan = tmp_path / "plan.json"
    assert main(["compile", str(resnet), "--json", str(plan)]) == 0
    text = capsys.readouterr().out
    # 10 convolutions, the stride-2 1x1's subsampling reorder, the input's quantize and its
    # reorder to channels-last, the pool, and the classifier writing dequantized float32
    assert "kernels: 15" in text and "reorders between kernels: 0" in text
    assert json.loads(plan.read_text())["kernels"]


@one_primitive_per_int8_node
def test_inspect_json_has_the_documented_keys(resnet: Path, capsys) -> None:
    assert main(["inspect", str(resnet), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert {"kernels", "reorders", "not_fused"} <= info.keys()
    for kernel in info["kernels"]:
        assert {"name", "primitive", "impl", "src_dtype", "dst_dtype", "post_ops",
                "optimizations", "absorbed"} <= kernel.keys()
    convs = [k for k in info["kernels"] if k["primitive"] == "convolution"]
    assert all(k["dst_dtype"] == "u8" for k in convs)
    assert sum("sum" in k["post_ops"] for k in convs) == 4  # the four residual adds
    assert not any(k["impl"].startswith("ref") for k in convs)
    assert {n["node"] for n in info["not_fused"]} == {"input_QuantizeLinear"}
    assert info["kernels"][-1]["dst_dtype"] == "f32"  # the output's dequantize is absorbed


def test_inspect_text_lists_kernels_and_reasons(resnet: Path, capsys) -> None:
    assert main(["inspect", str(resnet)]) == 0
    text = capsys.readouterr().out
    assert "/layer1.0/conv2/Conv: convolution u8→u8" in text
    assert "sum(scale=" in text and "composer:" in text
    assert "input_QuantizeLinear (FakeQuantize): quantizes the graph input" in text


@pytest.mark.parametrize("mode", ["fused", "unfused", "fp32", "reference"])
def test_run_saves_outputs(resnet: Path, tmp_path: Path, mode: str, capsys) -> None:
    out = tmp_path / "out.npz"
    assert main(["run", str(resnet), "--mode", mode, "--output", str(out)]) == 0
    with np.load(out) as npz:
        assert npz["logits"].shape == (1, 10)


def test_run_reads_inputs_and_names_missing_ones(resnet: Path, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.npz"
    np.savez(bad, other=np.zeros(3, np.float32))
    assert main(["run", str(resnet), "--inputs", str(bad)]) == 1
    assert "lacks model inputs ['input']" in capsys.readouterr().err


def test_bad_model_gives_an_error_not_a_traceback(tmp_path: Path, capsys) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    assert main(["compile", str(junk)]) == 1
    assert "MalformedModelError" in capsys.readouterr().err


def test_inexact_int8_keeps_onednns_kernels(resnet: Path, tmp_path: Path, capsys) -> None:
    """--inexact-int8: no weight split anywhere (on a VNNI / AMX CPU nothing splits anyway);
    the outputs stay close to the exact plan's, and where the CPU splits, fewer kernels."""
    from qfuse.compiler.api import compile_model, random_inputs

    exact_plan, inexact_plan = tmp_path / "exact.json", tmp_path / "inexact.json"
    assert main(["compile", str(resnet), "--json", str(exact_plan)]) == 0
    assert main(["compile", str(resnet), "--inexact-int8", "--json", str(inexact_plan)]) == 0
    capsys.readouterr()
    exact, inexact = (json.loads(p.read_text()) for p in (exact_plan, inexact_plan))
    assert inexact["exact_int8"] == {}
    assert not any(k["name"].endswith(":lo") for k in inexact["kernels"])
    if exact["exact_int8"]:  # this CPU splits: the inexact plan has one kernel less per split
        split = sum(k["name"].endswith(":lo") for k in exact["kernels"])
        # and none of the copies of even input channels that pair-safe weights read
        even = sum(re.search(r"@even\d*$", k["name"]) is not None for k in exact["kernels"])
        # and none of the reorders of a matmul computed in float32 instead of split
        copies = sum(float_matmul_copy(k) for k in exact["kernels"])
        assert split > 0 and len(inexact["kernels"]) == len(exact["kernels"]) - split - even \
            - copies
    model = compile_model(resnet, exact_int8=False)
    feeds = random_inputs(model, seed=0)
    a, b = model.run(feeds), compile_model(resnet).run(feeds)
    for name in model.outputs:
        if not exact["exact_int8"]:  # nothing split: the same plan, the same outputs
            np.testing.assert_array_equal(a[name], b[name])
            continue
        # saturated pair sums move some outputs; the result stays the same model's
        cos = float(np.dot(a[name].ravel(), b[name].ravel())
                    / (np.linalg.norm(a[name]) * np.linalg.norm(b[name])))
        assert cos > 0.9, cos
