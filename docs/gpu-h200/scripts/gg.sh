#!/bin/bash
# collect GGUF parts; when all 10 are there, assemble and check the sha256
mkdir -p /tmp/gg/parts
for d in .gguf/g*; do [ -d "$d" ] && cp $d/* /tmp/gg/parts/; done
n=$(ls /tmp/gg/parts | wc -l); echo "gguf parts on device: $n/10"
if [ "$n" = 10 ] && [ ! -f /tmp/gg/READY ]; then
  cat /tmp/gg/parts/g.part-* > /tmp/gg/model.gguf
  s=$(sha256sum /tmp/gg/model.gguf | cut -d' ' -f1); echo "gguf sha256 $s"
  if [ "$s" = 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 ]; then rm -rf /tmp/gg/parts; touch /tmp/gg/READY; echo GGUF_READY; else echo GGUF_BAD; fi
fi
