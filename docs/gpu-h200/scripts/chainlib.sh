# Helpers that a lease's background chain sources (bash): each step's log and start/end lines in $L/progress.
#   step NAME SECS CMD...   run CMD under a timeout, its output in $L/NAME.log
#   fail WHAT               say so in progress, mark the chain done, stop it
#   wait_for DIR N          wait until DIR holds N files
#   checked GLOB SHA256     the concatenated files of GLOB have this sha256
#   put SRC DEST            copy SRC's files into DEST, each appearing whole (a temporary name, then a rename)
#   install_wheels          unpack the vLLM wheelhouse parts (/tmp/whp) and the extra wheels (/tmp/xp), install
#                           them under /tmp/site
L=${L:-/tmp/logs}; mkdir -p $L
step() { local name=$1 t=$2; shift 2; echo "=== $name start $(date -u +%T)" >> $L/progress
  timeout $t "$@" > $L/$name.log 2>&1; local rc=$?; echo "=== $name rc=$rc $(date -u +%T)" >> $L/progress; return $rc; }
fail() { echo "=== FAILED: $1 $(date -u +%T)" >> $L/progress; touch $L/ALLDONE; exit 1; }
wait_for() { while [ "$(ls $1 2>/dev/null | wc -l)" -lt $2 ]; do sleep 1; done; }
checked() { local got; got=$(cat $1 | sha256sum | cut -d' ' -f1)
  [ "$got" = "$2" ] || { echo "sha256 of $1: $got, expected $2" >> $L/progress; return 1; }; }
put() { mkdir -p $2; for f in $1/*; do [ -f "$f" ] && cp "$f" "$2/.$(basename $f).tmp" && mv "$2/.$(basename $f).tmp" "$2/$(basename $f)"; done; }
install_wheels() { step install 600 bash -c 'cd /tmp && cat whp/wh.part-* | tar -xf - && cat xp/x.part-* | tar -xf - &&
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site wh/*.whl dl/*.whl'; }
# A lease's parts, chain and polls (lease 15 on; leases 13 and 14 wrote these out, as they ran):
#   put_parts KIND...       copy this call's carried parts: the wheelhouse (.gpu/pNN) to /tmp/whp, the extra wheels
#                           (.whl/xN) to /tmp/xp, each KIND's (.whl/KINDNN) to /tmp/KINDp
#   start_chain SCRIPT      once: the carried tree copied to /tmp/repo, `SCRIPT chain` started there in the background
#   chain_prologue          the chain's environment, the GPU memory monitor, the wheels checked and installed, the
#                           versions logged (needs N_WH, N_X, WH_SHA, X_SHA)
#   chain_epilogue          what the GPU holds at the end, the processes left, ALLDONE
#   poll_and_pack SECS      wait up to SECS for ALLDONE; report progress and the logs' notable lines; pack the logs
#                           and the roots /tmp/rl and /tmp/rlhf (no caches, weights or saved states) into $OUT
put_parts() { for d in .gpu/p[0-9]*; do [ -d "$d" ] && put $d /tmp/whp; done
  for d in .whl/x[0-9]*; do [ -d "$d" ] && put $d /tmp/xp; done
  for k in "$@"; do for d in .whl/$k[0-9]*; do [ -d "$d" ] && put $d /tmp/${k}p; done; done; }
start_chain() { [ -f $L/chain.started ] && return
  rm -rf /tmp/repo && mkdir -p /tmp/repo && tar --exclude=./.gpu --exclude=./.whl -cf - . | tar -xf - -C /tmp/repo
  touch $L/chain.started
  setsid bash /tmp/repo/$1 chain > $L/chain.out 2>&1 < /dev/null & }
chain_prologue() {
  export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 REPLAYLIB_MODELS=/tmp/models TQDM_DISABLE=1 RAY_USAGE_STATS_ENABLED=0
  export VLLM_USE_FLASHINFER_SAMPLER=0 REPLAYLIB_OUT=/tmp/rl
  cd /tmp/repo
  echo "=== chain start $(date -u +%T) commit $(cat COMMIT 2>/dev/null)" >> $L/progress
  ( while [ ! -f $L/ALLDONE ]; do echo "$(date -u +%T),$(nvidia-smi --query-gpu=memory.used,utilization.gpu \
      --format=csv,noheader | tr -d ' ')" >> $L/gpu_memory.csv; sleep 15; done ) &
  wait_for /tmp/whp $N_WH; wait_for /tmp/xp $N_X
  checked "/tmp/whp/wh.part-*" $WH_SHA && checked "/tmp/xp/x.part-*" $X_SHA || fail "wheel parts"
  install_wheels || fail install
  export PYTHONPATH=/tmp/site:/tmp/repo
  step versions 120 bash -c 'date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
    python3 -c "import sys, vllm, torch, transformers, tokenizers, papermill; print(sys.version); print(\"vllm\", vllm.__version__, \"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"transformers\", transformers.__version__, \"tokenizers\", tokenizers.__version__, \"papermill\", papermill.__version__)"; cat COMMIT 2>/dev/null; nproc; free -g'; }
chain_epilogue() { step smi 60 nvidia-smi --query-gpu=name,memory.used --format=csv
  step leftovers 60 bash -c 'ps aux | grep -E "vllm|EngineCore|replaylib" | grep -v grep | wc -l'
  touch $L/ALLDONE; }
poll_and_pack() { local t0; t0=$(date +%s)
  while [ $(( $(date +%s) - t0 )) -lt ${1:-60} ] && [ ! -f $L/ALLDONE ]; do sleep 3; done
  cat $L/progress 2>/dev/null
  for f in $L/campaign*.log $L/hf_*.log; do [ -f $f ] && { echo "--- $(basename $f)"
    grep -E "rror|Traceback|finished|failed|FAILED|done|waiting|room" $f | tail -8 | cut -c1-300; }; done
  tail -2 $L/gpu_memory.csv 2>/dev/null
  if [ -n "$OUT" ]; then
    tar -czf $OUT/logs.tgz -C /tmp logs $(cd /tmp && ls -d rl/runs/campaign-*/logs rl/runs/.engines 2>/dev/null)
    for root in rl rlhf; do
      [ -d /tmp/$root ] && (cd /tmp && tar -czf /tmp/$root.tgz --exclude=.vllm-cache --exclude='*.safetensors' \
        --exclude=state --exclude=states $root && split -b 15M -d -a 1 /tmp/$root.tgz $OUT/$root.tgz.part-)
    done
    du -sh /tmp/rl /tmp/rlhf 2>/dev/null; ls -la $OUT
  fi; }
# Leases 21 on, with Qwen's GGUF among the parts (.whl/qNN):
#   qwen_parts_call SCRIPT  a parts call: its parts put, the chain `SCRIPT chain` started once, the counts so far
#   qwen_from_parts         in the chain: Qwen's parts checked, joined and converted to the embedded model
qwen_parts_call() { put_parts q; start_chain $1
  echo "parts: wheelhouse $(ls /tmp/whp 2>/dev/null | wc -l)/$N_WH extra $(ls /tmp/xp 2>/dev/null | wc -l)/$N_X" \
    "qwen $(ls /tmp/qp 2>/dev/null | wc -l)/$N_Q; $(tail -1 $L/progress 2>/dev/null)"; }
qwen_from_parts() { wait_for /tmp/qp $N_Q; checked "/tmp/qp/*" $Q_SHA || fail "qwen parts"
  mkdir -p /tmp/gg && cat /tmp/qp/* > /tmp/gg/qwen.gguf && rm -rf /tmp/qp
  step convert_qwen 600 python3 -m replaylib.models fetch qwen2.5-coder-0.5b-instruct --gguf /tmp/gg/qwen.gguf ||
    fail "qwen conversion"; }
