#!/usr/bin/env bash
# Prepare, on a machine with a package registry, the wheels scripts/gpu_check.sh installs on the lent GPU machine
# (it has Python 3.12, torch, torchvision, lightning, OpenCV, matplotlib and TensorBoard, but no registry and
# none of: lmdb, hydra-core, omegaconf, antlr4, torchcodec, zstandard). They go into .whl/ (ignored by git, ~11 MB):
#   bash scripts/gpu_wheels.sh            then run through the device tool, carrying .whl:
#   bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# .whl/ is in .gitignore
mkdir -p .whl
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" -d .whl \
  torchcodec==0.17.0 lmdb==3.0.0 hydra-core==1.3.8 omegaconf==2.3.1 zstandard==0.25.0
python3 -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3   # an sdist only: build its pure-Python wheel here
ls -la .whl
