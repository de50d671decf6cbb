"""Optimizers (SINGA's ``singa.opt``): SGD, Adam, and DistOpt, which averages gradients across the
ranks of a job while backward runs.

An optimizer learns its parameters from the model it is given (``model.set_optimizer``), or else
from the graph of the first loss it steps on.
"""
from . import _tandem
from .device import _share_cores
from .distributed import _abort_job_on_uncaught_error
from .tensor import float16, float32


class Optimizer:
    """Base: holds the hyper-parameters until the parameters are known, then a C++ optimizer."""

    def __init__(self, lr, dtype=float32):
        if dtype != float32:
            raise ValueError("optimizer state is kept in float32; pass dtype=tensor.float32")
        self._lr = float(lr)
        self._model = None
        self._module = None  # the C++ module listing the parameters
        self._impl = None

    # ---- parameters
    def _use_model(self, model):
        self._model = model
        if model._initialized and self._impl is None and model.get_params():
            self._build(model._module())

    def _ensure(self, loss):
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

    def _build(self, module):
        self._module = module
        self._impl = self._create(module.parameters())

    def _create(self, params):
        raise NotImplementedError

    def _cpp_optimizer(self):
        if self._impl is None and self._model is not None:
            self._build(self._model._module())
        return self._impl

    # ---- hyper-parameters
    @property
    def lr(self):
        return self._lr

    @lr.setter
    def lr(self, value):
        self._lr = float(value)
        if self._impl is not None:
            self._impl.lr = self._lr

    # ---- steps
    def __call__(self, loss):
        self.backward_and_update(loss)

    def backward_and_update(self, loss):
        """Back-propagates from loss and applies the gradients."""
        self._ensure(loss)
        _tandem.backward(loss)
        self.step()

    def step(self):
        """Applies the accumulated gradients, then clears them."""
        if self._impl is None:
            raise RuntimeError("the optimizer has no parameters yet: call it on a loss or use model.set_optimizer")
        self._impl.step()
        self._impl.zero_grad(True)


class SGD(Optimizer):
    """SGD with momentum, dampening, weight decay and Nesterov momentum."""

    def __init__(self, lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, dtype=float32):
        super().__init__(lr, dtype)
        self.momentum = float(momentum)
        self.dampening = float(dampening)
        self.weight_decay = float(weight_decay)
        self.nesterov = bool(nesterov)

    def _create(self, params):
        return _tandem.SGD(params, self._lr, self.momentum, self.dampening, self.weight_decay, self.nesterov)


class Adam(Optimizer):
    """Adam with bias correction (``decoupled=True``: AdamW)."""

    def __init__(self, lr=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-8, weight_decay=0.0, decoupled=False,
                 dtype=float32):
        super().__init__(lr, dtype)
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)
        self.weight_decay = float(weight_decay)
        self.decoupled = bool(decoupled)

    def _create(self, params):
        return _tandem.Adam(params, self._lr, self.beta_1, self.beta_2, self.epsilon, self.weight_decay,
                            self.decoupled)


class DistOpt(Optimizer):
    """The distributed optimizer: wraps ``opt`` and averages gradients across the job's ranks.

    The ranks come from the launcher (``tandem launch``, ``mpiexec``, torchrun) or, for processes
    started by ``multiprocessing``, from ``nccl_id`` (a :class:`tandem.NcclIdHolder` made by the
    parent) with ``local_rank`` and ``world_size`` (the guide's ``gpu_num`` and ``gpu_per_node``).
    Without any, it is a one-rank DistOpt. GPU tensors travel over NCCL, CPU tensors over Gloo.

    Calling it on a loss runs a step of ``dist_option`` (plain: ``backward_and_update``; also half,
    partialUpdate, sparseTopK, sparseThreshold, powerSGD, with ``spars``, ``clip``,
    ``error_feedback`` and ``powersgd_rank``); the guide's ``backward_and_*`` calls pick their own.
    ``buffSize`` is the number of float32 gradients per all-reduce bucket; ``skip_nonfinite`` makes
    ``update`` skip, on every rank, a step whose averaged gradients hold inf or NaN; ``timeout``
    (seconds) bounds joining the job and each collective.
    """

    def __init__(self, opt=None, nccl_id=None, local_rank=None, world_size=None, buffSize=4194304, *,
                 gpu_num=None, gpu_per_node=None, dist_option="plain", spars=0.05, clip=0.0, error_feedback=True,
                 powersgd_rank=2, half_dtype=float16, first_bucket_size=262144, skip_nonfinite=False,
                 timeout=300.0):
        opt = opt if opt is not None else SGD()
        if not isinstance(opt, Optimizer) or isinstance(opt, DistOpt):
            raise TypeError("DistOpt wraps an SGD or Adam optimizer")
        super().__init__(opt.lr)
        self.opt = opt
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
        self._env = env
        self._options = dict(bucket_bytes=int(buffSize) * 4, first_bucket_bytes=int(first_bucket_size) * 4,
                             method=dist_option, half_dtype=half_dtype, clip=float(clip), spars=float(spars),
                             error_feedback=bool(error_feedback), rank=int(powersgd_rank),
                             skip_nonfinite=bool(skip_nonfinite))
        self._timeout = float(timeout)
        self._comms = {}
        self._pending = []
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

    # ---- communication
    def communicator(self, dev):
        """The job's communicator for tensors on ``dev`` (joined on first use; every rank must ask
        for the same kinds of device in the same order)."""
        key = (dev.type, dev.index if dev.is_cuda() else 0)
        if key not in self._comms:
            self._comms[key] = _tandem.init_communicator(dev, self._timeout)
        return self._comms[key]

    def all_reduce(self, t):
        """Starts summing ``t`` over the ranks, in place; ``wait()`` finishes it."""
        self._pending.append(self.communicator(t.device).all_reduce(t))

    def wait(self):
        """Waits for every all_reduce started since the last wait."""
        pending, self._pending = self._pending, []
        for w in pending:
            w.wait()

    def _build(self, module):
        self.opt._build(module)
        self._module = module
        comm = self.communicator(module.parameters()[0].device)
        self._impl = _tandem.DistOpt(self.opt._impl, comm, **self._options)
        self._impl.sync_parameters(module)

    def _cpp_optimizer(self):
        if self._impl is None and self._model is not None:
            self._build(self._model._module())
        return self.opt._impl

    # ---- a step of the configured dist_option, whole or split around the synchronisation
    def __call__(self, loss):
        self.step(loss)

    def step(self, loss):
        """backward_and_sync, then update."""
        self._ensure(loss)
        self._impl.step(loss)

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

    def update(self):
        """Applies the gradients; False, on every rank, when the step was skipped (skip_nonfinite).
        ValueError without a backward_and_sync since the last update."""
        return self._require_impl().update()

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

    # ---- the guide's steps
    def backward_and_update(self, loss, threshold=None):
        """Backward with gradients averaged in buckets as they become ready, then the update.
        (``threshold`` is SINGA's fusion size, which the buckets replace.)"""
        self._ensure(loss)
        self._impl.backward_and_update(loss)

    def backward_and_update_half(self, loss, clipping=False, clip_Value=100, threshold=None):
        """As backward_and_update with gradients sent in 16 bits; with ``clipping``, each gradient
        value is first clipped into [-clip_Value, clip_Value]."""
        self._ensure(loss)
        self._impl.backward_and_update_half(loss, bool(clipping), float(clip_Value))

    def backward_and_partial_update(self, loss, threshold=None):
        """A local update, then one chunk of the parameters averaged across ranks (round robin)."""
        self._ensure(loss)
        self._impl.backward_and_partial_update(loss)

    def backward_and_sparse_update(self, loss, spars=0.05, topK=True, corr=True, threshold=None):
        """Sends only part of the gradients: with ``topK`` the fraction ``spars`` of largest
        magnitudes, else those with |g| >= spars; with ``corr`` what was not sent is kept for the
        next step."""
        self._ensure(loss)
        self._impl.backward_and_sparse_update(loss, float(spars), bool(topK), bool(corr))

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
        """The gradient buckets in launch order: offset, numel, parameter indices and their offsets."""
        return self._require_impl().bucket_layout()

    def residual_norms(self):
        """Per parameter, the L2 norm of the error-feedback residual (sparse modes, powerSGD)."""
        return self._require_impl().residual_norms()

    def _require_impl(self):
        if self._impl is None:
            raise RuntimeError("DistOpt has no parameters yet: compile the model after set_optimizer, or step once")
        return self._impl


def _either(value, alias, name, alias_name):
    if alias is not None and value is not None and int(alias) != int(value):
        raise ValueError(f"{name}={value} and {alias_name}={alias} disagree")
    v = value if value is not None else alias
    return None if v is None else int(v)


__all__ = ["Optimizer", "SGD", "Adam", "DistOpt"]
