"""Stand-in data for SINGA's examples whose own data is not on the machine (docs/python.md has the runs).

    python bench/make_singa_standins.py malaria FASHION_MNIST_DIR OUT_DIR [TRAIN_PER_CLASS TEST_PER_CLASS]
    python bench/make_singa_standins.py qabot OUT.pickle
    python bench/make_singa_standins.py bank OUT_DIR [CLIENTS]

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


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "malaria":
        malaria(sys.argv[2], sys.argv[3], *[int(v) for v in sys.argv[4:6]])
    elif len(sys.argv) == 3 and sys.argv[1] == "qabot":
        qabot(sys.argv[2])
    elif len(sys.argv) in (3, 4) and sys.argv[1] == "bank":
        bank(sys.argv[2], *[int(v) for v in sys.argv[3:4]])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
