"""PaddleOCR models end to end: render a text line, preprocess it as rapidocr does, CTC-decode.

Used by the OCR test and the optimizer benchmark to check optimized models on real inputs; the
models come from `pip install --no-deps rapidocr-onnxruntime==1.4.4`, Pillow from the `dev` extra.
rapidocr reads images with OpenCV (BGR); our lines are black on white, so channel order is moot.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import onnx

from .errors import InfcError

RAPIDOCR_INSTALL = "pip install --no-deps rapidocr-onnxruntime==1.4.4"
PADDLEOCR_MODELS = {
    "det": "ch_PP-OCRv4_det_infer.onnx",
    "rec": "ch_PP-OCRv4_rec_infer.onnx",
    "cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx",
}
# rapidocr's config.yaml: recognizer and classifier input shapes, detector mean/std.
REC_HEIGHT, REC_MIN_WIDTH = 48, 320
CLS_HEIGHT, CLS_WIDTH = 48, 192
DET_MEAN, DET_STD = 0.5, 0.5


def paddleocr_model_paths() -> dict[str, Path]:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise InfcError(f"rapidocr_onnxruntime is not installed; the PaddleOCR models come with it: {RAPIDOCR_INSTALL}")
    folder = Path(list(spec.submodule_search_locations)[0]) / "models"
    paths = {kind: folder / name for kind, name in PADDLEOCR_MODELS.items()}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise InfcError(f"PaddleOCR models missing ({', '.join(missing)}); reinstall with: {RAPIDOCR_INSTALL}")
    return paths


def character_list(model: onnx.ModelProto) -> list[str]:
    """As rapidocr's CTCLabelDecode builds it: CTC blank at 0, the model's characters, then a space."""
    metadata = {p.key: p.value for p in model.metadata_props}
    if "character" not in metadata:
        raise InfcError("the recognizer has no 'character' metadata entry")
    return ["blank"] + metadata["character"].splitlines() + [" "]


def render_text_line(text: str, font_size: int = 32) -> np.ndarray:
    """Black text on white with Pillow's built-in scalable font (Pillow >= 10.1): HxWx3 uint8."""
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:
        raise InfcError("Pillow is not installed: pip install 'infc[dev]'") from None
    font = ImageFont.load_default(size=font_size)
    left, top, right, bottom = font.getbbox(text)
    margin = font_size // 4
    image = Image.new("RGB", (right - left + 2 * margin, bottom - top + 2 * margin), "white")
    ImageDraw.Draw(image).text((margin - left, margin - top), text, fill="black", font=font)
    return np.asarray(image)


def resize_normalize(image: np.ndarray, height: int, width: int, may_widen: bool) -> np.ndarray:
    """rapidocr's resize_norm_img: keep the aspect ratio at `height`, squeeze into `width` (the recognizer
    widens its canvas to fit the line instead: `may_widen`), (x/255 - 0.5)/0.5, zero-pad right; 1x3xHxW."""
    from PIL import Image

    ratio = image.shape[1] / image.shape[0]
    if may_widen:
        width = max(width, int(height * ratio))
    resized_width = min(width, math.ceil(height * ratio))
    resized = np.asarray(Image.fromarray(image).resize((resized_width, height), Image.BILINEAR), dtype=np.float32)
    padded = np.zeros((3, height, width), dtype=np.float32)
    padded[:, :, :resized_width] = (resized.transpose(2, 0, 1) / 255 - 0.5) / 0.5
    return padded[np.newaxis]


def rec_input(image: np.ndarray) -> np.ndarray:
    return resize_normalize(image, REC_HEIGHT, REC_MIN_WIDTH, may_widen=True)


def cls_input(image: np.ndarray) -> np.ndarray:
    return resize_normalize(image, CLS_HEIGHT, CLS_WIDTH, may_widen=False)


def det_input(image: np.ndarray, size: int = 640) -> np.ndarray:
    """The line pasted at the top left of a white size x size page, normalized with the detector's mean/std."""
    page = np.full((size, size, 3), 255, dtype=np.uint8)
    height, width = min(size, image.shape[0]), min(size, image.shape[1])
    page[:height, :width] = image[:height, :width]
    return ((page.astype(np.float32) / 255 - DET_MEAN) / DET_STD).transpose(2, 0, 1)[np.newaxis].copy()


def ctc_greedy_decode(probs_TC: np.ndarray, characters: list[str]) -> str:
    """Best class per time step, repeats collapsed, blanks (index 0) dropped."""
    best = probs_TC.argmax(axis=-1)
    keep = np.ones(len(best), dtype=bool)
    keep[1:] = best[1:] != best[:-1]
    keep &= best != 0
    return "".join(characters[i] for i in best[keep])
