#!/bin/bash
# Lease 5: campaign-gpu-embedded on the H200 with the Ray executor (two engines sharing the GPU),
# then the same campaign with the local executor, then the records compared.
#   lease5.sh parts        copy the parts this call carried (.gpu/pNN, .whl/rN, .whl/gN) under /tmp
#   lease5.sh launch       start the chain below in its own session (it outlives the call)
#   lease5.sh poll SECS    wait up to SECS for the chain's end; report; pack logs and runs into $OUT
# The chain: install the vLLM wheelhouse and the extra wheels (Ray, papermill, ipykernel,
# pypdfium2) into /tmp/site; snapshot the tree to /tmp/repo; assemble and convert the embedded
# GGUF; run the campaign with --executor ray --ray-workers 2 --gpus-per-worker 0.5 into /tmp/rlray;
# the same campaign with --executor local into /tmp/rllocal (the vLLM compile cache copied
# over); compare the two roots.
# Environment of `launch`: RAY_ARGS (default "--ray-workers 2 --gpus-per-worker 0.5"), RUN_LOCAL
# (default 1; 0 skips the local campaign and the comparison).
L=/tmp/logs; mkdir -p $L
what=$1
if [[ $what == parts ]]; then
  mkdir -p /tmp/whp /tmp/xp /tmp/gg/parts
  for d in .gpu/p*; do [ -d "$d" ] && cp $d/* /tmp/whp/; done
  for d in .whl/r*; do [ -d "$d" ] && cp $d/* /tmp/xp/; done
  for d in .whl/g*; do [ -d "$d" ] && cp $d/* /tmp/gg/parts/; done
  echo "parts: wheelhouse $(ls /tmp/whp | wc -l)/7 extra $(ls /tmp/xp | wc -l)/2 gguf $(ls /tmp/gg/parts | wc -l)/10"
  exit 0
fi
if [[ $what == launch ]]; then
  rm -rf /tmp/repo && mkdir -p /tmp/repo && tar --exclude=./.gpu --exclude=./.whl -cf - . | tar -xf - -C /tmp/repo
  setsid bash /tmp/repo/docs/gpu-h200/scripts/lease5.sh chain > $L/chain.out 2>&1 < /dev/null &
  sleep 1; echo launched; exit 0
fi
if [[ $what == chain ]]; then
  export PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0
  export PYTHONUNBUFFERED=1 REPLAYLIB_MODELS=/tmp/models TQDM_DISABLE=1 RAY_USAGE_STATS_ENABLED=0
  step() { local name=$1 t=$2; shift 2; echo "=== $name start $(date -u +%T)" >> $L/progress
    timeout $t "$@" > $L/$name.log 2>&1; local rc=$?; echo "=== $name rc=$rc $(date -u +%T)" >> $L/progress; return $rc; }
  rm -rf /tmp/rlray /tmp/rllocal $L/RAYDONE $L/ALLDONE; mkdir -p $L/old && mv $L/*.log $L/progress $L/old/ 2>/dev/null
  [ -d /tmp/site/vllm ] || step install 600 bash -c 'cd /tmp && cat whp/wh.part-* > wh.tar && sha256sum wh.tar && tar -xf wh.tar &&
    cat xp/extra.part-* > extra.tar && sha256sum extra.tar && tar -xf extra.tar &&
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site wh/*.whl dlk/*.whl &&
    python3 -c "import vllm, ray, papermill, ipykernel, pypdfium2; print(\"vllm\", vllm.__version__, \"ray\", ray.__version__, \"papermill\", papermill.__version__)"' || { touch $L/ALLDONE; exit 1; }
  cd /tmp/repo
  step versions 120 bash -c 'date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
    python3 -c "import sys, vllm, torch, transformers, ray; print(sys.version); print(\"vllm\", vllm.__version__, \"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"transformers\", transformers.__version__, \"ray\", ray.__version__)"; cat COMMIT 2>/dev/null; md5sum replaylib/*.py'
  [ -f /tmp/gg/model.gguf ] || step gguf 300 bash -c 'cat /tmp/gg/parts/g.part-* > /tmp/gg/model.gguf && sha256sum /tmp/gg/model.gguf'
  [ -f /tmp/models/qwen2.5-coder-0.5b-instruct/config.json ] || step convert 600 python3 -m replaylib.models fetch --gguf /tmp/gg/model.gguf || { touch $L/ALLDONE; exit 1; }
  REPLAYLIB_OUT=/tmp/rlray step campaign_ray 1800 python3 -m replaylib.campaign params/campaign-gpu-embedded.yaml \
    --executor ray ${RAY_ARGS:---ray-workers 2 --gpus-per-worker 0.5}
  touch $L/RAYDONE
  [ "${RUN_LOCAL:-1}" = 1 ] || { touch $L/ALLDONE; exit 0; }
  mkdir -p /tmp/rllocal/runs && cp -r /tmp/rlray/runs/.vllm-cache /tmp/rllocal/runs/ 2>/dev/null
  REPLAYLIB_OUT=/tmp/rllocal step campaign_local 1800 python3 -m replaylib.campaign params/campaign-gpu-embedded.yaml \
    --executor local
  step compare 120 python3 docs/gpu-h200/scripts/compare_roots.py /tmp/rlray /tmp/rllocal
  touch $L/ALLDONE
  exit 0
fi
if [[ $what == ray2 ]]; then
  # second try, with the fixes: stop whatever still runs, then the Ray campaign alone (code in /tmp/repo2)
  pkill -f replaylib.campaign; pkill -f replaylib.run; pkill -f ipykernel_launcher; sleep 3
  for i in $(seq 60); do [ "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" -lt 100 ] && break; sleep 1; done
  rm -rf /tmp/repo2 && mkdir -p /tmp/repo2 && tar --exclude=./.gpu --exclude=./.whl -cf - . | tar -xf - -C /tmp/repo2
  rm -f $L/RAYDONE $L/ALLDONE; mkdir -p /tmp/rlray/runs && cp -r /tmp/rllocal/runs/.vllm-cache /tmp/rlray/runs/ 2>/dev/null
  setsid bash -c 'export PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONUNBUFFERED=1 REPLAYLIB_MODELS=/tmp/models RAY_USAGE_STATS_ENABLED=0 REPLAYLIB_OUT=/tmp/rlray;
    cd /tmp/repo2; echo "=== campaign_ray2 start $(date -u +%T)" >> /tmp/logs/progress;
    python3 -m replaylib.campaign params/campaign-gpu-embedded.yaml --executor ray --ray-workers 2 --gpus-per-worker 0.5 > /tmp/logs/campaign_ray2.log 2>&1;
    echo "=== campaign_ray2 rc=$? $(date -u +%T)" >> /tmp/logs/progress; touch /tmp/logs/RAYDONE' > /dev/null 2>&1 < /dev/null &
  sleep 1; echo launched ray2; exit 0
fi
if [[ $what == poll ]]; then
  lim=${2:-60}; flag=${3:-ALLDONE}; t0=$(date +%s)
  while [ $(( $(date +%s) - t0 )) -lt $lim ]; do [ -f $L/$flag ] && break; sleep 3; done
  echo "--- progress"; cat $L/progress 2>/dev/null
  for f in $L/campaign_*.log $L/compare.log; do [ -f $f ] && { echo "--- $f"; tail -6 $f | cut -c1-400; }; done
  grep -h -E "Error|error:" $L/install.log $L/convert.log 2>/dev/null | tail -3
  for r in rlray rllocal; do [ -d /tmp/$r/runs ] && for f in /tmp/$r/runs/*/run.log; do echo "--- $f"; tail -2 $f | cut -c1-300; done; done
  if [ -n "$OUT" ]; then
    tar -czf $OUT/logs.tgz -C /tmp logs
    for r in rlray rllocal; do [ -d /tmp/$r ] && tar -czf $OUT/$r.tgz --exclude='*.safetensors' --exclude='.vllm-cache' -C /tmp $r; done
    mkdir -p /tmp/raylogs && cp -r /tmp/ray/session_latest/logs /tmp/raylogs/ 2>/dev/null; [ -d /tmp/raylogs/logs ] && tar -czf $OUT/raylogs.tgz -C /tmp raylogs
    ls -la $OUT
  fi
  exit 0
fi
