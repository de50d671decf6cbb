"""Optimizers (SINGA's ``singa.opt``): SGD, Adam, learning-rate schedules, and DistOpt, which sums or
averages across the ranks of a job.

An optimizer learns its parameters from the model it is given (``model.set_optimizer``, or a model's
``compile`` when ``set_optimizer`` only stored it), or else from the graph of the first loss it steps
on. ``dtype=tensor.float16`` (SINGA's 16-bit training) keeps the parameters and the optimizer's state
in float32 and makes the model compute in tandem's f16 precision: 16-bit convolutions and matrix
products on GPUs, exact float32 on CPUs (see ``Optimizer``).
"""
import contextlib
import math
import weakref

from . import _tandem
from .device import _share_cores
from .distributed import _abort_job_on_uncaught_error
from .tensor import bfloat16, float16, float32

# SINGA's fusion threshold (elements): accepted by DistOpt's steps, whose buckets replace it.
_SINGA_THRESHOLD = 2097152
# The 16-bit dtypes an optimizer accepts and the precision the model then computes in.
_PRECISIONS = {float16: "f16", bfloat16: "bf16"}


# ---- schedules (SINGA's DecayScheduler)

def _number(step):
    """A step count given as a number or a one-element tensor."""
    return float(step.item()) if isinstance(step, _tandem.Tensor) else float(step)


class DecayScheduler:
    """A value that follows the step count: ``sched(step)`` is a one-element tensor (SINGA's), where
    ``step`` is a number or a one-element tensor. Subclasses define ``call(step)``."""

    def __init__(self, init_value):
        self.init_value = init_value

    def __call__(self, step):
        value = self.call(step)
        if isinstance(value, _tandem.Tensor):
            return value
        return _tandem.full([1], float(value), step.device if isinstance(step, _tandem.Tensor) else None,
                            float32)

    def call(self, step):
        raise NotImplementedError(f"{type(self).__name__} must define call(step)")

    def value_at(self, step):
        """The value at ``step``, as a float (computed in double precision where ``call`` returns a number)."""
        v = self.call(step)
        return v.item() if isinstance(v, _tandem.Tensor) else float(v)


class Constant(DecayScheduler):
    """``init_value`` at every step."""

    def call(self, step):
        return float(self.init_value)


class ExponentialDecay(DecayScheduler):
    """``init_value * decay_rate ** (step / decay_steps)`` (with ``staircase``, the exponent rounded
    down)."""

    def __init__(self, init_value, decay_steps, decay_rate, staircase=False):
        super().__init__(init_value)
        if decay_steps <= 0:
            raise ValueError(f"ExponentialDecay: decay_steps must be positive, got {decay_steps}")
        self.decay_steps = decay_steps
        self.decay_rate = decay_rate
        self.staircase = bool(staircase)

    def call(self, step):
        s = _number(step) / self.decay_steps
        if self.staircase:
            s = math.floor(s)
        return float(self.init_value) * float(self.decay_rate) ** s


class WarmupCosineDecay(DecayScheduler):
    """Linear warm-up, then cosine decay (as GPT training runs; tandem's, SINGA has none): step k <
    warmup_steps has ``init_value * (k + 1) / warmup_steps``; from warmup_steps to total_steps the value
    falls along half a cosine from init_value to min_value, and stays at min_value after. The same
    schedule as C++ optim::WarmupCosine."""

    def __init__(self, init_value, warmup_steps, total_steps, min_value=0.0):
        super().__init__(init_value)
        if not 0 <= warmup_steps < total_steps:
            raise ValueError(f"WarmupCosineDecay: needs 0 <= warmup_steps < total_steps, got {warmup_steps} and "
                             f"{total_steps}")
        if not 0.0 <= min_value <= init_value:
            raise ValueError(f"WarmupCosineDecay: needs 0 <= min_value <= init_value, got {min_value} and {init_value}")
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.min_value = float(min_value)

    def call(self, step):
        k = _number(step)
        peak = float(self.init_value)
        if k < self.warmup_steps:
            return peak * (math.floor(k) + 1) / self.warmup_steps
        if k >= self.total_steps:
            return self.min_value
        progress = (k - self.warmup_steps) / (self.total_steps - self.warmup_steps)
        return self.min_value + (peak - self.min_value) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _schedule(value, what, fixed=False):
    """A number or DecayScheduler as a DecayScheduler; ``fixed`` ones must be constant."""
    if isinstance(value, DecayScheduler):
        if fixed and not isinstance(value, Constant):
            raise ValueError(f"{what} must be a number or opt.Constant in tandem (only lr may follow a schedule)")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number or a DecayScheduler, got {type(value).__name__}")
    return Constant(value)


class Optimizer:
    """Base: holds the hyper-parameters until the parameters are known, then a C++ optimizer.

    ``lr`` is a number or a DecayScheduler (then read at each step, from the steps taken so far).
    ``dtype`` is ``tensor.float32``, or ``tensor.float16`` / ``tensor.bfloat16`` for 16-bit training:
    tandem then keeps float32 parameters and optimizer state (the master copies) and the model computes
    in that precision (``autograd.precision``): on GPUs, convolutions and matrix products take 16-bit
    copies of activations and weights, and gradients of the weights come back in float32; on CPUs
    everything is float32. A model whose optimizer has a 16-bit dtype, or whose input tensors are
    16-bit, runs its steps in that precision (CPU inputs are converted to float32 first). No loss is
    scaled, as in SINGA's float16 training.

    A subclass that defines SINGA's ``apply(param_name, param_value, param_grad)`` (and not tandem's
    C++ optimizer) steps in Python, as SINGA's own optimizers are written: a call on a loss runs
    ``call(loss)``, which back-propagates and gives ``apply`` each parameter with its gradient (named by
    ``p.name``, or ``id(p)``), then ``step()``, which counts the step and sets ``lr_value`` (a
    one-element tensor) to the schedule's next rate. ``device_check(*tensors)`` moves tensors to the
    first one's device. Such an optimizer's state is its own: checkpoints keep the model's parameters and
    the step count; recorded steps and DistOpt need one of tandem's optimizers.
    """

    def __init__(self, lr, dtype=float32):
        if dtype != float32 and dtype not in _PRECISIONS:
            raise ValueError(f"dtype must be tensor.float32, tensor.float16 or tensor.bfloat16, got {dtype}")
        self.dtype = dtype
        self._schedule = _schedule(lr, "lr")
        self._steps = 0
        self._lr = self._schedule.value_at(0)
        self.lr_value = _tandem.full([1], self._lr, None, float32)  # SINGA's: the rate as a tensor
        self._model = None
        self._module = None  # the C++ module listing the parameters
        self._impl = None
        self._singles = {}  # apply() of parameters the C++ optimizer does not hold: name -> (param, impl)
        self._leaves_checked = False
        self._groups = None  # set_param_groups' groups, applied when the C++ optimizer exists

    @property
    def precision(self):
        """The precision the model computes in with this optimizer ("f16", "bf16"), or None."""
        return _PRECISIONS.get(self.dtype)

    def _python_steps(self):
        """True for a subclass that steps in Python: it defines apply() and no C++ optimizer."""
        cls = type(self)
        return cls._create is Optimizer._create and cls.apply is not Optimizer.apply

    def device_check(self, *inputs):
        """SINGA's: moves every tensor given to the device of the first, in place (numbers, such as
        tandem's ``step_counter``, are left as they are)."""
        dev = inputs[0].device
        for t in inputs[1:]:
            if isinstance(t, _tandem.Tensor) and t.device != dev:
                t.to_device(dev)

    # ---- parameters
    def _use_model(self, model):
        self._model = model
        if model._initialized and self._impl is None and model.get_params():
            self._build(model._module())

    def _ensure(self, loss):
        if self._python_steps():
            return
        if self._impl is None:
            if self._model is not None:
                module = self._model._module()
            else:
                module = _tandem.ParamModule()
                for i, p in enumerate(_tandem.graph_leaves(loss)):
                    module.add_parameter(f"param{i}", p)
            if not module.parameters():
                raise ValueError("the loss depends on no parameter: nothing to optimise")
            self._build(module)
        if not self._leaves_checked:
            self._leaves_checked = True
            self._check_leaves(loss)

    def _check_leaves(self, loss):
        """A loss that reaches the model's parameters and also tensors outside them would leave those
        untrained: refused (a loss reaching none of them is the C++ optimizer's to refuse)."""
        if self._model is None:
            return
        mine = {p._impl_id for p in self._module.parameters()}
        leaves = _tandem.graph_leaves(loss)
        stray = [t for t in leaves if t._impl_id not in mine]
        if stray and len(stray) < len(leaves):
            shapes = ", ".join(str(list(t.shape)) for t in stray[:5])
            raise ValueError(f"the loss depends on {len(stray)} tensor(s) that require a gradient but are not "
                             f"parameters of the model ({shapes}): make their layers attributes of a layer of the "
                             "model or give them to register_layers, or set requires_grad=False")

    def _build(self, module):
        self._module = module
        if self._python_steps():
            return  # apply() steps each parameter
        # Frozen parameters (Embedding.from_pretrained(freeze=True), requires_grad=False) are not trained.
        self._impl = self._create([p for p in module.parameters() if p.requires_grad])
        self._impl.lr = self._lr
        if self._groups is not None:
            self._apply_groups()

    # ---- parameter groups
    def set_param_groups(self, groups):
        """Gives groups of parameters their own settings (tandem's; PyTorch's param_groups in spirit):
        ``groups`` is a list of dicts with "params" (parameter names, as ``model.get_params()`` lists
        them, or the tensors themselves) and any of "weight_decay", "lr" (the group's rate at the start;
        it follows the learning-rate schedule in proportion) or "lr_scale" (a factor of the optimizer's
        rate). Parameters in no group keep the optimizer's settings; frozen parameters (``requires_grad``
        False), which it does not step, are passed over. :func:`decay_groups` makes the usual split. Takes
        effect now, or when the optimizer learns its parameters."""
        self._groups = self._checked_groups(groups)
        if self._impl is not None:
            self._apply_groups()
            self._forget_recorded_step()

    def _checked_groups(self, groups):
        if self._python_steps():
            raise ValueError(f"set_param_groups: {type(self).__name__} steps in Python (its apply()); parameter groups "
                             "are settings of tandem's optimizers (SGD, Adam, RMSProp, AdaGrad)")
        checked = []
        for i, g in enumerate(groups):
            if not isinstance(g, dict) or "params" not in g:
                raise TypeError(f"set_param_groups: group {i} must be a dict with 'params'")
            unknown = sorted(set(g) - {"params", "weight_decay", "lr", "lr_scale"})
            if unknown:
                raise ValueError(f"set_param_groups: group {i} has unknown keys {unknown} (params, weight_decay, lr, "
                                 "lr_scale)")
            if "lr" in g and "lr_scale" in g:
                raise ValueError(f"set_param_groups: group {i} gives both lr and lr_scale")
            checked.append(dict(g))
        return checked

    def _apply_groups(self):
        _tandem.set_param_groups(self._impl, self._group_tuples())

    def _group_tuples(self):
        """The groups as the C++ optimizer takes them: (parameters, lr_scale, weight_decay or None)."""
        by_name = dict(self._module.named_parameters())
        held = {t._impl_id for t in self._impl.params()}
        frozen = {t._impl_id for t in by_name.values()} - held
        base = self._schedule.value_at(0)
        tuples = []
        for i, g in enumerate(self._groups):
            params = []
            for p in g["params"]:
                if isinstance(p, str):
                    if p not in by_name:
                        raise KeyError(f"set_param_groups: group {i} names '{p}', which is not a parameter (there are: "
                                       f"{', '.join(by_name) or 'none'})")
                    p = by_name[p]
                if p._impl_id not in frozen:  # a frozen parameter has no settings to take
                    params.append(p)
            if "lr" in g:
                if base <= 0:
                    raise ValueError("set_param_groups: a group's lr needs the optimizer's own rate to be positive "
                                     "(give lr_scale instead)")
                scale = float(g["lr"]) / base
            else:
                scale = float(g.get("lr_scale", 1.0))
            decay = g.get("weight_decay")
            tuples.append((params, scale, None if decay is None else float(decay)))
        return tuples

    def _forget_recorded_step(self):
        """A recorded step ran with the groups it was recorded with: the model records its step again."""
        model = self._model
        if model is not None and getattr(model, "_recorded", None) is not None:
            model._recorded = None
            model._steady_key, model._steady_calls = None, 0

    @property
    def param_groups(self):
        """The groups in effect: a list of dicts with "params" (names), "lr_scale" and "weight_decay" (None:
        the optimizer's own); empty until the optimizer knows its parameters."""
        if self._impl is None:
            return []
        names = {t._impl_id: n for n, t in self._module.named_parameters()}
        return [{"params": [names.get(t._impl_id, "?") for t in params], "lr_scale": scale,
                 "weight_decay": decay} for params, scale, decay in _tandem.param_groups(self._impl)]

    def _create(self, params):
        raise NotImplementedError

    def _cpp_optimizer(self):
        if self._impl is None and self._model is not None:
            self._build(self._model._module())
        return self._impl

    # ---- hyper-parameters and the step count
    @property
    def lr(self):
        """The learning rate of the next step (a float; set it to a number or a DecayScheduler)."""
        return self._lr

    @lr.setter
    def lr(self, value):
        self._schedule = _schedule(value, "lr")
        self._refresh_lr()

    @property
    def step_counter(self):
        """Steps taken so far (SINGA's counter, which drives the schedules)."""
        return self._steps

    def _refresh_lr(self):
        self._lr = self._schedule.value_at(self._steps)
        self.lr_value.set_value(self._lr)
        if self._impl is not None:
            self._impl.lr = self._lr
        for _, impl in self._singles.values():
            impl.lr = self._lr

    def _count_step(self):
        self._steps += 1
        self._refresh_lr()

    def get_states(self):
        """The step counter, as SINGA's (the moments travel with the model's checkpoints: model.save_states)."""
        return {"step_counter": self._steps}

    def set_states(self, states):
        """Takes the step counter get_states gave: the learning rate follows it, as SINGA's."""
        self._steps = int(states["step_counter"])
        self._refresh_lr()

    def _gather_state(self):
        """Before a checkpoint is written: the whole state in the optimizer save_states writes (DistOpt's)."""

    def _release_state(self):
        """After the checkpoint is written: the copy _gather_state made is dropped (DistOpt's)."""

    def _after_load(self):
        """After a checkpoint was loaded into the C++ optimizer (DistOpt's)."""

    def _loading(self):
        """Around loading a checkpoint into the model (DistOpt's, under sharded parameters: whole meanwhile)."""
        return contextlib.nullcontext()

    # ---- steps
    def __call__(self, loss):
        self.backward_and_update(loss)

    def backward_and_update(self, loss):
        """Back-propagates from loss and applies its gradients, as SINGA's: gradients left on the
        parameters by earlier passes (an ``autograd.backward`` loop, ``t.backward()``) are dropped first.
        To apply the sum of several passes, call ``t.backward()`` for each, then ``step()``."""
        if self._python_steps():
            self.call(loss)
        else:
            self._fresh_backward(loss)
        self.step()

    def call(self, loss):
        """SINGA's first half of a step: back-propagates and applies this loss's gradients (as
        backward_and_update), without counting the step (``step()`` counts it)."""
        if self._python_steps():
            from .autograd import backward

            for p, g in backward(loss):
                if p.name is None:
                    p.name = id(p)
                self.apply(p.name, p, g)
            return
        self._fresh_backward(loss)
        self._impl.step()
        self._impl.zero_grad(True)

    def _fresh_backward(self, loss):
        self._ensure(loss)
        self._impl.zero_grad(True)  # nothing to drop after a step: it leaves no gradient
        _tandem.backward(loss)

    def step(self):
        """Applies the accumulated gradients, then clears them, and counts the step (an optimizer that
        steps in Python: counts it, and sets lr_value to the next rate)."""
        if self._python_steps():
            self._count_step()
            return
        if self._impl is None:
            raise RuntimeError("the optimizer has no parameters yet: call it on a loss or use model.set_optimizer")
        self._impl.step()
        self._impl.zero_grad(True)
        self._count_step()

    def apply(self, param_name, param_value, param_grad):
        """SINGA's per-parameter step: updates ``param_value`` in place with ``param_grad`` (the
        gradient may be changed; do not use it afterwards). The optimizer's state for it (momentum)
        is the one its other steps use; ``param_name`` keys it for parameters it does not hold."""
        impl, index = self._slot(param_name, param_value)
        impl.step_param(index, param_grad)

    def update(self, param, grad):
        """SINGA's (deprecated) ``apply`` keyed by the parameter itself."""
        self.apply(getattr(param, "name", None) or id(param), param, grad)

    def _slot(self, name, param):
        if self._impl is not None:
            for i, p in enumerate(self._impl.params()):
                if p.data_ptr == param.data_ptr and p.shape == param.shape:
                    return self._impl, i
        held = self._singles.get(name)
        if held is None or held[0].data_ptr != param.data_ptr:
            # A tensor made without stores_grad (SINGA's Tensor(shape) or from_numpy) is stepped through
            # a leaf that shares its memory: SINGA's apply updates any tensor in place.
            leaf = param if param.requires_grad else _tandem.Tensor(data=param, requires_grad=True,
                                                                    stores_grad=True)
            impl = self._create([leaf])
            impl.lr = self._lr
            held = self._singles[name] = (param, impl)
        return held[1], 0


class SGD(Optimizer):
    """SGD with momentum, dampening, weight decay and Nesterov momentum (SINGA's signature):
    buf = momentum * buf + (1 - dampening) * (g + weight_decay * p), p -= lr * buf (Nesterov: p -= lr *
    (g + momentum * buf)). A momentum buffer starts from the first gradient. momentum, dampening and
    weight_decay may be opt.Constant."""

    def __init__(self, lr=0.1, momentum=0, dampening=0, weight_decay=0, nesterov=False, dtype=float32):
        super().__init__(lr, dtype)
        self.momentum = float(_schedule(momentum, "momentum", fixed=True).init_value)
        self.dampening = float(_schedule(dampening, "dampening", fixed=True).init_value)
        self.weight_decay = float(_schedule(weight_decay, "weight_decay", fixed=True).init_value)
        self.nesterov = bool(nesterov)
        if self.momentum < 0:
            raise ValueError(f"Invalid momentum value: {self.momentum}")
        if self.weight_decay < 0:
            raise ValueError(f"Invalid weight_decay value: {self.weight_decay}")
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")

    def _create(self, params):
        return _tandem.SGD(params, self._lr, self.momentum, self.dampening, self.weight_decay, self.nesterov)


class Adam(Optimizer):
    """Adam with bias correction (SINGA's signature; ``decoupled=True``: AdamW)."""

    def __init__(self, lr=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-8, weight_decay=0, decoupled=False,
                 dtype=float32):
        super().__init__(lr, dtype)
        self.beta_1 = float(_schedule(beta_1, "beta_1", fixed=True).init_value)
        self.beta_2 = float(_schedule(beta_2, "beta_2", fixed=True).init_value)
        self.epsilon = float(_schedule(epsilon, "epsilon", fixed=True).init_value)
        self.weight_decay = float(_schedule(weight_decay, "weight_decay", fixed=True).init_value)
        if self.weight_decay < 0:
            raise ValueError(f"Invalid weight_decay value: {self.weight_decay}")
        self.decoupled = bool(decoupled)

    def _create(self, params):
        return _tandem.Adam(params, self._lr, self.beta_1, self.beta_2, self.epsilon, self.weight_decay,
                            self.decoupled)


class RMSProp(Optimizer):
    """RMSProp, SINGA's signature and rule: ``RMSProp(lr=0.1, rho=0.9, epsilon=1e-8, weight_decay=0)``:
    g += weight_decay * p; v = rho v + (1 - rho) g^2 (v from zeros); p -= lr g / sqrt(v + epsilon). The
    update is one fused kernel over all parameters; v travels with checkpoints ("square_avg")."""

    def __init__(self, lr=0.1, rho=0.9, epsilon=1e-8, weight_decay=0, dtype=float32):
        super().__init__(lr, dtype)
        self.rho = float(_schedule(rho, "rho", fixed=True).init_value)
        self.epsilon = float(_schedule(epsilon, "epsilon", fixed=True).init_value)
        self.weight_decay = float(_schedule(weight_decay, "weight_decay", fixed=True).init_value)
        if self.weight_decay < 0:
            raise ValueError(f"Invalid weight_decay value: {self.weight_decay}")
        if not 0.0 <= self.rho < 1.0:
            raise ValueError(f"Invalid rho value: {self.rho} (it must lie in [0, 1))")
        if self.epsilon <= 0:
            raise ValueError(f"Invalid epsilon value: {self.epsilon}")

    def _create(self, params):
        return _tandem.RMSProp(params, self._lr, self.rho, self.epsilon, self.weight_decay, True)


class AdaGrad(Optimizer):
    """AdaGrad, SINGA's signature and rule: ``AdaGrad(lr=0.1, epsilon=1e-8, weight_decay=0)``:
    g += weight_decay * p; h += g^2 (h from zeros); p -= lr g / sqrt(h + epsilon). The update is one
    fused kernel over all parameters; h travels with checkpoints ("sum")."""

    def __init__(self, lr=0.1, epsilon=1e-8, weight_decay=0, dtype=float32):
        super().__init__(lr, dtype)
        self.epsilon = float(_schedule(epsilon, "epsilon", fixed=True).init_value)
        self.weight_decay = float(_schedule(weight_decay, "weight_decay", fixed=True).init_value)
        if self.weight_decay < 0:
            raise ValueError(f"Invalid weight_decay value: {self.weight_decay}")
        if self.epsilon <= 0:
            raise ValueError(f"Invalid epsilon value: {self.epsilon}")

    def _create(self, params):
        return _tandem.AdaGrad(params, self._lr, 0.0, self.weight_decay, 0.0, self.epsilon, True)


def decay_groups(model, weight_decay):
    """The usual weight-decay split of a model's parameters, for ``set_param_groups``: matrices, filters
    and recurrent weights decay with ``weight_decay``; biases, normalisation scales and shifts (every
    parameter of fewer than two dimensions but a CudnnRNN's flat weight) and embedding tables do not,
    as GPT training does. Returns two groups of parameter names."""
    from .layer import CudnnRNN, Embedding

    if weight_decay < 0:
        raise ValueError(f"decay_groups: weight_decay must not be negative, got {weight_decay}")
    module = model._module()
    names = {t._impl_id: n for n, t in module.named_parameters()}
    key = lambda t: t._impl_id  # noqa: E731
    decayed, kept = _tandem.decay_groups(module, float(weight_decay))
    decay = [key(t) for t in decayed[0]]
    keep = [key(t) for t in kept[0]]
    tables, flat = set(), set()

    def walk(layer):
        if isinstance(layer, Embedding) and layer.W is not None:
            tables.add(key(layer.W))
        if isinstance(layer, CudnnRNN) and layer.W is not None:
            flat.add(key(layer.W))
        for sub in layer._layers.values():
            walk(sub)

    walk(model)
    decay = [k for k in decay if k not in tables] + [k for k in keep if k in flat]
    keep = [k for k in keep if k not in flat] + [k for k in tables if k not in keep]
    return [{"params": [names[k] for k in decay], "weight_decay": float(weight_decay)},
            {"params": [names[k] for k in keep], "weight_decay": 0.0}]


class DistOpt(Optimizer):
    """The distributed optimizer (SINGA's signature): wraps ``opt`` and averages gradients across the
    job's ranks.

    The ranks come from the launcher (``tandem launch``, ``mpiexec``, torchrun) or, for processes
    started by ``multiprocessing``, from ``nccl_id`` (a :class:`tandem.NcclIdHolder` made by the
    parent) with ``local_rank`` and ``world_size`` (the guide's ``gpu_num`` and ``gpu_per_node``).
    Without any, it is a one-rank DistOpt. GPU tensors travel over NCCL, CPU tensors over Gloo.

    Calling it on a loss runs a step of ``dist_option`` (plain: ``backward_and_update``; also half,
    partialUpdate, sparseTopK, sparseThreshold, powerSGD, with ``spars``, ``clip``,
    ``error_feedback`` and ``powersgd_rank``); the guide's ``backward_and_*`` calls pick their own.
    ``buffSize`` is the number of float32 gradients per all-reduce bucket; ``skip_nonfinite`` makes
    ``update`` skip, on every rank, a step whose averaged gradients hold inf or NaN; ``timeout``
    (seconds) bounds joining the job and each collective. ``opt=None`` is SINGA's default, ``SGD()``.
    ``shard`` ("none", "optimizer", "gradients", "parameters") keeps the optimizer's state (and the
    gradients, and the parameters) only once across the ranks (ZeRO stages 1 to 3).

    ``shard="parameters"`` (stage 3) needs a Model (``set_optimizer``, then ``compile``): each rank keeps
    only its slices of the parameters between uses, and the model's layers are the units they are gathered
    by (layer groups). Every sublayer of the model holding trained parameters is one group; a call of it
    (``self.fc1(x)``, with any tensors in and out) gathers its parameters whole for its forward and frees them
    after, and backward gathers them again when it reaches the layer and frees them once past it, the next
    group's gather started meanwhile. The groups run in the order the model's first forward (compile's)
    first called the layers, those it did not call after them in registration order. A tensor two layers
    hold (tied weights) is one parameter of both groups. Refused with a message naming them: trained
    parameters of the model itself (outside every layer), a layer of a group called outside its enclosing
    layer's call, a parameter the loss reached without its layer being called (checked at the first step),
    a layer returning objects other than tensors (and lists, tuples, dicts of them), a loss without a
    model. Between steps a parameter views a NaN: ``get_params``/``get_states`` gather them first (a
    collective: every rank calls them; whole until the next forward), ``set_params``/``set_states`` and
    ``load_states`` write them whole and each rank keeps its slices, ``save_states`` writes them whole (the
    checkpoint of an unsharded run). Set parameter groups before ``compile``.
    With ``uneven_inputs`` ranks may have different numbers of batches:
    a rank whose data ran out calls ``join()`` and takes part in the others' steps until all are done.
    ``master_weights`` (``bfloat16`` or ``float16``) makes the parameters hold values of that type while
    the optimizer steps float32 masters of them, kept as its state (sharded with it under ``shard``).
    ``release_gradients=True`` holds the gradients only from backward to ``update()`` (with ``shard="none"``
    and no master weights; the tandem program always does): each bucket is allocated as backward reaches its
    parameters and released by the update, which leaves every parameter's ``grad`` None, so that a step's peak
    memory holds no gradient beside the activations. The steps are those of kept gradients, bit for bit.
    ``offload="optimizer"`` keeps the optimizer's state and the f32 values it steps in host memory (each rank its
    slices, as ``shard="optimizer"`` cuts them; the step runs on the CPU), ``offload="parameters"`` also keeps
    ``shard="parameters"``' slices of the parameters there between uses (``shard="none"`` becomes
    ``"parameters"``): ``tandem train --offload`` (docs/distributed.md). The steps are those without offload.
    """

    def __init__(self, opt=None, nccl_id=None, local_rank=None, world_size=None, buffSize=4194304, *,
                 gpu_num=None, gpu_per_node=None, dist_option="plain", spars=0.05, clip=0.0, error_feedback=True,
                 powersgd_rank=2, half_dtype=float16, first_bucket_size=262144, skip_nonfinite=False,
                 timeout=300.0, shard="none", uneven_inputs=False, master_weights=None, release_gradients=False,
                 offload="none"):
        opt = opt if opt is not None else SGD()
        if not isinstance(opt, Optimizer) or isinstance(opt, DistOpt):
            raise TypeError("DistOpt wraps an optimizer (SGD, Adam, RMSProp, AdaGrad)")
        if opt._python_steps():
            raise TypeError(f"DistOpt wraps one of tandem's optimizers (SGD, Adam, RMSProp, AdaGrad); {type(opt).__name__} "
                            "steps in Python (its apply()), which DistOpt's C++ step cannot call")
        super().__init__(opt.lr, opt.dtype)
        self.opt = opt
        self.lr_value = opt.lr_value  # the wrapped optimizer's, which it keeps up to date in place
        self._held = []  # the wrapped optimizer's parameters, once built
        local_rank = _either(local_rank, gpu_num, "local_rank", "gpu_num")
        world_size = _either(world_size, gpu_per_node, "world_size", "gpu_per_node")
        if nccl_id is not None:
            if local_rank is None or world_size is None:
                raise ValueError("with nccl_id, give this process's local_rank (gpu_num) and the world_size "
                                 "(gpu_per_node)")
            env = nccl_id._enter(local_rank, world_size)
        else:
            env = _tandem.detect_env()
            for given, actual, name in ((local_rank, env.local_rank, "local_rank"),
                                        (world_size, env.world_size, "world_size")):
                if given is not None and int(given) != actual:
                    raise ValueError(f"{name}={given} but the launcher ({env.launcher}) made this process "
                                     f"{name} {actual}; pass nccl_id to start ranks yourself, or leave {name} out")
        if buffSize < 1 or first_bucket_size < 1:
            raise ValueError("buffSize and first_bucket_size are counts of gradients and must be positive")
        if dist_option not in _tandem.sync_method_names():
            raise ValueError(f"unknown dist_option {dist_option!r} (choose {', '.join(_tandem.sync_method_names())})")
        if offload not in ("none", "optimizer", "parameters"):
            raise ValueError(f"offload is 'none', 'optimizer' or 'parameters', not {offload!r}")
        if offload == "parameters":
            # Stage 3's slices on the host: the parameters are sharded (none becomes parameters, as in C++).
            if str(shard).lower().replace("-", "").replace("_", "") not in ("none", "0", "parameters", "3"):
                raise ValueError(f"offload='parameters' keeps shard='parameters' slices on the host: it takes "
                                 f"shard='parameters' (or 'none'), not {shard!r}")
            shard = "parameters"
        self._env = env
        self._options = dict(bucket_bytes=int(buffSize) * 4, first_bucket_bytes=int(first_bucket_size) * 4,
                             method=dist_option, half_dtype=half_dtype, clip=float(clip), spars=float(spars),
                             error_feedback=bool(error_feedback), rank=int(powersgd_rank),
                             skip_nonfinite=bool(skip_nonfinite), shard=str(shard),
                             uneven_inputs=bool(uneven_inputs),
                             master_weights=float32 if master_weights is None else master_weights,
                             release_gradients=bool(release_gradients), offload=str(offload))
        self._timeout = float(timeout)
        # Sharded parameters (ZeRO stage 3): the model's layers become layer groups (see _declare_layer_groups).
        self._stage3 = str(shard).lower().replace("-", "").replace("_", "") in ("parameters", "3")
        self._grouped = []  # (layer, its _tandem.LayerGroup), in forward order
        self._groups_checked = False
        self._comms = {}
        self._staged = {"plain": [], "half": []}  # fused_all_reduce(..., send=False) copies, by kind
        _share_cores(env.local_size)
        if env.launcher == "mpi":
            _abort_job_on_uncaught_error()

    # ---- ranks (the guide's names and the short ones)
    @property
    def local_rank(self):
        return self._env.local_rank

    @property
    def global_rank(self):
        return self._env.rank

    @property
    def world_size(self):
        return self._env.world_size

    rank_in_local = local_rank
    rank_in_global = global_rank

    @property
    def lr(self):
        return self.opt.lr

    @lr.setter
    def lr(self, value):
        self.opt.lr = value

    @property
    def step_counter(self):
        return self.opt.step_counter

    def get_states(self):
        """The wrapped optimizer's step counter (SINGA's Optimizer.get_states), which the learning-rate
        schedule follows; keep it in a checkpoint's aux states (model.save_states holds the rest)."""
        return self.opt.get_states()

    def set_states(self, states):
        """Gives the wrapped optimizer the step counter get_states gave (its learning rate follows)."""
        self.opt.set_states(states)

    def set_param_groups(self, groups):
        """The wrapped optimizer's parameter groups (see Optimizer.set_param_groups), at any time: under
        ``shard`` the slices of the parameters each rank steps are cut again along the new groups, their
        state kept, which is a collective (every rank calls it with the same groups). Under
        ``shard="parameters"`` only before the DistOpt takes the model's parameters (compile)."""
        inner = self.opt
        checked = inner._checked_groups(groups)
        if self._impl is not None and self._stage3:
            raise ValueError("DistOpt(shard='parameters'): set the parameter groups before compile (or before "
                             "set_optimizer on a compiled model); once the parameters are sharded, their slices "
                             "stay cut along the groups they were cut with")
        inner._groups = checked
        if self._impl is not None:
            self._impl.set_param_groups(inner._group_tuples())
            self._forget_recorded_step()
        elif inner._impl is not None:
            inner._apply_groups()

    @property
    def param_groups(self):
        return self.opt.param_groups

    # ---- communication (SINGA's helpers: sums over the ranks). Each is finished when its call returns:
    # the guide's synchronize() divides the tensor right after all_reduce, without wait(), and SINGA's
    # own streams leave that division racing with the collective. On GPUs "finished" means that later
    # work on the device is ordered after the collective (the host does not wait for it); on CPUs the
    # sum is there when the call returns.
    def communicator(self, dev):
        """The job's communicator for tensors on ``dev`` (joined on first use; every rank must ask
        for the same kinds of device in the same order)."""
        key = (dev.type, dev.index if dev.is_cuda() else 0)
        if key not in self._comms:
            self._comms[key] = _tandem.init_communicator(dev, self._timeout)
        return self._comms[key]

    def all_reduce(self, tensor):
        """Sums ``tensor`` over the ranks, in place; what runs after the call sees the sum."""
        self.communicator(tensor.device).all_reduce(tensor).wait()

    def all_reduce_half(self, tensor):
        """As all_reduce with the values sent and summed in float16 (the tensor is float32)."""
        _check_f32(tensor, "all_reduce_half")
        half = tensor.as_type(float16)
        self.communicator(tensor.device).all_reduce(half).wait()
        tensor.copy_(half)

    def fused_all_reduce(self, tensor, send=True):
        """SINGA's fused all-reduce of a list of tensors. ``send=False`` copies their values into the
        fusion buffer; ``send=True`` sums the buffer over the ranks (or, with nothing copied in, the
        tensors given) and writes the sums into the tensors given, in order."""
        self._fused(_tensor_list(tensor, "fused_all_reduce"), send, "plain")

    def fused_all_reduce_half(self, tensor, send=True):
        """As fused_all_reduce with the fused values sent and summed in float16 (the tensors are float32)."""
        tensors = _tensor_list(tensor, "fused_all_reduce_half")
        for t in tensors:
            _check_f32(t, "fused_all_reduce_half")
        self._fused(tensors, send, "half")

    def _fused(self, tensors, send, kind):
        if not send:
            self._staged[kind].append(_flat_copy(tensors))
            return
        staged, self._staged[kind] = self._staged[kind], []
        buf = _flat_copy(tensors) if not staged else staged[0] if len(staged) == 1 else _flat_copy(staged)
        total = sum(t.numel() for t in tensors)
        if buf.numel() != total:
            raise ValueError(f"{'fused_all_reduce' if kind == 'plain' else 'fused_all_reduce_half'}: the fusion buffer "
                             f"holds {buf.numel()} values (from the calls with send=False) but the tensors given "
                             f"hold {total}")
        wire = buf.as_type(float16) if kind == "half" else buf
        self.communicator(buf.device).all_reduce(wire).wait()
        _scatter(wire, tensors)

    def sparsification(self, tensor, accumulation, spars, topK):
        """SINGA's sparsified all-reduce of one float32 tensor, in place: the sum over the ranks of
        each rank's selection from tensor (+ accumulation): with ``topK`` the ceil(spars * n) values of
        largest magnitude, else those with |x| >= spars. ``accumulation`` (a float32 tensor of as many
        elements, or None) keeps what this rank did not send, for the next call."""
        _tandem.sparse_all_reduce(self.communicator(tensor.device), tensor, accumulation, float(spars), bool(topK))

    def fused_sparsification(self, tensor, accumulation, spars, topK):
        """As sparsification over a list of tensors fused into one buffer (one selection across all of
        them); ``accumulation`` holds as many elements as the tensors together."""
        tensors = _tensor_list(tensor, "fused_sparsification")
        buf = _flat_copy(tensors)
        _tandem.sparse_all_reduce(self.communicator(buf.device), buf, accumulation, float(spars), bool(topK))
        _scatter(buf, tensors)

    def wait(self):
        """SINGA's end of the collectives above; tandem's are finished when their calls return, so
        there is nothing left to wait for."""

    # ---- the C++ DistOpt
    def _build(self, module):
        self.opt._build(module)
        self._module = module
        if self._stage3:
            self._declare_layer_groups(module)
        comm = self.communicator(module.parameters()[0].device)
        self._impl = _tandem.DistOpt(self.opt._impl, comm, **self._options)
        self._held = self.opt._impl.params()
        self._impl.sync_parameters(module)

    # ---- sharded parameters (ZeRO stage 3): the model's layers as layer groups
    def _declare_layer_groups(self, module):
        """Makes every sublayer of the model that holds trained parameters a layer group (C++
        nn::LayerGroup), in the order the model's first forward (compile's) first called them, those it did
        not call after them in the order the model registered them; the model's module lists them for the C++
        DistOpt, which shards the parameters along them. A call of such a layer then runs as its group's
        forward (layer.py). Refused: a model's own trained parameters (used by its forward outside any
        layer), a model sharded by another DistOpt."""
        model = self._model
        if model is None:
            raise ValueError("DistOpt(shard='parameters') shards a Model's parameters by its layers: give it the model "
                             "(model.set_optimizer(opt), then compile, or compile after it); the graph of a loss does "
                             "not say which layer uses which parameter")
        other = model.__dict__.get("_sharded_by")
        if other is not None and other() is not None and other() is not self:
            raise ValueError("DistOpt(shard='parameters'): the model's parameters are sharded by another DistOpt "
                             "already (a model is trained by one DistOpt of sharded parameters; build the model "
                             "anew)")
        trained = {p._impl_id: p for p in self.opt._impl.params()}
        names = {t._impl_id: n for n, t in module.named_parameters()}
        candidates = []
        for name, layer in model._layers.items():
            params, ids = [], set()
            for p in layer._module().parameters():
                if p._impl_id in trained and p._impl_id not in ids:
                    ids.add(p._impl_id)
                    params.append(trained[p._impl_id])
            if params:
                candidates.append((name, layer, params))
        first_calls = model.__dict__.get("_first_calls") or []
        position = {}
        for i, layer in enumerate(first_calls):
            position.setdefault(id(layer), i)
        candidates.sort(key=lambda c: position.get(id(c[1]), len(first_calls)))  # stable: the others keep their order
        covered = {p._impl_id for _, _, params in candidates for p in params}
        loose = [names.get(i, "?") for i in trained if i not in covered]
        if loose:  # the model's own (registered on it, or tensors it holds as attributes): read by its forward itself
            raise ValueError(f"DistOpt(shard='parameters'): parameter(s) {', '.join(loose)} belong to the model "
                             "itself, not to one of its layers; parameters are gathered by layer (each sublayer of "
                             "the model holding parameters is a layer group, whole only while it is called), so move "
                             "them into a Layer the model calls, or freeze them (requires_grad=False)")
        for layer in _all_layers(model):
            layer.__dict__.pop("_layer_group", None)
            layer.__dict__.pop("_in_groups", None)
        groups = []
        self._grouped = []
        for name, layer, params in candidates:
            group = _tandem.LayerGroup(name, params)
            layer.__dict__["_layer_group"] = group
            layer.__dict__["_group_calls"] = 0
            for inner in _all_layers(layer)[1:]:
                inner.__dict__["_in_groups"] = inner.__dict__.get("_in_groups", ()) + (group,)
            groups.append(group)
            self._grouped.append((layer, group))
        module.set_layer_groups(groups)
        model.__dict__["_sharded_by"] = weakref.ref(self)

    def _check_groups_ran(self, loss):
        """At the first step: every parameter the loss reached belongs to a layer that was called (as its
        group's forward); one that was read without calling its layer held no values."""
        reached = {t._impl_id for t in _tandem.graph_leaves(loss)}
        called = [layer.__dict__.get("_group_calls", 0) > 0 for layer, _ in self._grouped]
        names = {t._impl_id: n for n, t in self._module.named_parameters()}
        for k, (layer, group) in enumerate(self._grouped):
            if called[k]:
                continue
            for p in group.params:
                i = p._impl_id
                if i in reached and not any(called[j] for j, (_, g) in enumerate(self._grouped)
                                            if any(q._impl_id == i for q in g.params)):
                    raise ValueError(f"DistOpt(shard='parameters'): the loss depends on parameter "
                                     f"{names.get(i, '?')} of layer '{group.name}', which was not called: its "
                                     "parameters are gathered only while it is called (layer(x)), and were read "
                                     "without that (the model's forward must call each layer whose parameters it "
                                     "uses, and a layer must hold, as attributes or sublayers, the parameters its "
                                     "forward reads)")

    def _ensure(self, loss):
        fresh = self._impl is None  # built now: this step's forward ran before the layers were groups
        super()._ensure(loss)
        if self._stage3 and not fresh and not self._groups_checked:
            self._groups_checked = True
            self._check_groups_ran(loss)
        # The ranks' buckets hold the parameters DistOpt took: one frozen since would still be stepped with a
        # zero gradient (its momentum, weight decay and Adam's moments moving it).
        for i, p in enumerate(self._held):
            if not p.requires_grad:
                names = {t._impl_id: n for n, t in self._module.named_parameters()}
                name = names.get(p._impl_id, f"parameter {i}")
                raise ValueError(f"DistOpt: {name} was frozen (requires_grad=False) after DistOpt took the model's "
                                 "parameters, and its buckets would still step it: freeze parameters before "
                                 "compile (or before set_optimizer on a compiled model)")

    def _gather_state(self):
        if self._impl is not None:
            self._impl.gather_optimizer_state()  # under shard: collective (sharded parameters: whole too)

    def _release_state(self):
        if self._impl is not None:
            self._impl.release_optimizer_state()
            self._impl.release_parameters(False)  # sharded parameters: the whole copies gathered for the checkpoint

    @contextlib.contextmanager
    def _loading(self):
        # Sharded parameters are whole while the checkpoint is written into them; then each rank keeps its pieces.
        impl = self._impl
        if impl is None:
            yield
            return
        impl.gather_parameters()
        try:
            yield
        except BaseException:
            impl.release_parameters(False)
            raise
        impl.release_parameters(True)

    def _after_load(self):
        # A checkpoint restores the wrapped optimizer's groups: under shard the slices are cut along them now
        # (if they changed), not in the middle of the next step.
        if self._impl is not None:
            self._impl.set_param_groups(_tandem.param_groups(self.opt._impl))

    def _cpp_optimizer(self):
        if self._impl is None and self._model is not None:
            self._build(self._model._module())
        return self.opt._impl

    def _run(self, name, loss, *args):
        """A whole step of the C++ DistOpt, at the learning rate the schedule gives it, then counted."""
        self._ensure(loss)
        self.opt._refresh_lr()
        getattr(self._impl, name)(loss, *args)
        self.opt._count_step()

    # ---- a step of the configured dist_option, whole or split around the synchronisation
    def __call__(self, loss):
        self.step(loss)

    def step(self, loss):
        """backward_and_sync, then update."""
        self._run("step", loss)

    def backward_and_sync(self, loss):
        """Backward with the gradients averaged across ranks (``p.grad`` then holds the average);
        ``update()`` applies them. Between the two, user code may inspect or change the gradients.
        A loss that reaches none of the parameters raises ValueError."""
        self._ensure(loss)
        self._impl.backward_and_sync(loss)

    def clip_grad_norm(self, max_norm):
        """Scales the averaged gradients to a global L2 norm of at most ``max_norm`` (between
        backward_and_sync and update); returns the norm before, the same on every rank."""
        return self._require_impl().clip_grad_norm(float(max_norm))

    def update(self, param=None, grad=None):
        """Without arguments: applies the gradients of the last backward_and_sync; False, on every
        rank, when the step was skipped (skip_nonfinite); ValueError without a backward_and_sync since
        the last update. With them (SINGA's): divides ``grad``, this rank's sum, by the world size in
        place and applies it to ``param`` with the wrapped optimizer."""
        if param is None and grad is None:
            impl = self._require_impl()
            self.opt._refresh_lr()
            applied = impl.update()
            self.opt._count_step()
            return applied
        if param is None or grad is None:
            raise TypeError("update(param, grad) takes both, or neither (to apply the synchronised gradients)")
        grad /= self.world_size
        self.opt.update(param, grad)
        return True

    def join(self, clip_norm=0.0):
        """With ``uneven_inputs``: this rank has no batch left. Takes part, with zero gradients, in the
        other ranks' steps (and their update, at the learning rate each step has) until every rank has
        called join(); their averages are over the ranks that still had data. ``clip_norm``: what the
        others pass to clip_grad_norm each step. Returns how many steps it took part in."""
        impl = self._require_impl()
        steps = 0
        while impl.join_step(float(clip_norm)):
            self.opt._refresh_lr()
            impl.update()
            self.opt._count_step()
            steps += 1
        return steps

    def memory_report(self):
        """Bytes this rank keeps: parameters, gradients, optimizer_state, master_weights, total."""
        return self._require_impl().memory_report()

    def no_sync(self):
        """``with sgd.no_sync():`` backward_and_sync only accumulates this rank's gradients; the next
        backward_and_sync outside averages the sum once (gradient accumulation)."""
        return self._require_impl().no_sync()

    def convert_sync_batch_norm(self, model):
        """Makes the model's BatchNorm2d layers take their training statistics over every rank (the
        model must have run once, e.g. compile); returns how many layers there are."""
        module = model._module()
        if not module.parameters():
            raise RuntimeError("the model has no parameters yet: compile it first")
        return _tandem.convert_sync_batch_norm(module, self.communicator(module.parameters()[0].device))

    # ---- the guide's steps. SINGA's `threshold` is its fusion size (in values), which tandem's buckets
    # (buffSize) replace: it is accepted and changes nothing.
    def backward_and_update(self, loss, threshold=_SINGA_THRESHOLD):
        """Backward with gradients averaged in buckets as they become ready, then the update."""
        self._run("backward_and_update", loss)

    def backward_and_update_half(self, loss, threshold=_SINGA_THRESHOLD, clipping=False, clip_Value=100):
        """As backward_and_update with gradients sent in 16 bits; with ``clipping``, each gradient
        value is first clipped into [-clip_Value, clip_Value]."""
        self._run("backward_and_update_half", loss, bool(clipping), float(clip_Value))

    def backward_and_partial_update(self, loss, threshold=_SINGA_THRESHOLD):
        """A local update, then one chunk of the parameters averaged across ranks (round robin)."""
        self._run("backward_and_partial_update", loss)

    def backward_and_sparse_update(self, loss, threshold=_SINGA_THRESHOLD, spars=0.05, topK=False, corr=True):
        """Sends only part of the gradients: with ``topK`` the fraction ``spars`` of largest
        magnitudes (per bucket), else those with |g| >= spars; with ``corr`` what was not sent is kept
        for the next step."""
        self._run("backward_and_sparse_update", loss, float(spars), bool(topK), bool(corr))

    # ---- between steps
    def sync_parameters(self):
        """Checks that every rank has the same model, then copies rank 0's parameters and buffers."""
        self._require_impl().sync_parameters(self._module)

    def average_parameters(self):
        """Averages parameters and buffers across ranks (after partial updates, before evaluating)."""
        self._require_impl().average_parameters()

    def average_buffers(self):
        """Averages buffers (batch-norm running statistics) across ranks."""
        self._require_impl().average_buffers()

    def check_consistency(self, include_buffers=True):
        """Raises, naming the first tensor that differs, unless all ranks hold identical values."""
        self._require_impl().check_consistency(include_buffers)

    @property
    def stats(self):
        """Communication counters of this rank (bytes, collectives, time spent waiting)."""
        return self._require_impl().stats

    def reset_stats(self):
        self._require_impl().reset_stats()

    def bucket_layout(self):
        """The gradient buckets in launch order: offset, numel, span (with the padding to whole blocks per
        rank when sharded), parameter indices and their offsets."""
        return self._require_impl().bucket_layout()

    def residual_norms(self):
        """Per parameter, the L2 norm of the error-feedback residual (sparse modes, powerSGD)."""
        return self._require_impl().residual_norms()

    def _require_impl(self):
        if self._impl is None:
            raise RuntimeError("DistOpt has no parameters yet: compile the model after set_optimizer, or step once")
        return self._impl


def _all_layers(layer):
    """The layer and every layer inside it, each once, the layer first."""
    out, seen, todo = [], set(), [layer]
    while todo:
        l = todo.pop(0)
        if id(l) in seen:
            continue
        seen.add(id(l))
        out.append(l)
        todo.extend(l._layers.values())
    return out


def _either(value, alias, name, alias_name):
    if alias is not None and value is not None and int(alias) != int(value):
        raise ValueError(f"{name}={value} and {alias_name}={alias} disagree")
    v = value if value is not None else alias
    return None if v is None else int(v)


def _tensor_list(tensors, what):
    ts = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
    if not ts or not all(isinstance(t, _tandem.Tensor) for t in ts):
        raise TypeError(f"{what} takes a non-empty list of tensors")
    return ts


def _check_f32(t, what):
    if t.dtype != float32:
        raise ValueError(f"{what} sends float32 tensors as float16; got {t}")


def _flat_copy(tensors):
    """A new 1-D tensor holding the tensors' values one after another (a copy even of one tensor:
    joining one tensor, and reshaping a contiguous one, give views of it)."""
    with _tandem.no_grad():
        flat = [_tandem.reshape(t.detach(), [t.numel()]) for t in tensors]
        return flat[0].clone() if len(flat) == 1 else _tandem.cat(flat, 0)


def _scatter(buf, tensors):
    """Copies consecutive slices of the 1-D ``buf`` into the tensors."""
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(buf.narrow(0, offset, n))
        offset += n


__all__ = ["Optimizer", "SGD", "Adam", "RMSProp", "AdaGrad", "DistOpt", "DecayScheduler", "Constant",
           "ExponentialDecay", "WarmupCosineDecay", "decay_groups"]
