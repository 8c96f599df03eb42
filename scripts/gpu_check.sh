#!/usr/bin/env bash
# GPU check for a lent GPU machine (under 5 minutes): the GPU-marked tests, then the raw-vs-LMDB A/B
# on the GPU, printing GPU utilisation per backend. Results land in ${OUT:-/tmp}/gpu_ab.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp}/gpu_ab"
pip install -q -e ".[test]"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python -m pytest -q -m gpu
python train.py -m data=raw,lmdb ab.repeats=2 trainer=gpu loader=fast trainer.max_epochs=3 trainer.enable_progress_bar=false \
  demo.images_per_class=1000 data.image_size=128 paths.data_dir="$out/data" hydra.sweep.dir="$out/sweep"
echo "== A/B on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) =="
cat "$out/sweep/comparison.txt"
