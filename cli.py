"""The `infc` command line (GUIDE.md section 8). Exit codes: 0 ok, 1 internal, 2 bad input, 3 wrong target."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import click
from rich.console import Console

from . import __version__
from .compiler.atomic import check_writable
from .compiler.atomic import write_text_atomic as _write_text_atomic
from .compiler.errors import BadInput, InfcError

# compiler/quantize/weight_range.py (not imported here: the CLI starts without the quantize stack)
INT8_WEIGHTS = ["auto", "8bit", "7bit"]
INT8_WEIGHTS_HELP = ("int8: weight codes in [-127, 127] (8bit) or [-64, 64] (7bit: onnxruntime's u8 x s8 kernels "
                     "on x86 without VNNI saturate 8-bit ones); auto: 7bit where this CPU lacks VNNI.")

# compiler/decoder/lm_head.py LM_HEAD_CHOICES (spelled out here for the same reason)
LM_HEAD = ["auto", "fp32", "int8"]
LM_HEAD_HELP = ("Decoder plans, int8 / w8: the LM head (the GEMM making the logits) kept fp32 or quantized too; auto: "
                "fp32 for int8, for w8 as the sensitivity selection decides.")

stderr = Console(stderr=True, markup=False)
PIPED_WIDTH = 160  # columns of reports written to a file or a pipe (rich's 80 cut pass and kernel names)


def _report_console() -> Console:
    """Where reports print: stdout, as wide as the terminal, or PIPED_WIDTH when it is not one (a CI
    log, `| less`); COLUMNS, when set, wins as rich has it."""
    console = Console(markup=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(markup=False, width=PIPED_WIDTH)
    return console


def _fail(message: str, code: int) -> None:
    # one line, whatever the words quoted inside it: onnxruntime's messages carry newlines
    click.echo("error: " + " ".join(part.strip() for part in message.splitlines() if part.strip()), err=True)
    sys.exit(code)


def _reader_went_away() -> None:
    """stdout's reader closed the pipe (`infc run PLAN --prompt ... | head`): stop quietly, as a
    process killed by SIGPIPE would (exit 128 + 13), with stdout pointed at /dev/null so that the
    interpreter's last flush does not fail again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(141)


# Ctrl-C: 128 + SIGINT, as a shell reports a process the signal ended, so scripts tell it from a failure
INTERRUPTED = 130
OUTPUT_FLAGS = ("-o", "--output", "--outputs", "--html")  # the files a command writes


def _output_args(args: list[str]) -> list[str]:
    """The output paths given on the command line (the subcommand's context is gone by the time an
    interrupt reaches the group)."""
    found = []
    for flag, value in zip(args, args[1:]):
        if flag in OUTPUT_FLAGS:
            found.append(value)
    found += [a.split("=", 1)[1] for a in args if a.split("=", 1)[0] in OUTPUT_FLAGS and "=" in a]
    return found


class InfcGroup(click.Group):
    """Turns every failure into one `error:` line and the documented exit code; no tracebacks."""

    def invoke(self, ctx):
        # the subcommand's arguments, before click consumes them (`protected_args` before click 8.2)
        protected = ctx._protected_args if hasattr(ctx, "_protected_args") else ctx.protected_args
        raw_args = [*protected, *ctx.args]
        try:
            return super().invoke(ctx)
        except InfcError as exc:
            _fail(str(exc), exc.exit_code)
        except click.exceptions.Exit:
            raise
        except click.ClickException as exc:
            _fail(exc.format_message(), 2)
        except (KeyboardInterrupt, click.Abort):  # Ctrl-C: outputs are written by rename, so none is half-written
            written = _output_args(raw_args)
            _fail("interrupted" + (f"; {', '.join(written)} not written" if written else ""), INTERRUPTED)
        except BrokenPipeError:
            _reader_went_away()
        except MemoryError:
            _fail("out of memory", 1)
        except Exception as exc:  # noqa: BLE001 - the promise is one line, never a traceback
            if os.environ.get("INFC_DEBUG"):
                raise
            _fail(f"internal error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
                  "(set INFC_DEBUG=1 for a traceback)", 1)


@click.group(cls=InfcGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="infc")
def main():
    """infc: ONNX graph optimizer and autotuning compiler with its own runtime."""


def _parse_dims(values) -> dict[str, int]:
    dims = {}
    for item in values:
        name, _, number = item.partition("=")
        if not name or not number.isdigit():
            raise BadInput(f"--dim {item}: expected NAME=INT")
        dims[name] = int(number)
    return dims


def _verify_optimized(model_path: str, original, optimized, seed: int, feeds, dims) -> list:
    from .compiler.verify import verify_models

    try:
        return verify_models(original, optimized, seed=seed, feeds=feeds, dims=_parse_dims(dims))
    except InfcError as exc:
        raise type(exc)(f"{model_path}: {exc}") from None


def _check_dim_names(dims: dict[str, int], model, model_path: str) -> None:
    """--dim NAME=INT names a symbolic dim of the model's inputs: a typo would be ignored silently."""
    initializers = {t.name for t in model.graph.initializer}
    known = list(dict.fromkeys(d.dim_param for v in model.graph.input if v.name not in initializers
                               for d in v.type.tensor_type.shape.dim if d.dim_param))
    unknown = [name for name in dims if name not in known]
    if unknown:
        raise BadInput(f"--dim {unknown[0]}={dims[unknown[0]]}: {model_path} has no input dim named '{unknown[0]}' "
                       f"(its symbolic dims: {', '.join(known) or 'none'})")


def _refuse_overwriting(output: str | None, flag: str, **inputs: str | None) -> None:
    """An output path that names one of the command's own input files (`infc build m.onnx -o m.onnx`)
    would replace it, silently: the model, plan or inputs would be gone."""
    if not output or not Path(output).exists():
        return
    for what, path in inputs.items():
        if path and Path(path).exists() and os.path.samefile(output, path):
            raise BadInput(f"{flag} {output}: is the {what.replace('_', ' ')} itself; write the output elsewhere")


def _check_writable_output(path: str) -> None:
    folder = Path(path).parent if str(Path(path).parent) else Path(".")
    if not folder.is_dir():
        raise BadInput(f"{path}: output folder '{folder}' does not exist")
    if not os.access(folder, os.W_OK):
        raise BadInput(f"{path}: output folder '{folder}' is not writable")
    if Path(path).is_dir():
        raise BadInput(f"{path}: is a directory")
    check_writable(path)


def _load_feeds(inputs_path: str) -> dict:
    from .compiler.runtime.feeds_io import load_feeds

    return load_feeds(inputs_path)


def _model_feeds(model_path: str, inputs_path: str) -> dict:
    """--inputs for a model: every graph input by name, of its dtype and static dims."""
    from .compiler.graph import import_graph
    from .compiler.lower import value_info
    from .compiler.model_io import load_model
    from .compiler.runtime.feeds_io import check_feeds

    inputs = [value_info(t) for t in import_graph(load_model(model_path)).inputs]
    return check_feeds(inputs, _load_feeds(inputs_path), inputs_path, "the model")


def _run_optimize(model_path: str, quiet: bool):
    from .compiler.model_io import load_model
    from .compiler.optimize import optimize_model
    from .compiler.passes.pipeline import PORTABLE_PIPELINE

    model = load_model(model_path)
    if quiet:
        return model, optimize_model(model, PORTABLE_PIPELINE)
    with stderr.status("optimizing") as status:
        result = optimize_model(model, PORTABLE_PIPELINE,
                                progress=lambda phase, name: status.update(f"optimizing: {phase} / {name}"))
    return model, result


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Where to write the optimized ONNX model.")
@click.option("--verify", is_flag=True, help="Run original and result in onnxruntime on seeded random inputs and compare.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable report on stdout.")
@click.option("--seed", default=0, show_default=True, help="Seed for --verify inputs.")
@click.option("--dim", "dims", multiple=True, metavar="NAME=INT", help="Value of a symbolic dim for --verify inputs.")
@click.option("--inputs", "inputs_path", type=click.Path(dir_okay=False),
              help="--verify on these inputs (.npz keyed by input name) instead of random ones.")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "bf16", "int8"]), default="fp32", show_default=True,
              help="Also convert to this precision (fp16/bf16 keep lossy ops in fp32; int8 writes QDQ).")
@click.option("--tolerance", type=float, help="fp16/bf16: max relative error; nodes that break it are pinned to fp32.")
@click.option("--calib", type=click.Path(), help="int8: calibration inputs, an .npz or a folder of them.")
@click.option("--calib-method", type=click.Choice(["minmax", "percentile", "entropy"]), default="minmax", show_default=True)
@click.option("--int8-weights", type=click.Choice(INT8_WEIGHTS), default="auto", show_default=True, help=INT8_WEIGHTS_HELP)
def optimize(model, output, verify, as_json, seed, dims, inputs_path, precision, tolerance, calib, calib_method, int8_weights):
    """Optimize MODEL and write the result as ONNX that onnxruntime runs."""
    from .compiler.model_io import save_model
    from .compiler.report import print_report, report_json

    _check_writable_output(output)
    _refuse_overwriting(output, "-o", model=model, inputs_file=inputs_path)
    if inputs_path and not verify:  # nothing else reads them: a run without the check its user asked for
        raise BadInput(f"--inputs {inputs_path}: the inputs --verify runs both models on; add --verify")
    if dims and not verify and precision == "fp32":
        raise BadInput("--dim sets dims of the inputs that --verify (or --precision's repair and calibration) "
                       "makes up; add --verify")
    feeds = _model_feeds(model, inputs_path) if inputs_path else None
    original, result = _run_optimize(model, quiet=as_json)
    _check_dim_names(_parse_dims(dims), original, model)
    report = report_json(result)
    if precision != "fp32":
        from .compiler.quantize import apply_precision

        # calibration and the repair's trials take minutes on large models: say so on a terminal
        # (rich draws nothing when stderr is a pipe; --json keeps stderr quiet)
        doing = "calibrating and quantizing to int8" if precision == "int8" else f"converting to {precision}"
        with contextlib.nullcontext() if as_json else stderr.status(doing):
            result.model, report["quantize"] = apply_precision(result.model, precision, tolerance=tolerance, calib=calib,
                                                               method=calib_method, seed=seed,
                                                               dims=_parse_dims(dims) or None, int8_weights=int8_weights)
    if verify:
        with contextlib.nullcontext() if as_json else stderr.status("verifying against onnxruntime"):
            diffs = _verify_optimized(model, original, result.model, seed, feeds, dims)
        report["outputs"] = [d.to_json() for d in diffs]
        report["max_abs_diff"] = max((d.max_abs_diff for d in diffs), default=0.0)
        report["max_rel_diff"] = max((d.max_rel_diff for d in diffs), default=0.0)
        from .compiler.verify_selection import selection_note

        if note := selection_note(original.graph, diffs):
            report["verify_note"] = note
    save_model(result.model, output)
    report["output"] = str(output)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    print_report(report, _report_console())
    if verify:
        click.echo(f"verify: max abs diff {report['max_abs_diff']:.3g}, max rel diff {report['max_rel_diff']:.3g} "
                   f"over {len(report['outputs'])} outputs")
        if report.get("verify_note"):
            click.echo(f"verify note: {report['verify_note']}")
    click.echo(f"wrote {output}: {report['nodes_before']} -> {report['nodes_after']} nodes")


@main.command()
@click.argument("target", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), help="Also write a self-contained HTML page.")
def inspect(target, as_json, html_path):
    """Explain a model: which fusions fired, why others did not, ops before and after."""
    from .compiler.report import print_report, report_html, report_json

    if html_path:
        _check_writable_output(html_path)
        _refuse_overwriting(html_path, "--html", model_or_plan=target)
    if _is_plan(target):
        from .compiler.plan_report import plan_report, print_plan_report

        report = plan_report(target)
        if html_path:
            _write_text_atomic(html_path, "<!DOCTYPE html><html><head><meta charset='utf-8'><title>infc plan</title></head>"
                               f"<body><pre>{__import__('html').escape(json.dumps(report, indent=2))}</pre></body></html>")
        if as_json:
            click.echo(json.dumps(report, indent=2))
        else:
            print_plan_report(report, _report_console())
        return
    _, result = _run_optimize(target, quiet=as_json)
    report = report_json(result)
    report["model"] = str(target)
    if html_path:
        _write_text_atomic(html_path, report_html(report, f"infc inspect: {Path(target).name}"))
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        print_report(report, _report_console())


def _is_plan(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(8) == b"INFCPLAN"
    except OSError:
        return False


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False), help="Shape profile (YAML); default: the model's static shapes.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Where to write the plan.")
@click.option("--target", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--precision", type=click.Choice(["fp32", "fp16", "bf16", "int8", "w8"]), default="fp32", show_default=True,
              help="fp16/bf16: fp32 islands + self-repair; int8: QDQ (needs --calib; decoder plans: int8 weights, activations "
                   "quantized per token); w8: int8 weights (decoder plans).")
@click.option("--tolerance", type=float, help="fp16/bf16: output error budget of the self-repair (default 1e-2).")
@click.option("--calib", type=click.Path(), help="Calibration / verification inputs: an .npz or a folder of them.")
@click.option("--calib-method", type=click.Choice(["minmax", "percentile", "entropy"]), default="minmax", show_default=True)
@click.option("--int8-weights", type=click.Choice(INT8_WEIGHTS), default="auto", show_default=True, help=INT8_WEIGHTS_HELP)
@click.option("--lm-head", type=click.Choice(LM_HEAD), default="auto", show_default=True, help=LM_HEAD_HELP)
@click.option("--cache-dir", type=click.Path(file_okay=False), help="Engine and timing cache folder (default: ./cache or $INFC_CACHE_DIR).")
@click.option("--no-cache", is_flag=True, help="Neither read nor write the engine cache.")
@click.option("--no-fallback", is_flag=True, help="Fail when an op has no native kernel instead of running it in onnxruntime.")
@click.option("--verify", is_flag=True, help="Compare the plan's outputs with onnxruntime on the original model.")
@click.option("--inputs", "inputs_path", type=click.Path(dir_okay=False),
              help="Representative inputs (.npz by input name) for the build's sample runs and --verify, for models "
                   "whose control flow depends on input values; without --profile, their shapes are the profile.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable build report on stdout.")
def build(model, profile_path, output, target, precision, tolerance, calib, calib_method, int8_weights, lm_head, cache_dir, no_cache,
          no_fallback, verify, inputs_path, as_json):
    """Build MODEL into a plan bound to this machine."""
    from .compiler.build import BuildOptions, build as run_build
    from .compiler.build_precision import PrecisionSettings
    from .compiler.engine_cache import default_cache_dir
    from .compiler.plan_report import print_build_report

    _refuse_overwriting(output, "-o", model=model, profile=profile_path, inputs_file=inputs_path,
                        calibration_file=calib if calib and Path(calib).is_file() else None)
    options = BuildOptions(target=target, precision=precision, allow_fallback=not no_fallback, verify=verify,
                           precision_settings=PrecisionSettings(tolerance, calib, calib_method, int8_weights, lm_head),
                           use_cache=not no_cache, cache_dir=Path(cache_dir) if cache_dir else default_cache_dir(),
                           show_progress=not as_json, sample_feeds=_load_feeds(inputs_path) if inputs_path else None,
                           sample_feeds_source=str(inputs_path))
    log = (lambda msg: None) if as_json else (lambda msg: stderr.print(msg, highlight=False))
    report = run_build(model, profile_path, output, options, log)
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
    else:
        print_build_report(report, _report_console())


@main.command()
@click.argument("plan", type=click.Path(dir_okay=False))
@click.option("--inputs", "inputs_path", type=click.Path(dir_okay=False), help=".npz keyed by input name (default: random).")
@click.option("--outputs", "outputs_path", type=click.Path(dir_okay=False),
              help="Write outputs to this .npz (a decoder plan: one JSON line per request).")
@click.option("--iterations", default=10, show_default=True, type=click.IntRange(min=1))
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(min=0),
              help="Untimed runs before the timed ones (one-shot plans).")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0),  # NumPy's seeds are >= 0
              help="Seed of random inputs, or of sampling (decoder plans).")
@click.option("--json", "as_json", is_flag=True, help="Print latency statistics as JSON.")
@click.option("--op-profile", is_flag=True,
              help="Time each step: one-shot plans in as many more runs after the timed ones, decoder plans over "
                   "the whole serving run; print the slowest steps and the time per op type (with --json: every "
                   "step, under op_profile).")
@click.option("--prompt", help="Decoder plans: generate from this text (through the model's chat template).")
@click.option("--max-tokens", type=click.IntRange(min=1),
              help="Decoder plans: most tokens to generate per request (default 128).")
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="Decoder plans: 0 is greedy.")
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(min=0, max=1, min_open=True),
              help="Decoder plans: sample from the smallest set of tokens whose probability reaches this.")
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(min=-1),
              help="Decoder plans: sample from this many most likely tokens (0 or -1: all).")
@click.option("--workload", type=click.Path(dir_okay=False), help="Decoder plans: a JSONL trace of requests (-: standard input).")
@click.option("--num-requests", type=click.IntRange(min=1), help="Decoder plans: this many synthetic requests.")
@click.option("--input-len", default="128", show_default=True, help="Synthetic prompt length: N or LOW:HIGH.")
@click.option("--output-len", default="128", show_default=True, help="Synthetic output length: N or LOW:HIGH.")
@click.option("--rate", default=float("inf"), show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Synthetic Poisson arrivals per second.")
@click.option("--batching", type=click.Choice(["continuous", "static"]), default="continuous", show_default=True)
@click.option("--max-num-seqs", type=click.IntRange(min=1), help="Decoder plans: most sequences per step (default: the plan's).")
@click.option("--itl-factor", type=click.FloatRange(min=1, min_open=True),
              help="Decoder plans: keep a step with decodes within this factor of a decode-only step by capping "
                   "its prefill tokens (protects inter-token latency while long prompts are prefilled; default: no cap).")
def run(plan, inputs_path, outputs_path, iterations, warmup, seed, as_json, op_profile, **decode_options):
    """Run a plan: on given inputs or random ones, timing N iterations; a decoder plan serves requests."""
    import numpy as np

    if outputs_path:
        _check_writable_output(outputs_path)
        _refuse_overwriting(outputs_path, "--outputs", plan=plan, inputs_file=inputs_path,
                            workload=decode_options.get("workload"))
    kind = _plan_kind(plan)
    _check_run_options(plan, kind, _given_options())
    if kind == "decoder":
        return _run_decoder(plan, outputs_path, seed, as_json, op_profile, **decode_options)

    from .compiler.runtime.feeds_io import load_feeds, random_plan_feeds, save_outputs
    from .compiler.runtime.index_contract import indexes_out_of_range
    from .compiler.runtime.session import PlanSession

    session = PlanSession(plan)
    feeds = load_feeds(inputs_path) if inputs_path else random_plan_feeds(session, seed)
    feeds = session.check_feeds(feeds, inputs_path or "random inputs")
    try:
        outputs = session.run(feeds)
    except BadInput as exc:
        raise BadInput(f"{inputs_path}: {exc}" if inputs_path else str(exc)) from exc
    except InfcError as exc:
        if inputs_path and indexes_out_of_range(exc):  # the build's inputs indexed inside the tables; these do not
            raise BadInput(f"{inputs_path}: an index in the inputs is outside the table it indexes: {exc}") from exc
        if inputs_path:
            raise
        raise InfcError(f"{exc} (on random inputs: a model whose control flow or indexes depend on input values "
                        "needs real ones, --inputs FEEDS.npz)") from exc
    times = session.benchmark(feeds, iterations, warmup)
    if outputs_path:
        save_outputs(outputs_path, outputs)
    stats = {"plan": str(plan), "iterations": iterations, "warmup": warmup,
             "latency_ms": {"p50": float(np.percentile(times, 50)), "p90": float(np.percentile(times, 90)),
                            "p99": float(np.percentile(times, 99)), "mean": float(np.mean(times)),
                            "min": float(np.min(times)), "max": float(np.max(times)), "std": float(np.std(times)),
                            "iterations": iterations},
             "throughput_per_s": 1e3 * len(times) / float(np.sum(times)),  # runs a second, one after another
             "outputs": {name: {"shape": list(a.shape), "dtype": a.dtype.name} for name, a in outputs.items()}}
    if op_profile:
        from .compiler.runtime.step_profile import profile_report, timing_steps

        with timing_steps(session.executor) as step_times:  # apart from the latency runs: timing costs a little
            for _ in range(iterations):
                session.run(feeds)
                step_times.runs += 1
        stats["op_profile"] = profile_report(session.executor, step_times, times)
    if as_json:
        click.echo(json.dumps(stats, indent=2))
        return
    lat = stats["latency_ms"]
    for name, info in stats["outputs"].items():
        click.echo(f"output {name}: {info['dtype']} {info['shape']}")
    click.echo(f"latency over {iterations} runs: p50 {lat['p50']:.3f} ms, p90 {lat['p90']:.3f} ms, p99 {lat['p99']:.3f} ms "
               f"(min {lat['min']:.3f}, max {lat['max']:.3f}); throughput {stats['throughput_per_s']:.1f} runs/s")
    if op_profile:
        from .compiler.runtime.step_profile import format_profile

        for line in format_profile(stats["op_profile"]):
            click.echo(line)


# Options of `infc run` that one kind of plan, or one source of requests, uses: given anywhere else
# they would be silently ignored (a benchmark without the arrivals its user asked for), so they
# are refused.
ONE_SHOT_OPTIONS = ("inputs_path", "iterations", "warmup")
DECODER_OPTIONS = ("prompt", "max_tokens", "temperature", "top_p", "top_k", "workload", "num_requests", "input_len", "output_len", "rate",
                   "batching", "max_num_seqs", "itl_factor")
REQUEST_SOURCES = ("prompt", "workload", "num_requests")
SOURCE_OPTIONS = {"max_tokens": ("prompt", "workload"), "input_len": ("num_requests",),
                  "output_len": ("num_requests",), "rate": ("num_requests",)}
SOURCE_OPTION_HINTS = {("max_tokens", "num_requests"): " (synthetic output lengths come from --output-len)",
                       ("rate", "workload"): " (a trace gives each request's arrival_s)"}


def _given_options() -> dict[str, str]:
    """The options given on the command line: parameter name -> flag."""
    ctx = click.get_current_context()
    flags = {p.name: p.opts[0] for p in ctx.command.params}
    return {name: flags[name] for name in ctx.params
            if ctx.get_parameter_source(name) not in (click.core.ParameterSource.DEFAULT,
                                                      click.core.ParameterSource.DEFAULT_MAP)}


def _check_run_options(plan: str, kind: str | None, given: dict[str, str]) -> None:
    if kind != "decoder":
        misplaced = [flag for name, flag in given.items() if name in DECODER_OPTIONS]
        if misplaced:
            raise BadInput(f"{plan}: {misplaced[0]} needs a decoder plan (this one is kind '{kind}')")
        return
    misplaced = [flag for name, flag in given.items() if name in ONE_SHOT_OPTIONS]
    if misplaced:
        raise BadInput(f"{plan}: {misplaced[0]} is for one-shot plans; a decoder plan serves requests "
                       "(--prompt, --workload or --num-requests)")
    sources = [name for name in REQUEST_SOURCES if name in given]
    if len(sources) != 1:
        raise BadInput("a decoder plan takes exactly one of --prompt, --workload and --num-requests"
                       + (f" (got {', '.join(given[name] for name in sources)})" if sources else ""))
    for name, flag in given.items():
        if sources[0] not in SOURCE_OPTIONS.get(name, sources):
            allowed = " and ".join(f"--{n.replace('_', '-')}" for n in SOURCE_OPTIONS[name])
            raise BadInput(f"{flag} applies to {allowed}, not --{sources[0].replace('_', '-')}"
                           + SOURCE_OPTION_HINTS.get((name, sources[0]), ""))


def _plan_kind(path: str) -> str | None:
    """The plan's kind; a missing file or one that is not a plan is refused here, as the plan
    reader words it (before options that need some kind of plan are judged). The header's layout is
    checked once, by the reader that runs the plan (a decoder plan's header is large)."""
    from .compiler.plan.format import read_plan

    kind = read_plan(path, verify=False, check_meta=False).meta.get("kind")
    return kind if kind is None or isinstance(kind, str) else "malformed"


def _load_decoder_runner(plan: str):
    from .compiler.runtime.model_runner import load_model_runner

    return load_model_runner(plan)


def _decode_requests(runner, text, seed, prompt, max_tokens, temperature, top_p, top_k, workload, num_requests,
                     input_len, output_len, rate):
    import dataclasses

    from .compiler.runtime.sampler import SamplingParams
    from .compiler.runtime.sequence import Request
    from .compiler.runtime.text import unicode_problem
    from .compiler.runtime.workload import parse_length, parse_trace, synthetic

    defaults = SamplingParams(max_tokens=128 if max_tokens is None else max_tokens, temperature=temperature,
                              top_p=top_p, top_k=top_k)
    if prompt is not None:
        if text is None:
            raise BadInput("--prompt needs the model's tokenizer and this plan carries none; use --workload with prompt_ids")
        problem = unicode_problem(prompt)
        if problem:
            raise BadInput(f"--prompt: {problem}")
        try:
            prompt_ids = text.encode_prompt(prompt)
        except BadInput as exc:  # the chat template's refusal, say
            raise BadInput(f"--prompt: {exc}") from None
        return [Request(prompt_ids=prompt_ids, params=dataclasses.replace(defaults, seed=seed), source="--prompt")]
    if workload is not None:
        requests = parse_trace(workload, defaults)
        malformed = [r.error for r in requests if r.error]
        if malformed:  # before the engine warms up: a malformed line needs no model to be found
            more = f" (and {len(malformed) - 1} more malformed lines)" if len(malformed) > 1 else ""
            raise BadInput(malformed[0] + more)
        return requests
    requests = synthetic(num_requests, parse_length(input_len, "--input-len"), parse_length(output_len, "--output-len"),
                         runner.spec.vocab_size, rate, seed, runner.spec.eos_token_ids,
                         dataclasses.replace(defaults, ignore_eos=True))
    requests = [dataclasses.replace(r, source=f"--input-len {input_len} --output-len {output_len}: request {i}")
                for i, r in enumerate(requests)]
    # A synthetic request ignores EOS to produce exactly its output length; past the context the
    # engine would cut it short, and the benchmark would count fewer tokens than it asked for
    # (vLLM's server refuses such a request).
    too_long = [r for r in requests if len(r.prompt_ids) + r.params.max_tokens > runner.spec.max_model_len]
    if too_long:
        first = too_long[0]
        more = f" (and {len(too_long) - 1} more)" if len(too_long) > 1 else ""
        raise BadInput(f"{first.source}: {len(first.prompt_ids)} prompt + {first.params.max_tokens} output tokens are "
                       f"past the plan's max_model_len {runner.spec.max_model_len}{more}")
    return requests


def _refuse_unservable(engine, requests: list) -> list:
    """The requests, tokenized, once every one of them can be served: a workload with a request
    that cannot is refused before anything runs (no partial results), naming the first one."""
    requests = [engine.tokenized(r) for r in requests]
    refusals = [problem for problem in map(engine.refusal, requests) if problem]
    if refusals:
        more = f" (and {len(refusals) - 1} more requests that cannot be served)" if len(refusals) > 1 else ""
        raise BadInput(refusals[0] + more)
    return requests


def _run_decoder(plan, outputs_path, seed, as_json, op_profile, batching, max_num_seqs, itl_factor, **request_options):
    import contextlib

    from .compiler.runtime.engine import Engine, EngineConfig
    from .compiler.runtime.invariant_gemm import gemm_invariance_report
    from .compiler.runtime.metrics import LiveDisplay, request_record
    from .compiler.runtime.scheduler_config import SchedulerConfig
    from .compiler.runtime.text import TextCodec

    runner = _load_decoder_runner(plan)
    text = TextCodec.for_runner(runner)
    requests = _decode_requests(runner, text, seed, **request_options)
    profile = getattr(runner, "decode_profile", None) or {}
    max_num_seqs = max_num_seqs or profile.get("max_num_seqs", 8)
    token_budget = profile.get("max_num_batched_tokens", 2048)
    if max_num_seqs > token_budget:  # every running decode must fit in one step: the budget follows
        stderr.print(f"warning: --max-num-seqs {max_num_seqs} is above the plan's max_num_batched_tokens "
                     f"{token_budget}; steps take up to {max_num_seqs} tokens")
    scheduler = SchedulerConfig(max_num_seqs, max(token_budget, max_num_seqs), static_batching=batching == "static")
    num_kv_blocks = profile.get("num_kv_blocks") if isinstance(profile.get("num_kv_blocks"), int) else None
    is_streaming = request_options["prompt"] is not None and not as_json
    engine = Engine(runner, EngineConfig(scheduler, num_kv_blocks, seed=seed, itl_factor=itl_factor), text,
                    on_text=(lambda seq, piece: click.echo(piece, nl=False)) if is_streaming else None)
    requests = _refuse_unservable(engine, requests)
    from .compiler.runtime.step_profile import format_profile, profile_report, timing_steps

    executor = getattr(runner, "executor", None)
    with timing_steps(executor) if op_profile else contextlib.nullcontext() as step_times:
        if as_json or is_streaming:
            seqs = engine.run(requests)
        else:
            with LiveDisplay(stderr, len(requests), engine.clock) as display:
                seqs = engine.run(requests, on_step=display.update)
    if op_profile:
        step_times.runs = engine.stats.num_steps  # model steps: prefill chunks and decodes together
    if is_streaming and seqs[0].text:
        click.echo()
    if outputs_path:
        _write_text_atomic(outputs_path, "".join(json.dumps(request_record(i, s)) + "\n" for i, s in enumerate(seqs)))
    summary = {"plan": str(plan), "batching": batching, "max_num_seqs": max_num_seqs,
               "num_kv_blocks": engine.blocks.num_blocks, **engine.summary(seqs),
               "batch_invariant_gemms": gemm_invariance_report()}
    if request_options["prompt"] is not None:  # one request: its answer belongs in the report a script reads
        summary["text"], summary["finish_reason"] = seqs[0].text, seqs[0].finish_reason
    if op_profile:
        summary["op_profile"] = profile_report(executor, step_times, [])
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    elif not is_streaming:
        _print_decode_summary(summary)
    else:  # the text went to stdout: timings on stderr, one line, so a pipe gets the text alone
        _print_stream_timings(summary)
    if op_profile and not as_json:
        for line in format_profile(summary["op_profile"]):
            click.echo(line, err=is_streaming)
    failed = [(i, s) for i, s in enumerate(seqs) if s.error]
    if failed:
        raise BadInput(f"{len(failed)} of {len(seqs)} requests failed (request {failed[0][0]}: {failed[0][1].error})")


def _print_stream_timings(s: dict) -> None:
    ttft, tpot = s["ttft_ms"]["p50"], s["tpot_ms"]["p50"]
    speed = f"; TPOT {tpot:.1f} ms ({1000 / tpot:.1f} tok/s)" if tpot else ""
    click.echo(f"[{s['prompt_tokens']} prompt tokens, {s['output_tokens']} generated; TTFT "
               f"{ttft or 0:.0f} ms{speed}]", err=True)


def _print_decode_summary(s: dict) -> None:
    def ms(key):  # none measured (TPOT and ITL of one-token outputs): say so rather than 0 ms
        stats = s[key]
        return "n/a" if stats["p50"] is None else f"p50 {stats['p50']:.1f} / p99 {stats['p99']:.1f} ms"
    click.echo(f"{s['requests']} requests, {s['output_tokens']} output tokens in {s['duration_s']:.2f} s: "
               f"{s['output_tok_s']:.1f} tok/s, {s['requests_per_s']:.2f} requests/s ({s['batching']} batching, "
               f"up to {s['max_num_seqs']} sequences)")
    click.echo(f"TTFT {ms('ttft_ms')}; TPOT {ms('tpot_ms')}; ITL {ms('itl_ms')}; end to end {ms('e2e_ms')}")
    click.echo(f"preemptions {s['preemptions']}, KV waste {s['kv_waste_pct']:.1f}% of {s['num_kv_blocks']} blocks, "
               f"prefix hits {s['prefix_hit_pct']:.1f}%, time outside the model {s['outside_model_pct']:.1f}%")


@main.group()
def cache():
    """The engine and timing cache."""


@cache.command("ls")
@click.option("--cache-dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True)
def cache_ls(cache_dir, as_json):
    """List cached plans."""
    from .compiler.engine_cache import EngineCache, default_cache_dir

    entries = EngineCache(Path(cache_dir) if cache_dir else default_cache_dir()).entries()
    if as_json:
        click.echo(json.dumps([{k: e.get(k) for k in ("key", "model_name", "plan_bytes", "created")} for e in entries], indent=2))
        return
    if not entries:
        click.echo("engine cache is empty")
    for e in entries:
        click.echo(f"{e['key']}  {e.get('model_name')}  {e.get('plan_bytes', 0) / 1e6:.2f} MB  "
                   f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(e.get('created', 0)))}")


@cache.command("clear")
@click.option("--cache-dir", type=click.Path(file_okay=False))
def cache_clear(cache_dir):
    """Remove every cached plan and the timing cache."""
    from .compiler.engine_cache import EngineCache, default_cache_dir

    removed = EngineCache(Path(cache_dir) if cache_dir else default_cache_dir()).clear()
    click.echo(f"removed {removed} cached plans and the timing cache")


if __name__ == "__main__":
    main()
