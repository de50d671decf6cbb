"""Models (SINGA's ``singa.model``): subclass ``Model``, define ``forward(x)`` and
``train_one_batch(x, y, ...)``; calling the model trains on a batch in training mode and runs
``forward`` in evaluation mode.

With ``compile(..., use_graph=True)`` on a GPU, the training step is recorded once and replayed
whole (a CUDA graph): after three eager calls with the same input tensors, the fourth call records
``train_one_batch`` and every later call with those tensors replays it, reading the data now in them
(copy each batch into the same tensors, as the guide's scripts do with ``copy_from_numpy``) and
rewriting the tensors ``train_one_batch`` returned. Python code in ``train_one_batch`` runs only when
the step is recorded. Other input tensors, another learning rate or precision run eagerly (and are
recorded in turn); steps that cannot be recorded (the CPU, ranks over Gloo, Adam, loss scaling)
run eagerly, with the reason printed once. ``device.EnableGraph(False)`` makes a device's steps run
eagerly; ``device.ResetGraph()`` drops the steps recorded on it (they are recorded anew).

A model whose optimizer has a 16-bit ``dtype`` (SINGA's ``opt.SGD(dtype=tensor.float16)``), or whose
input tensors are 16-bit, runs its calls in that precision (``autograd.precision``) with float32
parameters; on the CPU, which computes in float32, 16-bit inputs are converted to float32 first."""
import contextlib
import json
import sys

from . import _tandem, autograd
from .layer import Layer
from .tensor import _recording_step

_SIXTEEN_BIT = {_tandem.DType.float16: "f16", _tandem.DType.bfloat16: "bf16"}

# Eager calls with the same inputs before the step is recorded: the first creates the optimizer's state,
# the first two settle the convolution algorithms and the memory the step needs.
_EAGER_STEPS_BEFORE_RECORDING = 3


def _tensors_in(a):
    """The tensors of an argument: itself, or those of a list or tuple."""
    if isinstance(a, _tandem.Tensor):
        return [a]
    if isinstance(a, (list, tuple)):
        return [t for t in a if isinstance(t, _tandem.Tensor)]
    return []


def _tensor_key(t):
    return (t.data_ptr, tuple(t.shape), tuple(t.strides), str(t.dtype), str(t.device))


class Model(Layer):
    def __init__(self):
        super().__init__()
        self.optimizer = None
        self.graph_mode = False
        self.sequential = False
        self._recorded = None  # {"key", "step", "out"}: the recorded training step
        self._steady_key = None
        self._steady_calls = 0
        self._graph_given_up = False

    def set_optimizer(self, optimizer):
        """The optimizer train_one_batch steps (self.optimizer); it takes this model's parameters."""
        self.optimizer = optimizer
        optimizer._use_model(self)

    def compile(self, inputs, is_train=True, use_graph=False, sequential=False, recompute=None):
        """Creates every parameter by running forward once on ``inputs`` (placeholder tensors of the
        batch's shape, on the training device), then sets training or evaluation mode. The optimizer
        set before takes the parameters now (DistOpt: all ranks start from rank 0's values).

        ``use_graph`` records the training step once and replays it on a GPU (see the module's
        notes); on the CPU steps run eagerly. ``sequential`` is accepted for SINGA scripts.
        ``recompute`` ("none", "selective" or "full") is :meth:`set_recompute`'s policy.
        """
        self.graph_mode = bool(use_graph)
        self._recorded = None
        self._steady_key = None
        self._steady_calls = 0
        self.sequential = bool(sequential)
        self.eval()
        inputs, scope = self._precision_scope(inputs, {})
        with _tandem.no_grad(), scope:
            self.forward(*inputs)
        self._initialized = True
        for name, t in self.get_states().items():  # SINGA's tensors carry their names (p.name)
            t.name = name
        self.train(is_train)
        if recompute is not None:
            self.set_recompute(recompute)
        if self.optimizer is not None:
            self.optimizer._use_model(self)

    def set_recompute(self, policy):
        """Activation recompute for the model's transformer blocks (``tandem.layer.TransformerBlock`` layers,
        the blocks of ``tandem.models.GPT`` and ``Llama``): "full" keeps only each block's input for backward
        and runs the block again there (dropout's masks replayed), so that a training step holds one block's
        activations at a time, for about a third more compute; "selective" frees each block's norms' (and
        SwiGLU's) outputs and makes them again in backward, for a few elementwise passes. The gradients are those
        of "none" (the default). Returns the number of blocks (or whole C++ models) it applies to. Call it after
        ``compile``."""
        if policy not in ("none", "selective", "full"):
            raise ValueError(f"recompute: the policy is 'none', 'selective' or 'full', got {policy!r}")
        from .layer import TransformerBlock
        on, found = policy != "none", 0

        def walk(layer):
            nonlocal found
            cpp = layer.__dict__.get("_cpp")
            if isinstance(layer, TransformerBlock):
                layer.recompute = policy if on else False
                found += 1
            elif cpp is not None and hasattr(cpp, "set_recompute"):
                cpp.set_recompute(policy)
                found += 1
            for sub in layer._layers.values():
                walk(sub)

        walk(self)
        if on and not found:
            if not self._initialized:
                raise ValueError(f"recompute: call {type(self).__name__}.compile(...) first (it builds the blocks)")
            raise ValueError(f"recompute={policy!r}: {type(self).__name__} has no transformer blocks to recompute "
                             "(tandem.layer.TransformerBlock layers and tandem.models.GPT / Llama have)")
        return found

    def graph(self, mode=True, sequential=False):
        """SINGA's switch for recorded steps after compile: mode False runs every training step eagerly,
        True records them on a GPU (as compile(use_graph=True)); sequential is accepted."""
        self.graph_mode = bool(mode)
        self.sequential = bool(sequential)
        if not self.graph_mode:
            self._recorded = None
            self._steady_key, self._steady_calls = None, 0

    def train(self, mode=True):
        """Training mode (or evaluation with mode False) for the model and its layers; sets
        ``autograd.training`` as SINGA's does."""
        super().train(mode)
        autograd.training = bool(mode)

    def __call__(self, *args, **kwargs):
        args, scope = self._precision_scope(args, kwargs)
        with scope:
            if not self.training:
                return self.forward(*args, **kwargs)
            if self.graph_mode:
                return self._recorded_step(args, kwargs)
            return self.train_one_batch(*args, **kwargs)

    # ---- 16-bit models
    def _precision_scope(self, args, kwargs):
        """The inputs to run with (16-bit CPU tensors as float32) and the precision block to run in."""
        want = getattr(self.optimizer, "precision", None) if self.optimizer is not None else None
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, _tandem.Tensor)]
        if want is None:
            want = next((_SIXTEEN_BIT[t.dtype] for t in tensors if t.dtype in _SIXTEEN_BIT), None)
        if want is None:
            return args, contextlib.nullcontext()
        args = tuple(a.as_type(_tandem.DType.float32) if isinstance(a, _tandem.Tensor) and a.dtype in _SIXTEEN_BIT
                     and a.device.is_cpu() else a for a in args)
        current = _tandem.current_precision()
        if current in (_tandem.Precision.f16, _tandem.Precision.bf16):  # the caller chose one already
            return args, contextlib.nullcontext()
        return args, _tandem.precision(want)

    # ---- recorded steps
    def _step_key(self, args, kwargs):
        """What a replay must match: the input tensors (address, shape, strides, dtype: views share an
        address), the other arguments, the learning rate and the precision in effect; and the device to
        record on. (None, None) where nothing can be recorded."""
        values = list(args) + [kwargs[k] for k in sorted(kwargs)]
        tensors = [t for a in values for t in _tensors_in(a)]
        if not tensors or not _tandem.graph_supported(tensors[0].device):
            return None, None
        parts = []
        for a in values:
            if _tensors_in(a):  # a tensor, or a list or tuple of them (SINGA's RNN inputs: one per step)
                parts.append(("tensors", tuple(_tensor_key(t) for t in _tensors_in(a)), len(a)
                              if isinstance(a, (list, tuple)) else None))
            else:
                parts.append(("value", repr(a)))
        lr = self.optimizer.lr if self.optimizer is not None else None
        return (tuple(sorted(kwargs)), tuple(parts), lr, str(_tandem.current_precision())), tensors[0].device

    def _replay_blocker(self):
        opt = self.optimizer
        if opt is None:
            return "the model has no optimizer (set_optimizer): its steps are not recorded"
        if opt._python_steps():
            return f"the optimizer ({type(opt).__name__}) steps in Python (its apply())"
        impl = getattr(opt, "_impl", None)
        if impl is None:
            return "the optimizer has no parameters yet"
        return impl.replay_blocker()

    def _give_up_recording(self, why):
        self._graph_given_up = True
        rank = getattr(self.optimizer, "global_rank", 0) if self.optimizer is not None else 0
        if rank == 0:
            print(f"tandem: steps run eagerly: {why}", file=sys.stderr, flush=True)

    def _recorded_step(self, args, kwargs):
        key, dev = self._step_key(args, kwargs)
        if key is None or not dev.graph_enabled():
            return self.train_one_batch(*args, **kwargs)
        rec = self._recorded
        if rec is not None and rec["generation"] != dev.graph_generation:  # the device's ResetGraph
            rec = self._recorded = None
            self._steady_key, self._steady_calls = None, 0
        if rec is not None and rec["key"] == key:
            rec["step"].replay()
            inner = getattr(self.optimizer, "opt", self.optimizer)
            inner._count_step()  # the replayed step counts for the learning-rate schedule
            return rec["out"]
        if self._graph_given_up:
            return self.train_one_batch(*args, **kwargs)
        self._steady_calls = self._steady_calls + 1 if key == self._steady_key else 1
        self._steady_key = key
        if self._steady_calls <= _EAGER_STEPS_BEFORE_RECORDING:
            return self.train_one_batch(*args, **kwargs)
        why = self._replay_blocker()
        if why:
            self._give_up_recording(why)
            return self.train_one_batch(*args, **kwargs)
        result = {}

        def body():
            _recording_step[0] = True  # nothing in the step may read the device's values on the host
            try:
                result["out"] = self.train_one_batch(*args, **kwargs)
            finally:
                _recording_step[0] = False

        dist = self.optimizer._impl if hasattr(self.optimizer, "backward_and_sync") else None
        try:
            step = _tandem.record_step(dev, body, dist)
        except Exception as e:  # nothing ran: the step is taken eagerly
            self._give_up_recording(f"recording the step failed: {e}")
            return self.train_one_batch(*args, **kwargs)
        step.replay()
        self._recorded = {"key": key, "step": step, "out": result.get("out"), "generation": dev.graph_generation}
        return self._recorded["out"]

    @property
    def replays(self):
        """How many calls replayed the recorded step."""
        return self._recorded["step"].replays if self._recorded is not None else 0

    def train_one_batch(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define train_one_batch() to be called in training mode")

    def save_states(self, fpath, aux_states=None):
        """Writes parameters, buffers, the optimizer's state and ``aux_states`` (a JSON-able dict)
        to one file, atomically. Under ``DistOpt(shard=...)`` each rank keeps a slice of the optimizer's
        state (and, with shard="parameters", of the parameters), gathered here from all of them: every rank
        calls save_states (each writes the whole checkpoint to the path it gives), which any model of the same
        layers loads, sharded or not."""
        opt = self.optimizer._cpp_optimizer() if self.optimizer is not None else None
        if opt is not None:
            self.optimizer._gather_state()
        try:
            _tandem.save_checkpoint(str(fpath), self._module(), opt, json.dumps(aux_states or {}))
        finally:
            if opt is not None:
                self.optimizer._release_state()  # the gathered copy: the whole model's optimizer state

    def load_states(self, fpath):
        """Loads what save_states wrote (the model must be compiled); returns the aux_states dict. The
        optimizer takes the file's state, step counts and parameter groups (give its step counter back
        with ``set_states``, from what ``get_states`` gave to aux_states). Under ``DistOpt(shard=
        "parameters")`` every rank calls it: the parameters are whole while the file's values go in, then each
        rank keeps its pieces of them."""
        opt = self.optimizer._cpp_optimizer() if self.optimizer is not None else None
        with self.optimizer._loading() if opt is not None else contextlib.nullcontext():
            aux = json.loads(_tandem.load_checkpoint(str(fpath), self._module(), opt))
        if opt is not None:
            self._recorded = None  # recorded with the optimizer's former groups and settings
            self._steady_key, self._steady_calls = None, 0
            self.optimizer._after_load()
        return aux
