"""Whole models on the native runtime (no fallback) against onnxruntime: the optimized fixtures, whose
fused contrib ops are what the runtime mostly sees, and the PaddleOCR models on a rendered text line."""

import onnx
import pytest

from infc.compiler.feeds import random_feeds
from infc.compiler.optimize import optimize_model
from infc.compiler.testing import FIXTURES

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["cnn_ts", "cnn_dynamo", "bert_ts", "bert_dynamo", "gpt2_ts", "gpt2_dynamo",
                                  "llama_ts", "llama_dynamo"])
def test_optimized_fixtures_match_ort(name, ort_check):
    model = onnx.load(FIXTURES / f"{name}.onnx")
    optimized = optimize_model(model).model
    ort_check(optimized, random_feeds(model, 0, None))


@pytest.mark.parametrize("kind", ["det", "rec", "cls"])
def test_paddleocr_models_match_ort(kind, ort_check):
    ocr = pytest.importorskip("infc.compiler.ocr")
    pytest.importorskip("PIL")
    try:
        path = ocr.paddleocr_model_paths()[kind]
    except Exception as exc:  # noqa: BLE001 - the models come with an optional package
        pytest.skip(str(exc))
    line = ocr.render_text_line("Hello OCR 2024")
    image = {"det": lambda: ocr.det_input(line, 320), "rec": lambda: ocr.rec_input(line), "cls": lambda: ocr.cls_input(line)}
    model = onnx.load(path)
    optimized = optimize_model(model).model
    # onnxruntime's GlobalAveragePool sums large images in float32 order (about 5e-5 off the float64 mean
    # where ours is 1e-7 off), which the detector's output carries.
    ort_check(optimized, {model.graph.input[0].name: image[kind]()}, rtol=2e-4 if kind == "det" else None)
