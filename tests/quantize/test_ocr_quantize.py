"""PaddleOCR PP-OCRv4 with reduced precision: INT8 calibrated on rendered text lines reads a held-out
line exactly as fp32 does; fp16 of the three models runs, and where it misses the 1e-2 budget the
repair step pins nodes until it holds."""

import numpy as np
import onnx
import pytest
from infc.compiler import ocr
from infc.compiler.errors import InfcError
from infc.compiler.optimize import optimize_model
from infc.compiler.quantize.int8 import quantize_int8
from infc.compiler.quantize.precision import convert_precision
from infc.compiler.quantize.repair import repair_precision
from infc.compiler.verify import compare_outputs, ort_session

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "infc", "model", "graph", "tensor", "quant", "calibrate", "Paris", "London", "2026", "42", "1337", "OCR", "text", "line", "Hello", "World", "optimizer", "runtime", "kernel"]
FONT_SIZES = (20, 24, 28, 32, 36, 40)
HELD_OUT = ("Hello World 42", 24)  # not among the calibration lines
TOLERANCE = 1e-2


def calibration_lines(count=36, seed=0):
    rng = np.random.default_rng(seed)
    return [(" ".join(rng.choice(WORDS, rng.integers(2, 5))), int(rng.choice(FONT_SIZES))) for _ in range(count)]


@pytest.fixture(scope="module")
def rec():
    try:
        return onnx.load(str(ocr.paddleocr_model_paths()["rec"]))
    except InfcError as exc:
        pytest.fail(str(exc), pytrace=False)  # CI installs rapidocr: fail loudly instead of skipping


def _read(model, text, font_size, characters):
    x = ocr.rec_input(ocr.render_text_line(text, font_size))
    return ocr.ctc_greedy_decode(ort_session(model, optimize=True).run(None, {"x": x})[0][0], characters)


@pytest.mark.slow
@pytest.mark.parametrize("is_optimized", [False, True])
def test_int8_recognizer_reads_the_held_out_line_like_fp32(rec, is_optimized):
    lines = calibration_lines()
    assert HELD_OUT not in lines
    source = optimize_model(rec).model if is_optimized else rec
    feeds = ({"x": ocr.rec_input(ocr.render_text_line(text, size))} for text, size in lines)
    quantized, report = quantize_int8(source, feeds, "minmax")
    assert report.num_samples == 36 and report.quantized["Conv"] == 38
    characters = ocr.character_list(rec)
    assert _read(rec, *HELD_OUT, characters) == HELD_OUT[0]
    assert _read(quantized, *HELD_OUT, characters) == HELD_OUT[0]


@pytest.mark.slow
def test_fp16_recognizer_reads_the_lines_and_repair_meets_the_budget(rec):
    feeds = [{"x": ocr.rec_input(ocr.render_text_line(*HELD_OUT))}]
    converted, _ = convert_precision(rec, "fp16")
    characters = ocr.character_list(rec)
    assert _read(converted, *HELD_OUT, characters) == HELD_OUT[0]
    repaired, report = repair_precision(rec, converted, TOLERANCE, feeds, max_conversions=12)
    assert report.is_within_tolerance and report.error_after <= TOLERANCE
    assert report.pinned or report.error_before <= TOLERANCE
    assert _read(repaired, *HELD_OUT, characters) == HELD_OUT[0]


@pytest.mark.slow
def test_fp16_classifier_within_budget():
    model = onnx.load(str(ocr.paddleocr_model_paths()["cls"]))
    converted, _ = convert_precision(model, "fp16")
    x = {"x": ocr.cls_input(ocr.render_text_line(*HELD_OUT))}
    names = [o.name for o in model.graph.output]
    diffs = compare_outputs(names, ort_session(model).run(names, x), ort_session(converted).run(names, x))
    assert max(d.max_rel_diff for d in diffs) <= TOLERANCE
