#!/bin/bash
# Lease 18 (run 2026-12-07 on an H100, code 9df14cf; docs/gpu-h200.md, "Lease 18"; what came back: lease18/):
# what lease 17 could not show, on TRL's GRPOTrainer with vLLM colocated (examples/trl_grpo_vllm_credit.py). The
# parts took 19 calls and about a minute; the chain 10 minutes:
#   1. grpo_nobudget: 5 steps with no budget to speak of (--budget-share 1000): every rollout measured on TRL's
#      engine. Step 1 is forced as sampled (its calibration resets the prefix cache); from step 2 on, each step's
#      first group resumes the blocks TRL's own decode left cached (certificate "sampler's blocks"), the others
#      force the batch as sampled (certificates against the tap's raw top-k and logprobs). 20 prompts: the verdict.
#   2. grpo_budget: 100 steps in the default budget: the share of the training's time credit takes.
#   3. grpo_groups: 1 step with each prompt's group forced alone (what forcing the batch buys).
#   Each trainer gets its own MASTER_PORT (two in one container collide on 29500: lease 17). Then, by hand on the
#   same machine (the commands in docs/gpu-h200.md): the paper-size campaign's stages with tests/test_gpu.py beside.
#   lease18.sh parts        copy the parts this call carried under /tmp; the first call also starts the chain
#   lease18.sh poll SECS    wait up to SECS for the chain's end; report; pack the logs and the GRPO outputs
# Parts: lease17_parts.sh WHEELHOUSE_TAR lease16.image-packages (the vLLM wheelhouse .gpu/pNN, the extra wheels
# .whl/xNN, Qwen's GGUF .whl/qNN; their counts and sha256 in lease17.parts).
L=/tmp/logs; mkdir -p $L
HERE=$(cd "$(dirname "$0")" && pwd)
source $HERE/chainlib.sh
source $HERE/lease17.parts  # N_* and *_SHA of the parts
case $1 in
parts)
  put_parts q
  start_chain docs/gpu-h200/scripts/lease18.sh
  echo "parts: wheelhouse $(ls /tmp/whp 2>/dev/null | wc -l)/$N_WH extra $(ls /tmp/xp 2>/dev/null | wc -l)/$N_X" \
    "qwen $(ls /tmp/qp 2>/dev/null | wc -l)/$N_Q; $(tail -1 $L/progress 2>/dev/null)";;
chain)
  chain_prologue
  step trl_version 60 python3 -c "import trl, datasets, accelerate; print('trl', trl.__version__, 'datasets', datasets.__version__, 'accelerate', accelerate.__version__)"
  wait_for /tmp/qp $N_Q; checked "/tmp/qp/*" $Q_SHA || fail "qwen parts"
  mkdir -p /tmp/gg && cat /tmp/qp/* > /tmp/gg/qwen.gguf && rm -rf /tmp/qp
  step convert_qwen 600 python3 -m replaylib.models fetch qwen2.5-coder-0.5b-instruct --gguf /tmp/gg/qwen.gguf ||
    fail "qwen conversion"
  grpo() { step $1 900 env MASTER_PORT=$2 python3 examples/trl_grpo_vllm_credit.py --out /tmp/$1 "${@:3}"; }
  grpo grpo_nobudget 29611 --steps 5 --budget-share 1000
  grpo grpo_budget 29613 --steps 100
  grpo grpo_groups 29612 --steps 1 --budget-share 1000 --forcing groups
  chain_epilogue;;
poll)
  poll_and_pack ${2:-60}
  for f in $L/grpo*.log $L/gpu_tests.log; do [ -f $f ] && { echo "--- $(basename $f)"
    grep -E "Traceback|Error|credit: re-feed|train_s|passed|failed|warning" $f | tail -5 | cut -c1-600; }; done
  for d in grpo_nobudget grpo_groups grpo_budget; do [ -f /tmp/$d/metrics.jsonl ] && echo "$d: $(grep -c credit/seconds /tmp/$d/metrics.jsonl) steps"; done
  [ -n "$OUT" ] && tar -czf $OUT/grpo.tgz -C /tmp $(cd /tmp && ls -d grpo*/metrics.jsonl grpo*/credit 2>/dev/null);;
*) echo "usage: lease18.sh parts|poll SECS"; exit 2;;
esac
