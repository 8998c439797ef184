#!/bin/bash
# Lease 15: the Qwen and Gemma 3 rows of params/campaign-gpu-families.yaml (SmolLM2's ran whole in lease 14): each
# model's primary and screened cohorts on the arith task on vLLM's multi-process engine and in-process, and each
# model's batch-invariant stage, run as two copies of the campaign file, one per model, each with its 4
# configurations at once, Gemma 3's as soon as its parts are here (the engines ask for their weights, KV cache and
# headroom; idle ones make room). Gemma 3 with the wider pivot search of its params files (40 + 40 problems, margin
# 2.0) and, beside it, on the transformers engine on CUDA (params/gpu-families-gemma3-hf.yaml). Qwen's GGUF is
# converted on the device by `python -m replaylib.models fetch` (gguf's reference dequantizer, the pinned tokenizer
# checked); Gemma 3 comes converted (transformers 5.23), as in lease 14. Last, Qwen on the transformers engine on
# CUDA up to its replay stage (lease 11 ran it on GSM8K): what a short lease leaves out first.
#   lease15.sh parts        copy the parts this call carried under /tmp; the first call also starts the chain
#   lease15.sh poll SECS    wait up to SECS for the chain's end; report; pack logs and records (no caches, no
#                           saved states) into $OUT
# Parts (docs/gpu-h200/scripts/lease14_parts.sh): the vLLM wheelhouse (.gpu/pNN), the extra wheels (.whl/x0),
# Gemma 3's converted directory as an xz'd tar (.whl/mNN), Qwen's GGUF (.whl/qNN), each split at 48M.
L=/tmp/logs; mkdir -p $L
HERE=$(cd "$(dirname "$0")" && pwd)
source $HERE/chainlib.sh
source $HERE/lease15.parts  # N_* and *_SHA of the parts
case $1 in
parts)
  put_parts m q
  start_chain docs/gpu-h200/scripts/lease15.sh
  echo "parts: wheelhouse $(ls /tmp/whp 2>/dev/null | wc -l)/$N_WH extra $(ls /tmp/xp 2>/dev/null | wc -l)/$N_X" \
    "qwen $(ls /tmp/qp 2>/dev/null | wc -l)/$N_Q gemma $(ls /tmp/mp 2>/dev/null | wc -l)/$N_M;" \
    "$(tail -1 $L/progress 2>/dev/null)";;
chain)
  chain_prologue
  hf() { step hf_$1 1500 python3 -m replaylib.run params/gpu-families-$1-hf.yaml --out /tmp/rlhf "${@:2}"; }
  campaign() {  # NAME ROWS-PREFIX: a copy of the three-family campaign with the rows of one model, run whole
    python3 - "$1" "$2" <<'PY' || { echo "=== FAILED: campaign copy $1" >> $L/progress; return 1; }
import sys, yaml
name, prefix = sys.argv[1:]
src = yaml.safe_load(open("params/campaign-gpu-families.yaml"))
keep = lambda rows: [r for r in rows if r["label"].startswith(prefix)]
src["name"], src["rows"], src["invariant"] = name, keep(src["rows"]), keep(src["invariant"])
src["figure1"] = src["rows"][0]["label"]
src["figure3"] = [p for p in src["figure3"] if any(p in r["params"] for r in src["rows"])]
src["concurrent_configs"] = 4
yaml.safe_dump(src, open(f"params/campaign-{name}.yaml", "w"), sort_keys=False)
PY
    step campaign_$1 1700 python3 -m replaylib.campaign params/campaign-$1.yaml --stages-only; }
  wait_for /tmp/mp $N_M
  checked "/tmp/mp/*" $M_SHA || fail "gemma parts"
  step gemma_dir 300 bash -c 'mkdir -p /tmp/models && cat /tmp/mp/* | python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)" | tar -xf - -C /tmp/models && rm -rf /tmp/mp &&
    python3 -m replaylib.models fetch gemma-3-270m && python3 -c "
from pathlib import Path
from replaylib.measure.models import EMBEDDED_MODELS, check_tokenizer
check_tokenizer(Path(\"/tmp/models/gemma-3-270m\"), EMBEDDED_MODELS[\"gemma-3-270m\"]); print(\"tokenizer as pinned\")"' ||
    fail "gemma directory"
  ( campaign families-gemma3 Gemma ) & side=($!)
  ( hf gemma3 ) & side+=($!)
  mkdir -p /tmp/gg
  wait_for /tmp/qp $N_Q
  checked "/tmp/qp/*" $Q_SHA || fail "qwen parts"
  cat /tmp/qp/* > /tmp/gg/qwen.gguf && rm -rf /tmp/qp
  step convert_qwen 600 python3 -m replaylib.models fetch qwen2.5-coder-0.5b-instruct --gguf /tmp/gg/qwen.gguf ||
    fail "qwen conversion"
  ( hf qwen --upto 03_three_pass_replay ) & side+=($!)
  campaign families-qwen Qwen
  wait ${side[@]}  # not the memory monitor, which ends with ALLDONE
  chain_epilogue;;
poll)
  poll_and_pack ${2:-60};;
*) echo "usage: lease15.sh parts|poll SECS"; exit 2;;
esac
