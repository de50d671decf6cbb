"""Image data sets from their standard files, as NumPy arrays."""
import numpy as np

from . import _tandem


def load_dataset(name="fashion-mnist", data_dir=None, train=True):
    """(x, y): float32 images [N, C, H, W] scaled to [0, 1] and int32 labels [N].

    ``name`` is 'fashion-mnist', 'mnist' or 'cifar10'; ``data_dir`` None reads the default directory
    (Fashion-MNIST: /usr/share/datasets/fashion-mnist, Debian's dataset-fashion-mnist).
    """
    ds = _tandem.load_dataset(name, data_dir or "", train)
    x = ds.images.to_numpy().astype(np.float32)
    x /= 255.0
    return x, ds.labels.to_numpy()


def load_fashion_mnist(data_dir=None):
    """train_x, train_y, test_x, test_y of Fashion-MNIST, as the guide's load_dataset returns them."""
    train_x, train_y = load_dataset("fashion-mnist", data_dir, True)
    test_x, test_y = load_dataset("fashion-mnist", data_dir, False)
    return train_x, train_y, test_x, test_y


default_data_dir = _tandem.default_data_dir
dataset_names = _tandem.dataset_names
