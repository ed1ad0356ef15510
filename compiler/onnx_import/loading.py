"""Reading a model: protobuf, external data (only from inside the model's folder), opset
checks and onnx.checker.

External data is read by hand rather than by onnx.load: each tensor's location is resolved
(symlinks included) and must stay inside the folder of the model file; ``..``, absolute
locations and symlinks leading out are refused with MalformedModelError naming the tensor, and
so is anything that is not a regular file (a FIFO would block the read forever, a device never
end it). Offset and length must be non-negative and lie inside the file, and the bytes read
are checked against the size limit (ir/limits.py) before reading. The model file itself must
be a non-empty regular file, and a graph without outputs is refused (nothing to compute).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import stat
import warnings
from collections.abc import Iterator
from pathlib import Path

import onnx
import onnx.parser
from google.protobuf import json_format, text_format
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper

from qfuse.compiler.errors import MalformedModelError, UnsupportedModelError
from qfuse.compiler.files import regular_file
from qfuse.compiler.onnx_import.context import DEFAULT_DOMAINS, OPENVINO_DOMAIN
from qfuse.ir.limits import check_bytes

logger = logging.getLogger(__name__)

# Converters read opsets from MIN_OPSET on; older models run as islands (down to
# OLDEST_OPSET). MAX_OPSET: the newest both the installed onnx and
# onnxruntime run (max_opset()).
OLDEST_OPSET, MIN_OPSET = 1, 11
# what onnx.load raises on bytes that are no model in the format the file's suffix names
# (.onnx binary protobuf, .json, .textproto / .prototxt, .onnxtxt)
NOT_A_MODEL = (DecodeError, json_format.Error, text_format.Error, onnx.parser.ParseError,
               RuntimeError, ValueError)


def load(model: onnx.ModelProto | str | os.PathLike) -> onnx.ModelProto:
    """A private copy of the model with all tensor data inline, checked."""
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        base: Path | None = None
    elif isinstance(model, (str, os.PathLike)):
        path = regular_file(model, "model")
        if path.stat().st_size == 0:
            raise MalformedModelError(f"'{path}' is empty, not an ONNX model")
        proto = read_proto(path, load_external_data=False)
        base = path.resolve().parent
    else:
        raise TypeError(f"import_model takes a ModelProto or a path, not {type(model).__name__}")
    if not proto.HasField("graph"):
        raise MalformedModelError("the model has no graph")
    if not proto.graph.output:
        raise MalformedModelError(f"graph '{proto.graph.name}' has no outputs: nothing to "
                                  f"compute")
    for tensor in _tensors(proto.graph):
        if tensor.data_location == TensorProto.EXTERNAL:
            _load_external(tensor, base)
    opset = default_opset(proto)
    _check(proto)
    logger.debug("loaded model '%s' (opset %d, %d nodes)", proto.graph.name, opset,
                 len(proto.graph.node))
    return proto


def read_proto(path: Path, load_external_data: bool = True) -> onnx.ModelProto:
    """onnx.load, with bytes that are no model in the suffix's format (the module's
    NOT_A_MODEL) refused in one line naming the file."""
    try:
        with warnings.catch_warnings():  # onnx warns that its .onnxtxt parser is experimental
            warnings.simplefilter("ignore", UserWarning)
            return onnx.load(str(path), load_external_data=load_external_data)
    except NOT_A_MODEL as exc:
        why = exc.args[0] if exc.args else exc
        why = why.decode(errors="replace") if isinstance(why, bytes) else str(why)
        first = " ".join(why.split())[:300]
        raise MalformedModelError(f"'{path}' is not an ONNX model: {first}") from exc


def default_opset(proto: onnx.ModelProto) -> int:
    """The default domain's opset, checked against the supported range."""
    versions = {o.domain: o.version for o in proto.opset_import}
    opset = next((versions[d] for d in DEFAULT_DOMAINS if d in versions), None)
    if opset is None:
        if not versions:
            raise MalformedModelError("the model imports no opset")
        # Only other domains (ai.onnx.ml, training, ...): every node is an island.
        logger.info("model imports no opset of the default ONNX domain; its nodes run as "
                    "islands")
        return OLDEST_OPSET
    if not OLDEST_OPSET <= opset <= max_opset():
        raise UnsupportedModelError(
            f"opset {opset} of the default ONNX domain is not supported "
            f"(supported: {OLDEST_OPSET} to {max_opset()}, the newest both onnx "
            f"{onnx.__version__} and the installed onnxruntime run); convert the model with "
            f"onnx.version_converter"
        )
    for domain in versions:
        if domain not in (*DEFAULT_DOMAINS, OPENVINO_DOMAIN):
            logger.debug("model imports domain '%s'; its nodes will be refused", domain)
    return opset


@functools.cache
def max_opset() -> int:
    """The newest default-domain opset that onnx knows and onnxruntime runs.

    onnx.defs.onnx_opset_version() bounds it from above; onnxruntime has no public query for
    its own bound, so a one-node Cast model (Cast changes with most recent opsets) is opened
    at decreasing opsets until a session can be created.
    """
    newest = onnx.defs.onnx_opset_version()
    try:
        import onnxruntime as ort
    except ImportError:
        return newest
    options = ort.SessionOptions()
    options.log_severity_level = 4  # a refused opset is expected here: no log line
    for opset in range(newest, MIN_OPSET, -1):
        graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT32)],
                                  "probe", [helper.make_tensor_value_info("x", 1, [1])],
                                  [helper.make_tensor_value_info("y", TensorProto.INT32, [1])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = min(model.ir_version, onnx.IR_VERSION)
        try:
            ort.InferenceSession(model.SerializeToString(), options,
                                 providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001, S112 (any refusal: try an older opset)
            continue
        return opset
    return MIN_OPSET


def _check(proto: onnx.ModelProto) -> None:
    try:
        onnx.checker.check_model(proto, full_check=False)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        where = re.search(r"Name: (\S*) OpType: (\S+)", str(exc))  # the checker's context line
        node = f"node '{where[1]}' ({where[2]}): " if where else ""
        raise MalformedModelError(f"onnx.checker rejects the model: {node}{first}") from exc
    except ValueError as exc:
        if "2GB" not in str(exc):
            raise MalformedModelError(f"onnx.checker rejects the model: {exc}") from exc
        logger.warning("model is larger than 2 GB; onnx.checker skipped")


def _offset_length(name: str, entries: dict[str, str]) -> tuple[int, int | None]:
    """The external data's offset (default 0) and length (None: to the end of the file)."""
    values: dict[str, int] = {}
    for key in ("offset", "length"):
        if key not in entries:
            continue
        try:
            values[key] = int(entries[key])
        except ValueError:
            raise MalformedModelError(f"tensor '{name}': external data {key} "
                                      f"'{entries[key]}' is not an integer") from None
        if values[key] < 0:
            raise MalformedModelError(f"tensor '{name}': external data {key} {values[key]} "
                                      f"is negative")
    return values.get("offset", 0), values.get("length")


def _tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    """Every tensor in the graph, subgraphs included."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor.values
                yield attr.sparse_tensor.indices
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)


def _load_external(tensor: TensorProto, base: Path | None) -> None:
    name = tensor.name or "<unnamed>"
    if base is None:
        raise MalformedModelError(
            f"tensor '{name}' keeps its data in an external file; import the model from its "
            f"path so the file can be found"
        )
    entries = {e.key: e.value for e in tensor.external_data}
    location = entries.get("location")
    if not location:
        raise MalformedModelError(f"tensor '{name}': external data without a location")
    if "\0" in location:
        raise MalformedModelError(f"tensor '{name}': external data location holds a NUL "
                                  f"character")
    try:
        target = (base / location).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop, a name too long
        raise MalformedModelError(f"tensor '{name}': external data location '{location}' "
                                  f"cannot be resolved: {exc}") from exc
    if Path(location).is_absolute() or not target.is_relative_to(base):
        raise MalformedModelError(
            f"tensor '{name}': external data location '{location}' is outside the model's "
            f"folder '{base}'"
        )
    offset, length = _offset_length(name, entries)
    try:
        info = target.stat()
    except OSError as exc:
        raise MalformedModelError(
            f"tensor '{name}': cannot read external data '{location}': "
            f"{exc.strerror or exc}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise MalformedModelError(f"tensor '{name}': external data '{location}' is not a "
                                  f"regular file")
    available = info.st_size - offset
    if available < 0 or (length is not None and length > available):
        want = "" if length is None else f"{length} bytes "
        raise MalformedModelError(
            f"tensor '{name}': external data '{location}' has {info.st_size} bytes; {want}at "
            f"offset {offset} lie outside it")
    length = available if length is None else length
    check_bytes(f"tensor '{name}' (external data '{location}')", length)
    try:
        with open(target, "rb") as f:
            f.seek(offset)
            data = f.read(length)
    except OSError as exc:
        raise MalformedModelError(
            f"tensor '{name}': cannot read external data '{location}': {exc.strerror or exc}"
        ) from exc
    if len(data) != length:
        raise MalformedModelError(
            f"tensor '{name}': external data '{location}' has {len(data)} bytes at offset "
            f"{offset}, want {length}"
        )
    tensor.raw_data = data
    del tensor.external_data[:]
    tensor.data_location = TensorProto.DEFAULT
