"""The small CNN of the distributed-training guide: two 5x5 convolutions (20 and 50 filters, ReLU fused)
each followed by 2x2 max pooling, then 500 hidden units and the class scores."""
from tandem import layer

from model.classifier import Classifier


class CNN(Classifier):
    input_size = 28
    dimension = 4

    def __init__(self, num_classes=10, num_channels=1):
        super().__init__(num_classes)
        # The older positional form: input channels, filters, kernel size.
        self.conv1 = layer.Conv2d(num_channels, 20, 5, padding=0, activation="RELU")
        self.pool1 = layer.MaxPool2d(2, 2, padding=0)
        self.conv2 = layer.Conv2d(20, 50, 5, padding=0, activation="RELU")
        self.pool2 = layer.MaxPool2d(2, 2, padding=0)
        self.flatten = layer.Flatten()
        self.hidden = layer.Linear(500)  # input size taken at the first call
        self.relu = layer.ReLU()
        self.scores = layer.Linear(num_classes)

    def forward(self, x):
        x = self.pool1(self.conv1(x))
        x = self.pool2(self.conv2(x))
        return self.scores(self.relu(self.hidden(self.flatten(x))))


def create_model(pretrained=False, **kwargs):
    """A CNN; ``pretrained`` weights are not available (only False)."""
    if pretrained:
        raise ValueError("no pretrained CNN weights are available")
    return CNN(**kwargs)
