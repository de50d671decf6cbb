#!/usr/bin/env bash
# ResNet-50 training throughput at batch 128 per GPU on synthetic 224x224 data, tandem beside the
# PyTorch peer (.data/peer/pytorch_ddp.py), on 1 and 2 GPUs. Expects a built build-gpu/.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T=$PWD/build-gpu/bin/tandem
for n in 1 2; do
  python3 -m torch.distributed.run --standalone --nproc_per_node=$n .data/peer/pytorch_ddp.py --model resnet50 \
    --batch 128 --steps 20 --warmup 5 2>&1 | grep RESULT | sed "s/^/peer ${n}gpu: /"
  $T launch -n $n -- $T bench train --model resnet50 --image 224 --channels 3 --classes 1000 -b 128 --steps 20 \
    --warmup 5 --device cuda 2>&1 | grep -E 'RESULT|error' | sed "s/^/tandem ${n}gpu: /"
done
