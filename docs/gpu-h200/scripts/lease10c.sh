#!/bin/bash
# Lease 10c (the session's last device time): after lease 10b, the transformers engine on CUDA with the
# math kernel beside the memory-efficient one, on the tiny random-weight model (grouped-query attention,
# 4 query and 2 key-value heads; no model to move): the benchmark's small workload with this tree's code
# and with the code before the decode loop stopped syncing per row (oldpkg.tar: cb5b4d5's replaylib with
# the same kernel list).
#   lease10c.sh parts | launch | poll SECS     as lease10.sh
L=/tmp/logs; mkdir -p $L
GGUF_SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
WH_SHA=${WH_SHA:-ee722e2f4360b3d983001b3c8ae77ace6f6dd6707342816e3903df28715a9343}
EXTRA_SHA=${EXTRA_SHA:-f2a9a2c9aeeb1a0605da1c65123338d8b3548a11ec3076e5d1b05b96343e68a9}
N_WH=${N_WH:-7} N_EXTRA=${N_EXTRA:-2} N_GGUF=${N_GGUF:-10}
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
    setsid bash /tmp/repo/docs/gpu-h200/scripts/lease10c.sh chain > $L/chain.out 2>&1 < /dev/null &
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
  rm -rf /tmp/old && cp -r /tmp/repo /tmp/old && rm -rf /tmp/old/replaylib && tar -xf oldpkg.tar -C /tmp/old
  step bench_new 300 python3 -m replaylib.bench --device cuda --engine hf --workload small --model tiny:0 --out /tmp/bench_new
  ( cd /tmp/old && PYTHONPATH=/tmp/site:/tmp/old step bench_old 300 python3 -m replaylib.bench --device cuda --engine hf --workload small --model tiny:0 --out /tmp/bench_old )
  touch $L/ALLDONE
  exit 0
fi
if [[ $what == poll ]]; then
  lim=${2:-60}; flag=${3:-ALLDONE}; t0=$(date +%s)
  while [ $(( $(date +%s) - t0 )) -lt $lim ]; do [ -f $L/$flag ] && break; sleep 3; done
  echo "--- progress"; cat $L/progress 2>/dev/null
  [ -f $L/gpu_tests.log ] && { echo "--- gpu_tests.log"; grep -E "PASSED|FAILED|ERROR|passed|failed" $L/gpu_tests.log | tail -14 | cut -c1-300; }
  for f in $L/bench_*.log; do [ -f $f ] && { echo "--- $(basename $f)"; grep -vE "^\s*$" $f | tail -12 | cut -c1-300; }; done
  if [ -n "$OUT" ]; then
    tar -czf $OUT/logs.tgz -C /tmp logs
    for d in bench_new bench_old; do [ -d /tmp/$d ] && tar -czf $OUT/$d.tgz -C /tmp $d; done
    ls -la $OUT
  fi
  exit 0
fi
echo "usage: lease10c.sh parts|launch|poll SECS [FLAG]"; exit 2
