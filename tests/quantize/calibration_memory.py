"""Peak memory of INT8 calibration over a folder of .npz samples, measured in a fresh process.

    python tests/quantize/calibration_memory.py MODEL.onnx CALIB_DIR METHOD   -> one JSON line

Used by test_int8.py to show that 1,000 samples cost no more memory than 10 (streaming statistics).
"""

import json
import resource
import sys
import tracemalloc

import onnx
from infc.compiler.quantize.calib_data import iter_calibration
from infc.compiler.quantize.int8 import quantize_int8


def main(model_path: str, folder: str, method: str) -> None:
    model = onnx.load(model_path)
    tracemalloc.start()
    _, report = quantize_int8(model, iter_calibration(folder, model), method)
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(json.dumps({"num_samples": report.num_samples, "python_peak_mb": traced_peak / 2**20,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
