#!/bin/bash
# Lease 17: credit in a real GRPO run, on TRL's own colocated vLLM engine, with the rest of the card shared.
#   1. examples/trl_grpo_vllm_credit.py: TRL's GRPOTrainer trains the embedded model (Qwen2.5-Coder-0.5B-Instruct)
#      on GSM8K with vLLM colocated; CreditCallback forces every measured step's rollouts through that engine, in
#      its default budget (a tenth of the training's time), 30 steps (/tmp/grpo). Beside it, a second trainer of its
#      own: 20 steps with credit given as much time as the training (--budget-share 1.0, /tmp/grpo-share1), for more
#      pivots and certificates.
#   2. Once both runs have logged two steps, beside them on the same card: params/campaign-gpu-paper-size.yaml
#      (6 configurations at once under one engine broker) and tests/test_gpu.py (-n 3), none of them sized for an
#      idle card: the broker's starts must wait for memory instead of failing.
#   lease17.sh parts        copy the parts this call carried under /tmp; the first call also starts the chain
#   lease17.sh poll SECS    wait up to SECS for the chain's end; report; pack logs, runs' records and the GRPO outputs
# Parts (lease17_parts.sh): the vLLM wheelhouse (.gpu/pNN), the extra wheels (.whl/x00), Qwen's GGUF (.whl/qNN).
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
  step grpo 900 python3 examples/trl_grpo_vllm_credit.py --out /tmp/grpo --steps 30 &
  grpo=$!
  step grpo_share1 900 python3 examples/trl_grpo_vllm_credit.py --out /tmp/grpo-share1 --steps 20 --budget-share 1.0 &
  share1=$!
  started() { [ "$(grep -c '"credit/seconds"' /tmp/$1/metrics.jsonl 2>/dev/null)" -ge 2 ] || grep -q "=== $2 rc" $L/progress; }
  for i in $(seq 450); do  # the campaign starts once the trainers hold their memory (two steps logged)
    started grpo grpo && started grpo-share1 grpo_share1 && break; sleep 2; done
  step gpu_tests 900 python3 -m pytest -q -rs -n 3 -p no:cacheprovider tests/test_gpu.py &
  tests=$!
  step campaign 1500 python3 -m replaylib.campaign params/campaign-gpu-paper-size.yaml --stages-only
  wait $tests $grpo $share1
  chain_epilogue;;
poll)
  poll_and_pack ${2:-60}
  [ -n "$OUT" ] && for f in $L/grpo*.log; do [ -f $f ] && { echo "--- $(basename $f)"; grep -E "Traceback|Error|credit: re-feed|train_s" $f | tail -5 | cut -c1-400; }; done
  [ -n "$OUT" ] && tar -czf $OUT/grpo.tgz -C /tmp $(cd /tmp && ls -d grpo/metrics.jsonl grpo/credit grpo-share1/metrics.jsonl grpo-share1/credit 2>/dev/null) 2>/dev/null;;
*) echo "usage: lease17.sh parts|poll SECS"; exit 2;;
esac
