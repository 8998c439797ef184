#!/bin/bash
# wait up to $1 s for flag $2 (or a failing step), then report and pack the logs into $OUT
L=/tmp/logs; lim=${1:-60}; flag=${2:-ALLDONE_all}; t0=$(date +%s)
nfail0=$(cat $L/progress 2>/dev/null | grep -c "rc=[1-9]")
while [ $(( $(date +%s) - t0 )) -lt $lim ]; do
  [ -f $L/$flag ] && break
  nfail=$(cat $L/progress 2>/dev/null | grep -c "rc=[1-9]"); [ "$nfail" != "$nfail0" ] && break
  sleep 3
done
echo "--- progress"; cat $L/progress 2>/dev/null; ls $L
echo "--- key lines"
grep -h -E "^(COUNTS|SUMMARY|PROBLEM_STATE|PIVOTS|SAMPLING|INVARIANT_REPORT|INVARIANT_FAILED|DRIVE_|REPLAY|TRUNKS)|passed|failed|skipped|Error|error:|Traceback" $L/*.log 2>/dev/null | cut -c1-600 | tail -80
if [ -n "$OUT" ]; then tar -czf $OUT/logs.tgz -C /tmp logs; cp $L/runs_*.tgz $OUT/ 2>/dev/null; fi
true
