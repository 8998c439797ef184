#!/bin/bash
# Lease 11: the transformers engine on CUDA at a size with power (issue: where re-feeding differs). The
# embedded model, 8 engines sharing the GPU on Ray: params/gpu-embedded-xplant.yaml (exact1, exact2,
# refeed, both transplants, the layer profile), its float32-prefix control on the same trunks and pivots
# (stages 01-02 copied; its exact passes are a second run of the main one's), the prompt-batching control
# (gpu-embedded-xplant-alone.yaml, its own trunks), stage 03 of the main configuration run again in
# another root, then the benchmark. Only the transformers stack is needed: no vLLM wheelhouse.
#   lease11.sh parts        copy the parts this call carried under /tmp; the first call also starts the chain
#   lease11.sh launch       snapshot the tree to /tmp/repo and start the chain (it waits for the parts)
#   lease11.sh poll SECS    wait up to SECS for the chain's end; report; pack logs and results into $OUT
L=${LOGS:-/tmp/logs}; mkdir -p $L
GGUF_SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
HX_SHA=${HX_SHA:-b57306ea1dfb80b776dd8ec09a8e06f447b9b1a0721fbe4811946bbc38e291e2}
N_HX=${N_HX:-2} N_GGUF=${N_GGUF:-10}
P=${PARAMS:-params}  # the configurations' directory (a CPU rehearsal points it elsewhere)
RL=${RL:-/tmp/rl} RL2=${RL2:-/tmp/rl2}
what=$1
put() { mkdir -p $2; for f in $1/*; do [ -f "$f" ] && cp "$f" "$2/.$(basename $f).tmp" && mv "$2/.$(basename $f).tmp" "$2/$(basename $f)"; done; }
if [[ $what == parts ]]; then
  for d in .whl/h[0-9]*; do [ -d "$d" ] && put $d /tmp/hx/parts; done
  for d in .whl/g[0-9]*; do [ -d "$d" ] && put $d /tmp/gg/parts; done
  [ -f $L/chain.started ] || bash $0 launch
  echo "parts: wheels $(ls /tmp/hx/parts 2>/dev/null | wc -l)/$N_HX gguf $(ls /tmp/gg/parts 2>/dev/null | wc -l)/$N_GGUF; $(tail -1 $L/progress 2>/dev/null)"
  exit 0
fi
if [[ $what == launch ]]; then
  rm -rf /tmp/repo && mkdir -p /tmp/repo && tar --exclude=./.gpu --exclude=./.whl -cf - . | tar -xf - -C /tmp/repo
  touch $L/chain.started
  setsid bash /tmp/repo/docs/gpu-h200/scripts/lease11.sh chain > $L/chain.out 2>&1 < /dev/null &
  sleep 1; echo launched; exit 0
fi
if [[ $what == chain ]]; then
  export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TQDM_DISABLE=1 RAY_USAGE_STATS_ENABLED=0
  export REPLAYLIB_MODELS=${REPLAYLIB_MODELS:-/tmp/models}
  step() { local name=$1 t=$2; shift 2; echo "=== $name start $(date -u +%T)" >> $L/progress
    timeout $t "$@" > $L/$name.log 2>&1; local rc=$?; echo "=== $name rc=$rc $(date -u +%T)" >> $L/progress; return $rc; }
  fail() { echo "=== FAILED: $1 $(date -u +%T)" >> $L/progress; touch $L/ALLDONE; exit 1; }
  wait_for() { while [ "$(ls $1 2>/dev/null | wc -l)" -lt $2 ]; do sleep 1; done; }
  checked() { local got; got=$(cat $1 | sha256sum | cut -d' ' -f1); [ "$got" = "$2" ] || { echo "sha256 $got, expected $2" >> $L/progress; return 1; }; }
  cd ${REPO:-/tmp/repo}
  echo "=== chain start $(date -u +%T) commit $(cat COMMIT 2>/dev/null)" >> $L/progress
  if [ -z "$CPU_REHEARSAL" ]; then
    wait_for /tmp/hx/parts $N_HX
    checked "/tmp/hx/parts/hx.part-*" $HX_SHA || fail "wheel parts"
    step install 300 bash -c 'cd /tmp/hx && cat parts/hx.part-* | tar -xf - &&
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site hx/*.whl' || fail install
    export PYTHONPATH=/tmp/site:$PWD
    step versions 120 bash -c 'date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
      python3 -c "import sys, torch, transformers, ray, papermill; print(sys.version); print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"transformers\", transformers.__version__, \"ray\", ray.__version__, \"papermill\", papermill.__version__)"; cat COMMIT 2>/dev/null; nproc; free -g'
    wait_for /tmp/gg/parts $N_GGUF
    checked "/tmp/gg/parts/g.part-*" $GGUF_SHA && cat /tmp/gg/parts/g.part-* > /tmp/gg/model.gguf || fail "model parts"
    step convert 600 python3 -m replaylib.models fetch --gguf /tmp/gg/model.gguf || fail convert
  fi
  R="python3 -m replaylib.run"
  # the main configuration up to its records, then the float32 control on its trunks and pivots
  step main 1500 $R $P/gpu-embedded-xplant.yaml --upto 03_three_pass_replay --out $RL || fail main
  mkdir -p $RL/runs/gpu-embedded-xplant-fp32
  cp -r $RL/runs/gpu-embedded-xplant/01_sampling $RL/runs/gpu-embedded-xplant/02_pivot_mining $RL/runs/gpu-embedded-xplant-fp32/
  step fp32 1200 $R $P/gpu-embedded-xplant-fp32.yaml --upto 03_three_pass_replay --out $RL
  step alone 1500 $R $P/gpu-embedded-xplant-alone.yaml --upto 03_three_pass_replay --out $RL
  step numbers 300 python3 docs/gpu-h200/scripts/lease11_numbers.py $RL
  # the products of the main configuration (stage 05's small invariant check, then the statistics)
  step products_main 600 $R $P/gpu-embedded-xplant.yaml --out $RL
  # stage 03 of the main configuration again, in another root, on the same trunks and pivots
  mkdir -p $RL2/runs/gpu-embedded-xplant
  cp -r $RL/runs/gpu-embedded-xplant/01_sampling $RL/runs/gpu-embedded-xplant/02_pivot_mining $RL2/runs/gpu-embedded-xplant/
  step rerun 1200 $R $P/gpu-embedded-xplant.yaml --upto 03_three_pass_replay --out $RL2
  step numbers2 300 python3 docs/gpu-h200/scripts/lease11_numbers.py $RL $RL2
  step products_alone 600 $R $P/gpu-embedded-xplant-alone.yaml --out $RL
  step products_fp32 600 $R $P/gpu-embedded-xplant-fp32.yaml --out $RL
  [ -z "$CPU_REHEARSAL" ] && step bench 420 python3 -m replaylib.bench --device cuda --engine hf --workload paper --naive-pivots 1
  step leftovers 60 bash -c 'ps -eo pid,ppid,etimes,args | grep -E "ray::|replaylib" | grep -v grep; nvidia-smi 2>/dev/null; true'
  touch $L/ALLDONE
  exit 0
fi
if [[ $what == poll ]]; then
  lim=${2:-60}; flag=${3:-ALLDONE}; t0=$(date +%s)
  while [ $(( $(date +%s) - t0 )) -lt $lim ]; do [ -f $L/$flag ] && break; sleep 3; done
  echo "--- progress"; cat $L/progress 2>/dev/null
  for f in $L/main.log $L/fp32.log $L/alone.log $L/rerun.log; do [ -f $f ] && { echo "--- $(basename $f)"; grep -vE "^\s*$" $f | tail -3 | cut -c1-300; }; done
  for f in $L/numbers2.log $L/numbers.log; do [ -f $f ] && { echo "--- $(basename $f)"; cut -c1-400 $f | head -60; break; }; done
  [ -f $L/bench.log ] && { echo "--- bench.log"; tail -25 $L/bench.log | cut -c1-300; }
  if [ -n "$OUT" ]; then
    tar -czf $OUT/logs.tgz -C $(dirname $L) $(basename $L)
    for r in $RL $RL2; do [ -d $r ] && tar -czf $OUT/$(basename $r).tgz --exclude='state' --exclude='shards' --exclude='.vllm-cache' -C $(dirname $r) $(basename $r); done
    ls -la $OUT
  fi
  exit 0
fi
echo "usage: lease11.sh parts|launch|poll SECS [FLAG]"; exit 2
