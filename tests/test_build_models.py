"""Every fixture and the three PaddleOCR models build into CPU plans that match onnxruntime on the
original model (fp32, 1e-4 relative), and the OCR line decodes identically from the plan."""

import json
from pathlib import Path

import onnx
import pytest

from infc.compiler import ocr
from infc.compiler.build import BuildOptions, build
from infc.compiler.runtime.feeds_io import random_plan_feeds
from infc.compiler.runtime.session import PlanSession
from infc.compiler.testing import FIXTURES
from infc.compiler.verify import compare_outputs, ort_session

PROFILES = Path(__file__).resolve().parent.parent / "profiles"
FIXTURE_PROFILES = {Path(m["name"]).stem: PROFILES / f"{m['model']}.yaml" for m in json.loads((FIXTURES / "fixtures.json").read_text())}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _build(model_path, profile, out, cache_dir):
    return build(str(model_path), str(profile), str(out), BuildOptions(cache_dir=cache_dir, show_progress=False))


def _assert_matches(session, model, feeds, rtol=1e-4):
    names = [o.name for o in model.graph.output]
    expected = ort_session(model).run(names, feeds)
    actual = session.run(session.check_feeds(feeds, "test"))
    for diff in compare_outputs(names, expected, [actual[n] for n in names]):
        assert diff.max_rel_diff <= rtol, diff


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FIXTURE_PROFILES))
def test_fixture_plan_matches_onnxruntime(name, tmp_path, cache_dir):
    report = _build(FIXTURES / f"{name}.onnx", FIXTURE_PROFILES[name], tmp_path / "p.bin", cache_dir)
    assert report["fallback_ops"] == []
    session = PlanSession(tmp_path / "p.bin")
    _assert_matches(session, onnx.load(FIXTURES / f"{name}.onnx"), random_plan_feeds(session, seed=3))


@pytest.mark.slow
def test_paddleocr_plans_match_and_decode_the_line(tmp_path, cache_dir):
    paths = ocr.paddleocr_model_paths()
    line = ocr.render_text_line("infc 2026 optimizer")
    inputs = {"rec": ocr.rec_input(line), "cls": ocr.cls_input(line), "det": ocr.det_input(line)}
    for kind, path in paths.items():
        report = _build(path, PROFILES / f"ppocr_{kind}.yaml", tmp_path / f"{kind}.bin", cache_dir)
        session = PlanSession(tmp_path / f"{kind}.bin")
        model = onnx.load(path)
        _assert_matches(session, model, {"x": inputs[kind]}, rtol=1e-4)
        if kind == "det":
            memory = report["memory"]
            assert memory["arena_bytes"] <= 0.5 * memory["sum_activation_bytes"]
        if kind == "rec":
            characters = ocr.character_list(model)
            (probs,) = session.run({"x": inputs["rec"]}).values()
            expected = ort_session(model).run(None, {"x": inputs["rec"]})[0]
            assert ocr.ctc_greedy_decode(probs[0], characters) == ocr.ctc_greedy_decode(expected[0], characters) == "infc 2026 optimizer"
