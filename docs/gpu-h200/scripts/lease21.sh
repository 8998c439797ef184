#!/bin/bash
# Lease 21 (as run, 2026-12-07, an H100, code 7f7b0a3; docs/gpu-h200.md): the GRPO example as it ships, after
# lease 20: the calibration lengthens its longer pass until the steps' cost shows (lease 20: 7 rollouts priced at
# 1.33 s took 11.2 s), and until a measured group has scaled the price a budgeted step measures one rollout. Three
# starts failed first (541 s), so the default run was cut from 300 steps to 200 before the fourth:
#   1. grpo_default: examples/trl_grpo_vllm_credit.py --steps 200, nothing else given: the first measured step's
#      price against its cost (estimated_s, seconds), the share, the rollouts and common pivots, the verdict.
#   2. grpo_share1: 20 steps at --budget-share 1.0.
#   After the chain, by hand with chainlib's step: grpo_again, the default run again for 150 steps (MASTER_PORT=29618,
#   --out /tmp/grpo_again), on the same machine after the first two runs.
#   lease21.sh parts        copy the parts this call carried under /tmp; the first call also starts the chain
#   lease21.sh poll SECS    wait up to SECS for the chain's end; report; pack the logs and the runs' outputs
# Parts: as lease 19's (lease17.parts). Numbers: lease17_numbers.py on the runs.
L=/tmp/logs; mkdir -p $L
HERE=$(cd "$(dirname "$0")" && pwd)
source $HERE/chainlib.sh
source $HERE/lease17.parts  # N_* and *_SHA of the parts
RUNS="grpo_default grpo_share1"
case $1 in
parts) qwen_parts_call docs/gpu-h200/scripts/lease21.sh;;
chain)
  chain_prologue
  qwen_from_parts
  step grpo_default 900 env MASTER_PORT=29616 python3 examples/trl_grpo_vllm_credit.py --out /tmp/grpo_default --steps 200
  step grpo_share1 600 env MASTER_PORT=29617 python3 examples/trl_grpo_vllm_credit.py --out /tmp/grpo_share1 --steps 20 \
    --budget-share 1.0
  chain_epilogue;;
poll)
  poll_and_pack ${2:-60}
  for r in $RUNS; do [ -f $L/$r.log ] && { echo "--- $r"; grep -E "Traceback|Error|credit: |train_s" $L/$r.log |
    tail -5 | cut -c1-400; }; [ -f /tmp/$r/metrics.jsonl ] && echo "$r: $(grep -c credit/bank_s /tmp/$r/metrics.jsonl) steps"; done
  kept=$(cd /tmp && ls -d grpo_*/metrics.jsonl grpo_*/credit 2>/dev/null)
  [ -n "$OUT" ] && [ -n "$kept" ] && tar -czf $OUT/grpo.tgz -C /tmp $kept;;
*) echo "usage: lease21.sh parts|poll SECS"; exit 2;;
esac
