"""Merged decoders (Optimum's decoder_model_merged.onnx, what transformers.js repos ship): an If on
the bool input use_cache_branch between the with-past and the no-past decoder, weights shared at the
top. The plan takes the with-past branch (decoder/cache_branch.py) and matches onnxruntime's greedy
loop on the merged file; an If whose branches both read the past KV is refused with the reason."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from infc.compiler.decoder.cache_branch import take_cache_branches
from infc.compiler.errors import BadInput
from infc.compiler.feeds import random_feeds
from infc.compiler.optimize import optimize_model
from infc.compiler.plan.format import read_plan
from infc.compiler.plan_report import plan_report
from infc.compiler.runtime.model_runner import load_model_runner
from infc.compiler.testing import FIXTURES

from .conftest import assert_greedy_matches_ort, build_plan, prompts, runner_greedy
from .test_hf_decoders import _profile

WITH_PAST = FIXTURES / "hf" / "qwen2_optimum.onnx"


def _no_past(graph: onnx.GraphProto, past: list[onnx.ValueInfoProto]) -> list[onnx.NodeProto]:
    """The decoder's nodes reading an empty past (Constants of length 0) instead of its past inputs."""
    empty = {}
    nodes = []
    for info in past:
        dims = [d.dim_value or 1 for d in info.type.tensor_type.shape.dim]
        dims[2] = 0
        empty[info.name] = f"{info.name}/empty"
        nodes.append(helper.make_node("Constant", [], [empty[info.name]],
                                      value=helper.make_tensor(f"{info.name}/empty", TensorProto.FLOAT, dims, [])))
    for node in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[:] = [empty.get(name, name) for name in copy.input]
        nodes.append(copy)
    return nodes


def merged(with_past: onnx.ModelProto, both_read_past: bool = False) -> onnx.ModelProto:
    """As optimum.onnx.merge_decoders writes it: initializers at the top, If(use_cache_branch) with
    the with-past decoder as then_branch and the no-past one as else_branch."""
    graph = with_past.graph
    past = [i for i in graph.input if i.name.startswith("past_key_values")]
    outputs = list(graph.output)
    then_branch = helper.make_graph(list(graph.node), "with_past", [], outputs)
    else_nodes = list(graph.node) if both_read_past else _no_past(graph, past)
    else_branch = helper.make_graph(else_nodes, "no_past", [], outputs)
    condition = helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1])
    node = helper.make_node("If", ["use_cache_branch"], [o.name for o in outputs], name="optimum::if",
                            then_branch=then_branch, else_branch=else_branch)
    top = helper.make_graph([node], "merged", [*graph.input, condition], outputs, initializer=list(graph.initializer))
    model = helper.make_model(top, opset_imports=list(with_past.opset_import), ir_version=with_past.ir_version)
    model.metadata_props.extend(with_past.metadata_props)
    return model


@pytest.fixture(scope="module")
def merged_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("merged") / "decoder_model_merged.onnx"
    onnx.save(merged(onnx.load(WITH_PAST)), path)
    return path


def test_a_merged_decoder_is_paged_through_its_with_past_branch(merged_path, tmp_path):
    plan = build_plan(merged_path, _profile(tmp_path, 128), tmp_path)
    meta = read_plan(plan).meta
    assert meta["decoder"]["fixed_branches"] == [{"if": "optimum::if", "condition": "use_cache_branch", "branch": "then_branch"}]
    assert "use_cache_branch" not in [i["name"] for i in meta["inputs"]]
    assert plan_report(plan)["decoder"]["fixed_branches"][0]["branch"] == "then_branch"  # infc inspect
    runner = load_model_runner(plan)
    requests = prompts(4, runner.spec.vocab_size, seed=1)
    tokens, logits = runner_greedy(runner, requests, 32, budget=128)
    # onnxruntime runs the merged file itself: use_cache_branch False on the prompt, True after
    assert_greedy_matches_ort(merged_path, requests, tokens, logits, 32)


def test_the_profile_may_list_the_branch_condition(merged_path, tmp_path):
    profile = _profile(tmp_path, 128)
    profile.write_text(profile.read_text().replace("inputs:\n", "inputs:\n  use_cache_branch: [1]\n"))
    assert read_plan(build_plan(merged_path, profile, tmp_path)).meta["decoder"]["fixed_branches"]


def test_an_if_whose_branches_both_read_the_past_is_refused():
    model = merged(onnx.load(WITH_PAST), both_read_past=True)
    with pytest.raises(BadInput, match=r"If 'optimum::if' on 'use_cache_branch': both of its branches read the past KV"):
        take_cache_branches(model)


def test_names_the_branch_shares_with_the_graph_are_renamed():
    """The branch's outputs are named as the If's (as Optimum writes them): inlined, they are renamed
    and the If's outputs follow through Identity; the result checks as a valid ONNX graph."""
    model, fixed = take_cache_branches(merged(onnx.load(WITH_PAST)))
    assert [f.branch for f in fixed] == ["then_branch"]
    onnx.checker.check_model(model)
    assert "use_cache_branch" not in [i.name for i in model.graph.input]
    assert not any(n.op_type == "If" for n in model.graph.node)
    outputs = {o.name for o in model.graph.output}
    producers = [o for n in model.graph.node for o in n.output if o in outputs]
    assert sorted(producers) == sorted(outputs)  # each output made once
    assert np.all([n.op_type == "Identity" for n in model.graph.node if set(n.output) & outputs])


def test_optimize_infers_each_branch_of_a_merged_decoder_on_its_own(merged_path):
    # the branches define the same names with their own types and shapes; inferred per branch, the
    # with-past branch optimizes about as far as the decoder alone (273 nodes where names were shared
    # against 205 alone; the Reshape / broadcast walks of shape inference see only the main graph)
    original = onnx.load(merged_path)
    optimized = optimize_model(original).model
    alone = len(optimize_model(onnx.load(WITH_PAST)).model.graph.node)
    branches = {a.name: a.g for n in optimized.graph.node if n.op_type == "If" for a in n.attribute}
    assert len(branches["then_branch"].node) <= 1.05 * alone
    reference, session = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                           for m in (original, optimized))
    for use_cache in (True, False):
        # batch 1: the no-past branch here reads empty pasts of batch 1 (_no_past)
        feeds = {k: v[:1] for k, v in random_feeds(original, 1).items()}
        feeds["use_cache_branch"] = np.array([use_cache])
        for want, got in zip(reference.run(None, feeds), session.run(None, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
