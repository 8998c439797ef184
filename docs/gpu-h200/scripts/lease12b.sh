#!/bin/bash
# Lease 12b: the three credit tests of tests/test_gpu.py again, after lease 12 (the tool given --enforce-eager
# for the smoke configuration's eagerly sampled trunks; the test's own vllm.LLM calls without a progress bar);
# then the credit tool on lease 12's nine rollouts with vLLM at 64 and 256 continuation tokens, to hold the
# calibrated estimate it prints against the time the groups took.
#   lease12b.sh parts       copy the parts this call carried under /tmp; the first call also starts the chain
#   lease12b.sh poll SECS   wait up to SECS for the chain's end; report; pack logs and results into $OUT
L=/tmp/logs; mkdir -p $L
WH_SHA=${WH_SHA:-d1277ba8708340e54e005953b163c7cb073cec96fc968d130fe05bcadc4ec9d6}
EXTRA_SHA=${EXTRA_SHA:-68a9300c594ca84a283d05445fbe40ea1a325aab54af7b63d4a6f1f584b3873f}
GGUF_SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
N_WH=8 N_EXTRA=3 N_GGUF=11
put() { mkdir -p $2; for f in $1/*; do [ -f "$f" ] && cp "$f" "$2/.$(basename $f).tmp" && mv "$2/.$(basename $f).tmp" "$2/$(basename $f)"; done; }
case $1 in
parts)
  for d in .gpu/p[0-9]*; do [ -d "$d" ] && put $d /tmp/whp; done
  for d in .whl/r[0-9]*; do [ -d "$d" ] && put $d /tmp/xp; done
  for d in .whl/g[0-9]*; do [ -d "$d" ] && put $d /tmp/gg/parts; done
  if [ ! -f $L/chain.started ]; then
    rm -rf /tmp/repo && mkdir -p /tmp/repo && tar --exclude=./.gpu --exclude=./.whl -cf - . | tar -xf - -C /tmp/repo
    touch $L/chain.started
    setsid bash /tmp/repo/docs/gpu-h200/scripts/lease12b.sh chain > $L/chain.out 2>&1 < /dev/null &
  fi
  echo "parts: wheelhouse $(ls /tmp/whp 2>/dev/null | wc -l)/$N_WH extra $(ls /tmp/xp 2>/dev/null | wc -l)/$N_EXTRA gguf $(ls /tmp/gg/parts 2>/dev/null | wc -l)/$N_GGUF; $(tail -1 $L/progress 2>/dev/null)";;
chain)
  export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 REPLAYLIB_MODELS=/tmp/models TQDM_DISABLE=1 RAY_USAGE_STATS_ENABLED=0
  step() { local name=$1 t=$2; shift 2; echo "=== $name start $(date -u +%T)" >> $L/progress
    timeout $t "$@" > $L/$name.log 2>&1; local rc=$?; echo "=== $name rc=$rc $(date -u +%T)" >> $L/progress; return $rc; }
  fail() { echo "=== FAILED: $1 $(date -u +%T)" >> $L/progress; touch $L/ALLDONE; exit 1; }
  wait_for() { while [ "$(ls $1 2>/dev/null | wc -l)" -lt $2 ]; do sleep 1; done; }
  cd /tmp/repo
  echo "=== chain start $(date -u +%T) commit $(cat COMMIT 2>/dev/null)" >> $L/progress
  wait_for /tmp/whp $N_WH; wait_for /tmp/xp $N_EXTRA
  [ "$(cat /tmp/whp/wh.part-* | sha256sum | cut -d' ' -f1)" = $WH_SHA ] &&
    [ "$(cat /tmp/xp/extra.part-* | sha256sum | cut -d' ' -f1)" = $EXTRA_SHA ] || fail "wheel parts"
  step install 600 bash -c 'cd /tmp && cat whp/wh.part-* | tar -xf - && cat xp/extra.part-* | tar -xf - &&
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site wh/*.whl dlk/*.whl' ||
    fail install
  export PYTHONPATH=/tmp/site:/tmp/repo
  step credit_tests 560 python3 -m pytest -q -p no:cacheprovider -n 3 --timeout 540 --basetemp=/tmp/pt tests/test_gpu.py \
    -rA -k "certifies_rollouts_vllm_sampled or beside_a_stage or caller_built"
  wait_for /tmp/gg/parts $N_GGUF
  [ "$(cat /tmp/gg/parts/g.part-* | sha256sum | cut -d' ' -f1)" = $GGUF_SHA ] || fail "model parts"
  cat /tmp/gg/parts/g.part-* > /tmp/gg/model.gguf
  step convert 600 python3 -m replaylib.models fetch --gguf /tmp/gg/model.gguf || fail convert
  C="python3 -m replaylib.credit docs/gpu-h200/lease12/rollouts-embedded.jsonl --model embedded:qwen2.5-coder-0.5b-instruct
     --grader gsm8k --device cuda --k 4 --margin 1.0 --max-pivots-per-rollout 3 --max-model-len 4096 --engine vllm"
  mkdir -p /tmp/cr
  step credit_vllm64 600 $C --max-cont-tokens 64 --out /tmp/cr/vllm64
  step credit_vllm256 600 $C --max-cont-tokens 256 --out /tmp/cr/vllm256
  touch $L/ALLDONE;;
poll)
  t0=$(date +%s); while [ $(( $(date +%s) - t0 )) -lt ${2:-60} ] && [ ! -f $L/ALLDONE ]; do sleep 3; done
  cat $L/progress 2>/dev/null
  [ -f $L/credit_tests.log ] && grep -E "^(PASSED|FAILED|ERROR)|passed|failed|^E  .*(Assert|assert)" $L/credit_tests.log | grep -v INFO | tail -12 | cut -c1-300
  for f in $L/credit_vllm*.log; do [ -f $f ] && { echo "--- $(basename $f)"; grep -E "estimate:|pivots;|rror" $f | tail -3 | cut -c1-400; }; done
  if [ -n "$OUT" ]; then
    tar -czf $OUT/logs.tgz -C /tmp logs
    [ -d /tmp/pt ] && (cd /tmp && find pt -name '*.json' -size -2M | tar -czf $OUT/pt.tgz -T -)
    [ -d /tmp/cr ] && tar -czf $OUT/cr.tgz --exclude='shards' -C /tmp cr
  fi;;
*) echo "usage: lease12b.sh parts|poll SECS"; exit 2;;
esac
