#!/bin/bash
# Lease 6: the whole params/campaign-gpu-embedded.yaml on the H200 with the Ray executor (one engine
# actor at a time), every stage through the runner, then the campaign statistics notebook.
#   lease6.sh parts        copy the parts this call carried under /tmp (each file appears whole)
#   lease6.sh launch       snapshot the tree to /tmp/repo and start the chain (it outlives the call
#                          and waits for the parts still to come)
#   lease6.sh poll SECS    wait up to SECS for the chain's end; report; pack logs and results into $OUT
# Parts, one per device call (each up to 50 MiB beside the tree): the embedded GGUF in 10 (.whl/g0 ...
# g9, the gguf wheel in .whl/gw with the first), the vLLM wheelhouse in 7 (.gpu/p00 ... p06), the
# extra wheels (Ray, papermill, ipykernel, pypdfium2) in 2 (.whl/r0, r1); docs/gpu-h200.md says how
# they were made. The GGUF comes first: its conversion (the device's torch and transformers) runs
# while the wheels arrive. Parts split otherwise: set N_GGUF, N_WH, N_EXTRA (the part counts) for
# `launch`.
L=/tmp/logs; mkdir -p $L
GGUF_SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
WH_SHA=0a3478062034311b70674ab184b860945f4d19bf6882e7f3a2544957e75ab2fb
EXTRA_SHA=e32f2036dab9a927f59964dc6c04612366377be45874589c05662826f539d281
what=$1
if [[ $what == parts ]]; then
  put() { mkdir -p $2; for f in $1/*; do [ -f "$f" ] && cp "$f" "$2/.$(basename $f).tmp" && mv "$2/.$(basename $f).tmp" "$2/$(basename $f)"; done; }
  for d in .gpu/p*; do [ -d "$d" ] && put $d /tmp/whp; done
  for d in .whl/r*; do [ -d "$d" ] && put $d /tmp/xp; done
  for d in .whl/g[0-9]*; do [ -d "$d" ] && put $d /tmp/gg/parts; done
  [ -d .whl/gw ] && put .whl/gw /tmp/gw
  echo "parts: gguf $(ls /tmp/gg/parts 2>/dev/null | wc -l) wheelhouse $(ls /tmp/whp 2>/dev/null | wc -l) extra $(ls /tmp/xp 2>/dev/null | wc -l); $(tail -1 $L/progress 2>/dev/null)"
  exit 0
fi
if [[ $what == launch ]]; then
  rm -rf /tmp/repo && mkdir -p /tmp/repo && tar --exclude=./.gpu --exclude=./.whl -cf - . | tar -xf - -C /tmp/repo
  setsid bash /tmp/repo/docs/gpu-h200/scripts/lease6.sh chain > $L/chain.out 2>&1 < /dev/null &
  sleep 1; echo launched; exit 0
fi
if [[ $what == chain ]]; then
  export HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0
  export PYTHONUNBUFFERED=1 REPLAYLIB_MODELS=/tmp/models TQDM_DISABLE=1 RAY_USAGE_STATS_ENABLED=0
  step() { local name=$1 t=$2; shift 2; echo "=== $name start $(date -u +%T)" >> $L/progress
    timeout $t "$@" > $L/$name.log 2>&1; local rc=$?; echo "=== $name rc=$rc $(date -u +%T)" >> $L/progress; return $rc; }
  fail() { echo "=== FAILED: $1 $(date -u +%T)" >> $L/progress; touch $L/ALLDONE; exit 1; }
  wait_for() { while [ "$(ls $1 2>/dev/null | wc -l)" -lt $2 ]; do sleep 1; done; }
  N_GGUF=${N_GGUF:-10} N_WH=${N_WH:-7} N_EXTRA=${N_EXTRA:-2}
  checked() { local got; got=$(cat $1 | sha256sum | cut -d' ' -f1); [ "$got" = "$2" ] || { echo "sha256 $got, expected $2" >> $L/progress; return 1; }; }
  cd /tmp/repo
  echo "=== chain start $(date -u +%T) commit $(cat COMMIT 2>/dev/null)" >> $L/progress
  # the model: assemble and convert it as soon as its parts are here, while the wheels still arrive
  ( wait_for /tmp/gg/parts $N_GGUF
    checked "/tmp/gg/parts/g.part-*" $GGUF_SHA && cat /tmp/gg/parts/g.part-* > /tmp/gg/model.gguf || { echo 1 > $L/convert.rc; exit; }
    wait_for /tmp/gw 1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/gsite /tmp/gw/*.whl
    export PYTHONPATH=/tmp/gsite
    step convert 600 python3 -m replaylib.models fetch --gguf /tmp/gg/model.gguf
    echo $? > $L/convert.rc ) &
  conv=$!
  wait_for /tmp/whp $N_WH; wait_for /tmp/xp $N_EXTRA
  checked "/tmp/whp/wh.part-*" $WH_SHA && checked "/tmp/xp/extra.part-*" $EXTRA_SHA || fail "wheel parts"
  step install 600 bash -c 'cd /tmp && cat whp/wh.part-* | tar -xf - && cat xp/extra.part-* | tar -xf - &&
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site wh/*.whl dlk/*.whl' ||
    fail install
  export PYTHONPATH=/tmp/site
  step versions 120 bash -c 'date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
    python3 -c "import sys, vllm, torch, transformers, ray, papermill; print(sys.version); print(\"vllm\", vllm.__version__, \"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"transformers\", transformers.__version__, \"ray\", ray.__version__, \"papermill\", papermill.__version__)"; cat COMMIT 2>/dev/null; md5sum replaylib/*.py' &
  wait $conv
  if [ "$(cat $L/convert.rc 2>/dev/null)" != 0 ]; then  # once more with the whole wheelhouse on the path
    [ -f /tmp/gg/model.gguf ] || fail "model parts"
    step convert2 600 python3 -m replaylib.models fetch --gguf /tmp/gg/model.gguf || fail convert
  fi
  REPLAYLIB_OUT=/tmp/rlray step campaign_ray 1800 python3 -m replaylib.campaign params/campaign-gpu-embedded.yaml \
    --executor ray ${RAY_ARGS:---ray-workers 1}
  for run in /tmp/rlray/runs/gpu-embedded*; do
    step verify_$(basename $run) 120 python3 -m replaylib.report --verify $run
  done
  touch $L/ALLDONE
  exit 0
fi
if [[ $what == poll ]]; then
  lim=${2:-60}; flag=${3:-ALLDONE}; t0=$(date +%s)
  while [ $(( $(date +%s) - t0 )) -lt $lim ]; do [ -f $L/$flag ] && break; sleep 3; done
  echo "--- progress"; cat $L/progress 2>/dev/null
  [ -f $L/campaign_ray.log ] && { echo "--- campaign_ray.log"; grep -v "to run (" $L/campaign_ray.log | tail -25 | cut -c1-300; }
  for f in /tmp/rlray/runs/campaign-gpu-embedded/logs/*.log; do [ -f $f ] && { echo "--- $f"; tail -3 $f | cut -c1-300; }; done
  if [ -n "$OUT" ]; then
    tar -czf $OUT/logs.tgz -C /tmp logs
    [ -d /tmp/rlray ] && tar -czf $OUT/rlray.tgz --exclude='*.safetensors' --exclude='.vllm-cache' -C /tmp rlray
    rm -rf /tmp/raylogs; mkdir -p /tmp/raylogs && cp -r /tmp/ray/session_latest/logs /tmp/raylogs/ 2>/dev/null
    [ -d /tmp/raylogs/logs ] && tar -czf $OUT/raylogs.tgz -C /tmp raylogs
    ls -la $OUT
  fi
  exit 0
fi
echo "usage: lease6.sh parts|launch|poll SECS [FLAG]"; exit 2
