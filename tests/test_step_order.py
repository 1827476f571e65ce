"""The order the in-context check runs a program's variants in (compiler/step_order.py): kept steps
together where dependencies allow, every dependency respected, the program's own order otherwise."""

import numpy as np

from infc.compiler import tune_context
from infc.compiler.step_order import clustered_order


def _step(name, *inputs, op="Conv"):
    return {"op": op, "name": name, "inputs": list(inputs), "outputs": [name]}


def _interleaved_branches():
    """Two independent branches from x, interleaved as a toposort lists them: a0 b0 a1 b1 a2 b2, then
    their sum. The a-steps are the kept ones."""
    steps = []
    for k in range(3):
        steps += [_step(f"a{k}", f"a{k - 1}" if k else "x"), _step(f"b{k}", f"b{k - 1}" if k else "x", op="Relu")]
    return steps + [_step("y", "a2", "b2", op="Add")]


def test_independent_kept_steps_run_back_to_back():
    steps = _interleaved_branches()
    order = clustered_order(steps, lambda i: steps[i]["name"].startswith("a"))
    assert [steps[i]["name"] for i in order] == ["a0", "a1", "a2", "b0", "b1", "b2", "y"]


def test_one_kind_or_a_value_written_twice_keeps_the_programs_order():
    steps = _interleaved_branches()
    assert clustered_order(steps, lambda i: False) == list(range(len(steps)))
    steps[3]["outputs"] = ["a0"]  # not a program the order may touch
    assert clustered_order(steps, lambda i: i % 2 == 0) == list(range(len(steps)))


def test_every_order_respects_the_dependencies():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(2, 30))
        steps = [_step(f"v{i}", *[f"v{j}" for j in rng.choice(i, size=min(i, int(rng.integers(0, 3))), replace=False)])
                 for i in range(n)]
        kinds = rng.random(n) < 0.5
        order = clustered_order(steps, lambda i: kinds[i])
        assert sorted(order) == list(range(n))
        position = {index: p for p, index in enumerate(order)}
        for index, step in enumerate(steps):
            assert all(position[int(name[1:])] < position[index] for name in step["inputs"])


def test_marked_steps_of_interleaved_branches_make_one_session():
    steps = _interleaved_branches()
    keep = frozenset(i for i, s in enumerate(steps) if s["name"].startswith("a"))
    marked = tune_context._with_marks([{**s, "tactic": "onnxruntime"} if i in keep else s for i, s in enumerate(steps)], keep)
    assert [s["name"] for s in marked][:3] == ["a0", "a1", "a2"]
    assert len({s.get("tactic_group") for s in marked[:3]}) == 1 and "tactic_group" in marked[0]


def test_a_run_of_bridges_alone_loses_its_marks():
    """A run of kept steps with no timed step among them (bridges only: with_bridges' rule) runs on infc."""
    steps = [_step("a", "x"), _step("u", "a", op="Relu"), _step("b", "u", op="Relu"), _step("y", "b", op="Relu")]
    steps[0]["tactic"] = "onnxruntime"  # a is timed; b a bridge, apart from it behind u
    marked = tune_context._with_marks(steps, frozenset({0, 2}))
    assert [s["name"] for s in marked if s.get("tactic")] == ["a"]
