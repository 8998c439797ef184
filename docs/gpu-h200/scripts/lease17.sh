#!/bin/bash
# Lease 17: credit in a real GRPO run, on TRL's own colocated vLLM engine, on a card shared with the GPU tests.
# examples/trl_grpo_vllm_credit.py: TRL's GRPOTrainer trains the embedded model (Qwen2.5-Coder-0.5B-Instruct) on GSM8K
# with vLLM colocated (4 prompts x 8 generations a step); CreditCallback forces every measured step's rollouts
# through that engine, as it sampled them (forcing "batch": the step's batch in one call).
#   grpo          30 steps in credit's default budget (a tenth of the training's time)
#   grpo_share1   beside it, a trainer of its own: 20 steps with credit given as much time as the training (more
#                 pivots and certificates)
#   grpo_groups   after grpo: 10 steps as grpo_share1, each prompt's group forced alone (forcing "groups")
#   gpu_tests     tests/test_gpu.py (-n 3), once both trainers have logged two steps
#   lease17.sh parts        copy the parts this call carried under /tmp; the first call also starts the chain
#   lease17.sh poll SECS    wait up to SECS for the chain's end; report; pack the logs and the GRPO outputs
# Parts (lease17_parts.sh): the vLLM wheelhouse (.gpu/pNN), the extra wheels (.whl/xNN), Qwen's GGUF (.whl/qNN).
L=/tmp/logs; mkdir -p $L
HERE=$(cd "$(dirname "$0")" && pwd)
source $HERE/chainlib.sh
source $HERE/lease17.parts  # N_* and *_SHA of the parts
case $1 in
parts)
  put_parts q
  start_chain docs/gpu-h200/scripts/lease17.sh
  echo "parts: wheelhouse $(ls /tmp/whp 2>/dev/null | wc -l)/$N_WH extra $(ls /tmp/xp 2>/dev/null | wc -l)/$N_X" \
    "qwen $(ls /tmp/qp 2>/dev/null | wc -l)/$N_Q; $(tail -1 $L/progress 2>/dev/null)";;
chain)
  chain_prologue
  step trl_version 60 python3 -c "import trl, datasets, accelerate; print('trl', trl.__version__, 'datasets', datasets.__version__, 'accelerate', accelerate.__version__)"
  wait_for /tmp/qp $N_Q; checked "/tmp/qp/*" $Q_SHA || fail "qwen parts"
  mkdir -p /tmp/gg && cat /tmp/qp/* > /tmp/gg/qwen.gguf && rm -rf /tmp/qp
  step convert_qwen 600 python3 -m replaylib.models fetch qwen2.5-coder-0.5b-instruct --gguf /tmp/gg/qwen.gguf ||
    fail "qwen conversion"
  grpo() { step $1 900 python3 examples/trl_grpo_vllm_credit.py --out /tmp/$1 "${@:2}"; }
  ( grpo grpo --steps 30; grpo grpo_groups --steps 10 --budget-share 1.0 --forcing groups ) &
  first=$!
  grpo grpo_share1 --steps 20 --budget-share 1.0 &
  second=$!
  started() { [ "$(grep -c '"credit/seconds"' /tmp/$1/metrics.jsonl 2>/dev/null)" -ge 2 ] || grep -q "=== $1 rc" $L/progress; }
  for i in $(seq 450); do  # the tests start once the trainers hold their memory (two steps logged)
    started grpo && started grpo_share1 && break; sleep 2; done
  step gpu_tests 900 python3 -m pytest -q -rs -n 3 -p no:cacheprovider tests/test_gpu.py
  wait $first $second
  chain_epilogue;;
poll)
  poll_and_pack ${2:-60}
  for f in $L/grpo*.log $L/gpu_tests.log; do [ -f $f ] && { echo "--- $(basename $f)"
    grep -E "Traceback|Error|credit: re-feed|train_s|passed|failed" $f | tail -4 | cut -c1-600; }; done
  for d in grpo grpo_share1 grpo_groups; do [ -f /tmp/$d/metrics.jsonl ] && echo "$d: $(grep -c credit/seconds /tmp/$d/metrics.jsonl) steps"; done
  [ -n "$OUT" ] && tar -czf $OUT/grpo.tgz -C /tmp $(cd /tmp && ls -d grpo*/metrics.jsonl grpo*/credit 2>/dev/null);;
*) echo "usage: lease17.sh parts|poll SECS"; exit 2;;
esac
