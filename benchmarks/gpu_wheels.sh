#!/usr/bin/env bash
# Wheels that benchmarks/gpu.sh needs beside a GPU machine's own packages (its image has torch, peft, accelerate,
# tokenizers, pyarrow, pandas, fsspec, xxhash; not trl, datasets, msgspec, dill, multiprocess, and transformers at
# another version), fetched on a machine with PyPI for Python 3.12 on x86-64 into .whl/ (ignored by git:
# `echo /.whl/ >> .git/info/exclude`). About 13 MB; the device tool carries 64 MiB with the repository (~25 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
    -d .whl trl==1.16.0 transformers==5.23.0 datasets==5.2.0 msgspec dill multiprocess
