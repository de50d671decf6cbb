"""Layers (SINGA's ``singa.layer``).

A layer creates its parameters at its first call, from the input: their shapes follow the input's
(``Linear(500)`` takes its input size then), they are placed on the input's device, and they are
drawn from that device's generator (``dev.SetRandSeed``). Layers assigned as attributes of a layer
or model are its sublayers, in the order of assignment; parameters are named by attribute path
("conv1.weight").
"""
from . import _tandem

_ACTIVATIONS = (None, "NOTSET", "RELU")


def _pair(v, what):
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"{what} must be an int or a pair, got {v!r}")
        return int(v[0]), int(v[1])
    return int(v), int(v)


def _square(v, what):
    a, b = _pair(v, what)
    if a != b:
        raise ValueError(f"{what} {v!r}: this layer takes the same value for height and width")
    return a


class Layer:
    """Base of layers and models."""

    def __init__(self):
        self.__dict__.setdefault("_layers", {})
        self.__dict__.setdefault("_params", {})
        self._cpp = None  # the C++ module of a built-in layer, once initialised
        self._initialized = False
        self.training = True

    def __setattr__(self, name, value):
        layers = self.__dict__.setdefault("_layers", {})
        layers.pop(name, None)
        if isinstance(value, Layer):
            layers[name] = value
        object.__setattr__(self, name, value)

    def __call__(self, *args, **kwargs):
        if not self._initialized:
            self.initialize(*args, **kwargs)
            self._initialized = True
        return self.forward(*args, **kwargs)

    def initialize(self, *args, **kwargs):
        """Creates the parameters from the first input (nothing for layers without any)."""

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def register_param(self, name, t):
        """Makes a tensor this layer created itself a trainable parameter named ``name``."""
        self._params[name] = t
        t.requires_grad = True
        return t

    def _set_cpp(self, module, device):
        module.to(device)
        module.train(self.training)
        self._cpp = module

    def _module(self):
        """The C++ module holding this layer's parameters and buffers by name, in registration order."""
        if self._cpp is not None:
            return self._cpp
        m = _tandem.ParamModule()
        for name, t in self._params.items():
            m.add_parameter(name, t)
        for name, sub in self._layers.items():
            m.add_module(name, sub._module())
        return m

    def get_params(self):
        """Trainable tensors by dotted name, in a fixed order (the same on every rank)."""
        return dict(self._module().named_parameters())

    def get_states(self):
        """Parameters and buffers (batch-norm running statistics) by dotted name."""
        m = self._module()
        return dict(m.named_parameters() + m.named_buffers())

    def set_params(self, params):
        """Copies values (tensors or arrays) into the named parameters."""
        self._assign(self.get_params(), params)

    def set_states(self, states):
        """Copies values (tensors or arrays) into the named parameters and buffers."""
        self._assign(self.get_states(), states)

    @staticmethod
    def _assign(mine, values):
        for name, v in values.items():
            if name not in mine:
                raise KeyError(f"no parameter or buffer named '{name}' (there are: {', '.join(mine) or 'none'})")
            t = mine[name]
            if isinstance(v, _tandem.Tensor):
                t.copy_(v)
            else:
                t.copy_from_numpy(v)

    def train(self, mode=True):
        """Training behaviour (dropout, batch-norm statistics) for this layer and its sublayers."""
        self.training = bool(mode)
        if self._cpp is not None:
            self._cpp.train(self.training)
        for sub in self._layers.values():
            sub.train(self.training)

    def eval(self):
        self.train(False)


class Conv2d(Layer):
    """2-D convolution: ``Conv2d(in_channels, out_channels, kernel_size, stride=1, padding=0,
    activation=None)``, or SINGA's ``Conv2d(out_channels, kernel_size, ...)`` with the input channels
    taken at the first call. ``activation="RELU"`` fuses a ReLU into the output."""

    def __init__(self, *args, stride=1, padding=0, bias=True, activation=None, dilation=1, group=1, **kwargs):
        super().__init__()
        names = ("in_channels", "out_channels", "kernel_size")
        given = dict(zip(names if len(args) == 3 else names[1:], args))
        if len(args) not in (2, 3) and not kwargs:
            raise TypeError("Conv2d(in_channels, out_channels, kernel_size) or Conv2d(out_channels, kernel_size)")
        given.update({k: kwargs.pop(k) for k in names if k in kwargs})
        if "nb_kernels" in kwargs:
            given["out_channels"] = kwargs.pop("nb_kernels")
        if kwargs:
            raise TypeError(f"Conv2d got unexpected arguments {sorted(kwargs)}")
        if "out_channels" not in given or "kernel_size" not in given:
            raise TypeError("Conv2d needs out_channels and kernel_size")
        if _pair(dilation, "dilation") != (1, 1) or group != 1:
            raise ValueError("Conv2d: dilation and groups other than 1 are not supported")
        if activation not in _ACTIVATIONS:
            raise ValueError(f"Conv2d: activation must be None or 'RELU', got {activation!r}")
        self.in_channels = given.get("in_channels")
        self.out_channels = int(given["out_channels"])
        self.kernel_size = _square(given["kernel_size"], "Conv2d kernel_size")
        self.stride = _square(stride, "Conv2d stride")
        self.padding = _square(padding, "Conv2d padding")
        self.bias = bool(bias)
        self.activation = activation if activation != "NOTSET" else None

    def initialize(self, x):
        if x.ndim != 4:
            raise ValueError(f"Conv2d expects NCHW input, got {x}")
        channels = x.shape[1]
        if self.in_channels is not None and self.in_channels != channels:
            raise ValueError(f"Conv2d was built for {self.in_channels} input channels but got {x}")
        self.in_channels = channels
        self._set_cpp(_tandem.Conv2d(channels, self.out_channels, self.kernel_size, x.device.generator,
                                     self.stride, self.padding, self.bias, self.activation == "RELU"), x.device)

    def forward(self, x):
        return self._cpp(x)

    @property
    def W(self):
        return self._cpp.weight

    @property
    def b(self):
        return self._cpp.bias


class Linear(Layer):
    """Fully connected: ``Linear(out_features)`` (input size from the first call) or
    ``Linear(in_features, out_features)``; ``activation="RELU"`` fuses a ReLU into the output."""

    def __init__(self, *args, bias=True, activation=None, **kwargs):
        super().__init__()
        if len(args) == 1:
            self.in_features, self.out_features = kwargs.pop("in_features", None), args[0]
        elif len(args) == 2:
            self.in_features, self.out_features = args
        else:
            self.in_features = kwargs.pop("in_features", None)
            self.out_features = kwargs.pop("out_features", None)
            if self.out_features is None:
                raise TypeError("Linear(out_features) or Linear(in_features, out_features)")
        if kwargs:
            raise TypeError(f"Linear got unexpected arguments {sorted(kwargs)}")
        if activation not in _ACTIVATIONS:
            raise ValueError(f"Linear: activation must be None or 'RELU', got {activation!r}")
        self.out_features = int(self.out_features)
        self.bias = bool(bias)
        self.activation = activation if activation != "NOTSET" else None

    def initialize(self, x):
        if x.ndim != 2:
            raise ValueError(f"Linear expects [N, features] input (add a Flatten layer), got {x}")
        if self.in_features is not None and self.in_features != x.shape[1]:
            raise ValueError(f"Linear was built for {self.in_features} input features but got {x}")
        self.in_features = x.shape[1]
        self._set_cpp(_tandem.Linear(self.in_features, self.out_features, x.device.generator, self.bias,
                                     self.activation == "RELU"), x.device)

    def forward(self, x):
        return self._cpp(x)

    @property
    def W(self):
        return self._cpp.weight

    @property
    def b(self):
        return self._cpp.bias


class _Pool2d(Layer):
    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel_size = _pair(kernel_size, "pooling kernel_size")
        self.stride = self.kernel_size if stride is None else _pair(stride, "pooling stride")
        self.padding = _pair(padding, "pooling padding")


class MaxPool2d(_Pool2d):
    """Max over each window: ``MaxPool2d(kernel_size, stride=kernel_size, padding=0)``."""

    def forward(self, x):
        return _tandem.max_pool2d(x, self.kernel_size, self.stride, self.padding)


class AvgPool2d(_Pool2d):
    """Mean over each window (padding counted as zeros)."""

    def forward(self, x):
        return _tandem.avg_pool2d(x, self.kernel_size, self.stride, self.padding)


class ReLU(Layer):
    def forward(self, x):
        return _tandem.relu(x)


class Sigmoid(Layer):
    def forward(self, x):
        return _tandem.sigmoid(x)


class Flatten(Layer):
    """Collapses the dimensions from ``axis`` on: [N, C, H, W] -> [N, C*H*W]."""

    def __init__(self, axis=1):
        super().__init__()
        self.axis = int(axis)

    def forward(self, x):
        return _tandem.flatten(x, self.axis)


class BatchNorm2d(Layer):
    """Batch normalisation per channel. ``momentum`` is SINGA's: the weight the running statistics
    keep at each step (running = momentum * running + (1 - momentum) * batch)."""

    def __init__(self, num_features=None, momentum=0.9, eps=1e-5):
        super().__init__()
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"BatchNorm2d: momentum must be in [0, 1), got {momentum}")
        self.num_features = num_features
        self.momentum = float(momentum)
        self.eps = float(eps)

    def initialize(self, x):
        if x.ndim != 4:
            raise ValueError(f"BatchNorm2d expects NCHW input, got {x}")
        if self.num_features is not None and self.num_features != x.shape[1]:
            raise ValueError(f"BatchNorm2d was built for {self.num_features} channels but got {x}")
        self.num_features = x.shape[1]
        self._set_cpp(_tandem.BatchNorm2d(self.num_features, 1.0 - self.momentum, self.eps), x.device)

    def forward(self, x):
        return self._cpp(x)


class Dropout(Layer):
    """Zeroes activations with probability ``ratio`` in training (and scales the rest by
    1/(1-ratio)); identity in evaluation. Its mask generator is seeded from the device's."""

    def __init__(self, ratio=0.5):
        super().__init__()
        if not 0.0 <= ratio < 1.0:
            raise ValueError(f"Dropout: ratio must be in [0, 1), got {ratio}")
        self.ratio = float(ratio)

    def initialize(self, x):
        seed = x.device.generator.next_below(2**63)
        self._set_cpp(_tandem.Dropout(self.ratio, seed), x.device)

    def forward(self, x):
        return self._cpp(x)


class SoftMaxCrossEntropy(Layer):
    """Mean over the batch of -log softmax(x)[label], as a tensor of shape (1,) (SINGA's); labels are
    class indices [N] (int32 or int64) or targets [N, C]: one-hot rows, or a distribution per row
    (the loss is then the mean of -sum(t * log softmax(x))). Other shapes are refused."""

    def forward(self, x, t):
        return _tandem.reshape(_tandem.softmax_cross_entropy(x, t), [1])


class Sequential(Layer):
    """Runs its layers in order; they are named by position ("0.weight")."""

    def __init__(self, *layers):
        super().__init__()
        for i, l in enumerate(layers):
            setattr(self, str(i), l)

    def forward(self, x):
        for l in self._layers.values():
            x = l(x)
        return x
