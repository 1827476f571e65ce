"""StringNormalizer runs natively: onnxruntime's needs a C++ locale (en_US.UTF-8 unless the node
names one) and will not load the model where it is missing, as scikit-learn's TfidfVectorizer
graphs find in most containers. The references below name C.UTF-8, which every glibc has."""

import numpy as np
import pytest
from onnx import TensorProto, helper

from infc.compiler.errors import BadInput

WORDS = np.array(["The", "cat", "THE", "Straße", "ÀÉ", "ǅ", "ok_9"], dtype=object)


@pytest.mark.parametrize("attrs", [
    {"case_change_action": "LOWER"},
    {"case_change_action": "UPPER"},  # 'ß' stays: onnxruntime maps one character at a time
    {"case_change_action": "NONE", "stopwords": ["the"], "is_case_sensitive": 1},
    {"case_change_action": "UPPER", "stopwords": ["the", "CAT"], "is_case_sensitive": 0},
    {"stopwords": ["àé"]},
])
@pytest.mark.parametrize("rank", [1, 2])
def test_string_normalizer_matches_onnxruntime(attrs, rank, single_node, ort_check):
    x = WORDS if rank == 1 else WORDS.reshape(1, -1)
    ort_check(single_node("StringNormalizer", {"x": x}, [("y", object)], {**attrs, "locale": "C.UTF-8"}), {"x": x})


def test_all_words_dropped_leave_one_empty_string(single_node, ort_check):
    for x in (np.array(["a", "A"], dtype=object), np.array([["a", "A"]], dtype=object)):
        model = single_node("StringNormalizer", {"x": x}, [("y", object)], {"stopwords": ["a"], "locale": "C.UTF-8"})
        y = ort_check(model, {"x": x})["y"]
        assert y.shape == (1,) * x.ndim and y.ravel()[0] == ""


def test_more_than_one_row_is_bad_input(single_node, native):
    x = np.array([["a"], ["b"]], dtype=object)
    with pytest.raises(BadInput, match=r"\[C\] or \[1, C\]"):
        native(single_node("StringNormalizer", {"x": x}, [("y", object)], {}), {"x": x})


def test_a_tfidf_front_end_without_a_locale_builds(tmp_path):
    # the node names no locale: onnxruntime would want en_US.UTF-8; the plan does not ask it
    from infc.compiler.build import BuildOptions, build
    from infc.compiler.runtime.session import PlanSession
    import onnx

    nodes = [helper.make_node("StringNormalizer", ["text"], ["norm"], case_change_action="LOWER"),
             helper.make_node("Tokenizer", ["norm"], ["tokens"], domain="com.microsoft", mark=0, mincharnum=1,
                              pad_value="#", tokenexp="[a-z]+")]
    graph = helper.make_graph(nodes, "tfidf_front", [helper.make_tensor_value_info("text", TensorProto.STRING, ["n"])],
                              [helper.make_tensor_value_info("tokens", TensorProto.STRING, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=8)
    onnx.save(model, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text("inputs: {text: {min: [1], opt: [2], max: [4]}}\n")
    build(str(tmp_path / "m.onnx"), str(tmp_path / "p.yaml"), str(tmp_path / "m.plan"),
          BuildOptions(use_cache=False, show_progress=False))
    tokens = PlanSession(tmp_path / "m.plan").run({"text": np.array(["Big Cat", "a DOG ran"])})["tokens"]
    assert tokens.tolist() == [["big", "cat", "#"], ["a", "dog", "ran"]]
