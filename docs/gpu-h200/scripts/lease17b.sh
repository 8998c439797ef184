#!/bin/bash
# Lease 17b: what lease 17 could not show (every measured step's credit failed on the vLLM path where the summary
# copied the grader: TRL's reward holds the trainer, whose engine holds queues): examples/trl_grpo_vllm_credit.py
# without a budget, so that every step's rollouts are measured, forced through TRL's engine as it sampled them
# (grpo_nobudget, 2 steps), then each prompt's group forced alone (grpo_groups, 1 step). The parts of lease 17.
#   lease17b.sh parts        copy the parts this call carried under /tmp; the first call also starts the chain
#   lease17b.sh poll SECS    as lease17.sh poll
L=/tmp/logs; mkdir -p $L
HERE=$(cd "$(dirname "$0")" && pwd)
source $HERE/chainlib.sh
source $HERE/lease17.parts  # N_* and *_SHA of the parts
case $1 in
parts)
  put_parts q
  start_chain docs/gpu-h200/scripts/lease17b.sh
  echo "parts: wheelhouse $(ls /tmp/whp 2>/dev/null | wc -l)/$N_WH extra $(ls /tmp/xp 2>/dev/null | wc -l)/$N_X" \
    "qwen $(ls /tmp/qp 2>/dev/null | wc -l)/$N_Q; $(tail -1 $L/progress 2>/dev/null)";;
chain)
  chain_prologue
  step trl_version 60 python3 -c "import trl, datasets, accelerate; print('trl', trl.__version__, 'datasets', datasets.__version__, 'accelerate', accelerate.__version__)"
  wait_for /tmp/qp $N_Q; checked "/tmp/qp/*" $Q_SHA || fail "qwen parts"
  mkdir -p /tmp/gg && cat /tmp/qp/* > /tmp/gg/qwen.gguf && rm -rf /tmp/qp
  step convert_qwen 600 python3 -m replaylib.models fetch qwen2.5-coder-0.5b-instruct --gguf /tmp/gg/qwen.gguf ||
    fail "qwen conversion"
  grpo() { step $1 400 python3 examples/trl_grpo_vllm_credit.py --out /tmp/$1 --budget-share 1000 "${@:2}"; }
  grpo grpo_nobudget --steps 2
  grpo grpo_groups --steps 1 --forcing groups
  chain_epilogue;;
poll)
  poll_and_pack ${2:-60}
  for f in $L/grpo*.log $L/gpu_tests.log; do [ -f $f ] && { echo "--- $(basename $f)"
    grep -E "Traceback|Error|credit: re-feed|train_s|passed|failed" $f | tail -4 | cut -c1-600; }; done
  for d in grpo_nobudget grpo_groups; do [ -f /tmp/$d/metrics.jsonl ] && echo "$d: $(grep -c credit/seconds /tmp/$d/metrics.jsonl) steps"; done
  [ -n "$OUT" ] && tar -czf $OUT/grpo.tgz -C /tmp $(cd /tmp && ls -d grpo*/metrics.jsonl grpo*/credit 2>/dev/null);;
*) echo "usage: lease17b.sh parts|poll SECS"; exit 2;;
esac
