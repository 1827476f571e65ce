"""The ONNX backend node tests (`onnx.backend.test`, node cases only) on the native runtime.

The backend imports each model with onnx-graphsurgeon, runs NO optimization pass, lowers it with
`allow_fallback=False` (an op without a native kernel fails its case) and executes it with the
NumPy executor. The suite runs as one pytest test that:
  - fails if a case outside `backend_node_failures.json` fails (a regression), naming it;
  - fails if fewer than MIN_PASSING cases pass;
  - prints the pass count, failures grouped by op, and cases that started passing.

Refresh the known-failure list (after adding kernels) and print the docs table with:
    python tests/test_backend_nodes.py --update
"""

from __future__ import annotations

import collections
import json
import re
import sys
import time
import unittest
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx.backend.base
import onnx.backend.test

from infc.compiler.graph import import_graph
from infc.compiler.lower import lower_graph
from infc.compiler.runtime.executor import Executor
from infc.compiler.runtime.kernels import has_kernel
from onnx_graphsurgeon.logger import G_LOGGER

KNOWN_FAILURES = Path(__file__).with_name("backend_node_failures.json")
MIN_PASSING = 1000
NODE_CASES = "OnnxBackendNodeModelTest"


class InfcRep(onnx.backend.base.BackendRep):
    def __init__(self, program):
        self.input_names = [i["name"] for i in program.inputs]
        self.output_names = [o["name"] for o in program.outputs]
        self.executor = Executor(program.steps, program.weights, program.opset, program.islands, self.output_names)

    def run(self, inputs, **kwargs):
        results = self.executor.run(dict(zip(self.input_names, inputs)))
        return tuple(results[name] for name in self.output_names)


class InfcBackend(onnx.backend.base.Backend):
    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs):
        program = lower_graph(import_graph(model), has_kernel, allow_fallback=False)
        return InfcRep(program)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"


def op_of(case_name: str, model: onnx.ModelProto | None) -> str:
    """The op a node case tests: the longest op name (of the model's nodes, else of all ONNX schemas)
    that starts the case name ("test_layer_normalization_4d_expanded" -> LayerNormalization)."""
    base = re.sub(r"^test_|_cpu$", "", case_name).replace("_", "").lower()
    base = base.removeprefix("aionnxml")
    for prefix, op in _CASE_ALIASES.items():
        if base.startswith(prefix):
            return op
    for names in ([n.op_type for n in model.graph.node] if model is not None else [], _ALL_OPS):
        matches = [op for op in names if base.startswith(op.lower())]
        if matches:
            return max(matches, key=len)
    return case_name


# case names that do not start with their op's name
_CASE_ALIASES = {"strnormalizer": "StringNormalizer", "basicdeformconv": "DeformConv", "trainingdropout": "Dropout",
                 "nesterovmomentum": "Momentum"}
_ALL_OPS = sorted({schema.name for schema in onnx.defs.get_all_schemas_with_history()})


def run_suite() -> dict:
    """Run every node case; returns names of passing and failing cases, failures with their op."""
    G_LOGGER.severity = G_LOGGER.ERROR  # graphsurgeon warns about every odd node test model
    started = time.perf_counter()
    with warnings.catch_warnings(), np.errstate(all="ignore"):  # the cases' own NumPy math warns too
        warnings.simplefilter("ignore")
        backend_test = onnx.backend.test.BackendTest(InfcBackend, __name__)
        models = {f"{case.name}_cpu": case.model for case in onnx.backend.test.loader.load_model_tests(kind="node")}
        case = backend_test.test_cases[NODE_CASES]
        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromTestCase(case).run(result)
    failed = {}
    for test, trace in result.failures + result.errors:
        name = test.id().split(".")[-1]
        failed[name] = {"op": op_of(name, models.get(name)), "error": trace.strip().splitlines()[-1][:200]}
    names = [n for n in unittest.defaultTestLoader.getTestCaseNames(case) if n.endswith("_cpu")]
    passed = sorted(n for n in names if n not in failed and n not in {t.id().split(".")[-1] for t, _ in result.skipped})
    return {"passed": passed, "failed": failed, "seconds": time.perf_counter() - started, "total": len(names)}


def load_known() -> dict:
    return json.loads(KNOWN_FAILURES.read_text()) if KNOWN_FAILURES.exists() else {"reasons": {}, "failing": {}}


def summary(outcome: dict, known: dict) -> str:
    by_op = collections.Counter(f["op"] for f in outcome["failed"].values())
    lines = [f"backend node tests: {len(outcome['passed'])} passed, {len(outcome['failed'])} failed "
             f"of {outcome['total']} ({outcome['seconds']:.0f} s)"]
    for op, count in sorted(by_op.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"  {op}: {count}  ({known['reasons'].get(op, 'no reason recorded')})")
    return "\n".join(lines)


def test_backend_node_suite():
    known = load_known()
    outcome = run_suite()
    print("\n" + summary(outcome, known))
    regressions = sorted(set(outcome["failed"]) - set(known["failing"]))
    now_passing = sorted(set(known["failing"]) & set(outcome["passed"]))
    if now_passing:
        print(f"now passing (drop them from {KNOWN_FAILURES.name}): {', '.join(now_passing)}")
    assert not regressions, "cases that used to pass now fail:\n" + "\n".join(
        f"  {name} [{outcome['failed'][name]['op']}]: {outcome['failed'][name]['error']}" for name in regressions)
    assert len(outcome["passed"]) >= MIN_PASSING, f"only {len(outcome['passed'])} node tests pass (< {MIN_PASSING})"


def _update() -> None:
    known = load_known()
    outcome = run_suite()
    reasons = {op: known["reasons"].get(op, "TODO") for op in sorted({f["op"] for f in outcome["failed"].values()})}
    failing = {name: f["op"] for name, f in sorted(outcome["failed"].items())}
    KNOWN_FAILURES.write_text(json.dumps({"reasons": reasons, "failing": failing}, indent=1) + "\n")
    print(summary(outcome, {"reasons": reasons}))
    for name, f in sorted(outcome["failed"].items()):
        print(f"{name} [{f['op']}]: {f['error']}")


if __name__ == "__main__":
    if "--update" in sys.argv:
        _update()
    else:
        print(summary(run_suite(), load_known()))
