"""`infc run --op-profile` on a decoder plan: every model step of the serving run timed, per step and per
op type, beside the serving metrics."""

import json

from click.testing import CliRunner

from infc import cli


def test_decoder_op_profile_times_the_model_steps_of_the_serving_run(decoder_plans):
    plan = next(iter(decoder_plans.values()))
    result = CliRunner().invoke(cli.main, ["run", str(plan), "--num-requests", "3", "--input-len", "12",
                                           "--output-len", "4", "--op-profile", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    profile = summary["op_profile"]
    assert profile["runs"] >= 4 and profile["executor_ms"] is None  # prefill chunks and three decode steps at least
    ops = {entry["op"] for entry in profile["ops"]}
    assert "infc.PagedAttention" in ops and "infc.BatchInvariant" in ops
    assert sum(row["ms"] for row in profile["steps"]) > 0
    text = CliRunner().invoke(cli.main, ["run", str(plan), "--num-requests", "2", "--input-len", "8",
                                         "--output-len", "2", "--op-profile"])
    assert text.exit_code == 0 and "time per model step over" in text.stdout and "op type (steps)" in text.stdout
