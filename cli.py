"""The `infc` command line (GUIDE.md section 8). Exit codes: 0 ok, 1 internal, 2 bad input, 3 wrong target."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import click
from rich.console import Console

from . import __version__
from .compiler.errors import BadInput, InfcError

stderr = Console(stderr=True)


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


class InfcGroup(click.Group):
    """Turns every failure into one `error:` line and the documented exit code; no tracebacks."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except InfcError as exc:
            _fail(str(exc), exc.exit_code)
        except click.exceptions.Exit:
            raise
        except click.ClickException as exc:
            _fail(exc.format_message(), 2)
        except click.Abort:
            _fail("aborted", 1)
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


def _check_writable_output(path: str) -> None:
    folder = Path(path).parent if str(Path(path).parent) else Path(".")
    if not folder.is_dir():
        raise BadInput(f"{path}: output folder '{folder}' does not exist")
    if not os.access(folder, os.W_OK):
        raise BadInput(f"{path}: output folder '{folder}' is not writable")
    if Path(path).is_dir():
        raise BadInput(f"{path}: is a directory")


def _run_optimize(model_path: str, quiet: bool):
    from .compiler.model_io import load_model
    from .compiler.optimize import optimize_model

    model = load_model(model_path)
    if quiet:
        return model, optimize_model(model)
    with stderr.status("optimizing") as status:
        result = optimize_model(model, progress=lambda phase, name: status.update(f"optimizing: {phase} / {name}"))
    return model, result


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Where to write the optimized ONNX model.")
@click.option("--verify", is_flag=True, help="Run original and result in onnxruntime on seeded random inputs and compare.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable report on stdout.")
@click.option("--seed", default=0, show_default=True, help="Seed for --verify inputs.")
@click.option("--dim", "dims", multiple=True, metavar="NAME=INT", help="Value of a symbolic dim for --verify inputs.")
def optimize(model, output, verify, as_json, seed, dims):
    """Optimize MODEL and write the result as ONNX that onnxruntime runs."""
    from .compiler.model_io import save_model
    from .compiler.report import print_report, report_json
    from .compiler.verify import verify_models

    _check_writable_output(output)
    original, result = _run_optimize(model, quiet=as_json)
    report = report_json(result)
    if verify:
        diffs = verify_models(original, result.model, seed=seed, dims=_parse_dims(dims))
        report["outputs"] = [d.to_json() for d in diffs]
        report["max_abs_diff"] = max((d.max_abs_diff for d in diffs), default=0.0)
        report["max_rel_diff"] = max((d.max_rel_diff for d in diffs), default=0.0)
    save_model(result.model, output)
    report["output"] = str(output)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    print_report(report, Console())
    if verify:
        click.echo(f"verify: max abs diff {report['max_abs_diff']:.3g}, max rel diff {report['max_rel_diff']:.3g} "
                   f"over {len(report['outputs'])} outputs")
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
    _, result = _run_optimize(target, quiet=as_json)
    report = report_json(result)
    report["model"] = str(target)
    if html_path:
        _write_text_atomic(html_path, report_html(report, f"infc inspect: {Path(target).name}"))
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        print_report(report, Console())


def _write_text_atomic(path: str, text: str) -> None:
    folder = Path(path).parent if str(Path(path).parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{Path(path).name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


if __name__ == "__main__":
    main()
