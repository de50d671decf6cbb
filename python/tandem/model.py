"""Models (SINGA's ``singa.model``): subclass ``Model``, define ``forward(x)`` and
``train_one_batch(x, y, ...)``; calling the model trains on a batch in training mode and runs
``forward`` in evaluation mode."""
import json

from . import _tandem
from .layer import Layer


class Model(Layer):
    def __init__(self):
        super().__init__()
        self.optimizer = None
        self.graph_mode = False
        self.sequential = False

    def set_optimizer(self, optimizer):
        """The optimizer train_one_batch steps (self.optimizer); it takes this model's parameters."""
        self.optimizer = optimizer
        optimizer._use_model(self)

    def compile(self, inputs, is_train=True, use_graph=False, sequential=False):
        """Creates every parameter by running forward once on ``inputs`` (placeholder tensors of the
        batch's shape, on the training device), then sets training or evaluation mode. The optimizer
        set before takes the parameters now (DistOpt: all ranks start from rank 0's values).

        ``use_graph`` and ``sequential`` are accepted for SINGA scripts; tandem runs eagerly.
        """
        self.graph_mode = bool(use_graph)
        self.sequential = bool(sequential)
        self.eval()
        with _tandem.no_grad():
            self.forward(*inputs)
        self._initialized = True
        self.train(is_train)
        if self.optimizer is not None:
            self.optimizer._use_model(self)

    def __call__(self, *args, **kwargs):
        self._initialized = True
        if self.training:
            return self.train_one_batch(*args, **kwargs)
        return self.forward(*args, **kwargs)

    def train_one_batch(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define train_one_batch() to be called in training mode")

    def save_states(self, fpath, aux_states=None):
        """Writes parameters, buffers, the optimizer's state and ``aux_states`` (a JSON-able dict)
        to one file, atomically."""
        opt = self.optimizer._cpp_optimizer() if self.optimizer is not None else None
        _tandem.save_checkpoint(str(fpath), self._module(), opt, json.dumps(aux_states or {}))

    def load_states(self, fpath):
        """Loads what save_states wrote (the model must be compiled); returns the aux_states dict."""
        opt = self.optimizer._cpp_optimizer() if self.optimizer is not None else None
        return json.loads(_tandem.load_checkpoint(str(fpath), self._module(), opt))
