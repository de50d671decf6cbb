"""Xception (Chollet, 2017) on 299 x 299 inputs: depthwise-separable convolutions in residual blocks
(entry flow, eight middle blocks, exit flow), then global max pooling and the class scores."""
from tandem import layer

from model.classifier import Classifier


class Block(layer.Layer):
    """``reps`` (ReLU, 3x3 separable convolution, batch norm) units with a shortcut; the channel count
    changes in the first unit (``grow_first``) or the last; a stride > 1 ends in 3x3 max pooling and
    projects the shortcut."""

    def __init__(self, in_filters, out_filters, reps, strides=1, padding=0, start_with_relu=True, grow_first=True):
        super().__init__()
        if in_filters != out_filters or strides != 1:
            self.skip = layer.Conv2d(in_filters, out_filters, 1, stride=strides, padding=padding, bias=False)
            self.skipbn = layer.BatchNorm2d(out_filters)
        else:
            self.skip = None
        # Channel counts along the units: in -> out -> out ... (grow_first) or in -> in ... -> out.
        widths = [in_filters] + [out_filters] * reps if grow_first else [in_filters] * reps + [out_filters]
        units = []
        for c_in, c_out in zip(widths[:-1], widths[1:]):
            units += [layer.ReLU(), layer.SeparableConv2d(c_in, c_out, 3, stride=1, padding=1, bias=False),
                      layer.BatchNorm2d(c_out)]
        if not start_with_relu:
            units = units[1:]
        if strides != 1:
            units.append(layer.MaxPool2d(3, strides, padding + 1))
        self.units = units
        self.register_layers(*units)
        self.add = layer.Add()

    def forward(self, x):
        y = x
        for u in self.units:
            y = u(y)
        shortcut = x if self.skip is None else self.skipbn(self.skip(x))
        return self.add(y, shortcut)


class Xception(Classifier):
    input_size = 299
    dimension = 4

    def __init__(self, num_classes=10, num_channels=3):
        super().__init__(num_classes)
        # The older positional form: input channels, filters, kernel, stride, padding.
        self.conv1 = layer.Conv2d(num_channels, 32, 3, 2, 0, bias=False)
        self.bn1 = layer.BatchNorm2d(32)
        self.relu1 = layer.ReLU()
        self.conv2 = layer.Conv2d(32, 64, 3, 1, 1, bias=False)
        self.bn2 = layer.BatchNorm2d(64)
        self.relu2 = layer.ReLU()
        self.entry = [Block(64, 128, 2, 2, start_with_relu=False), Block(128, 256, 2, 2), Block(256, 728, 2, 2)]
        self.middle = [Block(728, 728, 3, 1) for _ in range(8)]
        self.exit = Block(728, 1024, 2, 2, grow_first=False)
        self.register_layers(*self.entry, *self.middle)
        self.conv3 = layer.SeparableConv2d(1024, 1536, 3, 1, 1)
        self.bn3 = layer.BatchNorm2d(1536)
        self.relu3 = layer.ReLU()
        self.conv4 = layer.SeparableConv2d(1536, 2048, 3, 1, 1)
        self.bn4 = layer.BatchNorm2d(2048)
        self.relu4 = layer.ReLU()
        self.pool = layer.MaxPool2d(10, 1)  # the whole 10 x 10 map of a 299 x 299 input
        self.flatten = layer.Flatten()
        self.fc = layer.Linear(num_classes)

    def features(self, x):
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.relu2(self.bn2(self.conv2(x)))
        for b in self.entry + self.middle:
            x = b(x)
        x = self.exit(x)
        x = self.relu3(self.bn3(self.conv3(x)))
        return self.bn4(self.conv4(x))

    def forward(self, x):
        x = self.relu4(self.features(x))
        return self.fc(self.flatten(self.pool(x)))


def create_model(pretrained=False, **kwargs):
    """An Xception; ``pretrained`` weights are not available (only False)."""
    if pretrained:
        raise ValueError("no pretrained Xception weights are available")
    return Xception(**kwargs)
