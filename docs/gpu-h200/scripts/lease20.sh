#!/bin/bash
# Lease 20 (as run, 2026-12-07, an H100, in the 496 s lease 19's session had left; docs/gpu-h200.md): the GRPO
# example as it then shipped, in the default budget: continuations as long as the trainer's completions (lease 19's
# were cut at 128 tokens) and an account that reads a batch only once it can pay for a rollout and the reading
# (lease 19: 14 of 42 reads measured nothing). The device time ran out at step 68 of 100.
#   grpo_default: examples/trl_grpo_vllm_credit.py --steps 100, nothing else given.
#   lease20.sh parts        copy the parts this call carried under /tmp; the first call also starts the chain
#   lease20.sh poll SECS    wait up to SECS for the chain's end; report; pack the logs and the run's outputs
# Parts: as lease 19's (lease17.parts).
L=/tmp/logs; mkdir -p $L
HERE=$(cd "$(dirname "$0")" && pwd)
source $HERE/chainlib.sh
source $HERE/lease17.parts  # N_* and *_SHA of the parts
case $1 in
parts)
  put_parts q
  start_chain docs/gpu-h200/scripts/lease20.sh
  echo "parts: wheelhouse $(ls /tmp/whp 2>/dev/null | wc -l)/$N_WH extra $(ls /tmp/xp 2>/dev/null | wc -l)/$N_X" \
    "qwen $(ls /tmp/qp 2>/dev/null | wc -l)/$N_Q; $(tail -1 $L/progress 2>/dev/null)";;
chain)
  chain_prologue
  wait_for /tmp/qp $N_Q; checked "/tmp/qp/*" $Q_SHA || fail "qwen parts"
  mkdir -p /tmp/gg && cat /tmp/qp/* > /tmp/gg/qwen.gguf && rm -rf /tmp/qp
  step convert_qwen 600 python3 -m replaylib.models fetch qwen2.5-coder-0.5b-instruct --gguf /tmp/gg/qwen.gguf ||
    fail "qwen conversion"
  step grpo_default 900 env MASTER_PORT=29615 python3 examples/trl_grpo_vllm_credit.py --out /tmp/grpo_default --steps 100
  chain_epilogue;;
poll)
  poll_and_pack ${2:-60}
  [ -f $L/grpo_default.log ] && grep -E "Traceback|Error|credit: |train_s" $L/grpo_default.log | tail -6 | cut -c1-400
  [ -f /tmp/grpo_default/metrics.jsonl ] && echo "$(grep -c credit/bank_s /tmp/grpo_default/metrics.jsonl) steps logged"
  [ -n "$OUT" ] && [ -d /tmp/grpo_default ] && tar -czf $OUT/grpo.tgz -C /tmp grpo_default/metrics.jsonl $(cd /tmp && ls -d grpo_default/credit 2>/dev/null);;
*) echo "usage: lease20.sh parts|poll SECS"; exit 2;;
esac
