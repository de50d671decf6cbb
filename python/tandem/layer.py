"""Layers (SINGA's ``singa.layer``).

A layer creates its parameters at its first call, from the input: their shapes follow the input's
(``Linear(500)`` takes its input size then), they are placed on the input's device, and they are
drawn from that device's generator (``dev.SetRandSeed``). A layer's sublayers are, in the order they
joined it, the layers assigned as its attributes, those given to ``register_layers``, and any layer
first called during the layer's own first call that belongs to no other layer (SINGA's ResNet keeps
its downsampling convolution only in a closure; such a layer is named ``ClassName_index``).
Parameters are named by path ("conv1.weight", "Bottleneck_0.conv1.weight"); the order is the same on
every rank. A tensor held by several layers (tied weights) is one parameter, named by its first path.

Under ``opt.DistOpt(shard="parameters")`` a model's sublayers holding parameters are layer groups: each
call of such a layer runs as its group's forward (its parameters gathered for it; see DistOpt).
"""
import threading
from collections import OrderedDict

from . import _tandem

_ACTIVATIONS = (None, "NOTSET", "RELU")
_PAD_MODES = ("NOTSET", "SAME_UPPER", "SAME_LOWER")
# Keyword arguments SINGA's Conv2d passes to cuDNN; tandem chooses its algorithms itself.
_CONV_TUNING = ("cudnn_prefer", "workspace_MB_limit")

_calls = threading.local()  # the layers whose forward is running on this thread, innermost last


def _stack():
    return _calls.__dict__.setdefault("stack", [])


def _recorders():
    """The call lists of the layers in their first call on this thread: each records every layer called in it."""
    return _calls.__dict__.setdefault("recorders", [])


def _running_groups():
    """The layer groups whose forward is running on this thread (DistOpt shard="parameters")."""
    return _calls.__dict__.setdefault("groups", [])


class _Slot:
    """Where the i-th tensor of a flattened structure goes back."""
    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i


_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def _split(obj, tensors, strict, what):
    """obj with every tensor (inside lists, tuples and dicts too) replaced by a _Slot of its place in
    ``tensors``, to which it is appended. ``strict``: any other object than those and plain values
    (numbers, strings, None, NumPy arrays) is refused, naming ``what``."""
    if isinstance(obj, _tandem.Tensor):
        tensors.append(obj)
        return _Slot(len(tensors) - 1)
    if isinstance(obj, (list, tuple)):
        return (type(obj), [_split(o, tensors, strict, what) for o in obj])
    if isinstance(obj, dict):
        return (dict, type(obj), [(k, _split(v, tensors, strict, what)) for k, v in obj.items()])
    if strict and not isinstance(obj, _PLAIN) and type(obj).__module__ != "numpy":
        raise TypeError(f"{what} returned a {type(obj).__name__}: under DistOpt(shard='parameters') a layer's "
                        "forward returns tensors, or lists, tuples or dicts of them (and plain values), so that "
                        "its parameters are gathered again when backward reaches them")
    return obj


def _join(tmpl, tensors):
    """What _split took apart, with ``tensors`` in the slots."""
    if isinstance(tmpl, _Slot):
        return tensors[tmpl.i]
    if isinstance(tmpl, tuple) and len(tmpl) == 2 and isinstance(tmpl[0], type) and issubclass(tmpl[0], (list, tuple)):
        kind, items = tmpl
        items = [_join(t, tensors) for t in items]
        if kind is list or kind is tuple:
            return kind(items)
        return kind(*items) if hasattr(kind, "_fields") else kind(items)  # a namedtuple, or a subclass
    if isinstance(tmpl, tuple) and len(tmpl) == 3 and tmpl[0] is dict:
        _, kind, items = tmpl
        return kind((k, _join(t, tensors)) for k, t in items)
    return tmpl


def _grouped_call(layer, forward, args, kwargs):
    """A call of a layer that is a layer group: its forward as the group's run, with every tensor among
    the arguments and results passed through it (the inputs carry the op that releases the group in
    backward, the outputs the one that gathers it)."""
    group = layer.__dict__["_layer_group"]
    inputs = []
    tmpl = _split((args, kwargs), inputs, False, None)
    shape = {}

    def body(ins):
        a, kw = _join(tmpl, _same_objects(ins, inputs))
        running = _running_groups()
        running.append(group)
        try:
            out = forward(layer, *a, **kw)
        finally:
            running.pop()
        outs = shape["tensors"] = []
        shape["out"] = _split(out, outs, True, f"layer '{_path(layer)}' ({type(layer).__name__})")
        return outs

    layer.__dict__["_group_calls"] = layer.__dict__.get("_group_calls", 0) + 1
    outs = group.run(inputs, body)
    return _join(shape["out"], _same_objects(outs, shape["tensors"]))


def _same_objects(got, given):
    """The tensors back from the C++ side, as the Python objects given where they are the same tensor (the
    ones that needed no op recorded): their class (a subclass of Tensor) and attributes stay."""
    return [g if g._impl_id != t._impl_id else t for g, t in zip(got, given)]


def _path(layer):
    """The layer's dotted name within its model."""
    names = []
    while layer is not None and layer.__dict__.get("_parent") is not None:
        names.append(layer.__dict__.get("name") or type(layer).__name__)
        layer = layer.__dict__["_parent"]
    return ".".join(reversed(names)) or type(layer).__name__


def _check_group_member(layer):
    """A layer inside a layer group, called outside that group's run, would read parameters that are not
    there (their values live on the ranks in pieces between uses): refused."""
    groups = layer.__dict__.get("_in_groups")
    if not groups or not any(g.attached for g in groups):
        return
    running = _running_groups()
    if any(r is g for g in groups for r in running):
        return
    names = " or ".join(f"'{g.name}'" for g in groups)
    raise ValueError(f"layer '{_path(layer)}' ({type(layer).__name__}) is part of layer {names}, whose parameters "
                     "DistOpt(shard='parameters') gathers only while that layer is called; it was called outside it: "
                     "call it from its enclosing layer's forward, or make it a sublayer of the model itself")


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


def _padding(v, what):
    """SINGA's padding: an int, (h, w), or (top, bottom, left, right) with equal sides."""
    if isinstance(v, (tuple, list)) and len(v) == 4:
        top, bottom, left, right = (int(p) for p in v)
        if top != bottom or left != right:
            raise ValueError(f"{what} {v!r}: padding must be the same on both sides of each dimension")
        return top, left
    return _pair(v, what)


def _same_padding(size, kernel, stride, mode, what):
    """The padding per side that makes the output size ceil(size / stride) (SAME_UPPER / SAME_LOWER)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    if total % 2:
        raise ValueError(f"{what}: pad_mode={mode!r} needs {total} padding in a dimension of {size}, which cannot "
                         "be split evenly between the two sides; give the padding explicitly")
    return total // 2


def _built(name):
    """A read-only attribute that is the built C++ layer's ``name`` (None before the first call builds it)."""
    return property(lambda self: getattr(self._cpp, name) if self._cpp is not None else None)


def _wrap_forward(forward):
    """The layer's forward, run as the layer's call: the first one initialises the layer from its
    inputs, and a layer first called inside it that belongs to no other layer becomes its sublayer."""
    def call(self, *args, **kwargs):
        stack = _stack()
        if stack and stack[-1][0] is self:  # a forward calling its base class's
            return forward(self, *args, **kwargs)
        if stack:
            parent, parent_first = stack[-1]
            if parent_first and self.__dict__.get("_parent") is None:
                parent._adopt(self)
        recorders = _recorders()
        for calls in recorders:  # the first calls of the layers around: the order their sublayers run in
            calls.append(self)
        first = not self._initialized
        if first:
            self.initialize(*args, **kwargs)
            self._initialized = True
            recorders.append([])
        stack.append((self, first))
        try:
            if self.__dict__.get("_layer_group") is not None:
                return _grouped_call(self, forward, args, kwargs)
            if self.__dict__.get("_in_groups"):
                _check_group_member(self)
            return forward(self, *args, **kwargs)
        finally:
            stack.pop()
            if first:
                self.__dict__["_first_calls"] = recorders.pop()

    call.__name__, call.__qualname__, call.__doc__ = forward.__name__, forward.__qualname__, forward.__doc__
    call.__wrapped__ = forward
    return call


class Layer:
    """Base of layers and models."""

    sep = "."

    def __init__(self):
        self.__dict__.setdefault("_layers", {})
        self.__dict__.setdefault("_params", {})
        self.__dict__.setdefault("_parent", None)
        self.__dict__.setdefault("name", None)
        self._cpp = None  # the C++ module of a built-in layer, once initialised
        self._initialized = False
        self.training = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "forward" in cls.__dict__:
            cls.forward = _wrap_forward(cls.__dict__["forward"])

    def __setattr__(self, name, value):
        layers = self.__dict__.setdefault("_layers", {})
        layers.pop(name, None)
        if isinstance(value, Layer):
            layers[name] = value
            value.__dict__["_parent"] = self
            if value.__dict__.get("name") is None:
                value.__dict__["name"] = name
        object.__setattr__(self, name, value)

    def __getattr__(self, name):
        # Only reached for names that are not attributes: layers given to register_layers.
        layers = self.__dict__.get("_layers", {})
        if name in layers:
            return layers[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        self.__dict__.get("_layers", {}).pop(name, None)
        if name in self.__dict__:
            object.__delattr__(self, name)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def initialize(self, *args, **kwargs):
        """Creates the parameters from the first input (nothing for layers without any)."""

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def register_layers(self, *layers):
        """Makes layers held elsewhere (a list, a closure) sublayers of this one, as SINGA does: named
        ``ClassName_index`` by their position here, or by key when given one OrderedDict of them."""
        if len(layers) == 1 and isinstance(layers[0], (OrderedDict, dict)):
            items = list(layers[0].items())
        else:
            items = [(f"{type(v).__name__}_{i}", v) for i, v in enumerate(layers)]
        mine = self.__dict__.setdefault("_layers", {})
        for name, value in items:
            if not isinstance(value, Layer):
                raise TypeError(f"register_layers takes layers, got {type(value).__name__} for '{name}'")
            if mine.get(name, value) is not value:
                raise ValueError(f"register_layers: '{name}' already names another sublayer; register every layer "
                                 "in one call, or pass an OrderedDict of distinct names")
            mine[name] = value
            value.__dict__["_parent"] = self
            value.__dict__["name"] = name

    def _adopt(self, layer):
        """Makes a layer called inside this one's first call, and held by no other, a sublayer."""
        mine = self.__dict__.setdefault("_layers", {})
        if any(v is layer for v in mine.values()):
            return
        base = type(layer).__name__
        i = 0
        while f"{base}_{i}" in mine:
            i += 1
        mine[f"{base}_{i}"] = layer
        layer.__dict__["_parent"] = self
        layer.__dict__["name"] = f"{base}_{i}"

    def register_param(self, name, t):
        """Makes a tensor this layer created itself a trainable parameter named ``name``. Setting its
        ``requires_grad`` to False afterwards freezes it: it stays a parameter of the layer (listed,
        synchronised across ranks, checkpointed) that no optimizer steps."""
        self._params[name] = t
        t.requires_grad = True
        return t

    def _set_cpp(self, module, device):
        module.to(device)
        module.train(self.training)
        self._cpp = module

    def _module(self):
        """The C++ module holding this layer's parameters and buffers by name, in registration order:
        those given to register_param, then the tensors assigned as attributes that store a gradient
        (SINGA's layers create their parameters so: ``self.W = Tensor(..., stores_grad=True)``), then the
        sublayers'."""
        if self._cpp is not None:
            return self._cpp
        # A tensor is registered once in the whole tree (tied weights: under the first path that holds it).
        outer = getattr(_calls, "seen", None)
        seen = _calls.seen = outer if outer is not None else set()
        try:
            m = _tandem.ParamModule()
            for name, t in list(self._params.items()) + self._tensor_attributes():
                if t._impl_id not in seen:
                    m.add_parameter(name, t)
                    seen.add(t._impl_id)
            for name, sub in self._layers.items():
                child = sub._module()
                seen.update(p._impl_id for p in child.parameters())
                m.add_module(name, child)
        finally:
            if outer is None:
                _calls.seen = None
        return m

    def _tensor_attributes(self):
        """The tensors held as attributes that are parameters: leaves that store a gradient, and those
        that did when the layer's parameters were listed before (compile lists them) and have been frozen
        since (``requires_grad = False``): a frozen parameter is still one, left out of the optimizer."""
        known = self.__dict__.setdefault("_attribute_params", {})
        out = []
        for name, v in list(self.__dict__.items()):
            if not isinstance(v, _tandem.Tensor) or name.startswith("_") or not v.is_leaf:
                continue
            if v.requires_grad or known.get(name) is v:
                known[name] = v
                out.append((name, v))
        return out

    def device_check(self, *inputs):
        """SINGA's: moves every tensor given onto the device of the first (each handle in place)."""
        if not inputs:
            return
        dev = inputs[0].device
        for t in inputs[1:]:
            if t.device != dev:
                t.to_device(dev)

    def dtype_check(self, *inputs):
        """SINGA's: converts every tensor given to the dtype of the first (each handle in place)."""
        if not inputs:
            return
        dtype = inputs[0].dtype
        for t in inputs[1:]:
            if t.dtype != dtype:
                t.to_type(dtype)

    def get_params(self):
        """Trainable tensors by dotted name, in a fixed order (the same on every rank). Under
        ``DistOpt(shard="parameters")`` they are gathered whole first, a collective (every rank calls it),
        and stay whole until the model's next forward: read them before that."""
        self._gather_parameters()
        return dict(self._module().named_parameters())

    def get_states(self):
        """Parameters and buffers (batch-norm running statistics) by dotted name (gathered whole first
        under ``DistOpt(shard="parameters")``, as get_params)."""
        self._gather_parameters()
        m = self._module()
        return dict(m.named_parameters() + m.named_buffers())

    def set_params(self, params):
        """Copies values (tensors or arrays) into the named parameters (under ``DistOpt(shard=
        "parameters")`` a collective: every rank sets the same values)."""
        self._write_parameters(lambda: self._assign(self.get_params(), params))

    def set_states(self, states):
        """Copies values (tensors or arrays) into the named parameters and buffers (a collective under
        ``DistOpt(shard="parameters")``, as set_params)."""
        self._write_parameters(lambda: self._assign(self.get_states(), states))

    def _sharding(self):
        """The C++ DistOpt that keeps this layer's model's parameters sharded (shard="parameters"), or None."""
        root = self
        while root.__dict__.get("_parent") is not None:
            root = root.__dict__["_parent"]
        ref = root.__dict__.get("_sharded_by")
        dist = ref() if ref is not None else None
        return getattr(dist, "_impl", None) if dist is not None else None

    def _gather_parameters(self):
        impl = self._sharding()
        if impl is not None:
            impl.gather_parameters()

    def _write_parameters(self, write):
        """write() with the parameters whole; under sharded parameters each rank then keeps its pieces of
        what was written (nothing, when write() raised)."""
        impl = self._sharding()
        if impl is None:
            return write()
        impl.gather_parameters()
        try:
            write()
        except BaseException:
            impl.release_parameters(False)
            raise
        impl.release_parameters(True)

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
    """2-D convolution, SINGA's signature: ``Conv2d(nb_kernels, kernel_size, stride=1, padding=0,
    dilation=1, group=1, bias=True, pad_mode="NOTSET", activation="NOTSET")`` with the input channels
    taken at the first call, or the older ``Conv2d(in_channels, nb_kernels, kernel_size, stride,
    padding)`` (the input channels are then checked). ``group`` splits the channels into groups with
    filters of their own (``group`` = input channels: depthwise); ``activation="RELU"`` fuses a ReLU;
    ``pad_mode`` "SAME_UPPER" / "SAME_LOWER" pads so that the output is ceil(input / stride)."""

    def __init__(self, nb_kernels, kernel_size, *args, stride=1, padding=0, dilation=1, group=1, bias=True,
                 pad_mode="NOTSET", activation="NOTSET", **kwargs):
        super().__init__()
        self.in_channels = None
        if len(args) > 3:
            raise TypeError("Conv2d(in_channels, nb_kernels, kernel_size, stride, padding) takes at most 5 "
                            f"positional arguments, got {2 + len(args)}")
        if args:  # the older form: the first argument is the input channel count
            self.in_channels, nb_kernels, kernel_size = int(nb_kernels), kernel_size, args[0]
            if len(args) > 1:
                stride = args[1]
            if len(args) > 2:
                padding = args[2]
        unknown = sorted(k for k in kwargs if k not in _CONV_TUNING)
        if unknown:
            raise TypeError(f"Conv2d got unexpected keyword arguments {unknown}")
        if _pair(dilation, "Conv2d dilation") != (1, 1):
            raise ValueError(f"Conv2d: dilation {dilation!r} is not supported (only 1)")
        if activation not in _ACTIVATIONS:
            raise ValueError(f"Conv2d: activation must be 'NOTSET' or 'RELU', got {activation!r}")
        if pad_mode not in _PAD_MODES:
            raise ValueError(f"Conv2d: pad_mode must be one of {', '.join(_PAD_MODES)}, got {pad_mode!r}")
        self.nb_kernels = int(nb_kernels)
        self.kernel_size = (_square(kernel_size, "Conv2d kernel_size"),) * 2
        self.stride = (_square(stride, "Conv2d stride"),) * 2
        self.padding = (_square(_padding(padding, "Conv2d padding"), "Conv2d padding"),) * 2
        self.group = int(group)
        self.bias = bool(bias)
        self.pad_mode = pad_mode
        self.activation = activation if activation is not None else "NOTSET"
        if self.nb_kernels < 1 or self.group < 1 or self.nb_kernels % self.group:
            raise ValueError(f"Conv2d: group ({self.group}) must be positive and divide nb_kernels ({self.nb_kernels})")
        if self.in_channels is not None and self.in_channels % self.group:
            raise ValueError(f"Conv2d: group ({self.group}) must divide the input channels ({self.in_channels})")

    @property
    def out_channels(self):
        return self.nb_kernels

    def initialize(self, x):
        if x.ndim != 4:
            raise ValueError(f"Conv2d expects NCHW input, got {x}")
        channels = x.shape[1]
        if self.in_channels is not None and self.in_channels != channels:
            raise ValueError(f"Conv2d was built for {self.in_channels} input channels but got {x}")
        if channels % self.group:
            raise ValueError(f"Conv2d: group ({self.group}) must divide the input channels, got {x}")
        self.in_channels = channels
        k, s = self.kernel_size[0], self.stride[0]
        if self.pad_mode != "NOTSET":
            ph = _same_padding(x.shape[2], k, s, self.pad_mode, "Conv2d")
            pw = _same_padding(x.shape[3], k, s, self.pad_mode, "Conv2d")
            if ph != pw:
                raise ValueError(f"Conv2d: pad_mode={self.pad_mode!r} needs padding {ph} x {pw} for {x}; this layer "
                                 "takes the same padding for height and width")
            self.padding = (ph, ph)
        self._set_cpp(_tandem.Conv2d(channels, self.nb_kernels, k, x.device.generator, s, self.padding[0], self.bias,
                                     self.activation == "RELU", self.group), x.device)

    def forward(self, x):
        return self._cpp(x)

    W = _built("weight")
    b = _built("bias")


class SeparableConv2d(Layer):
    """A depthwise convolution (one ``kernel_size`` filter per input channel) followed by a pointwise
    (1x1) one to ``nb_kernels`` channels, as SINGA's: ``SeparableConv2d(nb_kernels, kernel_size,
    stride=1, padding=0, bias=False)``, or ``SeparableConv2d(in_channels, nb_kernels, kernel_size,
    stride, padding)``. Its sublayers are ``depthwise_conv`` and ``point_conv``."""

    def __init__(self, nb_kernels, kernel_size, *args, stride=1, padding=0, bias=False):
        super().__init__()
        self.in_channels = None
        if len(args) > 3:
            raise TypeError("SeparableConv2d(in_channels, nb_kernels, kernel_size, stride, padding) takes at most 5 "
                            f"positional arguments, got {2 + len(args)}")
        if args:
            self.in_channels, nb_kernels, kernel_size = int(nb_kernels), kernel_size, args[0]
            if len(args) > 1:
                stride = args[1]
            if len(args) > 2:
                padding = args[2]
        self.nb_kernels = int(nb_kernels)
        self.kernel_size, self.stride, self.padding, self.bias = kernel_size, stride, padding, bool(bias)

    def initialize(self, x):
        if x.ndim != 4:
            raise ValueError(f"SeparableConv2d expects NCHW input, got {x}")
        if self.in_channels is not None and self.in_channels != x.shape[1]:
            raise ValueError(f"SeparableConv2d was built for {self.in_channels} input channels but got {x}")
        self.in_channels = x.shape[1]
        self.depthwise_conv = Conv2d(self.in_channels, self.kernel_size, stride=self.stride, padding=self.padding,
                                     group=self.in_channels, bias=self.bias)
        self.point_conv = Conv2d(self.nb_kernels, 1, bias=self.bias)

    def forward(self, x):
        return self.point_conv(self.depthwise_conv(x))


class Linear(Layer):
    """Fully connected, SINGA's signature: ``Linear(out_features, bias=True)`` (input size from the
    first call) or the older ``Linear(in_features, out_features, bias)``; ``activation="RELU"`` fuses a
    ReLU into the output."""

    def __init__(self, *args, bias=True, activation=None, **kwargs):
        super().__init__()
        if len(args) > 3:
            raise TypeError(f"Linear(in_features, out_features, bias) takes at most 3 positional arguments, got "
                            f"{len(args)}")
        if len(args) == 1:
            self.in_features, self.out_features = kwargs.pop("in_features", None), args[0]
        elif len(args) >= 2:
            self.in_features, self.out_features = args[0], args[1]
            if len(args) == 3:
                bias = args[2]
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

    W = _built("weight")
    b = _built("bias")


class Pooling2d(Layer):
    """Max (``is_max``) or average pooling, SINGA's: ``Pooling2d(kernel_size, stride=kernel_size,
    padding=0, is_max=True, pad_mode="NOTSET")``; kernel, stride and padding are ints or pairs. The
    average counts padded positions as zeros."""

    def __init__(self, kernel_size, stride=None, padding=0, is_max=True, pad_mode="NOTSET"):
        super().__init__()
        if pad_mode not in _PAD_MODES:
            raise ValueError(f"pooling: pad_mode must be one of {', '.join(_PAD_MODES)}, got {pad_mode!r}")
        self.kernel_size = _pair(kernel_size, "pooling kernel_size")
        self.stride = self.kernel_size if stride is None else _pair(stride, "pooling stride")
        self.padding = _padding(padding, "pooling padding")
        self.is_max = bool(is_max)
        self.pad_mode = pad_mode

    def initialize(self, x):
        if self.pad_mode != "NOTSET" and x.ndim == 4:
            self.padding = tuple(_same_padding(x.shape[2 + i], self.kernel_size[i], self.stride[i], self.pad_mode,
                                               type(self).__name__) for i in range(2))

    def forward(self, x):
        pool = _tandem.max_pool2d if self.is_max else _tandem.avg_pool2d
        return pool(x, self.kernel_size, self.stride, self.padding)


class MaxPool2d(Pooling2d):
    """Max over each window: ``MaxPool2d(kernel_size, stride=kernel_size, padding=0, pad_mode="NOTSET")``."""

    def __init__(self, kernel_size, stride=None, padding=0, pad_mode="NOTSET"):
        super().__init__(kernel_size, stride, padding, True, pad_mode)


class AvgPool2d(Pooling2d):
    """Mean over each window (padding counted as zeros)."""

    def __init__(self, kernel_size, stride=None, padding=0, pad_mode="NOTSET"):
        super().__init__(kernel_size, stride, padding, False, pad_mode)


class MaxPool1d(Pooling2d):
    """Max over windows of the last dimension of [N, C, 1, W]."""

    def __init__(self, kernel_size, stride=None, padding=0, pad_mode="NOTSET"):
        stride = kernel_size if stride is None else stride
        super().__init__((1, kernel_size), (1, stride), (0, padding), True, pad_mode)


class AvgPool1d(Pooling2d):
    """Mean over windows of the last dimension of [N, C, 1, W]."""

    def __init__(self, kernel_size, stride=None, padding=0, pad_mode="NOTSET"):
        stride = kernel_size if stride is None else stride
        super().__init__((1, kernel_size), (1, stride), (0, padding), False, pad_mode)


class ReLU(Layer):
    def forward(self, x):
        return _tandem.relu(x)


class Sigmoid(Layer):
    def forward(self, x):
        return _tandem.sigmoid(x)


class Add(Layer):
    """a + b (same shape and dtype): the residual connection."""

    def forward(self, a, b):
        return _tandem.add(a, b)


class Cat(Layer):
    """The tensors of a list joined along ``axis`` (their other extents must agree)."""

    def __init__(self, axis=0):
        super().__init__()
        self.axis = int(axis)

    def forward(self, xs):
        return _tandem.cat(list(xs), self.axis)


class Reshape(Layer):
    """``Reshape()(x, shape)``: the same elements in ``shape`` (one extent may be -1)."""

    def forward(self, x, shape):
        return _tandem.reshape(x, [int(s) for s in shape])


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

    @property
    def channels(self):
        return self.num_features

    def initialize(self, x):
        if x.ndim != 4:
            raise ValueError(f"BatchNorm2d expects NCHW input, got {x}")
        if self.num_features is not None and self.num_features != x.shape[1]:
            raise ValueError(f"BatchNorm2d was built for {self.num_features} channels but got {x}")
        self.num_features = x.shape[1]
        self._set_cpp(_tandem.BatchNorm2d(self.num_features, 1.0 - self.momentum, self.eps), x.device)

    def forward(self, x):
        return self._cpp(x)

    scale = _built("gamma")
    running_mean = _built("running_mean")
    running_var = _built("running_var")


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
    class indices, as SINGA reads labels of N elements ([N], or [N, 1] for more than one class; int32,
    int64, or whole numbers in a floating tensor: a fraction is a ValueError), or targets [N, C]: one-hot
    rows, or a distribution per row (the loss is then the mean of -sum(t * log softmax(x))). Other shapes
    are refused."""

    def forward(self, x, t):
        from .autograd import _class_labels
        return _tandem.reshape(_tandem.softmax_cross_entropy(x, _class_labels(x, t)), [1])


class Sequential(Layer):
    """Runs its layers in order; they are named by position ("0.weight")."""

    def __init__(self, *layers):
        super().__init__()
        for i, l in enumerate(layers):
            setattr(self, str(i), l)

    def forward(self, x):
        for l in list(self._layers.values()):
            x = l(x)
        return x


# ---- elementwise ops
# Activation layers beyond SINGA's ReLU and Sigmoid, named as tandem.autograd's operators; each applies
# its function elementwise (PRelu alone has a parameter).
class Tanh(Layer):
    def forward(self, x):
        return _tandem.tanh(x)


class LeakyRelu(Layer):
    """x for x > 0, a * x below."""

    def __init__(self, a=0.01):
        super().__init__()
        self.a = float(a)

    def forward(self, x):
        return _tandem.leaky_relu(x, self.a)


class Elu(Layer):
    """x for x > 0, alpha * (exp(x) - 1) below."""

    def __init__(self, alpha=1.0):
        super().__init__()
        self.alpha = float(alpha)

    def forward(self, x):
        return _tandem.elu(x, self.alpha)


class SeLU(Layer):
    """gamma * elu(x, alpha) (SINGA's defaults)."""

    def __init__(self, alpha=1.67326, gamma=1.0507):
        super().__init__()
        self.alpha, self.gamma = float(alpha), float(gamma)

    def forward(self, x):
        return _tandem.selu(x, self.alpha, self.gamma)


class SoftPlus(Layer):
    def forward(self, x):
        return _tandem.softplus(x)


class SoftSign(Layer):
    def forward(self, x):
        return _tandem.softsign(x)


class HardSigmoid(Layer):
    """max(0, min(1, alpha * x + gamma))."""

    def __init__(self, alpha=0.2, gamma=0.5):
        super().__init__()
        self.alpha, self.gamma = float(alpha), float(gamma)

    def forward(self, x):
        return _tandem.hard_sigmoid(x, self.alpha, self.gamma)


class Gelu(Layer):
    """x * Phi(x) (approximate="tanh": the tanh approximation)."""

    def __init__(self, approximate="none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"Gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        return _tandem.gelu(x, self.approximate == "tanh")


class Silu(Layer):
    def forward(self, x):
        return _tandem.silu(x)


class PRelu(Layer):
    """x for x > 0, slope * x below, with a trainable slope: one value (num_parameters=1) or one per
    channel (dimension 1 of the input), starting at ``init``."""

    def __init__(self, num_parameters=1, init=0.25):
        super().__init__()
        self.num_parameters = int(num_parameters)
        self.init = float(init)
        if self.num_parameters < 1:
            raise ValueError(f"PRelu: num_parameters must be at least 1, got {num_parameters}")

    def initialize(self, x):
        if self.num_parameters != 1 and (x.ndim < 2 or x.shape[1] != self.num_parameters):
            raise ValueError(f"PRelu has {self.num_parameters} slopes, one per channel, but the input {x} has "
                             f"{x.shape[1] if x.ndim >= 2 else 'no'} channels (dimension 1)")
        self.slope = self.register_param(
            "slope", _tandem.full([self.num_parameters], self.init, x.device, x.dtype))

    def forward(self, x):
        slope = self.slope
        if self.num_parameters != 1:
            slope = _tandem.reshape(slope, [self.num_parameters] + [1] * (x.ndim - 2))
        return _tandem.prelu(x, slope)


# ---- reductions, shape and indexing ops, products
class Gemm(Layer):
    """SINGA's Gemm layer: ``Gemm(nb_kernels, alpha=1.0, beta=1.0, transA=False, transB=True, bias=True,
    bias_shape=None)`` computes alpha * x' W' + beta * b (x' = x^T with transA; W' = W^T with transB).
    W is [nb_kernels, in] with transB, else [in, nb_kernels], drawn from N(0, 2 / (in + nb_kernels)) with
    the device's generator; b is zeros of bias_shape (default [1, nb_kernels]). x is 2-d."""

    def __init__(self, nb_kernels, alpha=1.0, beta=1.0, transA=False, transB=True, bias=True, bias_shape=None):
        super().__init__()
        self.nb_kernels = int(nb_kernels)
        self.alpha, self.beta = float(alpha), float(beta)
        self.transA = 1 if transA else 0
        self.transB = 1 if transB else 0
        self.bias = bool(bias)
        self.bias_shape = bias_shape
        self.W = None
        self.b = None

    def initialize(self, x):
        if x.ndim != 2:
            raise ValueError(f"Gemm expects a 2-d input, got shape {x.shape}")
        self.in_features = x.shape[0] if self.transA else x.shape[1]
        w_shape = (self.nb_kernels, self.in_features) if self.transB else (self.in_features, self.nb_kernels)
        std = (2.0 / (self.in_features + self.nb_kernels)) ** 0.5
        w = _tandem.Tensor(list(w_shape), x.device, x.dtype, requires_grad=True, stores_grad=True)
        w.gaussian(0.0, std)
        self.W = self.register_param("W", w)
        if self.bias:
            b_shape = tuple(self.bias_shape) if self.bias_shape else (1, self.nb_kernels)
            self.b = self.register_param(
                "b", _tandem.Tensor(list(b_shape), x.device, x.dtype, requires_grad=True, stores_grad=True))

    def forward(self, x):
        in_features = x.shape[0] if self.transA else x.shape[-1]
        in_w = self.W.shape[-1] if self.transB else self.W.shape[0]
        if in_features != in_w:
            raise ValueError(f"Gemm layer expects input features size {in_w}, received {in_features} (x {x.shape})")
        return _tandem.gemm(x, self.W, self.b, self.alpha, self.beta, bool(self.transA), bool(self.transB))


# ---- softmax, normalisation, losses, attention
class SoftMax(Layer):
    """Softmax over the dimensions from ``axis`` on (SINGA's layer; axis 1: each row of a 2-d input)."""

    def __init__(self, axis=1):
        super().__init__()
        self.axis = int(axis)

    def forward(self, x):
        from . import autograd
        return autograd.softmax(x, self.axis)


class MeanSquareError(Layer):
    """The mean over every element of (x - t)^2, as a tensor of shape (1,) (SINGA's layer)."""

    def forward(self, x, t):
        from . import autograd
        return autograd.mse_loss(x, t)


class CrossEntropy(Layer):
    """-sum(t log x) / N for probabilities x [N, C] and targets t [N, C] or class indices [N] (SINGA's layer)."""

    def forward(self, x, t):
        from . import autograd
        return autograd.cross_entropy(x, t)


class BinaryCrossEntropy(Layer):
    """SINGA's binary cross-entropy of probabilities x against targets t of x's shape (guarded against log 0),
    summed and divided by the batch size."""

    def forward(self, x, t):
        from . import autograd
        return autograd.binary_cross_entropy(x, t)


def _norm_shape(normalized_shape, x, what):
    if normalized_shape is None:
        return [x.shape[-1]]
    shape = [int(normalized_shape)] if isinstance(normalized_shape, int) else [int(s) for s in normalized_shape]
    if list(x.shape[len(x.shape) - len(shape):]) != shape:
        raise ValueError(f"{what} was built for normalized_shape {shape} but got {x}")
    return shape


class LayerNorm(Layer):
    """Layer normalisation over the trailing dimensions ``normalized_shape`` (None: the last dimension,
    its size taken at the first call), with a weight (ones) and bias (zeros) when ``elementwise_affine``."""

    def __init__(self, normalized_shape=None, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        self.normalized_shape = normalized_shape
        self.eps = float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        self.use_bias = bool(bias)

    def initialize(self, x):
        self.normalized_shape = _norm_shape(self.normalized_shape, x, "LayerNorm")
        self._set_cpp(_tandem.LayerNorm(self.normalized_shape, self.eps, self.elementwise_affine, self.use_bias),
                      x.device)

    def forward(self, x):
        return self._cpp(x)

    weight = _built("weight")
    bias = _built("bias")


class RMSNorm(Layer):
    """Root-mean-square normalisation over the trailing dimensions ``normalized_shape`` (None: the last,
    taken at the first call), with a weight of ones when ``elementwise_affine``."""

    def __init__(self, normalized_shape=None, eps=1e-6, elementwise_affine=True):
        super().__init__()
        self.normalized_shape = normalized_shape
        self.eps = float(eps)
        self.elementwise_affine = bool(elementwise_affine)

    def initialize(self, x):
        self.normalized_shape = _norm_shape(self.normalized_shape, x, "RMSNorm")
        self._set_cpp(_tandem.RMSNorm(self.normalized_shape, self.eps, self.elementwise_affine), x.device)

    def forward(self, x):
        return self._cpp(x)

    weight = _built("weight")


class MultiHeadAttention(Layer):
    """Multi-head attention over [B, T, E] inputs: ``num_heads`` heads of E / num_heads features, query,
    key, value and output projections (E taken from the first call unless ``embed_dim`` is given),
    ``causal`` masking of later positions, attention dropout in training. ``forward(x)`` attends x to
    itself; ``forward(query, key, value)`` attends query [B, Tq, E] over key and value [B, Tk, E]."""

    def __init__(self, num_heads, embed_dim=None, causal=False, bias=True, dropout=0.0):
        super().__init__()
        if int(num_heads) <= 0:
            raise ValueError(f"MultiHeadAttention: num_heads must be positive, got {num_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"MultiHeadAttention: dropout must be in [0, 1), got {dropout}")
        self.num_heads = int(num_heads)
        self.embed_dim = embed_dim
        self.causal = bool(causal)
        self.use_bias = bool(bias)
        self.dropout = float(dropout)

    def initialize(self, x, key=None, value=None):
        if x.ndim != 3:
            raise ValueError(f"MultiHeadAttention expects [B, T, E] input, got {x}")
        if self.embed_dim is not None and self.embed_dim != x.shape[2]:
            raise ValueError(f"MultiHeadAttention was built for embed_dim {self.embed_dim} but got {x}")
        self.embed_dim = x.shape[2]
        gen = x.device.generator
        seed = gen.next_below(2**63)
        self._set_cpp(_tandem.MultiHeadAttention(self.embed_dim, self.num_heads, gen, self.causal, self.use_bias,
                                                 self.dropout, seed), x.device)

    def forward(self, x, key=None, value=None):
        if key is None and value is None:
            return self._cpp(x)
        return self._cpp.attend(x, key if key is not None else x, value if value is not None else key)


class TransformerBlock(Layer):
    """GPT-2's pre-norm transformer block over [B, T, width] inputs (width taken from the first call unless
    given): ``x + drop(attn(ln_1(x)))``, then ``x + drop(mlp(ln_2(x)))``, with ``num_heads`` heads of causal
    (or, with ``causal=False``, full) self-attention from one query-key-value projection, and an MLP of
    ``mlp_ratio * width`` hidden units with the tanh form of GELU. In training, ``dropout`` drops the attention
    probabilities and each branch's output. Weights are drawn from N(0, init_std^2), the branches' output
    projections from N(0, (init_std / sqrt(2 residual_layers))^2) (GPT-2's scaling for a stack of that many
    blocks), biases zero. Parameters: ln_1.*, attn.c_attn.*, attn.c_proj.*, ln_2.*, mlp.c_fc.*, mlp.c_proj.*."""

    def __init__(self, num_heads, width=None, causal=True, dropout=0.0, bias=True, mlp_ratio=4, init_std=0.02,
                 residual_layers=1, eps=1e-5):
        super().__init__()
        if int(num_heads) <= 0:
            raise ValueError(f"TransformerBlock: num_heads must be positive, got {num_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"TransformerBlock: dropout must be in [0, 1), got {dropout}")
        self.num_heads = int(num_heads)
        self.width = None if width is None else int(width)
        self.causal = bool(causal)
        self.dropout = float(dropout)
        self.use_bias = bool(bias)
        self.mlp_ratio = int(mlp_ratio)
        self.init_std = float(init_std)
        self.residual_layers = int(residual_layers)
        self.eps = float(eps)

    def initialize(self, x):
        if x.ndim != 3:
            raise ValueError(f"TransformerBlock expects [B, T, width] input, got {x}")
        if self.width is not None and self.width != x.shape[2]:
            raise ValueError(f"TransformerBlock was built for width {self.width} but got {x}")
        if x.shape[2] % self.num_heads:
            raise ValueError(f"TransformerBlock: width {x.shape[2]} is not a multiple of num_heads {self.num_heads}")
        self.width = x.shape[2]
        self._set_cpp(_tandem.TransformerBlock(self.width, self.num_heads, x.device.generator, self.causal,
                                               self.dropout, self.use_bias, self.mlp_ratio, self.init_std,
                                               self.residual_layers, self.eps), x.device)

    recompute = False  # Model.set_recompute's policy ("full" or "selective"), or False
    doc_positions = None  # packed documents (set_document_positions), or None

    def set_document_positions(self, positions):
        """Packed documents: ``positions`` (int32 [B, T] on the block's device) holds each token's position in its
        document; the forwards that follow keep attention within documents. ``None``: one sequence per row."""
        self.doc_positions = positions
        if self._cpp is not None:
            self._cpp.set_document_positions(positions)

    def forward(self, x):
        if self.doc_positions is not None:
            self._cpp.set_document_positions(self.doc_positions)  # built after the positions were given
        if self.recompute and self.training and _tandem.grad_enabled():
            return _tandem.recompute_module(self._cpp, x, self.recompute)
        return self._cpp(x)

    def forward_cached(self, x, cache, capacity):
        """The block over the next positions x [B, Tn, width] with the earlier ones' keys and values in
        ``cache`` (a ``_tandem.KVCache`` made for ``capacity`` positions on first use); no gradient, no dropout."""
        if self._cpp is None:
            raise RuntimeError("TransformerBlock.forward_cached: call the block once first (it takes its width then)")
        return self._cpp.forward_cached(x, cache, int(capacity))


# ---- embedding, recurrent networks
def _indices(x):
    """Indices as int32 / int64 (SINGA passes them as floating tensors holding whole numbers)."""
    from .tensor import _whole_numbers

    return _whole_numbers(x, "Embedding", "indices")


class Embedding(Layer):
    """A table of ``input_dim`` rows of ``output_dim`` values looked up by integer indices, SINGA's
    signature: ``Embedding(input_dim, output_dim, initializer="gaussian")`` (N(0, 1) values, or U(-1, 1)
    with "uniform"). ``forward(x)`` takes indices of any shape (int32 / int64, or whole numbers in a
    floating tensor) and gives [..., output_dim]."""

    def __init__(self, input_dim, output_dim, initializer="gaussian"):
        super().__init__()
        if initializer not in ("gaussian", "uniform"):
            raise ValueError(f"Embedding: initializer must be 'gaussian' or 'uniform', got {initializer!r}")
        self.input_dim = int(input_dim)
        self.output_dim = int(output_dim)
        self.initializer = initializer

    def initialize(self, x):
        """Draws the table (at the first call; SINGA's scripts also call it themselves). Called again, it
        draws new values into the same table, trainable again, on the device of x."""
        w = self.W
        if w is None or w.device != x.device:
            self._build(x.device)
            return
        if self.initializer == "uniform":
            w.uniform(-1.0, 1.0)
        else:
            w.gaussian(0.0, 1.0)
        w.requires_grad = True

    def _build(self, device):
        self._set_cpp(_tandem.Embedding(self.input_dim, self.output_dim, device.generator,
                                        self.initializer == "uniform"), device)
        self._initialized = True

    def forward(self, x):
        return _tandem.embedding(self._cpp.weight, _indices(x))

    def from_pretrained(self, W, freeze=True):
        """Takes the table's values from W ([input_dim, output_dim], a tensor or an array); with freeze the
        table is not trained."""
        if self._cpp is None:
            self._build(W.device if isinstance(W, _tandem.Tensor) else _tandem.device(None))
        w = self._cpp.weight
        if tuple(W.shape) != tuple(w.shape):
            raise ValueError(f"Embedding.from_pretrained: W has shape {tuple(W.shape)}, the table is {tuple(w.shape)}")
        if isinstance(W, _tandem.Tensor):
            w.copy_(W)
        else:
            w.copy_from_numpy(W)
        w.requires_grad = not freeze

    W = _built("weight")


class RNN_Base(Layer):
    """The recurrent layers' common part: SINGA's call convention (``forward(xs, h0)`` with xs a list of
    per-step [N, I] tensors, giving a list of per-step outputs), on tandem's whole-sequence network (one
    flat weight, cuDNN on GPUs). xs may also be one tensor [T, N, I] ([N, T, I] with batch_first); the
    outputs are then one tensor too. A state [N, H] (a one-layer, one-direction network, SINGA's shape)
    is returned as [N, H]; states of deeper or bidirectional networks are [layers * directions, N, H].
    ``input_size`` None takes the size from the first call. Parameters follow PyTorch's names and
    initialisation (weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0, ..., U(-1/sqrt(H), 1/sqrt(H)))."""

    _mode = None

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0,
                 bidirectional=False):
        super().__init__()
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"{type(self).__name__}: dropout must be in [0, 1), got {dropout}")
        self.input_size = None if input_size is None else int(input_size)
        self.hidden_size = int(hidden_size)
        self.num_layers = int(num_layers)
        self.bias = bool(bias)
        self.batch_first = bool(batch_first)
        self.dropout = float(dropout)
        self.bidirectional = bool(bidirectional)

    def initialize(self, xs, *states):
        x = xs[0] if isinstance(xs, (list, tuple)) else xs
        size = int(x.shape[-1])
        if self.input_size is not None and self.input_size != size:
            raise ValueError(f"{type(self).__name__} was built for {self.input_size} input features but got {x}")
        self.input_size = size
        self._set_cpp(_tandem.RecurrentNet(self._mode, size, self.hidden_size, x.device.generator, self.num_layers,
                                           self.bias, self.batch_first, self.dropout, self.bidirectional), x.device)

    def _run(self, xs, h0, c0=None):
        steps = isinstance(xs, (list, tuple))
        if steps:
            if not xs:
                raise ValueError(f"{type(self).__name__}: no inputs")
            axis = 1 if self.batch_first else 0
            shape = [1, xs[0].shape[0], xs[0].shape[-1]] if axis == 0 else [xs[0].shape[0], 1, xs[0].shape[-1]]
            x = _tandem.cat([_tandem.reshape(t, shape) for t in xs], axis)
        else:
            x = xs
        flat_state = h0 is not None and h0.ndim == 2
        if flat_state:
            h0 = _tandem.reshape(h0, [1] + list(h0.shape))
            c0 = None if c0 is None else _tandem.reshape(c0, [1] + list(c0.shape))
        x, h0, c0 = self._broadcast_batch(x, h0, c0)
        y, hy, cy = self._cpp.forward_states(x, h0, c0)
        if flat_state or (h0 is None and self.num_layers == 1 and not self.bidirectional and steps):
            hy = _tandem.reshape(hy, list(hy.shape[1:]))
            cy = None if cy is None else _tandem.reshape(cy, list(cy.shape[1:]))
        if steps:
            axis = 1 if self.batch_first else 0
            n, f = y.shape[1 - axis], y.shape[2]
            y = [_tandem.reshape(_tandem.slice(y, axis, t, 1), [n, f]) for t in range(y.shape[axis])]
        return y, hy, cy


    def _broadcast_batch(self, x, h0, c0):
        """Inputs and states whose batch sizes differ, one of them 1, as SINGA's step-by-step layers take
        them (their sums broadcast): the one of batch 1 is repeated to the other's batch. Other mismatches
        are left to the network, which refuses them."""
        axis = 1 if self.batch_first else 0
        n = x.shape[1 - axis]
        states = [s for s in (h0, c0) if s is not None]
        m = states[0].shape[1] if states else n
        if n == m or 1 not in (n, m) or any(s.shape[1] != m for s in states):
            return x, h0, c0
        if n == 1:
            shape = list(x.shape)
            shape[1 - axis] = m
            return _tandem.expand(x, shape), h0, c0

        def wide(s):
            return None if s is None else _tandem.expand(s, [s.shape[0], n, s.shape[2]])

        return x, wide(h0), wide(c0)


class RNN(RNN_Base):
    """Elman RNN, SINGA's signature: ``RNN(input_size, hidden_size, num_layers=1, nonlinearity="tanh",
    bias=True, batch_first=False, dropout=0, bidirectional=False)``; ``forward(xs, h0)`` returns
    ``(outputs, h)``."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True, batch_first=False,
                 dropout=0, bidirectional=False):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional)
        self.nonlinearity = nonlinearity
        self._mode = nonlinearity

    def forward(self, xs, h0=None):
        y, h, _ = self._run(xs, h0)
        return y, h


class LSTM(RNN_Base):
    """LSTM, SINGA's signature: ``LSTM(input_size, hidden_size, nonlinearity="tanh", num_layers=1,
    bias=True, batch_first=False, dropout=0, bidirectional=False)``; ``forward(xs, (h0, c0))`` returns
    ``(outputs, h, c)``."""

    _mode = "lstm"

    def __init__(self, input_size, hidden_size, nonlinearity="tanh", num_layers=1, bias=True, batch_first=False,
                 dropout=0, bidirectional=False):
        if nonlinearity != "tanh":
            raise ValueError(f"LSTM: nonlinearity must be 'tanh', got {nonlinearity!r}")
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional)
        self.nonlinearity = nonlinearity

    def forward(self, xs, h0_c0=None):
        h0, c0 = (None, None) if h0_c0 is None else h0_c0
        return self._run(xs, h0, c0)


class GRU(RNN_Base):
    """GRU (tandem's, in the style of SINGA's RNN): ``GRU(input_size, hidden_size, num_layers=1, bias=True,
    batch_first=False, dropout=0, bidirectional=False)``; ``forward(xs, h0)`` returns ``(outputs, h)``."""

    _mode = "gru"

    def forward(self, xs, h0=None):
        y, h, _ = self._run(xs, h0)
        return y, h


_CUDNN_RNN_MODES = {"vanilla": "tanh", "tanh": "tanh", "relu": "relu", "lstm": "lstm", "gru": "gru"}


class CudnnRNN(Layer):
    """SINGA's whole-sequence recurrent layer: ``CudnnRNN(hidden_size, activation="tanh", num_layers=1,
    bias=True, batch_first=True, dropout=0, bidirectional=False, rnn_mode="lstm", use_mask=False,
    return_sequences=True)`` with rnn_mode "vanilla" / "tanh", "relu", "lstm" or "gru". ``forward(x, hx=None,
    cx=None)`` takes x [N, T, I] (batch_first) or [T, N, I] and returns y with D H features per step, or
    its last step [N, D H] without return_sequences. The input size comes from the first call; the flat
    weight ``W`` (PyTorch's parameters in order: per layer and direction weight_ih, weight_hh, bias_ih,
    bias_hh) is drawn from U(-1/sqrt(H), 1/sqrt(H)). It runs on CPUs too; on GPUs through cuDNN.
    Sequences of different lengths (use_mask) are not supported: pad them to one length."""

    def __init__(self, hidden_size, activation="tanh", num_layers=1, bias=True, batch_first=True, dropout=0,
                 bidirectional=False, rnn_mode="lstm", use_mask=False, return_sequences=True):
        super().__init__()
        if rnn_mode not in _CUDNN_RNN_MODES:
            raise ValueError(f"CudnnRNN: rnn_mode must be one of {', '.join(_CUDNN_RNN_MODES)}, got {rnn_mode!r}")
        if num_layers < 1:
            raise ValueError(f"CudnnRNN: num_layers must be positive, got {num_layers}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"CudnnRNN: dropout must be in [0, 1), got {dropout}")
        if use_mask:
            raise NotImplementedError("CudnnRNN: sequences of different lengths (use_mask=True) are not supported; "
                                      "pad the batch to one length")
        self.hidden_size = int(hidden_size)
        self.activation = activation
        self.num_layers = int(num_layers)
        self.bias = bool(bias)
        self.batch_first = bool(batch_first)
        self.dropout = float(dropout)
        self.bidirectional = 1 if bidirectional else 0
        self.rnn_mode = rnn_mode
        self.use_mask = False
        self.return_sequences = bool(return_sequences)
        self.input_size = None

    def initialize(self, x, hx=None, cx=None, seq_lengths=None):
        if x.ndim != 3:
            raise ValueError(f"CudnnRNN expects [N, T, I] (batch_first) or [T, N, I] input, got {x}")
        self.input_size = int(x.shape[2])
        mode = _CUDNN_RNN_MODES[self.rnn_mode]
        size = _tandem.rnn_weight_size(mode, self.input_size, self.hidden_size, self.num_layers,
                                       bool(self.bidirectional), self.bias)
        w = _tandem.Tensor([size], x.device, _tandem.DType.float32)
        k = (1.0 / self.hidden_size) ** 0.5
        w.uniform(-k, k)
        self.register_param("W", w)
        self._generator = _tandem.Generator(x.device.generator.next_below(2**62))  # dropout masks

    def forward(self, x, hx=None, cx=None, seq_lengths=None):
        if seq_lengths is not None:
            raise NotImplementedError("CudnnRNN: seq_lengths (sequences of different lengths) are not supported")
        mode = _CUDNN_RNN_MODES[self.rnn_mode]
        y, _, _ = _tandem.rnn(x, self.W, hx, cx if mode == "lstm" else None, mode, self.hidden_size, self.num_layers,
                              bool(self.bidirectional), self.batch_first, self.bias, self.dropout, self.training,
                              self._generator)
        if self.return_sequences:
            return y
        axis = 1 if self.batch_first else 0
        last = _tandem.slice(y, axis, y.shape[axis] - 1, 1)
        return _tandem.reshape(last, [y.shape[1 - axis], y.shape[2]])

    @property
    def W(self):
        return self._params.get("W")
