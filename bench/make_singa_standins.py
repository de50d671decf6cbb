"""Stand-in data for SINGA's examples whose own data is not on the machine (docs/python.md has the runs).

    python bench/make_singa_standins.py malaria FASHION_MNIST_DIR OUT_DIR [TRAIN_PER_CLASS TEST_PER_CLASS]
    python bench/make_singa_standins.py qabot OUT.pickle
    python bench/make_singa_standins.py bank OUT_DIR [CLIENTS]
    /usr/bin/python3 bench/make_singa_standins.py zoo OUT_DIR     (Debian's python3-torch and python3-torchvision)
    python bench/make_singa_standins.py cifar10 FASHION_MNIST_DIR OUT_DIR

malaria: what examples/malaria_cnn (and largedataset_cnn, with OUT_DIR/training_set as its Data folder)
read: PNG files under OUT_DIR/{training_set,testing_set}/{Parasitized,Uninfected}, here Fashion-MNIST shirts
(label 6) and pullovers (label 2) coloured as RGB at 80x80 (the scripts resize them); 640 / 128 per class by
default.

qabot: the cache examples/qabot's prepare_data() reads from /tmp/insuranceQA_cache.pickle in place of
InsuranceQA and the GoogleNews word vectors: 400 answers of 20-60 words from a 2,000-word vocabulary with
random 300-d vectors; 2,000 training and 200 test questions, each 6-12 words drawn from its answer, with 99
other answers as candidates.

bank: the splits examples/hfl's clients read (OUT_DIR/bank_{train,test}_{i}.csv, as its bank.py writes them
from UCI's bank-marketing data): 20 numeric features, 2,000 training and 500 test rows per client (3 by
default), y = 1 where a fixed random linear function of the features plus noise exceeds 0.5; client i's
features are scaled by 1 + 0.3 i.

zoo: the ONNX model-zoo archives examples/onnx downloads into /tmp (give /tmp as OUT_DIR), made from
torchvision's models with their initial (random) weights by torch.onnx.export in the opset of the zoo's file:
resnet18v1.tar.gz (ResNet-18, opset 9), mobilenetv2-1.0.tar.gz (MobileNetV2, 9), squeezenet1.1-7.tar.gz
(SqueezeNet 1.1, 7), shufflenet-v2-10.tar.gz (ShuffleNetV2 x1.0, 10), each holding the .onnx file where the
script opens it; and synset.txt (1,000 made-up class names) and kitten.jpg (examples/onnx/159008.jpg, copied
by hand) beside them.

cifar10: CIFAR-10's Python batches (OUT_DIR/data_batch_1..5 and test_batch, as examples/cnn/data/cifar10.py
reads them from /tmp/cifar-10-batches-py): Fashion-MNIST's 60,000 training and 10,000 test images padded to
32x32 and coloured as RGB, with their 10 labels.
"""
import gzip
import os
import pickle
import random
import sys

import numpy as np


def malaria(src, out, ntrain=640, ntest=128):
    from PIL import Image

    def idx(path, offset):
        with gzip.open(path, "rb") as f:
            return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)

    x = idx(f"{src}/train-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
    y = idx(f"{src}/train-labels-idx1-ubyte.gz", 8)
    for label, name in ((6, "Parasitized"), (2, "Uninfected")):
        images = x[y == label]
        for part, first, count in (("training_set", 0, ntrain), ("testing_set", ntrain, ntest)):
            folder = os.path.join(out, part, name)
            os.makedirs(folder, exist_ok=True)
            for i in range(count):
                g = images[first + i]
                rgb = np.stack([g, (g * 0.6).astype(np.uint8), 255 - g], -1)
                Image.fromarray(rgb).resize((80, 80)).save(os.path.join(folder, f"{i}.png"))
    print(f"{out}: {ntrain} training and {ntest} test images per class")


def qabot(out):
    rng = np.random.default_rng(0)
    random.seed(0)
    vocab = 2000
    idx2word = {i: f"w{i}" for i in range(1, vocab)}
    idx2word[0] = "<pad>"
    idx2vec = {i: rng.standard_normal(300).astype(np.float32) for i in range(1, vocab)}
    idx2vec[0] = np.zeros(300)
    label2answer = {label: [int(w) for w in rng.integers(1, vocab, int(rng.integers(20, 60)))] for label in range(400)}

    def questions(n):
        rows = []
        for _ in range(n):
            answer = random.randrange(400)
            words = random.sample(label2answer[answer], random.randint(6, 12))
            candidates = random.sample([a for a in range(400) if a != answer], 99)
            rows.append((words, [answer], candidates))
        return rows

    with open(out, "wb") as f:
        pickle.dump((questions(2000), questions(200), label2answer, idx2word, idx2vec), f)
    print(f"{out}: 2000 training and 200 test questions over 400 answers")


def bank(out, clients=3):
    import pandas as pd

    rng = np.random.default_rng(0)
    w = rng.standard_normal(20)
    os.makedirs(out, exist_ok=True)
    for i in range(clients):
        for part, n in (("train", 2000), ("test", 500)):
            x = rng.standard_normal((n, 20)) * (1 + i * 0.3)
            frame = pd.DataFrame(x, columns=[f"f{j}" for j in range(20)])
            frame["y"] = ((x @ w + rng.standard_normal(n)) > 0.5).astype(int)
            frame.to_csv(os.path.join(out, f"bank_{part}_{i}.csv"), index=False)
    print(f"{out}: {clients} clients of 2000 training and 500 test rows")


def zoo(out):
    import tarfile
    import tempfile

    import torch
    import torchvision

    torch.manual_seed(0)
    specs = [("resnet18", "resnet18v1", "resnet18v1/resnet18v1.onnx", 9),
             ("mobilenet_v2", "mobilenetv2-1.0", "mobilenetv2-1.0/mobilenetv2-1.0.onnx", 9),
             ("squeezenet1_1", "squeezenet1.1-7", "squeezenet1.1/squeezenet1.1.onnx", 7),
             ("shufflenet_v2_x1_0", "shufflenet-v2-10", "model/test_shufflenetv2/model.onnx", 10)]
    x = torch.randn(1, 3, 224, 224)
    with tempfile.TemporaryDirectory() as tmp:
        for name, archive, path, opset in specs:
            model = getattr(torchvision.models, name)().eval()
            os.makedirs(os.path.join(tmp, os.path.dirname(path)), exist_ok=True)
            torch.onnx.export(model, (x,), os.path.join(tmp, path), opset_version=opset, input_names=["data"],
                              output_names=["out"])
            with tarfile.open(os.path.join(out, f"{archive}.tar.gz"), "w:gz") as t:
                t.add(os.path.join(tmp, path.split("/")[0]), arcname=path.split("/")[0])
            print(f"{out}/{archive}.tar.gz: {name}, opset {opset}")
    with open(os.path.join(out, "synset.txt"), "w") as f:
        f.writelines(f"n{i:08d} class {i}\n" for i in range(1000))


def cifar10(src, out):
    def idx(path, offset):
        with gzip.open(path, "rb") as f:
            return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)

    def rgb(a):
        a = np.pad(a, ((0, 0), (2, 2), (2, 2)))
        return np.stack([a, a // 2 + 60, 255 - a], 1).reshape(len(a), -1)

    x = idx(f"{src}/train-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
    y = idx(f"{src}/train-labels-idx1-ubyte.gz", 8)
    os.makedirs(out, exist_ok=True)
    for i in range(5):
        part = slice(i * 10000, (i + 1) * 10000)
        with open(os.path.join(out, f"data_batch_{i + 1}"), "wb") as f:
            pickle.dump({"data": rgb(x[part]), "labels": [int(v) for v in y[part]]}, f)
    xt = idx(f"{src}/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
    yt = idx(f"{src}/t10k-labels-idx1-ubyte.gz", 8)
    with open(os.path.join(out, "test_batch"), "wb") as f:
        pickle.dump({"data": rgb(xt), "labels": [int(v) for v in yt]}, f)
    print(f"{out}: 5 training batches of 10000 and a test batch of 10000")


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "malaria":
        malaria(sys.argv[2], sys.argv[3], *[int(v) for v in sys.argv[4:6]])
    elif len(sys.argv) == 3 and sys.argv[1] == "qabot":
        qabot(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "cifar10":
        cifar10(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "zoo":
        zoo(sys.argv[2])
    elif len(sys.argv) in (3, 4) and sys.argv[1] == "bank":
        bank(sys.argv[2], *[int(v) for v in sys.argv[3:4]])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
