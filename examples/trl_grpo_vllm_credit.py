"""Counterfactual credit on a real GRPO run: TRL's GRPOTrainer training the embedded model (Qwen2.5-Coder-0.5B-
Instruct) on GSM8K word problems with vLLM colocated on one GPU, and replaylib's CreditCallback measuring each
step's rollouts on that same vLLM engine (no second copy of the policy): the first group resumes the blocks TRL's
decode left in the prefix cache, the others force the batch as TRL sampled it; within its default budget of a
tenth of the training's time.

    python examples/trl_grpo_vllm_credit.py --out runs/grpo-credit            # one CUDA GPU, vLLM 0.22.1
    python examples/trl_grpo_vllm_credit.py --no-vllm --model tiny:0 --steps 1 --out /tmp/g   # the plumbing, CPU

It writes <out>/metrics.jsonl (every step's logs, the credit metrics among them), <out>/credit/pivots.jsonl (every
pivot measured) and prints each step's credit line and, last, the pooled verdict. On an H100 a step takes about
1.5 s (docs/gpu-h200.md, leases 17 to 21), so in the default budget credit's account earns about 0.15 s a step:
its calibration (3-15 s) is paid back in 20-130 steps, then it measures a rollout whenever the account holds what
a step measuring one costs, about 2 s (lease 21: 8 rollouts in 200 steps and 7 in 150, every resume verified, 0.095
and 0.090 of the training's time); --budget-share 1.0 measures several every step, and a large share (1000) every
rollout.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from replaylib.credit.trl import CreditCallback  # noqa: E402
from replaylib.credit.trl_vllm import vllm_for_credit  # noqa: E402
from replaylib.measure.data import load_problems  # noqa: E402
from replaylib.measure.grading import grade_gsm8k  # noqa: E402
from replaylib.measure.models import resolve_model  # noqa: E402

INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def correct(prompts, completions, answer, **kwargs) -> list[float]:
    """The reward GRPO trains with, and credit's grader: 1 when the final answer is the reference number."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(grade_gsm8k(t, a)) for t, a in zip(texts, answer)]


def gsm8k_rows(first: int, n: int) -> list[dict]:
    """GSM8K problems first .. first+n-1 as a conversational dataset with their reference answers."""
    problems = load_problems("gsm8k")[first:first + n]
    return [{"id": f"gsm8k-{p.problem_id}", "prompt": [{"role": "user", "content": p.question + INSTRUCTION}],
             "answer": p.gold} for p in problems]


class StepLog(TrainerCallback):
    """Each step's logs as a line of <out>/metrics.jsonl, with its wall time."""

    def __init__(self, path: Path):
        self.path, self.began = path, None

    def on_step_begin(self, args, state, control, **kwargs):
        self.began = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": state.global_step, "wall_s": time.perf_counter() - self.began, **logs}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded:qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=4, help="prompts a step (each sampled --generations times)")
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-completion-length", type=int, default=256)
    parser.add_argument("--vllm-memory", type=float, default=0.1, help="TRL's vllm_gpu_memory_utilization")
    parser.add_argument("--budget-share", type=float, default=0.1)
    parser.add_argument("--forcing", default="batch", choices=("batch", "groups"), help="the step's rollouts forced "
                        "as TRL sampled them, in one call (batch), or each prompt's group alone (groups)")
    parser.add_argument("--no-vllm", action="store_true", help="sample with transformers (no GPU needed)")
    a = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    path = str(resolve_model(a.model))
    cuda = torch.cuda.is_available()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if cuda else torch.float32)
    batch = a.prompts * a.generations
    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=batch, gradient_accumulation_steps=1,
                      num_generations=a.generations, max_completion_length=a.max_completion_length,
                      max_steps=a.steps, learning_rate=1e-6, beta=0.0, temperature=1.0, logging_steps=1,
                      report_to="none", save_strategy="no", seed=0, bf16=cuda, use_cpu=not cuda,
                      use_vllm=not a.no_vllm, vllm_mode="colocate", vllm_gpu_memory_utilization=a.vllm_memory,
                      vllm_enable_sleep_mode=False, gradient_checkpointing=cuda, disable_tqdm=True,
                      dataloader_num_workers=0)
    # a fingerprint of its own: datasets' default one pickles the table with dill, which fails on some pyarrow and
    # Python pairs ("Can't pickle <class 'MonthDayNano'>")
    dataset = Dataset(pa.Table.from_pylist(gsm8k_rows(1000, a.steps * a.prompts)), fingerprint=f"gsm8k-1000-{a.steps * a.prompts}")
    with contextlib.nullcontext() if a.no_vllm else vllm_for_credit():
        trainer = GRPOTrainer(model=model, reward_funcs=[correct], args=args, train_dataset=dataset,
                              processing_class=tokenizer)
    # every step; up to 2 pivots a rollout, 4 continuations per arm (each as long as a completion may be), in the
    # default budget
    callback = CreditCallback(every=1, budget_share=a.budget_share, k=4, max_pivots_per_rollout=2,
                              forcing=a.forcing).attach(trainer)
    trainer.add_callback(StepLog(out / "metrics.jsonl"))
    began = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - began
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for s in steps:
        if "credit/seconds" in s:
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in s.items()
                              if k.startswith("credit/") or k in ("step", "wall_s", "reward")}))
    print(json.dumps({"train_s": round(wall, 1), "credit_s": round(callback.spent_total, 1),
                      "credit_share_of_training": round(callback.spent_total / max(callback.own_s, 1e-9), 4),
                      "forced_through": "TRL's vLLM engine" if callback.llm is not None else "the policy in transformers",
                      "pooled": callback.pooled.line()}))


if __name__ == "__main__":
    main()
