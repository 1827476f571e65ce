"""Mutate a plan's header one field at a time, re-hash it, and run `infc run` and `infc inspect` on
each (in-process): a field of the wrong type, a missing key, an emptied list, a name nothing gives.
The section checksums do not catch such edits; `compiler/plan/meta_schema.py` should, with one error
naming the plan and the field, exit 2. Printed: each distinct outcome that is an internal error
(exit 1). Those that name a step ("Gather '/x' failed: ...") come from well-typed edits that contradict
the weights (a shape changed within its section) and are expected; any other is a finding.

    python scripts/fuzz_plan_headers.py PLAN [--cases N] [--seed S] [-- RUN_ARGS...]

A decoder plan needs request options for `run`, e.g. `-- --num-requests 2 --input-len 8 --output-len 3`.
"""
import argparse
import copy
import random
import tempfile
from pathlib import Path

from click.testing import CliRunner

from infc.cli import main
from infc.compiler.plan.format import read_plan, write_plan


def leaves(value, path=()):
    """Every field's path, lists sampled at their first three items."""
    yield path
    items = value.items() if isinstance(value, dict) else enumerate(value[:3]) if isinstance(value, list) else ()
    for key, item in items:
        yield from leaves(item, (*path, key))


def replacements(value) -> list:
    if isinstance(value, bool):
        return [not value, "x", None]
    if isinstance(value, int):
        return [-1, value + 1, 1 << 40, "7", None, 0]
    if isinstance(value, float):
        return [-value, 1e30, "x"]
    if isinstance(value, str):
        return ["", "bogus", 3, None, value + "x"]
    if isinstance(value, list):
        return [[], None, {}, value[:-1] or [1], value + value[-1:] if value else ["z"]]
    return [{}, None, []]


def lookup(meta, path):
    for key in path:
        meta = meta[key]
    return meta


def cases(meta):
    for path in (p for p in leaves(meta) if p):
        for value in replacements(lookup(meta, path)):
            yield path, value, False
        if isinstance(path[-1], str):
            yield path, None, True


def edited(meta, path, value, delete):
    meta = copy.deepcopy(meta)
    parent = lookup(meta, path[:-1])
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return meta


def fuzz():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan")
    parser.add_argument("--cases", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("run_args", nargs="*")
    args = parser.parse_args()
    plan = read_plan(args.plan)
    sections = {name: bytes(view) for name, view in plan.sections.items()}
    todo = list(cases(plan.meta))
    random.Random(args.seed).shuffle(todo)
    runner, seen = CliRunner(), set()
    print(f"{len(todo)} possible edits; running {min(args.cases, len(todo))}")
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "edited.plan"
        for path, value, delete in todo[:args.cases]:
            write_plan(target, edited(plan.meta, path, value, delete), sections)
            for command in (["run", str(target), *args.run_args], ["inspect", str(target)]):
                result = runner.invoke(main, command)
                if result.exit_code in (0, 2, 3):
                    continue
                line = (result.stderr or result.output).strip().splitlines()[-1:] or [repr(result.exception)]
                shape = tuple("#" if isinstance(k, int) else k for k in path)
                if (command[0], shape, line[0][:40]) not in seen:
                    seen.add((command[0], shape, line[0][:40]))
                    where = "/".join(map(str, path))
                    print(f"{command[0]} {where} {'deleted' if delete else repr(value)[:40]}: exit {result.exit_code}: {line[0][:200]}")
    print(f"{len(seen)} distinct internal errors")


if __name__ == "__main__":
    fuzz()
