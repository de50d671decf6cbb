"""The PyTorch side of bench/cpu_bench.sh: the guide's CNN (conv 20 5x5, pool, conv 50 5x5, pool,
linear 500, linear 10) trained on Fashion-MNIST's IDX files with SGD (lr 0.005, momentum 0.9,
weight decay 1e-5), one line per epoch with the training throughput.

usage: pytorch_cpu_cnn.py EPOCHS BATCH DATA_DIR THREADS
"""
import gzip
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        ndim = struct.unpack(">I", f.read(4))[0] & 0xFF
        dims = struct.unpack(">" + "I" * ndim, f.read(4 * ndim))
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(dims)


class GuideCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 20, 5), nn.Conv2d(20, 50, 5)
        self.fc1, self.fc2 = nn.Linear(4 * 4 * 50, 500), nn.Linear(500, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def main():
    epochs, batch, data, threads = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    torch.set_num_threads(threads)
    images = lambda name: torch.from_numpy(read_idx(f"{data}/{name}").copy()).float().unsqueeze(1) / 255
    labels = lambda name: torch.from_numpy(read_idx(f"{data}/{name}").astype(np.int64))
    train_x, train_y = images("train-images-idx3-ubyte.gz"), labels("train-labels-idx1-ubyte.gz")
    test_x, test_y = images("t10k-images-idx3-ubyte.gz"), labels("t10k-labels-idx1-ubyte.gz")
    torch.manual_seed(0)
    model = GuideCnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9, weight_decay=1e-5)
    n = len(train_x)
    for epoch in range(epochs):
        order = torch.randperm(n)
        model.train()
        loss_sum, correct, seen = 0.0, 0, 0
        start = time.perf_counter()
        for i in range(0, n, batch):
            idx = order[i:i + batch]
            x, y = train_x[idx], train_y[idx]
            out = model(x)
            loss = F.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += loss.item()
            correct += (out.argmax(1) == y).sum().item()
            seen += len(idx)
        train_s = time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            hits = sum((model(test_x[i:i + 1000]).argmax(1) == test_y[i:i + 1000]).sum().item()
                       for i in range(0, len(test_x), 1000))
        print(f"epoch {epoch} train_loss {loss_sum:.1f} train_acc {correct / seen:.4f} "
              f"eval_acc {hits / len(test_x):.4f} train_s {train_s:.2f} imgs/s {seen / train_s:.0f}", flush=True)


if __name__ == "__main__":
    main()
