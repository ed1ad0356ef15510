"""The example / test model zoo: float ONNX models built in code, and their QDQ versions.

Nothing is downloaded: every model is written with `builder.GraphBuilder` from deterministic
random weights, and quantized with ONNX Runtime's `quantize_static` on generated calibration
inputs (see `quantize.py` for the exact recipe).

    from qfuse.examples import zoo
    m = zoo.float_model("resnet")                    # onnx.ModelProto, BatchNorm not folded
    q = zoo.quantized_model("mobilenetv2")           # QDQ: u8 activations, per-channel s8 weights
    p = zoo.model_path("resnet50", quantized=True)   # built once, then read from the cache
    feeds = zoo.sample_inputs(m, n=4, seed=1)        # list of {input name: float32 array}

Determinism: a model is a function of (name, architecture kwargs, seed); a quantized model also
of (per_channel, calib_samples, preprocess) and the onnxruntime version. Calibration uses
`sample_inputs(float_model, calib_samples, seed)`; evaluate on another seed for unseen inputs.

Cache: `model_path` stores models under $QFUSE_CACHE or ~/.cache/qfuse/zoo, one file per key
(a hash of everything above, `ZOO_VERSION` and the zoo's own source code); files are written
to a temporary name and renamed into place, so concurrent processes never read a partial file.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from .models import mobilenetv2, resnet, resnet50, vgg
from .models_branchy import inception, shufflenet, unet
from .models_transformer import transformer

log = logging.getLogger(__name__)

# Part of every cache key, with a digest of this package's source files (so editing a builder
# or the quantization recipe invalidates the cache by itself); bump to force rebuilds anyway.
ZOO_VERSION = "1"

ARCHITECTURES: dict[str, Callable[..., onnx.ModelProto]] = {
    "resnet": resnet,
    "mobilenetv2": mobilenetv2,
    "inception": inception,
    "unet": unet,
    "vgg": vgg,
    "shufflenet": shufflenet,
    "transformer": transformer,
    "resnet50": resnet50,
}
# The ones small enough to build, quantize and run in a unit test (well under a second each).
SMALL_ARCHITECTURES = tuple(n for n in ARCHITECTURES if n != "resnet50")
# Calibration samples when `calib_samples` is not given: resnet50 calibrates on few images
# because ONNX Runtime's MinMax calibrator keeps every intermediate tensor of every sample.
DEFAULT_CALIB_SAMPLES = 8
_CALIB_SAMPLES_OVERRIDE = {"resnet50": 4}

# torchvision's ImageNet normalisation, applied to generated [0, 1] "pixels".
_IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
_IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


def _arch(name: str) -> Callable[..., onnx.ModelProto]:
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ValueError(f"unknown zoo model {name!r}; known: {', '.join(ARCHITECTURES)}") from None


def _resolved_kwargs(name: str, kw: dict[str, Any]) -> dict[str, Any]:
    """All architecture kwargs with defaults filled in (so equal models get equal cache keys)."""
    bound = inspect.signature(_arch(name)).bind(**kw)
    bound.apply_defaults()
    return dict(bound.arguments)


def float_model(name: str, **kw: Any) -> onnx.ModelProto:
    """Build the float model `name` (see ARCHITECTURES); kwargs go to its builder."""
    return _arch(name)(**kw)


def quantized_model(
    name: str,
    *,
    per_channel: bool = True,
    calib_samples: int | None = None,
    seed: int = 0,
    preprocess: bool = True,
    quant_format: str = "qdq",
    **kw: Any,
) -> onnx.ModelProto:
    """Build `name` with weight seed `seed` and quantize it with quantize_static (QDQ, u8
    activations, s8 weights, MinMax) on `calib_samples` generated inputs (seed `seed`).

    `calib_samples=None` means DEFAULT_CALIB_SAMPLES (8), or 4 for resnet50.
    `quant_format="qoperator"` writes QuantFormat.QOperator (QLinearConv, QGemm, ...) instead.
    """
    from .quantize import QuantFormat, quantize  # onnxruntime.quantization is slow to import

    if quant_format not in ("qdq", "qoperator"):
        raise ValueError(f"quant_format {quant_format!r}: want 'qdq' or 'qoperator'")
    fm = float_model(name, seed=seed, **kw)
    calib = sample_inputs(fm, _calib_samples(name, calib_samples), seed)
    fmt = QuantFormat.QOperator if quant_format == "qoperator" else QuantFormat.QDQ
    return quantize(fm, calib, per_channel=per_channel, preprocess=preprocess, quant_format=fmt)


def _calib_samples(name: str, n: int | None) -> int:
    return n if n is not None else _CALIB_SAMPLES_OVERRIDE.get(name, DEFAULT_CALIB_SAMPLES)


def default_cache_dir() -> Path:
    env = os.environ.get("QFUSE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "qfuse" / "zoo"


@functools.cache
def _source_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(Path(__file__).parent.glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def _cache_key(name: str, quantized: bool, kw: dict[str, Any]) -> str:
    import onnxruntime

    q_keys = ("per_channel", "calib_samples", "preprocess", "quant_format")
    arch_kw = {k: v for k, v in kw.items() if k not in q_keys}
    q_kw = {k: v for k, v in kw.items() if k in q_keys}
    ident = {
        "zoo": ZOO_VERSION,
        "source": _source_digest(),
        "onnx": onnx.__version__,
        "name": name,
        "arch": _resolved_kwargs(name, arch_kw),
    }
    if quantized:
        ident["ort"] = onnxruntime.__version__
        ident["quant"] = {
            "per_channel": q_kw.get("per_channel", True),
            "calib_samples": _calib_samples(name, q_kw.get("calib_samples")),
            "preprocess": q_kw.get("preprocess", True),
        }
        if q_kw.get("quant_format", "qdq") != "qdq":  # QDQ keys stay as they were
            ident["quant"]["quant_format"] = q_kw["quant_format"]
    blob = json.dumps(ident, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def model_path(
    name: str, quantized: bool = False, cache_dir: str | Path | None = None, **kw: Any
) -> Path:
    """Path of the cached ONNX file for `name` (float or quantized), building it on first use.

    kwargs are those of `float_model` / `quantized_model`. The write is atomic (temporary file
    in the same directory, then os.replace), so parallel processes may both build but never
    see a half-written file; the builds are deterministic, so whichever rename wins is the same.
    """
    _arch(name)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = (
        cache / f"{name}-{kw.get('quant_format', 'qdq') if quantized else 'float'}-"
        f"{_cache_key(name, quantized, kw)}.onnx"
    )
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    log.info("zoo: building %s (%s) into %s", name, "quantized" if quantized else "float", path)
    model = quantized_model(name, **kw) if quantized else float_model(name, **kw)
    fd, tmp = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp", dir=cache)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(model.SerializeToString(deterministic=True))
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the cache may be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _static_shape(vi: onnx.ValueInfoProto) -> tuple[int, ...]:
    dims = vi.type.tensor_type.shape.dim
    return tuple(d.dim_value if d.HasField("dim_value") else 1 for d in dims)


def _image(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Image-like data: smooth blobs of colour plus texture in [0, 1], then normalised."""
    n, c, h, w = shape
    cells = (max(h // 8, 1) + 1, max(w // 8, 1) + 1)
    coarse = rng.random((n, c, *cells))
    # Bilinear upsampling of the coarse grid gives low-frequency structure like real photos.
    ys, xs = np.linspace(0, cells[0] - 1, h), np.linspace(0, cells[1] - 1, w)
    y0, x0 = np.minimum(ys.astype(int), cells[0] - 2), np.minimum(xs.astype(int), cells[1] - 2)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    g = coarse
    smooth = (
        g[..., y0, :][..., x0] * (1 - fy) * (1 - fx)
        + g[..., y0 + 1, :][..., x0] * fy * (1 - fx)
        + g[..., y0, :][..., x0 + 1] * (1 - fy) * fx
        + g[..., y0 + 1, :][..., x0 + 1] * fy * fx
    )
    lum = smooth.mean(axis=1, keepdims=True)
    pix = 0.6 * lum + 0.3 * smooth + 0.1 * rng.random(shape)
    # Stretch each image's contrast to the full [0, 1] range, as a camera's auto-exposure would.
    lo, hi = pix.min(axis=(1, 2, 3), keepdims=True), pix.max(axis=(1, 2, 3), keepdims=True)
    pix = (pix - lo) / np.maximum(hi - lo, 1e-6)
    if c == 3:
        mean, std = _IMAGENET_MEAN[:, None, None], _IMAGENET_STD[:, None, None]
    else:
        mean, std = np.float32(0.45), np.float32(0.225)
    return ((pix - mean) / std).astype(np.float32)


def sample_inputs(
    model: onnx.ModelProto | str | Path, n: int, seed: int = 0
) -> list[dict[str, np.ndarray]]:
    """`n` deterministic float32 feed dicts matching the model's inputs.

    4-D inputs with 3 channels get normalised image-like data (values within -2.12..2.64); other
    inputs get N(0, 1) rows like token embeddings after an embedding LayerNorm.
    """
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    graph_inputs = [vi for vi in model.graph.input if vi.name not in inits]
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n):
        feed = {}
        for vi in graph_inputs:
            shape = _static_shape(vi)
            if len(shape) == 4 and shape[1] == 3:
                feed[vi.name] = _image(rng, shape)
            else:
                feed[vi.name] = rng.standard_normal(shape).astype(np.float32)
        samples.append(feed)
    return samples


__all__ = [
    "ARCHITECTURES",
    "DEFAULT_CALIB_SAMPLES",
    "SMALL_ARCHITECTURES",
    "ZOO_VERSION",
    "default_cache_dir",
    "float_model",
    "model_path",
    "quantized_model",
    "sample_inputs",
]
