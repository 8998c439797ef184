#!/bin/bash
# Lease 7: vLLM's serving modes on the H200. params/campaign-gpu-serving.yaml (the paper's rows on the
# embedded model with the multi-process engine and with the in-process one, the synchronized-pass
# control, the batch-invariant row; every stage through the runner, three configurations side by
# side, stages only: the campaign statistics run afterwards on a CPU from what comes back), and
# tests/test_gpu.py (both modes on the tiny model, batch invariance, the engine core inside a Ray
# actor, a killed stage's engine core).
#   lease7.sh parts        copy the parts this call carried under /tmp (each file appears whole); the
#                          first call also starts the chain (lease7.sh launch)
#   lease7.sh launch       snapshot the tree to /tmp/repo and start the chain (it outlives the call and
#                          waits for the parts still to come)
#   lease7.sh poll SECS    wait up to SECS for the chain's end; report; pack logs and results into $OUT
# Parts, one per device call beside the tree (64 MiB a call): the vLLM wheelhouse (.gpu/p00 ...) and
# the extra wheels (Ray, papermill, ipykernel, pypdfium2: .whl/r00 ...) first, so that the GPU tests
# run while the embedded GGUF (.whl/g00 ..., the gguf wheel in .whl/gw) arrives and converts; then the
# campaign. Counts and sha256: N_WH N_EXTRA N_GGUF WH_SHA EXTRA_SHA (GGUF_SHA is the model's own).
L=/tmp/logs; mkdir -p $L
GGUF_SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
WH_SHA=${WH_SHA:-24ca9761a15ac197ff6712406b6a9ec099029df491c4dd7e138e2cba26fa79e9}
EXTRA_SHA=${EXTRA_SHA:-5912975248c949aaf1bf5d820b82f5b0bcec83a1ccdaebbb75ce4036ad350028}
N_WH=${N_WH:-8} N_EXTRA=${N_EXTRA:-3} N_GGUF=${N_GGUF:-11}
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
    setsid bash /tmp/repo/docs/gpu-h200/scripts/lease7.sh chain > $L/chain.out 2>&1 < /dev/null &
  sleep 1; echo launched; exit 0
fi
if [[ $what == chain ]]; then
  # no VLLM_ENABLE_V1_MULTIPROCESSING here: each configuration's vllm_serving decides (and refuses a conflict)
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
  export PYTHONPATH=/tmp/site
  step versions 120 bash -c 'date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
    python3 -c "import sys, vllm, torch, transformers, ray, papermill; print(sys.version); print(\"vllm\", vllm.__version__, \"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"transformers\", transformers.__version__, \"ray\", ray.__version__, \"papermill\", papermill.__version__)"; cat COMMIT 2>/dev/null; md5sum replaylib/*.py'
  # the GPU tests (tiny model) while the GGUF arrives and converts; the campaign waits for them (its
  # three engines and theirs would not fit the GPU together); the killed-stage test runs after the
  # campaign (it measures the GPU's free memory)
  ( step gpu_tests 600 python3 -m pytest -q -p no:cacheprovider --timeout 300 tests/test_gpu.py -k "not killed" -rA ) &
  tests=$!
  wait_for /tmp/gg/parts $N_GGUF
  checked "/tmp/gg/parts/g.part-*" $GGUF_SHA && cat /tmp/gg/parts/g.part-* > /tmp/gg/model.gguf || fail "model parts"
  step convert 600 python3 -m replaylib.models fetch --gguf /tmp/gg/model.gguf || fail convert
  wait $tests
  REPLAYLIB_OUT=/tmp/rl step campaign 1800 python3 -m replaylib.campaign params/campaign-gpu-serving.yaml --stages-only
  step gpu_killed 600 python3 -m pytest -q -p no:cacheprovider --timeout 300 tests/test_gpu.py -k killed -rA
  for run in /tmp/rl/runs/gpu-embedded*; do
    step verify_$(basename $run) 120 python3 -m replaylib.report --verify $run
  done
  step leftovers 60 bash -c 'ps -eo pid,ppid,etimes,args | grep -i "VLLM::" | grep -v grep; nvidia-smi; true'
  touch $L/ALLDONE
  exit 0
fi
if [[ $what == poll ]]; then
  lim=${2:-60}; flag=${3:-ALLDONE}; t0=$(date +%s)
  while [ $(( $(date +%s) - t0 )) -lt $lim ]; do [ -f $L/$flag ] && break; sleep 3; done
  echo "--- progress"; cat $L/progress 2>/dev/null
  for f in gpu_tests gpu_killed; do [ -f $L/$f.log ] && { echo "--- $f.log"; tail -8 $L/$f.log | cut -c1-300; }; done
  [ -f $L/campaign.log ] && { echo "--- campaign.log"; grep -v "to run (" $L/campaign.log | tail -25 | cut -c1-300; }
  for f in /tmp/rl/runs/campaign-gpu-serving/logs/*.log; do [ -f $f ] && { echo "--- $f"; tail -2 $f | cut -c1-240; }; done
  if [ -n "$OUT" ]; then  # at most 8 files of 16 MiB come back: the results in parts of 15 MiB
    tar -czf $OUT/logs.tgz -C /tmp logs
    if [ -d /tmp/rl ]; then
      tar -czf /tmp/rl.tgz --exclude='.vllm-cache' -C /tmp rl && split -b 15M -d -a 1 /tmp/rl.tgz $OUT/rl.tgz.part
      sha256sum /tmp/rl.tgz > $OUT/rl.tgz.sha256
    fi
    ls -la $OUT
  fi
  exit 0
fi
echo "usage: lease7.sh parts|launch|poll SECS [FLAG]"; exit 2
