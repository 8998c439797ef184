#!/bin/bash
# Lease 19 (as run, 2026-12-07, an H100, docs/gpu-h200.md): lease 18's GRPO runs again, after its findings: forced
# requests now end as they were sampled (at their stop token, where vLLM's async scheduler decodes them a step more),
# certificates allow ties at the top-k's lowest value, and credit's account pays its calibration back before it
# reads a batch again. The chain took 11.5 minutes after the parts; the probe stopped at once on transformers 5's
# apply_chat_template (a dict, mended since) and ran again by hand; after the chain, grpo_long (the default budget,
# 300 steps) by hand. The steps (numbered 0 to 3):
#   0. probe (lease19_probe.py): an LLM built as TRL builds its colocated one samples 4 prompts x 8 with the tap on,
#      then the batch is forced as sampled and, as lease 18 forced it, each request to its length: the
#      certificates of both, by how each rollout ended, the rows vLLM decoded past a request's end, and where each
#      forcing's schedule (the rollouts each sampler call decoded) first left the sampler's.
#   1. grpo_nobudget: 5 steps, every rollout measured on TRL's engine (--budget-share 1000): the certificates of the
#      batch forced as sampled (lease 18: 122 of 128 'differs'), the sampler's blocks resumed, the verdict.
#   2. grpo_share1: 20 steps at --budget-share 1.0: per-step metrics and the pooled verdict of a run that measures
#      what its account allows.
#   3. grpo_budget: 100 steps in the default budget (lease 18: its account never held a rollout again after the
#      calibration, 0 measured): the rollouts measured and credit's share of the training's time.
#   Each trainer gets its own MASTER_PORT (two in one container collide on 29500: lease 17).
#   lease19.sh parts        copy the parts this call carried under /tmp; the first call also starts the chain
#   lease19.sh poll SECS    wait up to SECS for the chain's end; report; pack the logs and the GRPO outputs
# Parts: lease17_parts.sh WHEELHOUSE_TAR lease16.image-packages (the vLLM wheelhouse .gpu/pNN, the extra wheels
# .whl/xNN, Qwen's GGUF .whl/qNN; their counts and sha256 in lease17.parts).
L=/tmp/logs; mkdir -p $L
HERE=$(cd "$(dirname "$0")" && pwd)
source $HERE/chainlib.sh
source $HERE/lease17.parts  # N_* and *_SHA of the parts
case $1 in
parts)
  put_parts q
  start_chain docs/gpu-h200/scripts/lease19.sh
  echo "parts: wheelhouse $(ls /tmp/whp 2>/dev/null | wc -l)/$N_WH extra $(ls /tmp/xp 2>/dev/null | wc -l)/$N_X" \
    "qwen $(ls /tmp/qp 2>/dev/null | wc -l)/$N_Q; $(tail -1 $L/progress 2>/dev/null)";;
chain)
  chain_prologue
  step trl_version 60 python3 -c "import trl, datasets, accelerate; print('trl', trl.__version__, 'datasets', datasets.__version__, 'accelerate', accelerate.__version__)"
  wait_for /tmp/qp $N_Q; checked "/tmp/qp/*" $Q_SHA || fail "qwen parts"
  mkdir -p /tmp/gg && cat /tmp/qp/* > /tmp/gg/qwen.gguf && rm -rf /tmp/qp
  step convert_qwen 600 python3 -m replaylib.models fetch qwen2.5-coder-0.5b-instruct --gguf /tmp/gg/qwen.gguf ||
    fail "qwen conversion"
  step probe 600 python3 docs/gpu-h200/scripts/lease19_probe.py
  grpo() { step $1 900 env MASTER_PORT=$2 python3 examples/trl_grpo_vllm_credit.py --out /tmp/$1 "${@:3}"; }
  grpo grpo_nobudget 29611 --steps 5 --budget-share 1000
  grpo grpo_share1 29612 --steps 20 --budget-share 1.0
  grpo grpo_budget 29613 --steps 100
  chain_epilogue;;
poll)
  poll_and_pack ${2:-60}
  [ -f $L/probe.log ] && { echo "--- probe.log"; grep -E '^\{|Error' $L/probe.log | cut -c1-900; }
  for f in $L/grpo*.log $L/gpu_tests.log; do [ -f $f ] && { echo "--- $(basename $f)"
    grep -E "Traceback|Error|credit: re-feed|train_s|passed|failed|warning" $f | tail -5 | cut -c1-600; }; done
  for d in grpo_nobudget grpo_share1 grpo_budget; do [ -f /tmp/$d/metrics.jsonl ] && echo "$d: $(grep -c credit/bank_s /tmp/$d/metrics.jsonl) steps logged, $(grep -c credit/seconds /tmp/$d/metrics.jsonl) with credit run"; done
  [ -n "$OUT" ] && tar -czf $OUT/grpo.tgz -C /tmp $(cd /tmp && ls -d grpo*/metrics.jsonl grpo*/credit 2>/dev/null);;
*) echo "usage: lease19.sh parts|poll SECS"; exit 2;;
esac
