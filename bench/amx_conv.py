"""bf16 convolutions on AMX-BF16 tiles against onnxruntime's float32 ones, at ResNet-50's shapes,
side by side in one process.

    python bench/amx_conv.py [--repeats 3] [--runs 15] [--tag TAG] [--no-write]

For each convolution (ResNet-50's distinct ones at 1 x 224 x 224, each with its bias and Relu, and
the residual one with its sum): infc's kernel as a bf16 plan runs it with `bf16_tiles` (taps of
the converted input, runtime/kernels/amx_taps.py, where they apply, else the packed windows of
amx_conv.py; the activation's rounding to bf16 is part of its conversion, and so of its time), the
windows alone for comparison, infc's float32 kernel on the same values, and onnxruntime's float32
Conv (a one-node session, FusedConv's form: Conv + Add + Relu, default threads and one), the vendor
a bf16 plan's convolution races at build. Interleaved: `repeats` rounds of every candidate, each the median of
`runs` calls; the table shows medians in ms and each over onnxruntime's. Outputs are checked
against a float64 convolution of the same values first. Needs AMX-BF16 (says so and stops
without it). OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are unset for this benchmark (it re-runs itself
once, and says so). Results: bench/results/amx_conv[-TAG]-<date>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
from openblas_env import openblas_note, rerun_without_openblas_env  # noqa: E402 - bench/, beside this script

ROOT = Path(__file__).resolve().parent.parent
# (channels in, out, spatial, kernel, stride, with a residual)
SHAPES = [(3, 64, 224, 7, 2, False), (64, 64, 56, 1, 1, False), (64, 64, 56, 3, 1, False), (64, 256, 56, 1, 1, True),
          (256, 64, 56, 1, 1, False), (256, 128, 56, 1, 1, False), (128, 128, 56, 3, 2, False), (128, 512, 28, 1, 1, True),
          (512, 128, 28, 1, 1, False), (128, 128, 28, 3, 1, False), (512, 256, 28, 1, 1, False), (256, 256, 14, 3, 1, False),
          (256, 1024, 14, 1, 1, True), (1024, 256, 14, 1, 1, False), (512, 512, 7, 3, 1, False), (512, 2048, 7, 1, 1, True),
          (2048, 512, 7, 1, 1, False)]


def onnxruntime_conv(w, bias, attrs, x_shape, residual: bool, threads: int | None):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    if residual:
        nodes.append(helper.make_node("Add", ["c", "z"], ["s"]))
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    nodes.append(helper.make_node("Relu", [nodes[-1].output[0]], ["y"]))
    graph = helper.make_graph(nodes, "conv", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(),
                                   options, providers=["CPUExecutionProvider"])
    return lambda x, z: session.run(None, {"x": x, **({"z": z} if residual else {})})[0]


def median_ms(run, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def bench_args(doc: str) -> argparse.Namespace:
    """The options the AMX benchmarks share (see the module docstring), after re-running this
    process without the OpenBLAS variables when they are set."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--tag", default="")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--keep-openblas-env", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rerun_without_openblas_env(args.keep_openblas_env)
    return args


def main() -> int:
    args = bench_args(__doc__)

    from infc.compiler.runtime import amx_gemm, bf16_gemm
    from infc.compiler.runtime.kernels import amx_taps
    from infc.compiler.runtime.kernels.common import KernelContext
    from infc.compiler.runtime.kernels.conv import conv_forward, fused_conv

    if not amx_gemm.has_amx_bf16():
        print("this CPU has no usable AMX-BF16: nothing to compare")
        return 0
    rng = np.random.default_rng(0)
    rows = []
    takes_taps = amx_taps.applies

    def windows_only(run):
        """run() with amx_taps.py switched off: the packed windows of amx_conv.py."""
        def windows():
            amx_taps.applies = lambda *_: False
            try:
                return run()
            finally:
                amx_taps.applies = takes_taps
        return windows

    print(f"{'convolution':38} {'path':>7} {'tiles ms':>9} {'windows':>8} {'fp32 ms':>9} {'ORT ms':>8} {'ORT 1t':>8} "
          f"{'tiles/ORT':>10} {'tiles/fp32':>11}")
    for c, m, size, k, stride, residual in SHAPES:
        x = rng.standard_normal((1, c, size, size)).astype(np.float32)  # not rounded: the packing rounds it
        w = bf16_gemm.bf16_values((rng.standard_normal((m, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32))
        bias = rng.standard_normal(m).astype(np.float32)
        out = (size + 2 * (k // 2) - k) // stride + 1
        z = rng.standard_normal((1, m, out, out)).astype(np.float32) if residual else None
        attrs = {"kernel_shape": [k, k], "pads": [k // 2] * 4, "strides": [stride, stride]}
        fused = {**attrs, "activation": "Relu"}
        tiles_ctx, plain_ctx = KernelContext(17, [None], bf16_tiles=True), KernelContext(17, [None])
        windows_ctx = KernelContext(17, [None], bf16_tiles=True)
        inputs = [x, w, bias] + ([z] if residual else [])
        candidates = {
            "tiles": lambda: fused_conv(inputs, fused, tiles_ctx)[0],
            "windows": windows_only(lambda: fused_conv(inputs, fused, windows_ctx)[0]),
            "fp32": lambda: fused_conv([bf16_gemm.bf16_values(x)] + inputs[1:], fused, plain_ctx)[0],
            "ort": (lambda run: lambda: run(bf16_gemm.bf16_values(x), z))(onnxruntime_conv(w, bias, attrs, x.shape, residual, None)),
            "ort_1t": (lambda run: lambda: run(bf16_gemm.bf16_values(x), z))(onnxruntime_conv(w, bias, attrs, x.shape, residual, 1)),
        }
        wide = conv_forward(bf16_gemm.bf16_values(x).astype(np.float64), w.astype(np.float64), bias.astype(np.float64), attrs)
        expected = np.maximum(wide + (z if residual else 0.0), 0.0)
        for name, run in candidates.items():
            error = float(np.abs(run() - expected).max() / np.abs(expected).max())
            if error > 1e-5:
                raise SystemExit(f"{name} on conv {c}->{m} {size}x{size} k{k}: max error {error:.2e} of the largest")
        times = {name: [] for name in candidates}
        for _ in range(args.repeats):
            for name, run in candidates.items():
                times[name].append(median_ms(run, args.runs))
        med = {name: statistics.median(values) for name, values in times.items()}
        label = f"{c}->{m} {size}x{size} k{k} s{stride}{' +residual' if residual else ''}"
        path = "taps" if takes_taps(c, (k, k)) else "windows"
        row = {"conv": label, "path": path, **{f"{name}_ms": round(value, 4) for name, value in med.items()},
               "tiles_over_ort": round(med["tiles"] / med["ort"], 3), "tiles_over_fp32": round(med["tiles"] / med["fp32"], 3)}
        rows.append(row)
        print(f"{label:38} {path:>7} {med['tiles']:9.3f} {med['windows']:8.3f} {med['fp32']:9.3f} {med['ort']:8.3f} {med['ort_1t']:8.3f} "
              f"{row['tiles_over_ort']:10.2f} {row['tiles_over_fp32']:11.2f}")
    total = {name: sum(r[f"{name}_ms"] for r in rows) for name in ("tiles", "windows", "fp32", "ort", "ort_1t")}
    print(f"{'sum over the shapes':38} {'':>7} {total['tiles']:9.3f} {total['windows']:8.3f} {total['fp32']:9.3f} {total['ort']:8.3f} {total['ort_1t']:8.3f} "
          f"{total['tiles'] / total['ort']:10.2f} {total['tiles'] / total['fp32']:11.2f}")
    if not args.no_write:
        import onnxruntime

        day = datetime.date.today().isoformat()
        path = ROOT / "bench" / "results" / f"amx_conv{'-' + args.tag if args.tag else ''}-{day}.json"
        path.write_text(json.dumps({"date": day, "machine": platform.processor() or platform.machine(),
                                    "onnxruntime": onnxruntime.__version__, "openblas_env": openblas_note(),
                                    "repeats": args.repeats, "runs": args.runs, "rows": rows, "sum_ms": total}, indent=1) + "\n")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
