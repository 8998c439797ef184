#!/bin/bash
# Lease 12b: the three credit tests of tests/test_gpu.py again, after lease 12 (the tool given --enforce-eager
# for the smoke configuration's eagerly sampled trunks; the test's own vllm.LLM calls without a progress bar).
# Only the vLLM wheels travel (the tiny model is built from its config).
#   lease12b.sh parts       copy the parts this call carried under /tmp; the first call also starts the chain
#   lease12b.sh poll SECS   wait up to SECS for the chain's end; report; pack the logs into $OUT
L=/tmp/logs; mkdir -p $L
WH_SHA=${WH_SHA:-d1277ba8708340e54e005953b163c7cb073cec96fc968d130fe05bcadc4ec9d6}
EXTRA_SHA=${EXTRA_SHA:-68a9300c594ca84a283d05445fbe40ea1a325aab54af7b63d4a6f1f584b3873f}
N_WH=8 N_EXTRA=3
put() { mkdir -p $2; for f in $1/*; do [ -f "$f" ] && cp "$f" "$2/.$(basename $f).tmp" && mv "$2/.$(basename $f).tmp" "$2/$(basename $f)"; done; }
case $1 in
parts)
  for d in .gpu/p[0-9]*; do [ -d "$d" ] && put $d /tmp/whp; done
  for d in .whl/r[0-9]*; do [ -d "$d" ] && put $d /tmp/xp; done
  if [ ! -f $L/chain.started ]; then
    rm -rf /tmp/repo && mkdir -p /tmp/repo && tar --exclude=./.gpu --exclude=./.whl -cf - . | tar -xf - -C /tmp/repo
    touch $L/chain.started
    setsid bash /tmp/repo/docs/gpu-h200/scripts/lease12b.sh chain > $L/chain.out 2>&1 < /dev/null &
  fi
  echo "parts: wheelhouse $(ls /tmp/whp 2>/dev/null | wc -l)/$N_WH extra $(ls /tmp/xp 2>/dev/null | wc -l)/$N_EXTRA; $(tail -1 $L/progress 2>/dev/null)";;
chain)
  export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 REPLAYLIB_MODELS=/tmp/models TQDM_DISABLE=1 RAY_USAGE_STATS_ENABLED=0
  step() { local name=$1 t=$2; shift 2; echo "=== $name start $(date -u +%T)" >> $L/progress
    timeout $t "$@" > $L/$name.log 2>&1; local rc=$?; echo "=== $name rc=$rc $(date -u +%T)" >> $L/progress; return $rc; }
  wait_for() { while [ "$(ls $1 2>/dev/null | wc -l)" -lt $2 ]; do sleep 1; done; }
  cd /tmp/repo
  echo "=== chain start $(date -u +%T) commit $(cat COMMIT 2>/dev/null)" >> $L/progress
  wait_for /tmp/whp $N_WH; wait_for /tmp/xp $N_EXTRA
  [ "$(cat /tmp/whp/wh.part-* | sha256sum | cut -d' ' -f1)" = $WH_SHA ] &&
    [ "$(cat /tmp/xp/extra.part-* | sha256sum | cut -d' ' -f1)" = $EXTRA_SHA ] || { echo "=== FAILED: parts" >> $L/progress; touch $L/ALLDONE; exit 1; }
  step install 600 bash -c 'cd /tmp && cat whp/wh.part-* | tar -xf - && cat xp/extra.part-* | tar -xf - &&
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site wh/*.whl dlk/*.whl'
  export PYTHONPATH=/tmp/site:/tmp/repo
  step credit_tests 560 python3 -m pytest -q -p no:cacheprovider -n 3 --timeout 540 tests/test_gpu.py -rA \
    -k "certifies_rollouts_vllm_sampled or beside_a_stage or caller_built"
  touch $L/ALLDONE;;
poll)
  t0=$(date +%s); while [ $(( $(date +%s) - t0 )) -lt ${2:-60} ] && [ ! -f $L/ALLDONE ]; do sleep 3; done
  cat $L/progress 2>/dev/null
  [ -f $L/credit_tests.log ] && grep -E "^(PASSED|FAILED|ERROR)|passed|failed|^E  .*(Assert|assert)" $L/credit_tests.log | grep -v INFO | tail -12 | cut -c1-300
  [ -n "$OUT" ] && tar -czf $OUT/logs.tgz -C /tmp logs;;
*) echo "usage: lease12b.sh parts|poll SECS"; exit 2;;
esac
