"""AlexNet (five convolutions, three fully connected layers with dropout) on 224 x 224 inputs."""
from tandem import layer

from model.classifier import Classifier


class AlexNet(Classifier):
    input_size = 224
    dimension = 4

    def __init__(self, num_classes=10, num_channels=1):
        super().__init__(num_classes)
        # (filters, kernel, stride, padding, pooled after) of each convolution, each followed by a ReLU.
        convs = [(64, 11, 4, 2, True), (192, 5, 1, 2, True), (384, 3, 1, 1, False), (256, 3, 1, 1, False),
                 (256, 3, 1, 1, True)]
        self.features = []
        channels = num_channels
        for i, (filters, kernel, stride, padding, pooled) in enumerate(convs):
            self.features.append(layer.Conv2d(channels, filters, kernel, stride=stride, padding=padding))
            self.features.append(layer.ReLU())
            if pooled:
                self.features.append(layer.MaxPool2d(2, 2, padding=0))
            channels = filters
        self.features.append(layer.AvgPool2d(3, 2, padding=0))
        self.register_layers(*self.features)
        self.flatten = layer.Flatten()
        self.drop1 = layer.Dropout()
        self.fc1 = layer.Linear(4096)
        self.relu1 = layer.ReLU()
        self.drop2 = layer.Dropout()
        self.fc2 = layer.Linear(4096)
        self.relu2 = layer.ReLU()
        self.scores = layer.Linear(num_classes)

    def forward(self, x):
        for f in self.features:
            x = f(x)
        x = self.relu1(self.fc1(self.drop1(self.flatten(x))))
        x = self.relu2(self.fc2(self.drop2(x)))
        return self.scores(x)


def create_model(pretrained=False, **kwargs):
    """An AlexNet; ``pretrained`` weights are not available (only False)."""
    if pretrained:
        raise ValueError("no pretrained AlexNet weights are available")
    return AlexNet(**kwargs)
