"""Export to ONNX (``sonnx.to_onnx``, SINGA's export of a model's graph).

tandem's autograd graph keeps what backward needs, not the attributes of the operations (a convolution's
strides, a pooling's window), and only for operations whose inputs need a gradient. An export therefore
records the forward instead: while a recording runs on a thread, every operation of tandem's Python API
called on that thread (the functions of the compiled module ``_tandem``, the methods of ``Tensor``, the
built-in layers that hold C++ modules) is noted with its arguments and results, and the calls are then
translated into ONNX nodes, opset 17, for the given inputs and outputs.

* Values that depend on neither an input nor a parameter are folded into constants (shapes, masks,
  tables computed from constants); parameters (tensors that store a gradient) and buffers become
  initializers, named by their place in their model (``conv1.weight``).
* A value made by an operation with no ONNX form (attention, recurrent networks, losses, ...) is refused
  when an output depends on it, naming the operation; so is a value made while recording by something the
  recording did not see, a tensor read back to the host (``to_numpy``, ``item``) before an output was
  computed from it, a tensor computed from the inputs written in place, and batch normalisation or dropout
  run in training mode (an ONNX graph is the model in evaluation mode: call ``model.eval()``).
* Shapes are those of the recorded inputs: the graph's inputs and outputs have fixed shapes.
"""
import threading

import numpy as np

from . import _tandem, layer
from . import tensor as _tensor_module
from .sonnx_export_ops import _ELEM, _EXPORTERS, _NP_OF, WRITTEN, _Unsupported

__all__ = ["OPSET", "WRITTEN", "record", "to_onnx"]

Tensor = _tandem.Tensor
DType = _tandem.DType
OPSET = 17


# ---- the recording
class _Call:
    """One operation the recording saw: its name, its arguments and results (tensors as handles of their
    own, which a later in-place conversion of the caller's handle does not move), the version of each
    argument tensor at the call, and its place in the order of calls."""

    __slots__ = ("op", "args", "kwargs", "out", "pre", "versions", "index", "obj")

    def __init__(self, op, args, kwargs, out, pre, versions, index, obj=None):
        self.op, self.args, self.kwargs, self.out, self.pre = op, args, kwargs, out, pre
        self.versions, self.index, self.obj = versions, index, obj


def _key(t):
    return t._impl_id


def _stable(v):
    """v with every tensor in it (nested in lists and tuples) replaced by a handle of its own."""
    if isinstance(v, Tensor):
        return v._handle()
    if isinstance(v, (list, tuple)):
        return type(v)(_stable(x) for x in v)
    return v


def _tensors(v):
    """The tensors in v (a tensor, or lists and tuples of them), in order."""
    if isinstance(v, Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors(x)]
    if isinstance(v, dict):
        return [t for x in v.values() for t in _tensors(x)]
    return []


class _Recording:
    """The calls one ``record()`` block saw on its thread."""

    def __init__(self):
        self.calls = []
        self.paused = 0
        self.start_serial = _tandem._tensor_serial()
        self.versions = {}  # tensor key -> in-place writes seen so far
        self.made = {}      # key of a result -> index of the call that made it
        self.keep = []      # every tensor met, so that no key is taken again by another tensor while recording

    def note(self, op, args, kwargs, out, pre=None, obj=None):
        args, kwargs = _stable(args), {k: _stable(v) for k, v in kwargs.items()}
        out = _stable(out)
        ins = _tensors(args) + _tensors(kwargs)
        versions = {_key(t): self.versions.get(_key(t), 0) for t in ins}
        call = _Call(op, args, kwargs, out, pre, versions, len(self.calls), obj)
        self.calls.append(call)
        self.keep.extend(ins)
        for t in _tensors(out):
            self.keep.append(t)
            self.made.setdefault(_key(t), call.index)
        return call

    def wrote(self, t):
        self.versions[_key(t)] = self.versions.get(_key(t), 0) + 1


_local = threading.local()


def _current():
    rec = getattr(_local, "recording", None)
    return rec if rec is not None and not rec.paused else None


# What each kind of call means to the recording, by name.
_HOST_READS = {"to_numpy", "Tensor.to_numpy", "Tensor.numpy", "Tensor.__array__", "Tensor.item", "Tensor.__float__",
               "Tensor.__dlpack__"}
_WRITES = {"Tensor.copy_", "Tensor.copy_data", "Tensor.set_value", "Tensor.fill_", "Tensor.zero_", "Tensor.gaussian",
           "Tensor.uniform", "Tensor.copy_from_numpy", "Tensor.__iadd__", "Tensor.__isub__", "Tensor.__imul__",
           "Tensor.__itruediv__"}
_REBINDS = {"Tensor.to_type", "Tensor.to_device"}  # the handle is pointed at a converted copy
# Methods of Tensor that neither make nor read values: not wrapped.
_TENSOR_PLAIN = {"size", "numel", "dim", "is_contiguous", "__len__", "__repr__", "shares_storage", "_handle",
                 "__dlpack_device__", "__new__", "__getattribute__", "__setattr__", "__delattr__", "__dir__",
                 "__sizeof__", "__reduce__", "__reduce_ex__", "__format__", "__str__", "__hash__", "__getstate__"}
# Python methods of Tensor recorded as one operation (they convert their operands first).
_TENSOR_PYTHON_OPS = {"__add__", "__sub__", "__mul__", "__truediv__"}


def _wrapper(op, fn, kind):
    def call(*args, **kwargs):
        rec = _current()
        if rec is None:
            return fn(*args, **kwargs)
        name = f"{type(args[0]).__name__}.{op}" if kind == "module" and args else op
        pre = [_key(t) for t in _tensors(args)] if op in _REBINDS else None
        rec.paused += 1
        try:
            out = fn(*args, **kwargs)
        finally:
            rec.paused -= 1
        if op in _WRITES:
            rec.note(op, args, kwargs, None)
            rec.wrote(args[0])
        elif kind == "init":
            rec.note(op, args[1:], kwargs, args[0])
        else:
            rec.note(name, args, kwargs, args[0] if op in _REBINDS else out, pre)
        return out

    call.__name__ = getattr(fn, "__name__", op)
    call.__doc__ = getattr(fn, "__doc__", None)
    call.__wrapped__ = fn
    return call


def _layer_wrapper(cls, fn):
    def forward(self, *args, **kwargs):
        rec = _current()
        if rec is None:
            return fn(self, *args, **kwargs)
        rec.paused += 1
        try:
            out = fn(self, *args, **kwargs)
        finally:
            rec.paused -= 1
        rec.note(f"layer.{cls.__name__}", args, kwargs, out, obj=(self, bool(self.training)))
        return out

    forward.__name__, forward.__doc__, forward.__wrapped__ = fn.__name__, fn.__doc__, fn
    return forward


# The built-in layers whose forward runs a C++ module: recorded as one operation, with the layer.
_LAYERS = (layer.Conv2d, layer.Linear, layer.BatchNorm2d, layer.Dropout, layer.LayerNorm, layer.RMSNorm)

_install_lock = threading.Lock()
_installed = [0, []]  # users, [(owner, name, original)]


def _is_class(v):
    return isinstance(v, type)


def _patch_list():
    """(owner, name, replacement) for every entry point of tensor computations."""
    out = []
    originals = {}  # id of a compiled function -> its wrapper, so that aliases get the same one
    for name, fn in vars(_tandem).items():
        if name.startswith("__") or _is_class(fn) or not callable(fn):
            continue
        w = _wrapper(name, fn, "fn")
        originals[id(fn)] = w
        out.append((_tandem, name, w))
    # Methods of Tensor: the compiled ones, and the Python operators that convert their operands.
    for name, fn in list(vars(Tensor).items()):
        if name in _TENSOR_PLAIN or not callable(fn) or _is_class(fn):
            continue
        compiled = not hasattr(fn, "__code__")
        if name == "__init__":
            out.append((Tensor, name, _wrapper("Tensor.__init__", fn, "init")))
        elif compiled or name in _TENSOR_PYTHON_OPS or f"Tensor.{name}" in _WRITES | _HOST_READS:
            out.append((Tensor, name, _wrapper(f"Tensor.{name}", fn, "method")))
    # The C++ modules (their calls and methods): operations with no ONNX form unless a layer records them.
    for cname, cls in vars(_tandem).items():
        if not _is_class(cls) or not issubclass(cls, _tandem.Module):
            continue
        for name, fn in list(vars(cls).items()):
            if name.startswith("__") and name != "__call__":
                continue
            if not callable(fn) or _is_class(fn) or name in ("named_parameters", "named_buffers", "parameters",
                                                             "num_parameters", "train", "eval", "to", "describe",
                                                             "add_parameter", "add_buffer", "add_module"):
                continue
            out.append((cls, name, _wrapper(name, fn, "module")))
    for cls in _LAYERS:
        out.append((cls, "forward", _layer_wrapper(cls, cls.__dict__["forward"])))
    # Names bound elsewhere to the compiled functions: aliases in a module, ``_fn = _tandem.relu`` in a class,
    # and functions kept in closures (singa_wrap's; sonnx's table of operators).
    from . import autograd, model, opt, singa_wrap, sonnx
    for mod in (autograd, layer, model, opt, singa_wrap, sonnx, _tensor_module):
        for name, v in list(vars(mod).items()):
            if id(v) in originals:
                out.append((mod, name, originals[id(v)]))
            elif _is_class(v) and v.__module__ == mod.__name__:
                for attr, a in list(vars(v).items()):
                    if id(a) in originals:
                        out.append((v, attr, staticmethod(originals[id(a)])))
            for f in list(v.values()) if isinstance(v, dict) else [v]:
                for cell in getattr(f, "__closure__", None) or ():
                    try:
                        held = cell.cell_contents
                    except ValueError:  # an empty cell
                        continue
                    if id(held) in originals:
                        out.append((_Cell(cell), "cell_contents", originals[id(held)]))
    return out


class _Cell:
    """A closure's cell as an owner whose attribute cell_contents is patched and restored."""

    def __init__(self, cell):
        self.cell = cell

    @property
    def cell_contents(self):
        return self.cell.cell_contents

    @cell_contents.setter
    def cell_contents(self, v):
        self.cell.cell_contents = v


def _install():
    with _install_lock:
        if _installed[0] == 0:
            saved = []
            for owner, name, repl in _patch_list():
                saved.append((owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)))
                setattr(owner, name, repl)
            _installed[1] = saved
        _installed[0] += 1


def _uninstall():
    with _install_lock:
        _installed[0] -= 1
        if _installed[0] == 0:
            for owner, name, orig in reversed(_installed[1]):
                setattr(owner, name, orig)
            _installed[1] = []


class record:
    """``with sonnx.record(): y = model(x)`` records the forward for ``sonnx.to_onnx([x], [y])``. The last
    recording of a thread is kept (with the tensors it met) until the next one starts there."""

    def __enter__(self):
        if getattr(_local, "recording", None) is not None:
            raise RuntimeError("sonnx.record: a recording is already running on this thread")
        _install()
        self.recording = _Recording()
        _local.recording = self.recording
        _local.last = None
        return self

    def __exit__(self, *exc):
        _local.recording = None
        _uninstall()
        _local.last = self.recording
        return False

    def to_onnx(self, inputs, outputs, model_name="sonnx"):
        """The recorded forward as an ONNX ModelProto (see sonnx.to_onnx)."""
        return _export(self.recording, inputs, outputs, model_name)


# ---- from calls to nodes
class _Export:
    def __init__(self, recording, onnx):
        self.rec = recording
        self.onnx = onnx
        self.h = onnx.helper
        self.env = {}        # key -> ("value", name) | ("bad", why)
        self.from_input = set()  # keys of the values computed from the inputs
        self.nodes = []
        self.inits = []
        self.init_names = {}  # (key, version) or ("const", bytes) -> name
        self.taken = set()
        self.counter = 0
        self.call = None
        self.paths = {}  # key of a parameter or buffer -> its name in its model

    # names
    def fresh(self, base):
        base = base or "v"
        name, i = base, 1
        while name in self.taken:
            name, i = f"{base}_{i}", i + 1
        self.taken.add(name)
        return name

    # values
    def dynamic(self, t):
        """Whether t depends on an input or a parameter (then operations on it become nodes)."""
        v = self.env.get(_key(t))
        if v is not None:
            return True
        return bool(t.is_leaf and t.requires_grad)

    def name(self, t, trusted=False):
        """The ONNX name of tensor t as the current call saw it: a node's output, an input, or an
        initializer holding its value (a parameter, a buffer or a constant)."""
        k = _key(t)
        v = self.env.get(k)
        if v is not None:
            if v[0] == "bad":
                raise _Unsupported(v[1])
            return v[1]
        if not trusted and self.unseen(t):
            raise _Unsupported(self.unseen(t))
        version = self.rec.versions.get(k, 0)
        seen = self.call.versions.get(k, version) if self.call is not None else version
        if seen != version:
            raise _Unsupported(f"a tensor of shape {tuple(t.shape)} written in place after the model read it")
        cached = self.init_names.get((k, version))
        if cached is not None:
            return cached
        name = self.initializer(self._array(t), self.paths.get(k, "param" if t.is_leaf and t.requires_grad else ""),
                                t.dtype)
        self.init_names[(k, version)] = name
        return name

    def unseen(self, t):
        """Why t cannot be read as a constant, when it was made while recording by something the recording did
        not see (a function held from before it started, say): its value may depend on the inputs."""
        k = _key(t)
        if k in self.env or k in self.rec.made or t._serial < self.rec.start_serial:
            return None
        return f"a tensor made while recording by an operation the recording did not see (shape {tuple(t.shape)})"

    def _array(self, t):
        rec = self.rec
        rec.paused += 1
        try:
            return np.array(t.to_numpy(), copy=True)
        finally:
            rec.paused -= 1

    def initializer(self, array, base="", dtype=None):
        """An initializer holding array (a bfloat16 value: its float32 copy, cast)."""
        name = self.fresh(base or "const")
        array = np.asarray(array)
        self.inits.append(self.onnx.numpy_helper.from_array(array.copy(order="C"), name))  # 0-d stays 0-d
        if dtype == DType.bfloat16:
            return self.node("Cast", [name], to=_ELEM[DType.bfloat16])
        return name

    def const(self, value, dtype=np.int64):
        a = np.asarray(value, dtype=dtype)
        key = ("const", a.dtype.str, a.shape, a.tobytes())
        cached = self.init_names.get(key)
        if cached is None:
            cached = self.init_names[key] = self.initializer(a, "c")
        return cached

    def scalar(self, value, like):
        """A one-element constant in the type of tensor like (broadcasts)."""
        if like.dtype == DType.bfloat16:
            return self.node("Cast", [self.const(np.float32(value), np.float32)], to=_ELEM[DType.bfloat16])
        return self.const(value, _NP_OF[like.dtype])

    def node(self, op, inputs, outputs=1, **attrs):
        """Adds a node; returns its output name (a list of them for outputs > 1)."""
        names = [self.fresh(f"{op}_{self.counter}" if outputs == 1 else f"{op}_{self.counter}_{i}")
                 for i in range(outputs)]
        self.nodes.append(self.h.make_node(op, list(inputs), names, name=f"{op}_{self.counter}", **attrs))
        self.counter += 1
        return names[0] if outputs == 1 else names

    def bind(self, t, name):
        self.env[_key(t)] = ("value", name)

    def cast(self, name, dtype):
        return self.node("Cast", [name], to=_ELEM[dtype] if isinstance(dtype, DType) else dtype)

    def name_states(self, roots):
        """Initializers take the names the parameters and buffers have in their model (``conv1.weight``): of
        the model given, or of the outermost layers of those recorded. (A tensor's own name is not read: an
        unnamed tensor would take a made-up one, SINGA's Dummy#N.)"""
        seen = set()
        for lay in roots:
            while lay.__dict__.get("_parent") is not None:
                lay = lay.__dict__["_parent"]
            if id(lay) in seen:
                continue
            seen.add(id(lay))
            for path, t in lay.get_states().items():
                self.paths.setdefault(_key(t), path)

    # the translation
    def run(self, inputs, outputs, model_name):
        for i, x in enumerate(inputs):
            self.bind(x, self.fresh(f"input_{i}"))
        graph_inputs = [(self.env[_key(x)][1], x) for x in inputs]
        self.from_input.update(_key(x) for x in inputs)
        problems = []  # (call index, why): host reads and in-place writes of values computed from the inputs
        for call in self.rec.calls:
            self.call = call
            self.step(call, problems)
        self.call = None
        out_names, outs = [], []
        for i, y in enumerate(outputs):
            k = _key(y)
            v = self.env.get(k)
            made = self.rec.made.get(k)
            if v is None:
                if made is None and not any(_key(x) == k for x in inputs):
                    raise ValueError(f"sonnx.to_onnx: output {i} (shape {tuple(y.shape)}) was not computed while "
                                     "recording: compute it inside `with sonnx.record():`, or pass the model")
                name = self.name(y)  # a constant
            elif v[0] == "bad":
                raise NotImplementedError(f"sonnx.to_onnx: output {i} depends on {v[1]}, which has no ONNX export")
            else:
                name = v[1]
            for index, why in problems:
                if made is not None and made > index:
                    raise NotImplementedError(f"sonnx.to_onnx: {why} before output {i} was computed; an ONNX "
                                              "graph cannot do that")
            final = self.fresh(f"output_{i}")
            self.nodes.append(self.h.make_node("Identity", [name], [final], name=f"output_{i}"))
            out_names.append(final)
            outs.append(y)
        h = self.h
        graph = h.make_graph(
            self.nodes, model_name,
            [h.make_tensor_value_info(n, _ELEM[x.dtype], list(x.shape)) for n, x in graph_inputs],
            [h.make_tensor_value_info(n, _ELEM[y.dtype], list(y.shape)) for n, y in zip(out_names, outs)],
            self.inits)
        model = h.make_model(graph, producer_name="tandem", opset_imports=[h.make_opsetid("", OPSET)])
        model.ir_version = min(model.ir_version, 8)  # opset 17's IR, which onnx releases of its time read
        return model

    def step(self, call, problems):
        op = call.op
        ins = _tensors(call.args) + _tensors(call.kwargs)
        if op in _HOST_READS:
            if ins and _key(ins[0]) in self.from_input:
                problems.append((call.index, f"the model reads a value computed from its inputs back to the host "
                                             f"({op})"))
            return
        if op in _WRITES:
            if ins and _key(ins[0]) in self.from_input:
                problems.append((call.index, f"the model writes into a value computed from its inputs in place "
                                             f"({op})"))
            return
        if op in _REBINDS:
            old = call.pre[0] if call.pre else None
            new = call.out
            v = self.env.get(old)
            if v is None:
                return  # a constant converted: the new one is a constant too
            if v[0] == "bad" or op == "Tensor.to_device":
                self.env[_key(new)] = v
            else:
                self.env[_key(new)] = ("value", self.cast(v[1], new.dtype))
            if old in self.from_input:
                self.from_input.add(_key(new))
            return
        outs = _tensors(call.out)
        if not outs:
            return
        bad = next((self.env[_key(t)][1] if _key(t) in self.env else self.unseen(t) for t in ins
                    if self.env.get(_key(t), ("",))[0] == "bad" or self.unseen(t)), None)
        if bad is not None:
            for t in outs:
                self.env[_key(t)] = ("bad", bad)
            return
        if not any(self.dynamic(t) for t in ins) and op not in _ALWAYS:
            return  # constant folded: the results are read as constants where they are used
        fn = _EXPORTERS.get(op)
        try:
            if fn is None:
                raise _Unsupported(_describe(op))
            fn(self, call.out, *call.args, **call.kwargs)
        except _Unsupported as e:
            for t in outs:
                if _key(t) not in self.env or self.env[_key(t)][0] != "value":
                    self.env[_key(t)] = ("bad", str(e))
            return
        for t in outs:
            if _key(t) not in self.env:
                self.env[_key(t)] = ("bad", f"{_describe(op)} (its export gave no value for this result)")
        if any(_key(t) in self.from_input for t in ins):
            self.from_input.update(_key(t) for t in outs)


def _describe(op):
    name = op[len("layer."):] if op.startswith("layer.") else op
    return f"the operation {name}"


# Calls translated even when their inputs are constants (a layer's parameters are trusted inputs).
_ALWAYS = {"layer." + c.__name__ for c in _LAYERS}


def _export(recording, inputs, outputs, model_name, model=None):
    onnx = _onnx()
    if recording is None:
        raise ValueError("sonnx.to_onnx: nothing was recorded on this thread; compute the outputs inside "
                         "`with sonnx.record():` or pass the model: sonnx.to_onnx([x], model)")
    inputs = list(inputs)
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    for what, ts in (("inputs", inputs), ("outputs", outputs)):
        for i, t in enumerate(ts):
            if not isinstance(t, Tensor):
                raise TypeError(f"sonnx.to_onnx: {what}[{i}] must be a tandem Tensor, got {type(t).__name__}")
    if not outputs:
        raise ValueError("sonnx.to_onnx: no outputs to export")
    e = _Export(recording, onnx)
    roots = [model] if isinstance(model, layer.Layer) else []
    roots += [c.obj[0] for c in recording.calls if c.obj is not None]
    e.name_states(roots)
    model = e.run(inputs, outputs, model_name)
    onnx.checker.check_model(model, full_check=True)
    return model


def _onnx():
    from .sonnx import _onnx as load
    return load()


def to_onnx(inputs, outputs, model_name="sonnx"):
    """SINGA's ``sonnx.to_onnx(inputs, outputs)``: the ONNX ModelProto (opset 17) that computes ``outputs``
    from ``inputs``. ``outputs`` are tensors computed inside ``with sonnx.record():`` on this thread, or a
    model (a ``Model``, a ``Layer`` or any callable of the inputs): it is then run on the inputs in evaluation
    mode while recording (and put back in its mode), after one unrecorded call that creates the parameters
    of layers never called before. The graph's inputs are ``input_i``, its outputs ``output_i``, with the
    recorded shapes; parameters and buffers are initializers named by their place in their model."""
    inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    if isinstance(outputs, layer.Layer) or (callable(outputs) and not isinstance(outputs, (Tensor, list, tuple))):
        return _trace_and_export(inputs, outputs, model_name)
    outs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    return _export(getattr(_local, "last", None), inputs, outs, model_name)


def _trace_and_export(inputs, model, model_name):
    was = getattr(model, "training", None)
    is_layer = isinstance(model, layer.Layer)
    from . import autograd
    flag = autograd.training
    try:
        if is_layer:
            model.eval()
        model(*inputs)  # creates the parameters of layers called for the first time, unrecorded
        with record() as r:
            y = model(*inputs)
        outs = list(y) if isinstance(y, (list, tuple)) else [y]
        return _export(r.recording, inputs, outs, model_name, model)
    finally:
        if is_layer and was is not None:
            model.train(was)
        autograd.training = flag


