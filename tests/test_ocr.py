"""PaddleOCR end to end: a rendered line is read back by the original recognizer and by the one that
`infc optimize` writes; the optimized detector and classifier stay within 1e-4 on the same page."""

import numpy as np
import onnx
import pytest

from infc.compiler import ocr
from infc.compiler.errors import InfcError
from infc.compiler.model_io import load_model, save_model
from infc.compiler.optimize import optimize_model
from infc.compiler.verify import compare_outputs, ort_session

# Text the PP-OCRv4 recognizer reads exactly at these font sizes (letters, digits, spaces).
LINES = [("infc 2026 optimizer", 32), ("Hello World 42", 24)]
MAX_REL_DIFF = 1e-4


@pytest.fixture(scope="module")
def model_paths():
    try:
        return ocr.paddleocr_model_paths()
    except InfcError as exc:
        message = str(exc)
    # CI installs rapidocr, so a missing install fails loudly instead of skipping.
    pytest.fail(message, pytrace=False)


def _optimized_pair(path, tmp_path):
    """The original and what `infc optimize` writes, read back from disk as the CLI leaves it."""
    original = load_model(path)
    written = tmp_path / f"{path.stem}.infc.onnx"
    save_model(optimize_model(original).model, written)
    return original, onnx.load(str(written))


def _run(model, x):
    return ort_session(model).run(None, {model.graph.input[0].name: x})


def _assert_close(original, optimized, x):
    names = [o.name for o in original.graph.output]
    diffs = compare_outputs(names, _run(original, x), _run(optimized, x))
    worst = max(diffs, key=lambda d: d.max_rel_diff)
    assert worst.max_rel_diff <= MAX_REL_DIFF, (
        f"output '{worst.name}': max rel diff {worst.max_rel_diff:.3g} (abs {worst.max_abs_diff:.3g}) at {worst.worst_index}")


@pytest.mark.slow
def test_recognizer_reads_rendered_line_before_and_after_optimize(model_paths, tmp_path):
    original, optimized = _optimized_pair(model_paths["rec"], tmp_path)
    characters = ocr.character_list(original)
    assert len(characters) == 6625 and characters[0] == "blank" and characters[-1] == " "
    for text, font_size in LINES:
        x = ocr.rec_input(ocr.render_text_line(text, font_size))
        assert x.shape[:3] == (1, 3, 48) and x.shape[3] >= 320
        before = ocr.ctc_greedy_decode(_run(original, x)[0][0], characters)
        after = ocr.ctc_greedy_decode(_run(optimized, x)[0][0], characters)
        assert before == text
        assert after == before
        _assert_close(original, optimized, x)


@pytest.mark.slow
def test_classifier_matches_after_optimize(model_paths, tmp_path):
    original, optimized = _optimized_pair(model_paths["cls"], tmp_path)
    x = ocr.cls_input(ocr.render_text_line(LINES[0][0]))
    assert x.shape == (1, 3, 48, 192)
    # Upright text: class '0' (not rotated by 180 degrees) wins, before and after.
    assert int(np.argmax(_run(original, x)[0][0])) == 0 == int(np.argmax(_run(optimized, x)[0][0]))
    _assert_close(original, optimized, x)


@pytest.mark.slow
def test_detector_matches_after_optimize(model_paths, tmp_path):
    original, optimized = _optimized_pair(model_paths["det"], tmp_path)
    x = ocr.det_input(ocr.render_text_line(LINES[0][0]))
    assert x.shape == (1, 3, 640, 640)
    probability_map = _run(original, x)[0]
    # The text region lights up and the empty page does not: the input is realistic, not noise.
    assert probability_map[0, 0, :40, :250].max() > 0.5 > probability_map[0, 0, 200:, 200:].max()
    _assert_close(original, optimized, x)


def test_ctc_decode_collapses_repeats_and_drops_blanks():
    characters = ["blank", "a", "b", " "]
    steps = [1, 1, 0, 1, 2, 2, 0, 0, 3, 2]
    probs = np.eye(4, dtype=np.float32)[steps]
    assert ocr.ctc_greedy_decode(probs, characters) == "aab b"
