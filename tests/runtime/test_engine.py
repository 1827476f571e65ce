"""The decode loop with the fake runner: a request's tokens never depend on how it was scheduled,
a small pool only costs preemptions, prefix caching saves prefill, bad requests fail alone; and
the decoder side of `infc run`."""

import dataclasses
import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from infc import cli
from infc.compiler.runtime.decode_api import ModelSpec
from infc.compiler.runtime.engine import Engine, EngineConfig
from infc.compiler.runtime.fake_runner import DEFAULT_SPEC, FakeRunner, reference_tokens
from infc.compiler.runtime.sampler import SamplingParams
from infc.compiler.runtime.scheduler_config import SchedulerConfig
from infc.compiler.runtime.sequence import Request

SPEC = dataclasses.replace(DEFAULT_SPEC, max_model_len=512, block_size=8)


def workload(num=24, seed=0):
    """Mixed lengths, half of the prompts behind a shared 40-token prefix, some sampled, some stop at EOS."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, 256, 40).tolist()
    requests = []
    for i in range(num):
        own = rng.integers(0, 256, int(rng.integers(1, 60))).tolist()
        params = SamplingParams(max_tokens=int(rng.integers(1, 40)), ignore_eos=i % 3 == 0,
                                temperature=0.0 if i % 2 else 0.9, top_p=0.95, seed=None if i % 4 else 100 + i)
        requests.append(Request(prompt_ids=(shared + own) if i % 2 else own, params=params))
    return requests


def working_set_blocks(requests, block_size=SPEC.block_size):
    return sum(-(-(len(r.prompt_ids) + r.params.max_tokens) // block_size) for r in requests)


def serve(requests, num_kv_blocks=2000, prefix_caching=True, on_step=None, runner=None, itl_factor=None, **scheduler):
    scheduler = {"max_num_seqs": 8, "max_num_batched_tokens": 64, **scheduler}
    engine = Engine(runner or FakeRunner(SPEC), EngineConfig(SchedulerConfig(**scheduler), num_kv_blocks, prefix_caching,
                                                             itl_factor=itl_factor))
    seqs = engine.run(requests, on_step=on_step)
    return engine, seqs


@pytest.fixture(scope="module")
def requests():
    return workload()


@pytest.fixture(scope="module")
def alone(requests):
    """Each request served on its own engine: the tokens every other schedule must reproduce."""
    outputs = []
    for index, request in enumerate(requests):
        engine = Engine(FakeRunner(SPEC), EngineConfig(SchedulerConfig(1, 64), 200))
        for _ in range(index):  # same request index, so unseeded requests get the same stream
            engine.sequences.append(None)
        outputs.append(engine.run([request])[0].output_ids)
    return outputs


def test_greedy_alone_matches_the_logits_function(requests, alone):
    runner = FakeRunner(SPEC)
    for request, tokens in zip(requests, alone):
        if request.params.temperature == 0:
            assert tokens == reference_tokens(runner, request.prompt_ids, request.params.max_tokens, request.params.ignore_eos)
    assert any(t[-1] in SPEC.eos_token_ids for t in alone)  # some stopped at EOS


def preempt_newest_every(num_steps):
    def on_step(engine):
        if engine.stats.num_steps % num_steps == 0 and engine.scheduler.running:
            engine.scheduler.preempt(engine.scheduler.running[-1])
    return on_step


@pytest.mark.parametrize("setup", [
    dict(static_batching=True),
    dict(max_num_batched_tokens=8),
    dict(max_num_batched_tokens=33),
    dict(max_num_batched_tokens=512, max_num_seqs=24),
    dict(prefix_caching=False),
    dict(on_step=preempt_newest_every(5)),
    dict(itl_factor=1.2, max_num_batched_tokens=512, max_num_seqs=24),
], ids=["static", "chunk8", "chunk33", "chunk512", "no-prefix-cache", "forced-preemption", "decode-priority"])
def test_same_tokens_whatever_the_schedule(requests, alone, setup):
    engine, seqs = serve(requests, **setup)
    assert [s.output_ids for s in seqs] == alone
    if "on_step" in setup:
        assert engine.scheduler.num_preemptions > 0
    if setup.get("prefix_caching", True):
        assert engine.blocks.prefix_hit_pct > 0
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


@pytest.mark.parametrize("growth_lookahead", [0, 32])
def test_half_the_working_set_completes_with_the_same_tokens_and_frees_the_pool(requests, alone, growth_lookahead):
    num_blocks = working_set_blocks(requests) // 2
    engine, seqs = serve(requests, num_kv_blocks=num_blocks, max_num_seqs=24, max_num_batched_tokens=128,
                         growth_lookahead=growth_lookahead)
    assert [s.output_ids for s in seqs] == alone
    assert all(s.error is None and s.finish_reason in ("stop", "length") for s in seqs)
    if growth_lookahead == 0:  # admission leaves only the watermark: the pool runs out and preemption serves
        assert engine.scheduler.num_preemptions > 0
    assert engine.blocks.num_free_blocks == num_blocks and not any(engine.blocks.ref_counts)


def test_prefix_caching_cuts_prefill_by_the_shared_fraction():
    rng = np.random.default_rng(5)
    system, num, own_len = rng.integers(0, 256, 64).tolist(), 16, 32
    requests = [Request(prompt_ids=system + rng.integers(0, 256, own_len).tolist(), params=SamplingParams(max_tokens=4))
                for _ in range(num)]
    prefill = {}
    for caching in (False, True):
        _, seqs = serve(requests, prefix_caching=caching, max_num_seqs=16, max_num_batched_tokens=512)
        prefill[caching] = sum(s.num_prefill_tokens for s in seqs)
    # every request after the first repeats the system prompt: that share of the prompt tokens is redundant
    repeated_fraction = (num - 1) * len(system) / (num * (len(system) + own_len))
    assert prefill[False] == num * (len(system) + own_len)
    assert 1 - prefill[True] / prefill[False] >= repeated_fraction


def test_cancel_frees_blocks_at_once():
    requests = [Request(prompt_ids=[i] * (100 + i), params=SamplingParams(max_tokens=50, ignore_eos=True)) for i in range(4)]
    engine = Engine(FakeRunner(SPEC), EngineConfig(SchedulerConfig(2, 64), 100))
    seqs = [engine.add_request(r) for r in requests]
    for _ in range(4):
        engine.step()
    running, waiting = seqs[0], seqs[3]
    held = len(running.block_table)
    free_before = engine.blocks.num_free_blocks
    engine.cancel(running)
    engine.cancel(waiting)
    assert engine.blocks.num_free_blocks == free_before + held
    assert running.finish_reason == waiting.finish_reason == "cancelled"
    while engine.scheduler.has_work():
        engine.step()
    assert engine.blocks.num_free_blocks == 100


def test_bad_requests_fail_alone():
    good = Request(prompt_ids=[5, 6, 7], params=SamplingParams(max_tokens=5, ignore_eos=True))
    bad = {
        "empty prompt": Request(prompt_ids=[]),
        "token id 300 is outside the vocabulary [0, 257)": Request(prompt_ids=[1, 300]),
        "leaves no room in the context of 512": Request(prompt_ids=[1] * 512),
        "max_tokens must be a positive integer": Request(prompt_ids=[1], params=SamplingParams(max_tokens=0)),
        "needs 19 KV blocks at full length, the pool has 16": Request(prompt_ids=[1] * 100, params=SamplingParams(max_tokens=50)),
        "trace.jsonl:3: not JSON": Request(error="trace.jsonl:3: not JSON"),
        "a text prompt needs the model's tokenizer": Request(prompt="hello"),
        "seed must be an integer >= 0": Request(prompt_ids=[1], params=SamplingParams(temperature=0.5, seed=-1)),
        "arrival_s 1.7e+09 is not seconds after the start of the run (a timestamp?": Request(prompt_ids=[1],
                                                                                            arrival_s=1.7e9),
    }
    runner = FakeRunner(SPEC, has_tokenizer=False)
    engine, seqs = serve([good, *bad.values(), good], num_kv_blocks=16, runner=runner)
    expected = reference_tokens(runner, good.prompt_ids, 5, ignore_eos=True)
    assert seqs[0].output_ids == seqs[-1].output_ids == expected and seqs[0].error is None
    for seq, fragment in zip(seqs[1:-1], bad):
        assert fragment in seq.error and seq.finish_reason == "error" and seq.output_ids == []
    summary = engine.summary(seqs)
    assert summary["failed_requests"] == len(bad) and summary["requests"] == len(bad) + 2


def test_max_tokens_is_capped_by_the_context():
    _, (seq,) = serve([Request(prompt_ids=[1] * 500, params=SamplingParams(max_tokens=100, ignore_eos=True))])
    assert len(seq.output_ids) == 12 and seq.finish_reason == "length"


def test_text_streams_and_stop_strings_cut_it():
    prompt = Request(prompt="tell me", params=SamplingParams(max_tokens=60, ignore_eos=True))
    pieces = []
    engine = Engine(FakeRunner(SPEC), EngineConfig(SchedulerConfig(4, 64), 100), None, on_text=lambda s, p: pieces.append(p))
    from infc.compiler.runtime.text import TextCodec
    engine.text = TextCodec.for_runner(engine.runner)
    (full,) = engine.run([prompt])
    assert "".join(pieces) == full.text == engine.text.decode(full.output_ids)
    position = next(i for i, c in enumerate(full.text) if i > 3 and c.isascii() and c.isprintable())
    stop = full.text[position]
    engine2 = Engine(FakeRunner(SPEC), EngineConfig(SchedulerConfig(4, 64), 100), engine.text)
    (cut,) = engine2.run([dataclasses.replace(prompt, params=dataclasses.replace(prompt.params, stop=(stop,)))])
    assert cut.text == full.text[:full.text.index(stop)] and cut.finish_reason == "stop"
    assert cut.detokenize_s > 0


def test_metrics_and_records(requests):
    engine, seqs = serve(requests)
    summary = engine.summary(seqs)
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(summary[key]) >= {"p50", "p90", "p99"} and summary[key]["p50"] <= summary[key]["p99"]
    assert set(summary["phase_ms"]) == {"queue", "prefill", "decode", "detokenize"}
    assert summary["output_tokens"] == sum(len(s.output_ids) for s in seqs) and summary["output_tok_s"] > 0
    assert 0 <= summary["kv_waste_pct"] < summary["contiguous_kv_waste_pct"] < 100
    assert 0 < summary["outside_model_pct"] < 100 and summary["requests"] == len(requests)
    from infc.compiler.runtime.metrics import request_record
    record = request_record(0, seqs[0])
    assert record["output_ids"] == seqs[0].output_ids and "error" not in record and record["phase_s"]["queue"] >= 0


def test_poisson_arrivals_are_respected():
    from infc.compiler.runtime.workload import synthetic
    requests = synthetic(8, (4, 20), (2, 6), vocab_size=256, rate=400.0, seed=3)
    _, seqs = serve(requests)
    assert all(s.first_scheduled_s >= s.arrival_s for s in seqs)
    assert seqs[-1].arrival_s - seqs[0].arrival_s == pytest.approx(requests[-1].arrival_s)


# ---- infc run on a decoder plan (the runner is the fake one) ----

@pytest.fixture
def decoder_cli(monkeypatch, tmp_path):
    plan = tmp_path / "fake.plan"
    plan.write_bytes(b"INFCPLAN")
    monkeypatch.setattr(cli, "_plan_kind", lambda path: "decoder")
    monkeypatch.setattr(cli, "_load_decoder_runner", lambda path: FakeRunner(SPEC))

    def invoke(*args, stdin=None):
        return CliRunner().invoke(cli.main, ["run", str(plan), *map(str, args)], input=stdin)
    return invoke


def test_cli_synthetic_workload_json(decoder_cli, tmp_path):
    out = tmp_path / "out.jsonl"
    result = decoder_cli("--num-requests", 6, "--input-len", "4:30", "--output-len", 5, "--json", "--outputs", out,
                         "--max-num-seqs", 4)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["requests"] == 6 and summary["output_tokens"] == 30 and summary["max_num_seqs"] == 4
    assert isinstance(summary["batch_invariant_gemms"], dict)  # the fake runner has no GEMMs to report
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [len(r["output_ids"]) for r in records] == [5] * 6


def test_cli_prompt_json_report_holds_the_answer(decoder_cli, tmp_path):
    out = tmp_path / "out.jsonl"
    result = decoder_cli("--prompt", "hello", "--max-tokens", 6, "--json", "--outputs", out)
    assert result.exit_code == 0, result.output
    summary, (record,) = json.loads(result.stdout), [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["text"] == record["text"] and summary["finish_reason"] == record["finish_reason"]
    assert summary["output_tokens"] == len(record["output_ids"]) == 6


def test_cli_json_report_has_vllm_benchmark_keys_consistent_with_the_outputs(decoder_cli, tmp_path):
    out = tmp_path / "out.jsonl"
    result = decoder_cli("--num-requests", 7, "--input-len", "4:30", "--output-len", "1:9", "--json", "--outputs", out)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["completed_requests"] == len(records) == 7 and summary["failed_requests"] == 0
    assert summary["output_tokens"] == sum(len(r["output_ids"]) for r in records)
    assert summary["prompt_tokens"] == sum(r["prompt_tokens"] for r in records)
    duration = summary["duration_s"]
    assert summary["requests_per_s"] == pytest.approx(7 / duration)
    assert summary["output_tok_s"] == pytest.approx(summary["output_tokens"] / duration)
    assert summary["total_tok_s"] == pytest.approx((summary["output_tokens"] + summary["prompt_tokens"]) / duration)
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        stats = summary[key]
        assert set(stats) == {"mean", "std", "p50", "p90", "p99"} and stats["std"] >= 0
        assert stats["p50"] <= stats["p99"]
    assert summary["ttft_ms"]["p99"] <= summary["e2e_ms"]["p99"]
    # each request's own latencies, which the summary's statistics are made of
    for key, values in (("ttft_ms", [r["ttft_s"] for r in records]), ("e2e_ms", [r["e2e_s"] for r in records]),
                        ("itl_ms", [gap for r in records for gap in r["itl_s"]])):
        assert summary[key]["mean"] == pytest.approx(1e3 * np.mean(values))
        assert summary[key]["p50"] == pytest.approx(1e3 * np.median(values))
    assert all(len(r["itl_s"]) == len(r["output_ids"]) - 1 for r in records)


def test_cli_summary_says_na_for_latencies_it_could_not_measure(decoder_cli):
    result = decoder_cli("--num-requests", 2, "--input-len", 4, "--output-len", 1)  # one token: no TPOT, no ITL
    assert result.exit_code == 0, result.output
    assert "TPOT n/a; ITL n/a; end to end p50 " in result.stdout and "TTFT p50 " in result.stdout


def test_cli_static_continuous_and_decode_priority_agree(decoder_cli, tmp_path):
    outputs = {}
    for name, options in (("static", ["--batching", "static"]), ("continuous", []), ("itl", ["--itl-factor", 1.2])):
        out = tmp_path / f"{name}.jsonl"
        assert decoder_cli("--num-requests", 5, "--input-len", "3:40", "--output-len", "2:9", *options,
                           "--outputs", out).exit_code == 0
        outputs[name] = [json.loads(line)["output_ids"] for line in out.read_text().splitlines()]
    assert outputs["static"] == outputs["continuous"] == outputs["itl"]


def test_cli_prompt_streams_text(decoder_cli):
    result = decoder_cli("--prompt", "hello", "--max-tokens", 12, "--temperature", 0.5, "--seed", 4)
    assert result.exit_code == 0, result.output
    assert result.stdout.endswith("\n") and len(result.stdout) > 1
    assert "TTFT" not in result.stdout  # a pipe gets the text alone; the timings go to stderr, one line
    (timings,) = result.stderr.strip().splitlines()
    assert re.fullmatch(r"\[\d+ prompt tokens, \d+ generated; TTFT \d+ ms(; TPOT [\d.]+ ms \([\d.]+ tok/s\))?\]", timings)


def test_cli_top_k_and_top_p_reach_the_sampler(decoder_cli, tmp_path):
    def output_ids(*options):
        out = tmp_path / "out.jsonl"
        result = decoder_cli("--num-requests", 3, "--input-len", 5, "--output-len", 12, "--outputs", out, *options)
        assert result.exit_code == 0, result.output
        return [json.loads(line)["output_ids"] for line in out.read_text().splitlines()]
    greedy = output_ids()
    assert output_ids("--temperature", 5, "--top-k", 1) == greedy  # one candidate left: the argmax
    assert output_ids("--temperature", 5, "--top-p", 1e-9) == greedy  # the smallest set is the argmax alone
    assert output_ids("--temperature", 5) != greedy
    result = decoder_cli("--num-requests", 1, "--top-p", 0)
    assert result.exit_code == 2 and "Invalid value for '--top-p'" in result.stderr


def test_cli_prompt_that_is_not_unicode_is_bad_input(decoder_cli):
    result = decoder_cli("--prompt", "caf\udce9")  # a non-UTF-8 byte in argv, as Python keeps it
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: --prompt: character 3 ('\\udce9') is not valid Unicode (bytes that are not UTF-8, or a lone surrogate)"]


def test_cli_prompt_refused_by_the_chat_template_is_bad_input(decoder_cli, monkeypatch):
    def runner(path):
        fake = FakeRunner(SPEC)
        fake.chat_template = "{{ raise_exception('Conversations must start with a system message') }}"
        return fake
    monkeypatch.setattr(cli, "_load_decoder_runner", runner)
    result = decoder_cli("--prompt", "hi")
    assert result.exit_code == 2  # was an internal error (exit 1)
    assert result.stderr.strip().splitlines() == ["error: --prompt: the model's chat template refuses the "
                                                  "conversation: Conversations must start with a system message"]


def test_cli_op_profile_needs_an_infc_executor(decoder_cli):
    result = decoder_cli("--num-requests", 2, "--op-profile")  # the fake runner has none
    assert result.exit_code == 2 and "--op-profile times the steps of infc's executors" in result.stderr


def test_cli_refuses_a_trace_with_an_unservable_request_before_serving(decoder_cli, tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"prompt_ids": [1, 2, 3], "max_tokens": 3}\n{"prompt_ids": []}\nnot json\n')
    out = tmp_path / "out.jsonl"
    result = decoder_cli("--workload", trace, "--json", "--outputs", out)
    assert result.exit_code == 2 and result.stdout == ""  # no report of a run that did not happen
    assert result.stderr.strip().splitlines() == [f"error: {trace}:3: not JSON (Expecting value)"]
    assert not out.exists()
    trace.write_text('{"prompt_ids": [1, 2, 3], "max_tokens": 3}\n{"prompt_ids": []}\n{"prompt_ids": [1, 900]}\n')
    result = decoder_cli("--workload", trace, "--json", "--outputs", out)
    assert result.exit_code == 2 and result.stdout == "" and not out.exists()
    assert result.stderr.strip().splitlines() == [
        f"error: {trace}:2: empty prompt (and 1 more requests that cannot be served)"]


def test_cli_workload_from_standard_input(decoder_cli, tmp_path):
    trace = '\ufeff{"prompt_ids": [1, 2, 3], "max_tokens": 3}\n\n{"prompt_ids": [4, 5], "max_tokens": 2}\n'
    out = tmp_path / "out.jsonl"
    result = decoder_cli("--workload", "-", "--json", "--outputs", out, stdin=trace.encode())
    assert result.exit_code == 0, result.output
    assert [len(json.loads(line)["output_ids"]) for line in out.read_text().splitlines()] == [3, 2]
    result = decoder_cli("--workload", "-", stdin=b'{"prompt_ids": [1]}\n{"prompt_ids": "x"}\n')
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: <stdin>:2: 'prompt_ids' must be a list of integers"


def test_cli_max_num_seqs_above_the_token_budget_is_noted(decoder_cli):
    result = decoder_cli("--num-requests", 3, "--input-len", 4, "--output-len", 2, "--max-num-seqs", 4096, "--json")
    assert result.exit_code == 0, result.output
    assert "warning: --max-num-seqs 4096 is above the plan's max_num_batched_tokens 2048" in result.stderr
    assert json.loads(result.stdout)["max_num_seqs"] == 4096


def test_cli_malformed_trace_lines_are_refused_before_the_engine_starts(decoder_cli, monkeypatch, tmp_path):
    import infc.compiler.runtime.engine as engine_module

    def no_engine(*args, **kwargs):
        raise AssertionError("the engine (its KV pool and warm-up) is not needed to find a malformed line")
    monkeypatch.setattr(engine_module, "Engine", no_engine)
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"prompt_ids": [1]}\n{"prompt_ids": [1], "max_tokens": "4"}\n[]\n')
    result = decoder_cli("--workload", trace)
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {trace}:2: 'max_tokens' has the wrong type (str) (and 1 more malformed lines)"]


@pytest.mark.parametrize("options, fragment", [
    (["--num-requests", 2, "--input-len", 600], "--input-len 600 --output-len 128: request 0: 600 prompt + 128 output "
                                                "tokens are past the plan's max_model_len 512 (and 1 more)"),
    # fits the prompt, but the output would be cut short: fewer tokens than the benchmark asked for
    (["--num-requests", 3, "--input-len", "400:500", "--output-len", 120],
     "--input-len 400:500 --output-len 120: request 0: 4"),
    (["--workload", "{trace}"], "{trace}:2: token id 999 is outside the vocabulary"),
    (["--workload", "{trace}", "--max-tokens", 0], "Invalid value for '--max-tokens': 0 is not in the range x>=1"),
    (["--workload", "{trace}", "--temperature", -1], "Invalid value for '--temperature'"),
    (["--workload", "{trace}", "--seed", -1], "Invalid value for '--seed'"),
    (["--workload", "{seeded}"], "{seeded}:1: seed must be an integer >= 0, got -3"),
    (["--workload", "{late}"], "{late}:1: arrival_s 1e+308 is not seconds after the start of the run"),
    # was an OverflowError in time.sleep (exit 1)
    (["--num-requests", 3, "--rate", 1e-300], "request 1: arrival_s "),
])
def test_cli_unservable_requests_are_one_error_line_and_no_outputs(decoder_cli, tmp_path, options, fragment):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"prompt_ids": [1, 2]}\n{"prompt_ids": [1, 999]}\n')
    seeded = tmp_path / "seeded.jsonl"
    seeded.write_text('{"prompt_ids": [1, 2], "temperature": 0.5, "seed": -3}\n')
    late = tmp_path / "late.jsonl"
    late.write_text('{"prompt_ids": [1, 2], "arrival_s": 1e308}\n')
    out = tmp_path / "out.jsonl"
    names = {"trace": trace, "seeded": seeded, "late": late}
    result = decoder_cli(*[str(o).format(**names) for o in options], "--outputs", out)
    assert result.exit_code == 2 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and fragment.format(**names) in line
    assert not out.exists()


def test_cli_a_request_that_never_fits_the_pool_is_refused(decoder_cli, monkeypatch, tmp_path):
    monkeypatch.setattr(cli, "_load_decoder_runner", lambda path: _with_profile(FakeRunner(SPEC), num_kv_blocks=4))
    result = decoder_cli("--num-requests", 1, "--input-len", 20, "--output-len", 20)  # 40 tokens: 5 blocks of 8
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: --input-len 20 --output-len 20: request 0: needs 5 KV blocks at full length, the pool has 4"]


def _with_profile(runner, **decode_profile):
    runner.decode_profile = decode_profile
    return runner


def test_cli_needs_exactly_one_request_source(decoder_cli):
    result = decoder_cli("--prompt", "a", "--num-requests", 2)
    assert result.exit_code == 2 and "exactly one of --prompt, --workload and --num-requests" in result.stderr


@pytest.mark.parametrize("options, message", [
    (["--workload", "{trace}", "--rate", 5], "--rate applies to --num-requests, not --workload (a trace gives each "
                                             "request's arrival_s)"),
    (["--prompt", "hi", "--input-len", 5], "--input-len applies to --num-requests, not --prompt"),
    (["--num-requests", 2, "--max-tokens", 5], "--max-tokens applies to --prompt and --workload, not --num-requests "
                                               "(synthetic output lengths come from --output-len)"),
    (["--num-requests", 2, "--iterations", 3], "{plan}: --iterations is for one-shot plans; a decoder plan serves "
                                               "requests (--prompt, --workload or --num-requests)"),
    (["--input-len", 5], "a decoder plan takes exactly one of --prompt, --workload and --num-requests"),
])
def test_cli_refuses_options_its_request_source_would_ignore(decoder_cli, tmp_path, options, message):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"prompt_ids": [1, 2]}\n')
    plan = tmp_path / "fake.plan"
    result = decoder_cli(*[str(o).format(trace=trace) for o in options])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == ["error: " + message.format(plan=plan)]


def test_cli_decoder_options_on_a_one_shot_plan(monkeypatch, tmp_path):
    plan = tmp_path / "p.plan"
    plan.write_bytes(b"INFCPLAN")
    monkeypatch.setattr(cli, "_plan_kind", lambda path: "one_shot")
    result = CliRunner().invoke(cli.main, ["run", str(plan), "--prompt", "hi"])
    assert result.exit_code == 2 and "--prompt needs a decoder plan" in result.stderr
    for option, value in (("--rate", "3"), ("--batching", "static"), ("--temperature", "0.5")):  # no longer ignored
        result = CliRunner().invoke(cli.main, ["run", str(plan), option, value])
        assert result.exit_code == 2 and f"{option} needs a decoder plan" in result.stderr


def test_cli_decoder_options_on_a_missing_plan_name_the_file(tmp_path):
    result = CliRunner().invoke(cli.main, ["run", str(tmp_path / "none.plan"), "--num-requests", "2"])
    assert result.exit_code == 2 and result.stderr.strip() == f"error: {tmp_path / 'none.plan'}: no such plan file"


def test_spec_is_what_the_runner_reports():
    assert isinstance(FakeRunner(SPEC).spec, ModelSpec)


@pytest.mark.parametrize("content, fragment", [(None, "no such plan file"), (b"", "not an infc plan (bad magic)"),
                                               (b"\x08\x07onnx bytes", "not an infc plan (bad magic)")])
def test_cli_decoder_options_on_a_file_that_is_no_plan(tmp_path, content, fragment):
    plan = tmp_path / "model.plan"
    if content is not None:
        plan.write_bytes(content)
    for options in (["--prompt", "hi"], ["--num-requests", "2"], []):
        result = CliRunner().invoke(cli.main, ["run", str(plan), *options])
        assert result.exit_code == 2
        assert result.stderr.strip().splitlines() == [f"error: {plan}: {fragment}"]  # not "needs a decoder plan"
