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
