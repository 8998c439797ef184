#!/bin/bash
# Lease 3 (2026-11-30): the runner (papermill, every stage notebook) on the H200.
#   campaign3.sh install   wheelhouse + papermill wheels -> /tmp/site, snapshot the tree -> /tmp/repo, GPU tests
#   campaign3.sh main      (after the GGUF is assembled) convert it, run gpu-embedded (vLLM),
#                          gpu-embedded-extras (vLLM) and gpu-embedded-hf (transformers) side by side,
#                          then the benchmark alone on the GPU
L=/tmp/logs; mkdir -p $L
export PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0
export PYTHONUNBUFFERED=1 REPLAYLIB_OUT=/tmp/rl REPLAYLIB_MODELS=/tmp/models TQDM_DISABLE=1
step() { local name=$1 t=$2; shift 2; echo "=== $name start $(date +%T)" >> $L/progress
  timeout $t "$@" > $L/$name.log 2>&1; local rc=$?; echo "=== $name rc=$rc $(date +%T)" >> $L/progress; return $rc; }
what=$1
if [[ $what == install ]]; then
  step install 600 bash -c 'cd /tmp && cat whp/wh.part-* > wh.tar && sha256sum wh.tar && tar -xf wh.tar &&
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site wh/*.whl /tmp/pmw/*.whl &&
    python3 -c "import vllm, papermill, ipykernel; print(\"vllm\", vllm.__version__, \"papermill\", papermill.__version__)"'
  touch $L/INSTALLED
  cd /tmp/repo
  step versions 120 bash -c 'date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
    python3 -c "import sys, vllm, torch, transformers; print(sys.version); print(\"vllm\", vllm.__version__, \"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"transformers\", transformers.__version__)"; md5sum replaylib/*.py'
  step gpu_tests 600 python3 -m pytest -q -rs -p no:cacheprovider tests/test_gpu.py
  touch $L/SMOKE_DONE
  exit 0
fi
if [[ $what == main ]]; then
  for i in $(seq 900); do [ -f $L/INSTALLED ] && [ -f /tmp/gg/READY ] && break; sleep 1; done
  cd /tmp/repo
  step convert 600 python3 -m replaylib.models fetch --gguf /tmp/gg/model.gguf || { touch $L/ALLDONE; exit 1; }
  step run_vllm 1500 python3 -m replaylib.run params/gpu-embedded.yaml &
  sleep 20
  step run_extras 1500 python3 -m replaylib.run params/gpu-embedded-extras.yaml &
  step run_hf 1500 python3 -m replaylib.run params/gpu-embedded-hf.yaml &
  wait
  nvidia-smi --query-gpu=name,memory.used --format=csv > $L/smi_after_runs.log 2>&1
  step bench_paper 900 python3 -m replaylib.bench --device cuda --workload paper --engine vllm --naive-pivots 1
  step bench_small 600 python3 -m replaylib.bench --device cuda --workload small --engine vllm
  touch $L/ALLDONE
fi
