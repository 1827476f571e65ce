"""Bad input a user types at the documented CLI (README "Errors"): one `error:` line naming the file
or option, the documented exit code, no traceback, no output file. Cases found by the docsmatch sweep."""

import os
import signal
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

from infc.compiler.testing import make_model

F32 = np.float32


def infc(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "infc.cli", *map(str, args)], capture_output=True, text=True, cwd=cwd)


def assert_one_error(result, *fragments, code=2):
    assert result.returncode == code, (result.returncode, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def _embedding_model():
    """ids [batch, seq] -> rows of an 8-row table, then a MatMul (so the build tunes a GEMM)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"]), helper.make_node("MatMul", ["rows", "w"], ["y"])]
    return make_model(nodes, [("ids", np.int64, ["batch", "seq"])], [("y", F32, ["batch", "seq", 4])],
                      {"table": rng.standard_normal((8, 16)).astype(F32), "w": rng.standard_normal((16, 4)).astype(F32)})


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad_input")
    onnx.save(_embedding_model(), folder / "m.onnx")
    (folder / "p.yaml").write_text("dims:\n  batch: {min: 1, opt: 2, max: 4}\ninputs:\n  ids: [batch, 3]\n")
    result = infc("build", folder / "m.onnx", "--profile", folder / "p.yaml", "-o", folder / "m.plan", "--no-cache")
    assert result.returncode == 0, result.stderr
    return folder


def _unwritable(tmp_path):
    """A folder this process cannot create files in: root ignores permission bits, /proc refuses even root."""
    locked = tmp_path / "locked"
    locked.mkdir(exist_ok=True)
    locked.chmod(0o500)
    return locked if not os.access(locked, os.W_OK) else "/proc"


def test_an_npy_or_text_file_as_inputs_is_not_an_npz(plan):
    np.save(plan / "ids.npy", np.zeros((2, 3), np.int64))
    (plan / "text.npz").write_text("not an archive")
    for path in (plan / "ids.npy", plan / "text.npz"):
        assert_one_error(infc("run", plan / "m.plan", "--inputs", path), str(path), "not an .npz archive")
        assert_one_error(infc("optimize", plan / "m.onnx", "-o", plan / "q.onnx", "--precision", "int8", "--calib", path),
                         str(path), "not an .npz archive")
    assert not (plan / "q.onnx").exists()


def test_ids_outside_the_table_are_bad_input_naming_the_file(plan):
    np.savez(plan / "far.npz", ids=np.full((2, 3), 1000, np.int64))
    result = infc("run", plan / "m.plan", "--inputs", plan / "far.npz", "--outputs", plan / "out.npz")
    assert_one_error(result, str(plan / "far.npz"), "outside the table it indexes")
    assert not (plan / "out.npz").exists()


def test_an_unwritable_output_is_refused_before_any_work(plan, tmp_path):
    folder = _unwritable(tmp_path)
    try:
        cases = [("build", plan / "m.onnx", "-o", f"{folder}/x.plan", "--no-cache"),
                 ("build", plan / "m.onnx", "-o", tmp_path / "x.plan", "--cache-dir", f"{folder}/cache"),
                 ("run", plan / "m.plan", "--outputs", f"{folder}/out.npz"),
                 ("inspect", plan / "m.plan", "--html", f"{folder}/r.html")]
        for command in cases:
            written = next(a for a in command if str(a).startswith(str(folder)))
            assert_one_error(infc(*command), str(written), "cannot write")
        assert not (tmp_path / "x.plan").exists()
    finally:
        if folder != "/proc":
            folder.chmod(0o700)


def test_dim_names_a_dim_of_the_model_and_needs_verify(plan, tmp_path):
    out = tmp_path / "o.onnx"
    assert_one_error(infc("optimize", plan / "m.onnx", "-o", out, "--verify", "--dim", "btach=2"),
                     "--dim btach=2", "no input dim named 'btach'", "batch, seq")
    assert_one_error(infc("optimize", plan / "m.onnx", "-o", out, "--dim", "batch=2"), "--dim", "add --verify")
    np.savez(plan / "ids.npz", ids=np.zeros((2, 3), np.int64))
    assert_one_error(infc("optimize", plan / "m.onnx", "-o", out, "--inputs", plan / "ids.npz"), "--inputs", "add --verify")
    assert not out.exists()
    assert infc("optimize", plan / "m.onnx", "-o", out, "--verify", "--dim", "batch=2", "--dim", "seq=5").returncode == 0


def test_ctrl_c_during_a_build_leaves_nothing_and_says_so(plan, tmp_path):
    out = tmp_path / "x.plan"
    env = {**os.environ, "INFC_WHOLE_MODEL": "1"}  # a longer build: the interrupt lands inside it
    process = subprocess.Popen([sys.executable, "-m", "infc.cli", "build", plan / "m.onnx", "-o", out, "--no-cache"],
                               stderr=subprocess.PIPE, text=True, env=env,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    for line in process.stderr:  # the build has started once it reports the cache
        seen.append(line)
        if "engine cache disabled" in line:
            break
    process.send_signal(signal.SIGINT)
    _, rest = process.communicate(timeout=120)
    stderr = "".join(seen) + rest
    if process.returncode == 0:
        pytest.skip("the build finished before the interrupt")
    assert process.returncode == 130, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: interrupted; {out} not written"], stderr
    assert "Traceback" not in stderr
    assert list(tmp_path.iterdir()) == []


def test_an_output_that_names_an_input_file_is_refused_and_the_input_kept(plan, tmp_path):
    """`infc build m.onnx -o m.onnx` replaced the model with the plan, `run --outputs PLAN` the plan
    with the outputs: each silently, exit 0."""
    model = tmp_path / "m.onnx"
    model.write_bytes((plan / "m.onnx").read_bytes())
    plan_copy = tmp_path / "m.plan"
    plan_copy.write_bytes((plan / "m.plan").read_bytes())
    np.savez(tmp_path / "ids.npz", ids=np.zeros((2, 3), np.int64))
    cases = [(("build", model, "-o", model, "--no-cache"), "is the model itself"),
             (("optimize", model, "-o", tmp_path / "." / "m.onnx"), "is the model itself"),
             (("inspect", model, "--html", model), "is the model or plan itself"),
             (("run", plan_copy, "--outputs", plan_copy), "is the plan itself"),
             (("run", plan_copy, "--inputs", tmp_path / "ids.npz", "--outputs", tmp_path / "ids.npz"),
              "is the inputs file itself")]
    for command, fragment in cases:
        assert_one_error(infc(*command), fragment)
    assert model.read_bytes() == (plan / "m.onnx").read_bytes()
    assert plan_copy.read_bytes() == (plan / "m.plan").read_bytes()


def test_a_plan_edited_and_rehashed_names_the_plan_and_the_problem(plan, tmp_path):
    """The checksums vouch for the bytes; a header edited and re-hashed (a weight moved past its
    section, a step renamed) was an internal error or an error without the plan's name."""
    import copy

    from infc.compiler.plan.format import read_plan, write_plan

    original = read_plan(plan / "m.plan")
    sections = {name: bytes(view) for name, view in original.sections.items()}
    moved, renamed = copy.deepcopy(original.meta), copy.deepcopy(original.meta)
    next(iter(moved["weights"].values()))["offset"] = 1 << 30
    renamed["program"][0]["op"] = "NoSuchOp"
    for meta, fragment in ((moved, "corrupt plan (weight"), (renamed, "no runtime kernel for NoSuchOp")):
        write_plan(tmp_path / "edited.plan", meta, sections)
        assert_one_error(infc("run", tmp_path / "edited.plan"), str(tmp_path / "edited.plan"), fragment)


def test_a_header_field_of_the_wrong_type_or_a_dangling_name_is_refused_on_reading(plan, tmp_path):
    """Edited and re-hashed headers whose fields readers index blindly: each was an internal error
    (a KeyError in `inspect`, a TypeError comparing offsets, None handed to a kernel); now the plan
    and the field are named, exit 2, by `run` and `inspect` alike (found by mutating every field)."""
    import copy

    from infc.compiler.plan.format import read_plan, write_plan

    original = read_plan(plan / "m.plan")
    sections = {name: bytes(view) for name, view in original.sections.items()}
    first_weight = next(iter(original.meta["weights"]))

    def edit(change):
        meta = copy.deepcopy(original.meta)
        change(meta)
        return meta

    cases = [(lambda m: m["weights"][first_weight].update(offset="7"), f"weights.{first_weight}.offset"),
             (lambda m: m["weights"][first_weight].update(shape=[-1]), "expected an integer >= 0"),
             (lambda m: m["inputs"][0].update(dtype="int64x"), "inputs[0].dtype"),
             (lambda m: m["program"][0]["inputs"].__setitem__(0, None), "program[0].inputs[0]"),
             (lambda m: m["program"][-1]["inputs"].__setitem__(0, "nothing_gives_this"), "reads 'nothing_gives_this'"),
             (lambda m: m["outputs"][0].update(name="renamed"), "'renamed', which no step gives"),
             (lambda m: m["memory"].pop("arena_bytes"), "memory has no 'arena_bytes'"),
             (lambda m: m["profile"]["inputs"]["ids"].update(opt=None), "profile.inputs.ids.opt")]
    for change, fragment in cases:
        write_plan(tmp_path / "edited.plan", edit(change), sections)
        for command in ("run", "inspect"):
            assert_one_error(infc(command, tmp_path / "edited.plan"), str(tmp_path / "edited.plan"),
                             "inconsistent plan header", fragment)


def test_a_weight_shape_edited_within_its_section_names_the_weight(plan, tmp_path):
    """A weight's shape changed in a re-hashed header, its offset still inside the section: its
    bytes then cover less (or more) than the builder wrote for it, and a kernel failed on the
    wrong shape (exit 1, naming the step). The weights must tile their section as written."""
    import copy

    from infc.compiler.plan.format import read_plan, write_plan

    original = read_plan(plan / "m.plan")
    sections = {name: bytes(view) for name, view in original.sections.items()}
    largest = max(original.meta["weights"], key=lambda n: np.prod(original.meta["weights"][n]["shape"] or [1]))
    shape = original.meta["weights"][largest]["shape"]
    # a row fewer or more (at least 64 bytes here: within the builder's 64-byte padding no layout check can tell)
    for edited in ([], [shape[0] - 1, *shape[1:]], [shape[0] + 1, *shape[1:]], [shape[0] * 2, *shape[1:]]):
        meta = copy.deepcopy(original.meta)
        meta["weights"][largest]["shape"] = edited
        write_plan(tmp_path / "edited.plan", meta, sections)
        assert_one_error(infc("run", tmp_path / "edited.plan"), str(tmp_path / "edited.plan"), "corrupt plan (weight")


def test_an_error_quoting_a_multi_line_message_is_still_one_line(capsys):
    """onnxruntime's failures end their first line mid-sentence ('... Missing Input: x' then our hint
    on a second line): the error contract is one line."""
    from infc import cli

    with pytest.raises(SystemExit) as exited:
        cli._fail("island 'i' failed: Fail: [ONNXRuntimeError] Missing Input: attention_mask\n (on random inputs)", 1)
    assert exited.value.code == 1
    assert capsys.readouterr().err == "error: island 'i' failed: Fail: [ONNXRuntimeError] Missing Input: attention_mask (on random inputs)\n"


def test_lm_head_where_no_lm_head_is_quantized_is_refused(plan, tmp_path):
    """`--lm-head` was ignored without a word on a one-shot build and at fp32: a plan its user did not ask for."""
    model, profile = plan / "m.onnx", plan / "p.yaml"
    assert_one_error(infc("build", model, "--profile", profile, "-o", tmp_path / "a.plan", "--lm-head", "fp32", "--no-cache"),
                     "--lm-head applies to --precision int8 and w8 (this build is fp32)")
    assert_one_error(infc("build", model, "--profile", profile, "-o", tmp_path / "b.plan", "--lm-head", "int8",
                          "--precision", "w8", "--no-cache"), str(profile), "--lm-head applies to decoder plans")
    assert list(tmp_path.iterdir()) == []
