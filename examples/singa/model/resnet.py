"""ResNet (He et al., 2015) on 224 x 224 inputs: 18 and 34 layers of basic blocks, 50, 101 and 152 of
bottleneck blocks. Each stage is a list of blocks given to ``register_layers``; a block whose input and
output shapes differ adds a projection (1x1 convolution and batch norm) to its shortcut."""
from tandem import layer

from model.classifier import Classifier


class Projection(layer.Layer):
    """The shortcut of a block that changes the channel count or the resolution."""

    def __init__(self, in_channels, out_channels, stride):
        super().__init__()
        self.conv = layer.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)
        self.bn = layer.BatchNorm2d(out_channels)

    def forward(self, x):
        return self.bn(self.conv(x))


class BasicBlock(layer.Layer):
    """Two 3x3 convolutions and the shortcut."""

    expansion = 1

    def __init__(self, in_channels, channels, stride=1, shortcut=None):
        super().__init__()
        self.conv1 = layer.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = layer.BatchNorm2d(channels)
        self.relu1 = layer.ReLU()
        self.conv2 = layer.Conv2d(channels, channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = layer.BatchNorm2d(channels)
        self.shortcut = shortcut
        self.add = layer.Add()
        self.relu2 = layer.ReLU()

    def forward(self, x):
        y = self.relu1(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu2(self.add(y, x if self.shortcut is None else self.shortcut(x)))


class Bottleneck(layer.Layer):
    """1x1 reduction, 3x3 convolution, 1x1 expansion to 4 x channels, and the shortcut."""

    expansion = 4

    def __init__(self, in_channels, channels, stride=1, shortcut=None):
        super().__init__()
        out = channels * self.expansion
        self.conv1 = layer.Conv2d(in_channels, channels, 1, bias=False)
        self.bn1 = layer.BatchNorm2d(channels)
        self.relu1 = layer.ReLU()
        self.conv2 = layer.Conv2d(channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn2 = layer.BatchNorm2d(channels)
        self.relu2 = layer.ReLU()
        self.conv3 = layer.Conv2d(channels, out, 1, bias=False)
        self.bn3 = layer.BatchNorm2d(out)
        self.shortcut = shortcut
        self.add = layer.Add()
        self.relu3 = layer.ReLU()

    def forward(self, x):
        y = self.relu1(self.bn1(self.conv1(x)))
        y = self.relu2(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu3(self.add(y, x if self.shortcut is None else self.shortcut(x)))


class ResNet(Classifier):
    input_size = 224
    dimension = 4

    def __init__(self, block, depths, num_classes=10, num_channels=3):
        super().__init__(num_classes)
        self.conv1 = layer.Conv2d(num_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = layer.BatchNorm2d(64)
        self.relu = layer.ReLU()
        self.maxpool = layer.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.blocks = []
        channels = 64
        for stage, depth in enumerate(depths):
            width = 64 << stage
            for i in range(depth):
                stride = 2 if stage > 0 and i == 0 else 1
                shortcut = None
                if stride != 1 or channels != width * block.expansion:
                    shortcut = Projection(channels, width * block.expansion, stride)
                self.blocks.append(block(channels, width, stride, shortcut))
                channels = width * block.expansion
        self.register_layers(*self.blocks)
        self.avgpool = layer.AvgPool2d(7, stride=1)
        self.flatten = layer.Flatten()
        self.fc = layer.Linear(num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for b in self.blocks:
            x = b(x)
        return self.fc(self.flatten(self.avgpool(x)))


_DEPTHS = {18: (BasicBlock, [2, 2, 2, 2]), 34: (BasicBlock, [3, 4, 6, 3]), 50: (Bottleneck, [3, 4, 6, 3]),
           101: (Bottleneck, [3, 4, 23, 3]), 152: (Bottleneck, [3, 8, 36, 3])}


def _resnet(layers, pretrained, kwargs):
    if pretrained:
        raise ValueError(f"no pretrained ResNet-{layers} weights are available")
    block, depths = _DEPTHS[layers]
    return ResNet(block, depths, **kwargs)


def resnet18(pretrained=False, **kwargs):
    return _resnet(18, pretrained, kwargs)


def resnet34(pretrained=False, **kwargs):
    return _resnet(34, pretrained, kwargs)


def resnet50(pretrained=False, **kwargs):
    return _resnet(50, pretrained, kwargs)


def resnet101(pretrained=False, **kwargs):
    return _resnet(101, pretrained, kwargs)


def resnet152(pretrained=False, **kwargs):
    return _resnet(152, pretrained, kwargs)


def create_model(pretrained=False, layers=50, **kwargs):
    """A ResNet of 18, 34, 50 (the default), 101 or 152 layers."""
    if layers not in _DEPTHS:
        raise ValueError(f"ResNet has 18, 34, 50, 101 or 152 layers, not {layers}")
    return _resnet(layers, pretrained, kwargs)
