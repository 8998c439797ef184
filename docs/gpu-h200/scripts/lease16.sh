#!/bin/bash
# Lease 16: params/campaign-gpu-families.yaml whole, as one campaign on one card: Qwen2.5-Coder-0.5B, SmolLM2-135M
# and Gemma 3 270M, each model's primary and screened cohorts on the arith task on vLLM's multi-process engine and
# in-process, and each model's batch-invariant stage, its 6 configurations at once under one engine broker (the
# engines ask for their weights, KV cache and headroom; idle ones make room). The two GGUFs are converted on the
# device by `python -m replaylib.models fetch` (gguf's reference dequantizer, the pinned tokenizer checked); Gemma 3
# comes converted (transformers 5.23), as in leases 14 and 15. If a configuration fails, the campaign runs once more
# (finished stages are kept). Last, Qwen on the transformers engine on CUDA up to its replay stage on arith (lease 11
# ran it on GSM8K): what a short lease leaves out first.
#   lease16.sh parts        copy the parts this call carried under /tmp; the first call also starts the chain
#   lease16.sh poll SECS    wait up to SECS for the chain's end; report; pack logs and records (no caches, no
#                           saved states) into $OUT
# Parts (lease16_parts.sh): the vLLM wheelhouse (.gpu/pNN), the extra wheels (.whl/x00), SmolLM2's GGUF (.whl/sNN),
# Qwen's GGUF (.whl/qNN), Gemma 3's converted directory as an xz'd tar (.whl/mNN), each split at 48M.
L=/tmp/logs; mkdir -p $L
HERE=$(cd "$(dirname "$0")" && pwd)
source $HERE/chainlib.sh
source $HERE/lease16.parts  # N_* and *_SHA of the parts
case $1 in
parts)
  put_parts s q m
  start_chain docs/gpu-h200/scripts/lease16.sh
  echo "parts: wheelhouse $(ls /tmp/whp 2>/dev/null | wc -l)/$N_WH extra $(ls /tmp/xp 2>/dev/null | wc -l)/$N_X" \
    "smollm2 $(ls /tmp/sp 2>/dev/null | wc -l)/$N_S qwen $(ls /tmp/qp 2>/dev/null | wc -l)/$N_Q" \
    "gemma $(ls /tmp/mp 2>/dev/null | wc -l)/$N_M; $(tail -1 $L/progress 2>/dev/null)";;
chain)
  chain_prologue
  mkdir -p /tmp/gg
  convert() {  # NAME PARTS_DIR N SHA: the GGUF from its parts, converted and checked by the package's fetch
    wait_for $2 $3; checked "$2/*" $4 || fail "$1 parts"
    cat $2/* > /tmp/gg/$1.gguf && rm -rf $2
    step convert_$1 600 python3 -m replaylib.models fetch $1 --gguf /tmp/gg/$1.gguf || fail "$1 conversion"; }
  convert smollm2-135m-instruct /tmp/sp $N_S $S_SHA
  convert qwen2.5-coder-0.5b-instruct /tmp/qp $N_Q $Q_SHA
  wait_for /tmp/mp $N_M
  checked "/tmp/mp/*" $M_SHA || fail "gemma parts"
  step gemma_dir 300 bash -c 'mkdir -p /tmp/models && cat /tmp/mp/* | python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)" | tar -xf - -C /tmp/models && rm -rf /tmp/mp &&
    python3 -m replaylib.models fetch gemma-3-270m && python3 -c "
from pathlib import Path
from replaylib.measure.models import EMBEDDED_MODELS, check_tokenizer
check_tokenizer(Path(\"/tmp/models/gemma-3-270m\"), EMBEDDED_MODELS[\"gemma-3-270m\"]); print(\"tokenizer as pinned\")"' ||
    fail "gemma directory"
  families() { step $1 1700 python3 -m replaylib.campaign params/campaign-gpu-families.yaml --stages-only; }
  families campaign || families campaign_rerun
  step hf_qwen 900 python3 -m replaylib.run params/gpu-families-qwen-hf.yaml --out /tmp/rlhf --upto 03_three_pass_replay
  chain_epilogue;;
poll)
  poll_and_pack ${2:-60};;
*) echo "usage: lease16.sh parts|poll SECS"; exit 2;;
esac
