#!/bin/bash
# background chains (setsid): "all" = smoke then the real model; "conv" = GGUF -> HF conversion
L=/tmp/logs; mkdir -p $L
export PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0
export PYTHONUNBUFFERED=1 REPLAYLIB_OUT=/tmp/rl REPLAYLIB_MODELS=/tmp/models TQDM_DISABLE=1
cd /tmp/repo
D=".gpu/s/drive.py"
step() { local name=$1 t=$2; shift 2; echo "=== $name start $(date +%T)" >> $L/progress
  timeout $t "$@" > $L/$name.log 2>&1; local rc=$?; echo "=== $name rc=$rc $(date +%T)" >> $L/progress; return $rc; }
what=${1:-all}
echo $$ > $L/chain_$what.pid
M=/tmp/models/qwen2.5-coder-0.5b-instruct
if [[ $what == conv ]]; then
  for i in $(seq 600); do [ -f /tmp/gg/READY ] && break; sleep 2; done
  step r0_convert 600 python3 -m replaylib.models fetch --gguf /tmp/gg/model.gguf || \
    step r0_convert_fallback 600 python3 .gpu/s/convert_fallback.py $M
  [ -f $M/config.json ] && touch $L/CONVERTED || touch $L/CONVERT_FAILED
  exit 0
fi
step v_versions 120 bash -c 'date -u; nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv; python3 -c "import sys, vllm, torch, transformers; print(sys.version); print(\"vllm\", vllm.__version__, \"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"transformers\", transformers.__version__, torch.cuda.get_device_name(0))"; cat .gpu/s/md5.txt'
step b1_vllm_sample 400 python3 $D params/gpu-smoke.yaml '{}' sample,pivots
step b2_vllm_replay 400 python3 $D params/gpu-smoke.yaml '{}' replay,stats
step b3_vllm_invariant 400 python3 $D params/gpu-smoke.yaml '{}' invariant
step c_hf_cuda 400 python3 $D params/gpu-smoke.yaml '{"engine":"hf","device":"cuda","config":"gpu-smoke-hf"}' sample,pivots,replay,stats
step a_pytest 900 python3 -m pytest -q -rs tests/test_gpu.py
step d_smi 60 nvidia-smi --query-gpu=name,memory.used --format=csv
tar -czf $L/runs_smoke.tgz -C /tmp/rl runs
touch $L/SMOKE_DONE
for i in $(seq 600); do [ -f $L/CONVERTED ] || [ -f $L/CONVERT_FAILED ] && break; sleep 2; done
if [ -f $L/CONVERTED ]; then
  step r1_real_sample 600 python3 $D .gpu/s/real05.yaml '{}' sample,pivots
  step r2_real_replay 900 python3 $D .gpu/s/real05.yaml '{}' replay,stats
  step r3_real_invariant 900 python3 $D .gpu/s/real05.yaml '{}' invariant,table1both
  step r4_smi 60 nvidia-smi --query-gpu=name,memory.used --format=csv
  tar -czf $L/runs_real.tgz -C /tmp/rl runs/real05
fi
touch $L/ALLDONE_all
