# Lease 4 (2026-12-01): the paper7b benchmark on the H200, exactly as sent (7 device calls, one machine).
# Here, beforehand: the vLLM 0.22.1 wheelhouse built into .gpu/p00 ... .gpu/p06 (7 parts of <= 50 MiB,
# tar sha256 0a347806...ab2fb); the code (replaylib/, params/, data/paper-records/ of commit ac2fdca and
# a COMMIT file) copied into the git-ignored .dev/gpu-perf/.
# Calls 1-6, carry [".gpu/pNN"], NN = 00 ... 05 (call 1 also printed nvidia-smi):
mkdir -p /tmp/whp && cp .gpu/pNN/* /tmp/whp/
# Call 7, carry [".gpu/p06", ".dev"], timeout 600 s:
cp .gpu/p06/* /tmp/whp/ && R=$PWD && cd /tmp && cat whp/wh.part-* > wh.tar && sha256sum wh.tar | tee $OUT/install.log \
 && tar -xf wh.tar && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site wh/*.whl >> $OUT/install.log 2>&1
cd $R/.dev/gpu-perf && export PYTHONPATH=$PWD:/tmp/site HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONUNBUFFERED=1
(cat COMMIT; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
 python3 -c "import sys,vllm,torch,transformers;print(sys.version.split()[0], vllm.__version__, torch.__version__, transformers.__version__)"
 md5sum replaylib/*.py) > $OUT/versions.log 2>&1
python3 -m replaylib.bench --device cuda --workload paper7b --engine vllm --problems 6 --out /tmp/rb >> $OUT/bench.log 2>&1
python3 -m replaylib.bench --device cuda --workload paper7b --engine vllm --startup-only --out /tmp/rb > $OUT/startup.log 2>&1
