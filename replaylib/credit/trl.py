"""Credit inside a TRL training loop: every N steps, a sample of a GRPO step's rollouts goes through the credit
estimator on the trainer's own model, as the trainer sampled them and before its optimizer step moves the
policy, and the credit metrics join that step's logs (``trainer.state.log_history`` and every ``report_to``).

    trainer = GRPOTrainer(model=model, reward_funcs=[correct], args=args, train_dataset=dataset,
                          processing_class=tokenizer)
    CreditCallback(every=10, sample=8, ground_truth="answer", k=2).attach(trainer)
    trainer.train()

The rollouts are read where TRL has them as token ids, its tensors ``prompt_ids``/``prompt_mask`` (left
padded) and ``completion_ids``/``completion_mask`` (right padded), from the method that samples and scores
a step (``GRPOTrainer._generate_and_score_completions``, wrapped); the dataset rows beside them give each
rollout's ground truth (the column ``ground_truth`` names) and the grader's other columns. The grader is the
trainer's first reward function unless one is given. Where TRL kept the sampled tokens' logprobs
(``sampling_per_token_logps`` with vLLM, else ``old_per_token_logps``), they are certified at the trainer's
temperature. The metrics (``credit/floor``, ``credit/refeed``, ``credit/pivots``, ``credit/certified``,
``credit/seconds``, ...) are averaged by TRL like its own."""
from __future__ import annotations

import time

from transformers import TrainerCallback

TRL_LOGPROBS = ("sampling_per_token_logps", "old_per_token_logps")


class CreditCallback(TrainerCallback):
    def __init__(self, every: int = 10, sample: int = 8, ground_truth: str = "answer", grader=None,
                 prefix: str = "credit/", **settings):
        if every < 1 or sample < 1:
            raise ValueError(f"CreditCallback: every ({every}) and sample ({sample}) must be at least 1")
        self.every, self.sample, self.ground_truth, self.grader = every, sample, ground_truth, grader
        self.prefix, self.settings = prefix, settings
        self.estimator, self.trainer, self.logged = None, None, {}

    def attach(self, trainer) -> "CreditCallback":
        """Wrap the trainer's sampling of a step and add this callback; returns it."""
        self.trainer = trainer
        sample_and_score = trainer._generate_and_score_completions

        def wrapped(inputs):
            out = sample_and_score(inputs)
            step = trainer.state.global_step + 1  # the optimizer step these rollouts are for
            if trainer.model.training and (step - 1) % self.every == 0 and step not in self.logged:
                self.logged[step] = self.measure(out, inputs)
                for name, value in self.logged[step].items():
                    trainer._metrics["train"][name].append(value)
            return out

        trainer._generate_and_score_completions = wrapped
        trainer.add_callback(self)
        return self

    def batch(self, out: dict, inputs: list[dict]) -> dict:
        """The first ``sample`` rollouts of a step as the estimator reads a TRL batch: its tensors, the dataset
        columns of each row, and the sampled tokens' logprobs where TRL kept them."""
        from .inputs import ALIASES
        n = min(self.sample, len(inputs))
        batch = {k: out[k][:n] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
        for name in inputs[0]:
            if name != "prompt":  # the other columns reach a TRL reward function as its keyword arguments
                batch[name] = [row[name] for row in inputs[:n]]
        truth = "ground_truth" if self.ground_truth not in ALIASES["ground_truth"] else self.ground_truth
        batch[truth] = [str(row[self.ground_truth]) for row in inputs[:n]]
        logprobs = next((out[k] for k in TRL_LOGPROBS if out.get(k) is not None), None)
        if logprobs is not None:  # the sampled tokens' logprobs, at the trainer's temperature (the estimator's)
            batch["logprobs"] = logprobs[:n]
        return batch

    def measure(self, out: dict, inputs: list[dict]) -> dict:
        """The credit metrics of one step's sample, as floats (nan where a share has no pivot to count)."""
        from .estimator import Estimator
        started = time.perf_counter()
        if self.estimator is None:
            model = self.trainer.accelerator.unwrap_model(self.trainer.model)
            grader = self.grader or self.trainer.reward_funcs[0]
            settings = {"logprobs_temperature": float(self.trainer.args.temperature), **self.settings}
            self.estimator = Estimator(model=model, tokenizer=self.trainer.processing_class, grader=grader,
                                       **settings)
        self.estimator(self.batch(out, inputs))
        metrics = self.estimator.metrics(self.prefix)
        metrics[f"{self.prefix}seconds"] = time.perf_counter() - started
        return metrics

    def on_train_end(self, args, state, control, **kwargs):
        if self.estimator is not None:
            self.estimator.close()
            self.estimator = None
