"""Counterfactual credit inside a TRL training loop: two GRPO steps of a tiny random-weight Qwen2 model on the CPU,
with replaylib's CreditCallback measuring credit on every step's rollouts (the replica floor, how often re-feeding
changes the sign of A, pooled over the run with their intervals and the verdict, the certificates, the seconds it
took) and logging it with the trainer's own metrics.

    python examples/trl_grpo_credit.py                 # about a minute on a laptop CPU, offline
    python examples/trl_grpo_credit.py --typed-rows    # a dataset with an id column and integer answers, and a
                                                       # reward written for conversational completions that uses
                                                       # TRL's trainer_state, log_metric and completion_ids

Its last line is the credit metrics TRL logged, one JSON object per step; every pivot is also a row of
<output_dir>/credit/pivots.jsonl. With a real model: pass it and its tokenizer to GRPOTrainer as usual, the
reward function you train with, and the callback's settings (k, margin, max_cont_tokens, ...; docs/credit.md).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")  # TRL reads a deprecated property
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from replaylib.credit.trl import CreditCallback  # noqa: E402
from replaylib.measure.models import resolve_model  # noqa: E402


def correct(prompts, completions, answer, **kwargs) -> list[float]:
    """The reward GRPO trains with: 1 when the completion contains the answer (also the credit's grader)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if a in t else 0.0 for t, a in zip(texts, answer)]


def last_number_is_answer(prompts, completions, answer, id, trainer_state, log_metric, completion_ids,
                          **kwargs) -> list[float]:
    """A reward written for TRL's conversational data: the completion's message text, the integer answer as the
    dataset holds it, and TRL's extra arguments."""
    log_metric("reward/step_seen", float(trainer_state.global_step))
    rewards = []
    for completion, gold, ids in zip(completions, answer, completion_ids):
        numbers = re.findall(r"-?\d+", completion[0]["content"])
        rewards.append(1.0 if numbers and int(numbers[-1]) == gold and len(ids) > 0 else 0.0)
    return rewards


def tiny_model_and_tokenizer():
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny:0"))  # the package's tiny tokenizer, local files
    tokenizer.padding_side = "left"
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    model = Qwen2ForCausalLM(config)  # random weights: the numbers mean nothing, the plumbing is the point
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def rows(typed: bool) -> list[dict]:
    """Eight questions; typed: with an id column and the answers as integers."""
    if typed:
        return [{"id": f"problem-{i}", "prompt": [{"role": "user", "content": f"What is {i} + {i + 1}?"}],
                 "answer": 2 * i + 1} for i in range(8)]
    return [{"prompt": [{"role": "user", "content": f"What is {i} + {i + 1}?"}], "answer": str(2 * i + 1)}
            for i in range(8)]


def trainer_with_credit(reward, dataset_rows: list[dict], out: str, steps: int = 2, **credit) -> GRPOTrainer:
    """A GRPOTrainer of a tiny model on the CPU (4 rollouts a step: one prompt's 4 generations) with the
    CreditCallback attached."""
    torch.manual_seed(0)
    model, tokenizer = tiny_model_and_tokenizer()
    args = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, fp16=False, activation_checkpointing=False,
                      per_device_train_batch_size=4, gradient_accumulation_steps=1, num_generations=4,
                      max_completion_length=16, max_steps=steps, logging_steps=1, report_to="none",
                      save_strategy="no", use_vllm=False, beta=0.0, temperature=1.0, seed=0,
                      dataloader_num_workers=0, disable_tqdm=True)
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=Dataset.from_list(dataset_rows),
                          processing_class=tokenizer)
    # every step, its 4 rollouts: up to 2 pivots each, 2 continuations per arm of up to 8 tokens; no time budget
    # here, so that the example measures every step (a real run keeps the default: a tenth of a step's time)
    settings = dict(every=1, sample=4, budget_share=None, k=2, margin=5.0, max_pivots_per_rollout=2,
                    max_cont_tokens=8)
    CreditCallback(**{**settings, **credit}).attach(trainer)
    return trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--typed-rows", action="store_true", help="an id column, integer answers, and a reward "
                        "for conversational completions using TRL's extra arguments")
    typed = parser.parse_args().typed_rows
    with tempfile.TemporaryDirectory() as out:
        trainer = trainer_with_credit(last_number_is_answer if typed else correct, rows(typed), out)
        trainer.train()
        pivots = Path(out, "credit", "pivots.jsonl").read_text().splitlines()
    logged = [{k: v for k, v in entry.items() if k.startswith("credit/") or k == "step"}
              for entry in trainer.state.log_history if any(k.startswith("credit/") for k in entry)]
    print(f"{len(pivots)} pivots written to <output_dir>/credit/pivots.jsonl")
    print(json.dumps(logged))


if __name__ == "__main__":
    main()
