"""Convolution tactics on a real program: the steps onnxruntime wins run in onnxruntime sessions, the
plan still matches onnxruntime on the original model, and untimed steps keep infc's kernel."""

import numpy as np
import onnx
import pytest

from infc.compiler import tune_context, tune_vendor
from infc.compiler.autotune.cpu_conv import NATIVE, VENDOR
from infc.compiler.build import sample_run
from infc.compiler.graph import import_graph
from infc.compiler.lower import lower_graph
from infc.compiler.optimize import optimize_model
from infc.compiler.runtime.executor import Executor
from infc.compiler.runtime.kernels import has_kernel
from infc.compiler.runtime.vendor_op import TACTIC, is_conv_step
from infc.compiler.testing import FIXTURES, lowered_and_observed
from infc.compiler.tune_vendor import tune_vendor_tactics
from infc.compiler.verify import compare_outputs, ort_session

SHAPES = {"min": (1, 3, 32, 32), "opt": (4, 3, 32, 32), "max": (6, 3, 32, 32)}  # the fixture fixes H and W


def _program(name="cnn_ts.onnx"):
    model = onnx.load(str(FIXTURES / name))
    return (model, *lowered_and_observed(model, {
        level: {"pixel_values": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
        for level, shape in SHAPES.items()}))


def _run(program, feeds):
    names = [o["name"] for o in program.outputs]
    executor = Executor(program.steps, program.weights, program.opset, program.islands, output_names=names)
    return executor, [executor.run(feeds)[n] for n in names]


@pytest.fixture(autouse=True)
def time_every_convolution(monkeypatch):
    monkeypatch.setattr(tune_vendor, "MIN_MACS", 0)  # the fixture's convolutions are all small


@pytest.fixture(scope="module")
def cnn():
    return _program()


def test_small_convolutions_are_left_untimed(monkeypatch):
    monkeypatch.setattr(tune_vendor, "MIN_MACS", 1 << 40)
    _, program, seen = _program()
    rows, report = tune_vendor_tactics(program, seen, "test", budget_s=None, cache=None, show_progress=False,
                                     bench_fn=lambda run: [1e-3])
    assert rows == [] and report is None


def test_one_thread_winner_is_recorded():
    _, program, seen = _program()
    tune_vendor_tactics(program, seen, "test", budget_s=None, cache=None, show_progress=False,
                      bench_fn=lambda run: [1e-4 if run.config.param("threads") == 1 else 1e-3])
    convs = [s for s in program.steps if is_conv_step(s)]
    assert all(s["tactic"] == TACTIC and s["tactic_threads"] == 1 and s["tactic_ratio"] == 0.1 for s in convs)
    executor, _ = _run(program, {"pixel_values": np.zeros((1, 3, 32, 32), np.float32)})
    assert all(step.label.endswith("[onnxruntime, 1 thread]") for step in executor._steps
               if step.key[1] in ("Conv", "FusedConv"))


def test_context_check_drops_marks_that_do_not_pay(monkeypatch):
    _, program, seen = _program()
    tune_vendor_tactics(program, seen, "test", budget_s=None, cache=None, show_progress=False, bench_fn=lambda run: [1e-3])
    feeds = {"pixel_values": np.random.default_rng(3).standard_normal((4, 3, 32, 32)).astype(np.float32)}
    # a clock that makes every run of a marked program look slow: the marks must go
    state = {"t": 0.0, "calls": 0}

    def clock():
        state["calls"] += 1
        state["t"] += 1.0
        return state["t"]

    summary = tune_context.confirm_in_context(program, feeds, budget_s=0.0, clock=clock)
    assert summary["num_marked"] > 0 and summary["kept"] == "none" and summary["num_kept"] == 0
    assert not any(s.get("tactic") for s in program.steps)


def test_tactics_mark_steps_and_the_plan_still_matches_onnxruntime(cnn):
    model, program, seen = cnn
    rows, report = tune_vendor_tactics(program, seen, "test", budget_s=None, cache=None, show_progress=False,
                                     bench_fn=lambda run: [1e-3])  # all ties: the vendor wins them
    convs = [s for s in program.steps if is_conv_step(s)]
    assert convs and all(s.get("tactic") == TACTIC for s in convs)
    assert rows and all(r["winner"] == str(VENDOR) and r["shape"].startswith("Conv ") for r in rows)
    # every distinct input shape of every level was a tuning key, so each step has min/opt/max keys
    assert len(report.results) >= len({(s["inputs"][0]) for s in convs})
    feeds = {"pixel_values": np.random.default_rng(7).standard_normal((3, 3, 32, 32)).astype(np.float32)}
    executor, actual = _run(program, feeds)
    assert all("[onnxruntime]" in step.label for step in executor._steps if step.key[1] in ("Conv", "FusedConv"))
    expected = ort_session(model).run([o.name for o in model.graph.output], feeds)
    for diff in compare_outputs([o.name for o in model.graph.output], expected, actual):
        assert diff.max_rel_diff < 1e-5, diff


def test_a_spent_budget_leaves_steps_untimed_for_the_all_subset():
    _, program, seen = _program()
    rows, _ = tune_vendor_tactics(program, seen, "test", budget_s=0.0, cache=None, show_progress=False,
                                bench_fn=lambda run: [1e-3])
    assert rows and all(r["source"].startswith("untuned") for r in rows)
    convs = [s for s in program.steps if is_conv_step(s)]
    assert convs and all(s["tactic"] == TACTIC and s["tactic_ratio"] is None for s in convs)


def test_a_vendor_kernel_that_fails_leaves_the_step_to_infc():
    _, program, seen = _program()

    def bench(run):
        if run.config != NATIVE:
            raise RuntimeError("onnxruntime refused")
        return [1e-3]

    tune_vendor_tactics(program, seen, "test", budget_s=None, cache=None, show_progress=False, bench_fn=bench)
    assert not any(s.get("tactic") for s in program.steps)


def test_infc_winning_alone_leaves_the_step_to_the_context_check():
    _, program, seen = _program()

    def bench(run):
        return [1e-4 if run.config == NATIVE else 1e-3]

    rows, _ = tune_vendor_tactics(program, seen, "test", budget_s=None, cache=None, show_progress=False, bench_fn=bench)
    assert all(r["winner"] == str(NATIVE) for r in rows)
    # marked with its ratio (onnxruntime 10x slower alone): only the "all" subset holds it
    convs = [s for s in program.steps if is_conv_step(s)]
    assert convs and all(s["tactic_ratio"] == 10.0 for s in convs)
    assert tune_context._ratio(convs[0]) > tune_context.TIERS[-2]


def test_small_steps_are_marked_untimed_for_the_all_subset(monkeypatch):
    monkeypatch.setattr(tune_vendor, "MIN_MACS", 1 << 40)
    _, program, seen = _program()
    tune_vendor_tactics(program, seen, "test", budget_s=None, cache=None, show_progress=False, bench_fn=lambda run: [1e-3])
    convs = [s for s in program.steps if is_conv_step(s)]
    assert convs and all(s["tactic"] == TACTIC and s["tactic_ratio"] is None for s in convs)


def test_context_check_rejects_a_variant_whose_outputs_differ(monkeypatch):
    from infc.compiler.runtime import executor as executor_module

    _, program, seen = _program()
    tune_vendor_tactics(program, seen, "test", budget_s=None, cache=None, show_progress=False, bench_fn=lambda run: [1e-3])
    real = executor_module.group_runner

    def skewed(step, weights, decode, opset, spin, islands):  # a vendor session that computes something else
        assert not spin  # the variants take turns: none may spin
        run = real(step, weights, decode, opset, spin, islands)
        return lambda inputs, attrs, ctx: [y * np.float32(1.01) for y in run(inputs, attrs, ctx)]

    monkeypatch.setattr(executor_module, "group_runner", skewed)
    feeds = {"pixel_values": np.random.default_rng(4).standard_normal((4, 3, 32, 32)).astype(np.float32)}
    summary = tune_context.confirm_in_context(program, feeds, budget_s=0.0)
    assert summary["rejected_wrong"] and summary["kept"] == "none"
    assert not any(s.get("tactic") for s in program.steps)


def test_observer_executors_ignore_the_tactic():
    _, program, _ = _program()
    for step in program.steps:
        if is_conv_step(step):
            step["tactic"] = TACTIC
    executor = Executor(program.steps, program.weights, program.opset, program.islands,
                        observer=lambda name, array: None)
    labels = [s.label for s in executor._steps]
    assert not any("[onnxruntime]" in label for label in labels)


def _bert_program():
    """bert_ts with its GEMMs tuned (TunedMatMul steps), as the build leaves them before tactics."""
    from types import SimpleNamespace

    from infc.compiler.autotune.buckets import DEFAULT_M_BUCKETS
    from infc.compiler.autotune.config import Config
    from infc.compiler.tune_plan import _gemm_steps, _rewrite_step

    model = onnx.load(str(FIXTURES / "bert_ts.onnx"))
    program = lower_graph(import_graph(optimize_model(model).model), has_kernel)
    seen = {}
    for level, (batch, length) in {"min": (1, 4), "opt": (2, 16), "max": (3, 24)}.items():
        rng = np.random.default_rng(2)
        feeds = {"input_ids": rng.integers(0, 100, (batch, length)), "attention_mask": np.ones((batch, length), np.int64)}
        _, shapes = sample_run(program, feeds)
        seen[level] = {**{n: (v.shape, v.dtype.name) for n, v in feeds.items()}, **shapes}
    for index, step, *_ in list(_gemm_steps(program)):  # BLAS's plain recipe for every M, untimed
        result = SimpleNamespace(winner=Config("matmul"), status="test")
        _rewrite_step(program, index, step["inputs"][1], [(DEFAULT_M_BUCKETS[-1], result)])
    return model, program, seen


def test_gemm_steps_go_to_onnxruntime_and_the_plan_still_matches():
    model, program, seen = _bert_program()
    gemms = [s for s in program.steps if s["op"] == "TunedMatMul"]
    assert gemms
    rows, _ = tune_vendor_tactics(program, seen, "test", budget_s=None, cache=None, show_progress=False,
                                  bench_fn=lambda run: [1e-4 if run.config.param("threads") == 1 else 1e-3])
    assert all(s.get("tactic") == TACTIC and s.get("tactic_threads") == 1 for s in gemms)
    assert any(r["shape"].startswith("GEMM step M=") and r["winner"] == "onnxruntime(threads=1)" for r in rows)
    rng = np.random.default_rng(9)
    feeds = {"input_ids": rng.integers(0, 100, (2, 11)), "attention_mask": np.ones((2, 11), np.int64)}
    executor, actual = _run(program, feeds)
    assert sum("[onnxruntime, 1 thread]" in s.label for s in executor._steps) == len(gemms)
    expected = ort_session(model).run([o.name for o in model.graph.output], feeds)
    for diff in compare_outputs([o.name for o in model.graph.output], expected, actual):
        assert diff.max_rel_diff < 1e-5, diff


def test_no_fallback_builds_keep_every_step_on_infc(tmp_path):
    from infc.compiler.build import BuildOptions, build
    from infc.compiler.plan.format import read_plan

    options = BuildOptions(cache_dir=tmp_path / "cache", use_cache=False, show_progress=False, allow_fallback=False)
    build(str(FIXTURES / "cnn_ts.onnx"), str(FIXTURES.parent.parent / "profiles" / "cnn.yaml"), str(tmp_path / "p.plan"),
          options)
    meta = read_plan(str(tmp_path / "p.plan")).meta
    assert not any(step.get("tactic") for step in meta["program"])
    assert not any(row["shape"].startswith(("Conv ", "GEMM step")) for row in meta["tuning"])


def test_the_context_choice_is_replayed_from_the_timing_cache():
    """A rebuild keeps the variant the first build chose (TensorRT users know builds that differ from
    run to run); other feed shapes are another key."""
    from infc.compiler.autotune.timing_cache import TimingCache

    cache = TimingCache()
    feeds = {"pixel_values": np.random.default_rng(3).standard_normal((4, 3, 32, 32)).astype(np.float32)}
    kept = []
    for _ in range(2):
        _, program, seen = _program()
        tune_vendor_tactics(program, seen, "test", budget_s=None, cache=None, show_progress=False,
                            bench_fn=lambda run: [1e-3])
        summary = tune_context.confirm_in_context(program, feeds, shapes_by_level=seen, budget_s=0.0, cache=cache,
                                                 target="test")
        kept.append((summary["kept"], summary["cached"], summary["num_runs"] > 0,
                     [s.get("tactic_group") for s in program.steps]))
    assert not kept[0][1] and kept[0][2]  # measured
    assert kept[1] == (kept[0][0], True, False, kept[0][3])  # replayed: the same marks, nothing timed
    other = {"pixel_values": feeds["pixel_values"][:2]}
    _, program, _ = _program()
    assert str(tune_context.context_key(program, other, "test")) != str(tune_context.context_key(program, feeds, "test"))


def test_steps_onnxruntime_runs_keep_no_packed_copies_of_their_weights(tmp_path):
    # the tuned variants' packed weights serve infc's kernels only; a step run in onnxruntime reads the
    # weight itself, and falls back to a plain matmul on it when its session cannot load
    from infc.compiler.lower import Program
    from infc.compiler.tune_vendor import drop_packings_onnxruntime_replaces

    w = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)
    step = {"op": "TunedMatMul", "domain": "infc.cpu", "inputs": ["x", "w", "w@blocked", "w@shared"], "outputs": ["y"],
            "attrs": {"variants": [{"m_max": 4, "impl": "matmul", "params": {}, "packed": {"w": 1}, "source": "tuned"}]},
            "tactic": "onnxruntime"}
    other = {"op": "Relu", "domain": "", "inputs": ["w@shared"], "outputs": ["z"], "attrs": {}}
    program = Program([step, other], {"w": w, "w@blocked": w.ravel().copy(), "w@shared": w.copy()}, [],
                      [{"name": "y"}, {"name": "z"}], 17)
    assert drop_packings_onnxruntime_replaces(program) == 1
    assert step["inputs"] == ["x", "w"] and step["attrs"]["variants"] == []
    assert set(program.weights) == {"w", "w@shared"}  # another step still reads that one
    x = np.random.default_rng(1).standard_normal((3, 32)).astype(np.float32)
    plain = {**step}
    del plain["tactic"]  # infc's kernel, as when the session cannot load
    y = Executor([plain], program.weights, 17, output_names=["y"]).run({"x": x})["y"]
    np.testing.assert_allclose(y, x @ w, rtol=1e-5, atol=1e-5)


def _recurrent_model(op: str, skip_y: bool = False) -> onnx.ModelProto:
    """X [seq, batch, 6] -> bidirectional GRU (linear_before_reset, as torch exports it) or LSTM, hidden 5."""
    from onnx import TensorProto, helper

    gates, hidden = {"GRU": 3, "LSTM": 4}[op], 5
    rng = np.random.default_rng(0)
    weights = {"W": rng.standard_normal((2, gates * hidden, 6)), "R": rng.standard_normal((2, gates * hidden, hidden)),
               "B": rng.standard_normal((2, 2 * gates * hidden))}
    attrs = {"hidden_size": hidden, "direction": "bidirectional", **({"linear_before_reset": 1} if op == "GRU" else {})}
    outputs = ["" if skip_y else "Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, ["X", "W", "R", "B"], outputs, **attrs)
    graph = helper.make_graph([node], "rnn", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["seq", "batch", 6])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs if o],
                              [onnx.numpy_helper.from_array((w * 0.4).astype(np.float32), n) for n, w in weights.items()])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("op, skip_y", [("GRU", False), ("LSTM", False), ("LSTM", True)])
def test_recurrent_steps_are_offered_to_onnxruntime_and_match_it(op, skip_y):
    """infc's recurrent kernels loop over time in Python (a Conv1d + LSTM ran 26x slower than
    onnxruntime): the steps are marked for the in-context check, and run in a session they match."""
    model = _recurrent_model(op, skip_y)
    feeds = {level: {"X": np.random.default_rng(2).standard_normal((seq, batch, 6)).astype(np.float32)}
             for level, (seq, batch) in {"opt": (9, 2), "min": (1, 1), "max": (20, 4)}.items()}
    program, seen = lowered_and_observed(model, feeds)
    tune_vendor_tactics(program, seen, "test", budget_s=None, cache=None, show_progress=False, bench_fn=lambda run: [1e-3])
    (step,) = [s for s in program.steps if s["op"] == op]
    assert step["tactic"] == TACTIC and step["tactic_ratio"] is None
    executor, actual = _run(program, feeds["opt"])
    assert [s.label for s in executor._steps] == [f"{op} '' [onnxruntime]"]
    names = [o["name"] for o in program.outputs]
    for diff in compare_outputs(names, ort_session(model).run(names, feeds["opt"]), actual):
        assert diff.max_rel_diff < 1e-5, diff


def test_programs_on_a_coarse_grid_let_variants_differ_by_a_grid_step():
    """Quantized and fp16 / bf16 programs round values between ops: one float32 ulp before a rounding
    boundary moves a value a whole step, so tactic variants are checked at 1e-2, others at 1e-4."""
    add = {"op": "Add", "inputs": ["a", "b"], "outputs": ["c"]}
    cast = {"op": "Cast", "inputs": ["c"], "outputs": ["d"], "attrs": {"to": onnx.TensorProto.FLOAT}}
    assert tune_context.agreement_rtol([add, cast]) == tune_context.AGREE_RTOL
    for to in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):
        assert tune_context.agreement_rtol([add, dict(cast, attrs={"to": to})]) == tune_context.AGREE_RTOL_QUANTIZED
    quantize = {"op": "QuantizeLinear", "inputs": ["c", "s"], "outputs": ["q"]}
    assert tune_context.agreement_rtol([add, quantize]) == tune_context.AGREE_RTOL_QUANTIZED


def _skewed_sessions(monkeypatch, factor):
    from infc.compiler.runtime import executor as executor_module

    real = executor_module.group_runner

    def skewed(step, weights, decode, opset, spin, islands):
        run = real(step, weights, decode, opset, spin, islands)
        return lambda inputs, attrs, ctx: [y * np.float32(factor) for y in run(inputs, attrs, ctx)]
    monkeypatch.setattr(executor_module, "group_runner", skewed)


@pytest.mark.parametrize("noise, skew, accepted", [(0.0, 1.002, False), (1e-3, 1.002, True), (1e-3, 1.02, False)])
def test_context_tolerance_allows_for_the_programs_own_kernel_noise(monkeypatch, noise, skew, accepted):
    """Variants are checked against the unmarked program within NOISE_FACTOR times what its fused and
    unfused kernels differ by on the same feeds (up to 1e-2): an ill-conditioned output where infc's
    two correct evaluations are 1e-3 apart no longer refuses every onnxruntime variant, and a variant
    further off than that is still refused."""
    _, program, seen = _program()
    tune_vendor_tactics(program, seen, "test", budget_s=None, cache=None, show_progress=False, bench_fn=lambda run: [1e-3])
    _skewed_sessions(monkeypatch, skew)
    monkeypatch.setattr(tune_context, "_kernel_noise", lambda *args: noise)
    feeds = {"pixel_values": np.random.default_rng(4).standard_normal((4, 3, 32, 32)).astype(np.float32)}
    summary = tune_context.confirm_in_context(program, feeds, budget_s=0.0)
    assert summary["kernel_noise"] == noise
    assert summary["agreement_rtol"] == pytest.approx(max(1e-4, tune_context.NOISE_FACTOR * noise))
    assert bool(summary["rejected_wrong"]) is not accepted


def test_kernel_noise_of_a_well_conditioned_program_is_a_few_ulps(cnn):
    _, program, _ = cnn
    feeds = {"pixel_values": np.random.default_rng(5).standard_normal((4, 3, 32, 32)).astype(np.float32)}
    names = [o["name"] for o in program.outputs]
    reference = Executor(program.steps, program.weights, program.opset, program.islands, output_names=names).run(feeds)
    assert 0.0 <= tune_context._kernel_noise(program, feeds, reference, names) < 1e-5
