"""A one-hidden-layer perceptron on flattened images."""
from tandem import layer

from model.classifier import Classifier


class MLP(Classifier):
    dimension = 2

    def __init__(self, data_size=784, perceptron_size=100, num_classes=10):
        super().__init__(num_classes)
        self.data_size = data_size
        self.hidden = layer.Linear(data_size, perceptron_size)
        self.relu = layer.ReLU()
        self.scores = layer.Linear(num_classes)

    def forward(self, x):
        return self.scores(self.relu(self.hidden(x)))


def create_model(pretrained=False, **kwargs):
    """An MLP; ``pretrained`` weights are not available (only False)."""
    if pretrained:
        raise ValueError("no pretrained MLP weights are available")
    return MLP(**kwargs)
