#!/bin/bash
# The parts lease17.sh carries, made from nothing in git-ignored folders, and docs/gpu-h200/scripts/lease17.parts
# (their counts and sha256). Needs the embedded model fetched with its GGUF kept (`python -m replaylib.models fetch
# qwen2.5-coder-0.5b-instruct --keep-gguf`: models/NAME.gguf beside models/NAME/) and the vLLM 0.22.1 wheelhouse as
# a tar of wh/*.whl (../shared/gpu/build-wheelhouse.sh).
#   lease17_parts.sh WHEELHOUSE_TAR IMAGE_PACKAGES     (lease 17: IMAGE_PACKAGES = lease16.image-packages)
# IMAGE_PACKAGES: the names of the Python packages the device's image holds, one a line. The extra wheels: papermill
# and ipykernel with what they need at the pins of requirements.lock, less what the image or the wheelhouse already
# holds; and TRL with what it needs that the image may hold too old (datasets, multiprocess, accelerate,
# pyarrow), at the lock's pins.
set -e
wheelhouse=$(realpath "${1:?usage: lease17_parts.sh WHEELHOUSE_TAR IMAGE_PACKAGES}")
image=$(realpath "${2:?usage: lease17_parts.sh WHEELHOUSE_TAR IMAGE_PACKAGES}")
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
# without their dependencies (accelerate's would pull torch, which the image holds)
python3 -m pip download -q --no-deps "${py[@]}" -d $x/dl trl==1.16.0 datasets==5.2.0 accelerate==1.15.0 \
  multiprocess==0.70.19 pyarrow==$(sed -n 's/^pyarrow==//p' requirements.lock)
names() { tr 'A-Z_.' 'a-z--' | sed 's/ *$//'; }  # normalized package names
{ cat "$image"; tar -tf "$wheelhouse" | sed -n 's|^wh/\(.*\)\.whl$|\1|p' | cut -d- -f1; } | names > $x/present
for f in $x/dl/*.whl; do n=$(basename $f | cut -d- -f1 | names); case $n in accelerate|pyarrow) ;; *) grep -qx $n $x/present && rm $f;; esac; done
tar -C $x -cf - dl | split_into .whl/x x
split_into .whl/q qwen < $models/qwen2.5-coder-0.5b-instruct.gguf
rm -rf $x
{ echo "N_WH=$(ls -d .gpu/p[0-9]* | wc -l) WH_SHA=$(sha .gpu/p[0-9]*/*)"
  for k in x q; do echo "N_${k^^}=$(ls -d .whl/$k[0-9]* | wc -l) ${k^^}_SHA=$(sha .whl/$k[0-9]*/*)"; done
} > docs/gpu-h200/scripts/lease17.parts
cat docs/gpu-h200/scripts/lease17.parts
