"""bench/decode.py as docs/decode-benchmark.md runs it: `python bench/decode.py --fake` wrote its
tables over the whole of docs/decode-benchmark.md, dropping every other section of it."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_fake_run_writes_its_tables_beside_its_results_not_over_the_doc(tmp_path):
    doc = ROOT / "docs" / "decode-benchmark.md"
    before = doc.read_bytes()
    output = tmp_path / "decode.json"
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "decode.py"), "--fake", "--num-requests", "4",
                             "--max-len", "24", "--parts", "batching", "--comparisons", "same-seqs", "--repeats", "1",
                             "--output", str(output)], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert doc.read_bytes() == before
    assert output.exists() and "Continuous / static" in output.with_suffix(".md").read_text()
