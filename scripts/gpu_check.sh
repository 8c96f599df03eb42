#!/usr/bin/env bash
# GPU check for a lent GPU machine (under 5 minutes). Prepare the wheels here first (bash scripts/gpu_wheels.sh), then run
# this script through the device tool with carry [".whl"]. It prints, and leaves under ${OUT:-/tmp}:
#   1. the GPU-marked tests (batched GPU decode vs CPU on a database mixing JPEG bytes and zstd pixels, PerfMonitor's
#      GPU metrics, a GPU fit, detection boxes moved exactly by the batched nvJPEG decode);
#   2. scripts/gpu_decode_check.py: nvJPEG's stream-ordering stress check (TorchCodec PR 1634), GPU vs CPU pixels,
#      and batched GPU decode throughput against the CPU decoders;
#   3. the raw-vs-LMDB A/B on the GPU with the batched GPU decode (data.decode_device=cuda): data-wait and GPU utilisation;
#   4. a short peers run on 2,000 PNGs with the batches finished on the GPU: the default path x ImageFolder and each
#      auto row against its decode-only ceiling (the PNG targets this 2-core VM could not show).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp}"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then  # the lent machine: no registry; its own torch, lightning, OpenCV; the rest from the carried wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD"
else
  python3 -m pip install -q -e ".[test]"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, torchvision, torchcodec, lightning, cv2; print('torch', torch.__version__, 'torchvision', torchvision.__version__,
'torchcodec', torchcodec.__version__, 'lightning', lightning.__version__, 'cv2', cv2.__version__)"
python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_batchdecode.py tests/test_callbacks.py tests/test_train.py tests/test_masks_serve.py tests/test_boxes.py 2>&1 | tee "$out/gpu_tests.txt"
python3 scripts/gpu_decode_check.py 2>&1 | tee "$out/gpu_decode.txt"
python3 train.py -m data=raw,lmdb ab.repeats=2 trainer=gpu loader=fast trainer.max_epochs=3 trainer.enable_progress_bar=false \
  data.decode_device=cuda demo.images_per_class=1000 data.image_size=128 paths.data_dir="$out/data" hydra.sweep.dir="$out/sweep"
echo "== A/B on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), batched GPU decode =="
cat "$out/sweep/comparison.txt"
# The loader against its decode-only ceiling with the batches finished on the GPU (issue: fast by default), a short PNG run.
python3 benchmarks/peers.py --photos 0 --pngs 2000 --icons 0 --rounds 1 --warm-passes 2 --no-peers --only "auto" --finish-device cuda --dir /tmp/peers_cuda \
  --out "$out/peers_cuda" 2>&1 | grep -v -i warn | tee "$out/peers_cuda.txt"
