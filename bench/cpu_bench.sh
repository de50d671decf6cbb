#!/usr/bin/env bash
# CPU training throughput of the guide's CNN on Fashion-MNIST, batch 64: tandem against the PyTorch
# peer script, in one run, with the same thread count. Prints one line per system and thread count.
#   bench/cpu_bench.sh [PEER_SCRIPT] [DATA_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
PEER=${1:-../shared/bench/pytorch_cpu_cnn.py}
DATA=${2:-/usr/share/datasets/fashion-mnist}
T=${T:-build/bin/tandem}
PY=${PY:-/usr/bin/python3}  # Debian's python3-torch
[ -x "$T" ] || ./tandem.sh build
for th in 1 2; do
  line=$(OMP_NUM_THREADS=$th MKL_NUM_THREADS=$th "$PY" "$PEER" 1 64 "$DATA" | grep '^epoch')
  echo "pytorch threads=$th: $line"
  rm -f /tmp/tandem_cpu_bench.jsonl
  "$T" train --model cnn --dataset fashion-mnist --data-dir "$DATA" --epochs 1 --batch-size 64 --lr 0.005 \
    --momentum 0.9 --weight-decay 1e-5 --threads $th --progress off --metrics /tmp/tandem_cpu_bench.jsonl >/dev/null 2>&1
  python3 -c "import json; j=json.loads(open('/tmp/tandem_cpu_bench.jsonl').readline()); \
print(f\"tandem  threads=$th: epoch 0 train_loss {j['train_loss']:.1f} train_acc {j['train_acc']:.4f} eval_acc {j['eval_acc']:.4f} train_s {j['train_s']:.2f} imgs/s {j['train_images_per_s']:.0f}\")"
done
