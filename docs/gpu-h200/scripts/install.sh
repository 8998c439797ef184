#!/bin/bash
# unpack + install the vLLM wheelhouse (shared/gpu/README.md step 3), snapshot the repo to /tmp/repo
set -e
t0=$(date +%s)
cd /tmp && cat whp/wh.part-* > wh.tar && sha256sum wh.tar && tar -xf wh.tar
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site wh/*.whl
echo "installed in $(( $(date +%s) - t0 ))s"
