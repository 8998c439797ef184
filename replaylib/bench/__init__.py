"""Benchmark: the replay of a fixed workload, this package's engine against a naive baseline.

    python -m replaylib.bench --device cpu|cuda [--workload small|paper|tiny]
                              [--engine hf|vllm] [--workers N] [--bandwidth-tbs 4.8]
    python -m replaylib.bench --device cuda --workload paper7b --engine vllm [--problems N] [--startup-only]

paper7b (main_paper7b) is the paper's scale on vLLM: a random-weight model of Qwen2.5-7B-Instruct's
architecture, the paper-primary request structure with fixed lengths, the replay as stage 03 runs it
against one plain LLM.generate call with the same requests (its last line is
overhead_vs_plain_generate=<ratio>), the engine's start-up, and the projected cost of the paper's
seven configurations. The rest of this text is about the other workloads.

A workload fixes the model, the problems, the trunks (sampled by the engine itself with
the seeds of replaylib.measure.seeds.trunk_seed), the pivots (replaylib.measure.mining.mine with a fixed
Params), K and the lengths. On the same machine, in the same process and on the same
model object (same dtype, same linear kernel) it then replays every pivot's requests
(per arm: K sampled continuations and one greedy probe, prompt = job.prefix_ids(arm)):

  ours   HFEngine.run_pass(jobs, "refeed", ...): the re-feed pass, the apples-to-apples
         comparison with a re-feeding pipeline: both arms prefilled once, K + 1 rows per
         arm decoded in one batch, rows leaving at EOS / answer.
  naive  model.generate(...) one request at a time, as a typical credit pipeline does:
         every request re-feeds its whole prefix (on the slow CPU workload: the requests
         of the first `naive_pivots` pivots; rates are compared, not totals).

  ours x N (--workers N) the same pass on N engines side by side, each in a process of its own, the
         workload's problems dealt among them (replaylib.bench.side_by_side): one engine leaves a
         GPU mostly idle between its decode steps, so engines sharing it multiply its work.

Both are graded (replaylib.measure.replay.estimate) and write their records (parquet), and for
both the benchmark prints generated continuation tokens/s (continuations + probes, over
the phase's wall time), pivots/minute, peak memory, and the time split (prefill, decode,
grading, I/O, other). Its last line is

    speedup_vs_naive=<ratio> tokens_per_s=<ours> naive_tokens_per_s=<theirs>

The exactness of the fast path (record for record, bit for bit, against a deliberately slow
reference in invariant mode) is a test: tests/test_bench.py.

The dtype stays what the workload says (bf16): speed comes from the engine, never from
changing the numerics being measured."""
from .workloads import main

__all__ = ["main"]
