#!/bin/bash
# copy the working tree (without the wheel / gguf parts) to /tmp/repo: background runs read this copy
set -e
rm -rf /tmp/repo && mkdir -p /tmp/repo
tar --exclude=./.gpu --exclude=./.gguf --exclude=./.git -cf - . | tar -xf - -C /tmp/repo
mkdir -p /tmp/repo/.gpu && cp -r .gpu/s /tmp/repo/.gpu/s
md5sum replaylib/*.py tests/test_gpu.py > /tmp/repo/.gpu/s/md5.txt
