"""The credit tool's command line; bad input is one line on stderr and exit status 2."""
from __future__ import annotations

import argparse
import sys

from .graders import DEFAULT_TIMEOUT
from .inputs import BadInput


def credit_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m replaylib.credit",
                                 description="Counterfactual token credit of your rollouts: resume, replica and "
                                             "refeed estimates per pivot (docs/credit.md).")
    ap.add_argument("rollouts", help="JSONL, one rollout a line (id, prompt_ids, response_ids, ground_truth, ...)")
    ap.add_argument("--model", required=True, help="hub id or local directory, embedded:NAME, tiny:SEED")
    ap.add_argument("--grader", required=True, help="gsm8k, math (math-verify) or MODULE:FUNCTION (verl's "
                                                    "compute_score signature)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--passes", default="resume,replica,refeed", help="comma-separated: resume, replica, refeed")
    ap.add_argument("--k", type=int, default=4, help="continuations per arm")
    ap.add_argument("--margin", type=float, default=1.0, help="pivot when top-1 minus top-2 logprob is below this")
    ap.add_argument("--max-pivots-per-rollout", type=int, default=3)
    ap.add_argument("--max-cont-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.7, help="continuation temperature")
    ap.add_argument("--top-p", type=float, default=0.95, help="continuation nucleus")
    ap.add_argument("--probe-tokens", type=int, default=1, help="greedy probe length per arm")
    ap.add_argument("--stop-at-answer", action="store_true", help="stop a continuation once its boxed answer is complete")
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf",
                    help="hf (transformers) or vllm (0.22.1, CUDA: the response forced through its decode)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--serving", choices=["multiprocess", "inprocess"], default="multiprocess",
                    help="vllm: its default multi-process engine, as pipelines run it, or in-process")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                    help="vllm: share of GPU memory for the weights (and, with --kv-cache-gib 0, the cache)")
    ap.add_argument("--kv-cache-gib", type=float, default=4.0,
                    help="vllm: a KV cache of this many GiB, fixed, so the engine starts beside other engines on one "
                         "GPU (a trainer's, the stages'); 0: what --gpu-memory-utilization leaves after vLLM profiles "
                         "the free memory, which fails when other processes allocate or free memory meanwhile")
    ap.add_argument("--max-model-len", type=int, default=4096, help="vllm: context length")
    ap.add_argument("--enforce-eager", action="store_true",
                    help="vllm: no CUDA graphs; give it when the rollouts were sampled without them (an LLM built "
                         "with enforce_eager=True), else the certificates differ by the kernels alone")
    ap.add_argument("--executor", choices=["local", "ray"], default="local",
                    help="local: one engine; ray: --workers engines on Ray actors (one GPU each on CUDA)")
    ap.add_argument("--workers", type=int, default=1, help="ray: engines to start")
    ap.add_argument("--ray-address", default="", help="ray: empty starts a local instance; auto or HOST:PORT joins "
                                                      "a running cluster")
    ap.add_argument("--dtype", choices=["bfloat16", "float32", "float16"], default="bfloat16")
    ap.add_argument("--invariant", action="store_true", help="the engine's invariant mode: all passes must agree")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", choices=["hash", "replay"], default="hash",
                    help="hash: from (id, position, arm, k, seed); replay: stage 03's, ids '<problem_id>:<rollout>'")
    ap.add_argument("--success-above", type=float, default=0.0, help="success is a score above this")
    ap.add_argument("--grader-kind", choices=["auto", "verl", "trl", "openrlhf"], default="auto",
                    help="how a MODULE:FUNCTION grader is called: auto (from its parameters), verl (compute_score), "
                         "trl (reward function), openrlhf (reward_func(queries, prompts, labels))")
    ap.add_argument("--logprobs-temperature", type=float, default=1.0,
                    help="the temperature the rollouts' per-position logprobs were taken at (log softmax(logits/T))")
    ap.add_argument("--grader-timeout", type=float, default=DEFAULT_TIMEOUT,
                    help=f"seconds a call of a MODULE:FUNCTION grader may take ({DEFAULT_TIMEOUT:g}; at most "
                         f"86400)")
    return ap


def export_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m replaylib.credit export",
                                 description="A run's stage-01 trunks as credit-tool rollouts.")
    ap.add_argument("run_dir", help="runs/<config>")
    ap.add_argument("--out", required=True, help="the JSONL to write")
    ap.add_argument("--with-pivots", action="store_true", help="add the stage-02 pivots as positions")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["export"]:
            from .export import export
            a = export_parser().parse_args(argv[1:])
            n = export(a.run_dir, a.out, a.with_pivots)
            print(f"{n} rollouts written to {a.out}")
            return 0
        from .. import log_to_stdout
        from .tool import Settings, run
        a = credit_parser().parse_args(argv)
        log_to_stdout()
        settings = Settings(model=a.model, grader=a.grader, passes=[p for p in a.passes.split(",") if p], k=a.k,
                            margin=a.margin, max_pivots_per_rollout=a.max_pivots_per_rollout,
                            max_cont_tokens=a.max_cont_tokens, temperature=a.temperature, top_p=a.top_p,
                            probe_tokens=a.probe_tokens, stop_at_answer=a.stop_at_answer, engine=a.engine,
                            device=a.device, dtype=a.dtype, invariant=a.invariant, seed=a.seed, seeds=a.seeds,
                            success_above=a.success_above, grader_timeout=a.grader_timeout, serving=a.serving,
                            grader_kind=a.grader_kind, logprobs_temperature=a.logprobs_temperature,
                            gpu_memory_utilization=a.gpu_memory_utilization, kv_cache_gib=a.kv_cache_gib,
                            max_model_len=a.max_model_len, enforce_eager=a.enforce_eager,
                            executor=a.executor, workers=a.workers, ray_address=a.ray_address)
        summary = run(a.rollouts, a.out, settings)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    floor, refeed = summary["floor"], summary["refeed"]
    show = lambda x: "-" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    certs = ", ".join(f"{n} {c}" for c, n in summary["certificates"].items()) or "none"
    flagged = f"; {summary['not_verified']} pivots whose resume could not be verified (left out)" \
        if summary["not_verified"] else ""
    print(f"{summary['pivots']} pivots; sign of A differs from resume's: replica {show(floor)} (the floor), "
          f"refeed {show(refeed)}; certificates: {certs}{flagged}; {a.out}/credit.parquet, summary.json, "
          f"timing.json, report.html")
    printed = summary.get("grader", {}).get("printed_bytes", 0)
    if printed:
        print(f"the grader printed {printed} bytes over {summary['grader']['calls']} calls (not shown; the first "
              f"characters are summary.json's grader.printed_head)")
    if summary.get("invariant_ok") is False:
        print(f"error: --invariant: the passes' continuations differ at {summary['pivots'] - summary['passes_agree']} "
              f"pivots, where invariant mode must make them identical", file=sys.stderr)
        return 1
    return 0
