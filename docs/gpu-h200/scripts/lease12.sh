#!/bin/bash
# Lease 12: the stages and the credit tool on vLLM after the move to plan, unit and assemble (tests/test_gpu.py,
# side by side: the credit tool starting beside a stage's running engine with its fixed KV cache, the estimator
# on a vllm.LLM its caller built), then the credit tool's seconds per pivot on the embedded model (the CPU
# measurement's nine rollouts, docs/gpu-h200/lease12/rollouts-embedded.jsonl) with vLLM and the transformers
# engine, at 64 and 256 continuation tokens.
#   lease12.sh parts        copy the parts this call carried under /tmp; the first call also starts the chain
#   lease12.sh launch       snapshot the tree to /tmp/repo and start the chain (it waits for the parts)
#   lease12.sh poll SECS    wait up to SECS for the chain's end; report; pack logs and results into $OUT
L=/tmp/logs; mkdir -p $L
GGUF_SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
WH_SHA=${WH_SHA:-d1277ba8708340e54e005953b163c7cb073cec96fc968d130fe05bcadc4ec9d6}
EXTRA_SHA=${EXTRA_SHA:-68a9300c594ca84a283d05445fbe40ea1a325aab54af7b63d4a6f1f584b3873f}
N_WH=${N_WH:-8} N_EXTRA=${N_EXTRA:-3} N_GGUF=${N_GGUF:-11}
MODEL=embedded:qwen2.5-coder-0.5b-instruct
what=$1
put() { mkdir -p $2; for f in $1/*; do [ -f "$f" ] && cp "$f" "$2/.$(basename $f).tmp" && mv "$2/.$(basename $f).tmp" "$2/$(basename $f)"; done; }
if [[ $what == parts ]]; then
  for d in .gpu/p[0-9]*; do [ -d "$d" ] && put $d /tmp/whp; done
  for d in .whl/r[0-9]*; do [ -d "$d" ] && put $d /tmp/xp; done
  for d in .whl/g[0-9]*; do [ -d "$d" ] && put $d /tmp/gg/parts; done
  [ -d .whl/gw ] && put .whl/gw /tmp/gw
  [ -f $L/chain.started ] || bash $0 launch
  echo "parts: wheelhouse $(ls /tmp/whp 2>/dev/null | wc -l)/$N_WH extra $(ls /tmp/xp 2>/dev/null | wc -l)/$N_EXTRA gguf $(ls /tmp/gg/parts 2>/dev/null | wc -l)/$N_GGUF; $(tail -1 $L/progress 2>/dev/null)"
  exit 0
fi
if [[ $what == launch ]]; then
  rm -rf /tmp/repo && mkdir -p /tmp/repo && tar --exclude=./.gpu --exclude=./.whl -cf - . | tar -xf - -C /tmp/repo
  touch $L/chain.started
  N_WH=$N_WH N_EXTRA=$N_EXTRA N_GGUF=$N_GGUF WH_SHA=$WH_SHA EXTRA_SHA=$EXTRA_SHA \
    setsid bash /tmp/repo/docs/gpu-h200/scripts/lease12.sh chain > $L/chain.out 2>&1 < /dev/null &
  sleep 1; echo launched; exit 0
fi
if [[ $what == chain ]]; then
  export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 REPLAYLIB_MODELS=/tmp/models TQDM_DISABLE=1 RAY_USAGE_STATS_ENABLED=0
  step() { local name=$1 t=$2; shift 2; echo "=== $name start $(date -u +%T)" >> $L/progress
    timeout $t "$@" > $L/$name.log 2>&1; local rc=$?; echo "=== $name rc=$rc $(date -u +%T)" >> $L/progress; return $rc; }
  fail() { echo "=== FAILED: $1 $(date -u +%T)" >> $L/progress; touch $L/ALLDONE; exit 1; }
  wait_for() { while [ "$(ls $1 2>/dev/null | wc -l)" -lt $2 ]; do sleep 1; done; }
  checked() { local got; got=$(cat $1 | sha256sum | cut -d' ' -f1); [ "$got" = "$2" ] || { echo "sha256 $got, expected $2" >> $L/progress; return 1; }; }
  cd /tmp/repo
  echo "=== chain start $(date -u +%T) commit $(cat COMMIT 2>/dev/null)" >> $L/progress
  wait_for /tmp/whp $N_WH; wait_for /tmp/xp $N_EXTRA
  checked "/tmp/whp/wh.part-*" $WH_SHA && checked "/tmp/xp/extra.part-*" $EXTRA_SHA || fail "wheel parts"
  step install 600 bash -c 'cd /tmp && cat whp/wh.part-* | tar -xf - && cat xp/extra.part-* | tar -xf - &&
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site wh/*.whl dlk/*.whl' ||
    fail install
  export PYTHONPATH=/tmp/site:/tmp/repo
  step versions 120 bash -c 'date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
    python3 -c "import sys, vllm, torch, transformers, ray, papermill; print(sys.version); print(\"vllm\", vllm.__version__, \"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"transformers\", transformers.__version__, \"ray\", ray.__version__, \"papermill\", papermill.__version__)"; cat COMMIT 2>/dev/null; nproc; free -g'
  ( step gpu_tests 1200 python3 -m pytest -q -p no:cacheprovider -n 4 --timeout 1100 tests/test_gpu.py -rA ) &
  tests=$!
  wait_for /tmp/gg/parts $N_GGUF
  checked "/tmp/gg/parts/g.part-*" $GGUF_SHA && cat /tmp/gg/parts/g.part-* > /tmp/gg/model.gguf || fail "model parts"
  step convert 600 python3 -m replaylib.models fetch --gguf /tmp/gg/model.gguf || fail convert
  wait $tests  # the timings below with the GPU to themselves
  R=docs/gpu-h200/lease12/rollouts-embedded.jsonl
  C="python3 -m replaylib.credit $R --model $MODEL --grader gsm8k --device cuda --k 4 --margin 1.0 --max-pivots-per-rollout 3 --max-model-len 4096"
  mkdir -p /tmp/cr
  step credit_vllm64 600 $C --engine vllm --max-cont-tokens 64 --out /tmp/cr/vllm64
  step credit_vllm256 600 $C --engine vllm --max-cont-tokens 256 --out /tmp/cr/vllm256
  step credit_hf64 600 $C --engine hf --max-cont-tokens 64 --out /tmp/cr/hf64
  step credit_hf256 600 $C --engine hf --max-cont-tokens 256 --out /tmp/cr/hf256
  step leftovers 60 bash -c 'ps -eo pid,ppid,etimes,args | grep -E "VLLM::|engine_service|ray::" | grep -v grep; nvidia-smi; true'
  touch $L/ALLDONE
  exit 0
fi
if [[ $what == poll ]]; then
  lim=${2:-60}; flag=${3:-ALLDONE}; t0=$(date +%s)
  while [ $(( $(date +%s) - t0 )) -lt $lim ]; do [ -f $L/$flag ] && break; sleep 3; done
  echo "--- progress"; cat $L/progress 2>/dev/null
  [ -f $L/gpu_tests.log ] && { echo "--- gpu_tests.log"; grep -E "PASSED|FAILED|ERROR|passed|failed" $L/gpu_tests.log | tail -16 | cut -c1-300; }
  for f in $L/credit_*.log; do [ -f $f ] && { echo "--- $(basename $f)"; grep -E "pivots;|estimate|error|Error" $f | tail -3 | cut -c1-300; }; done
  if [ -n "$OUT" ]; then
    tar -czf $OUT/logs.tgz -C /tmp logs
    [ -d /tmp/cr ] && tar -czf $OUT/cr.tgz --exclude='shards' -C /tmp cr
    ls -la $OUT
  fi
  exit 0
fi
echo "usage: lease12.sh parts|launch|poll SECS [FLAG]"; exit 2
