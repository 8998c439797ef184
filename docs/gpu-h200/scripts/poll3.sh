#!/bin/bash
# wait up to $1 s for flag $2, then report; pack logs and runs (no KV state files) into $OUT
L=/tmp/logs; lim=${1:-60}; flag=${2:-ALLDONE}; t0=$(date +%s)
while [ $(( $(date +%s) - t0 )) -lt $lim ]; do [ -f $L/$flag ] && break; sleep 3; done
echo "--- progress"; cat $L/progress 2>/dev/null
for f in $L/run_*.log; do [ -f $f ] && { echo "--- $f"; tail -4 $f | cut -c1-400; }; done
for f in $L/bench_*.log; do [ -f $f ] && { echo "--- $f"; tail -3 $f | cut -c1-300; }; done
grep -h -E "passed|failed|Error|error:" $L/gpu_tests.log $L/install.log $L/convert.log 2>/dev/null | tail -5
if [ -n "$OUT" ]; then
  tar -czf $OUT/logs.tgz -C /tmp logs
  [ -d /tmp/rl/runs ] && tar -czf $OUT/runs.tgz --exclude='*.safetensors' --exclude='*.parquet.tmp' -C /tmp/rl runs
  ls -la $OUT
fi
true
