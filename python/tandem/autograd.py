"""Autograd and numerics: graphs are recorded as operations run, ``backward`` fills the leaves'
gradients; ``with precision("bf16"):`` runs GPU convolutions and products at that precision."""
from . import _tandem

backward = _tandem.backward
no_grad = _tandem.no_grad
grad_enabled = _tandem.grad_enabled
graph_leaves = _tandem.graph_leaves
precision = _tandem.precision
Precision = _tandem.Precision
current_precision = _tandem.current_precision
default_precision = _tandem.default_precision
set_deterministic_algorithms = _tandem.set_deterministic_algorithms
deterministic_algorithms = _tandem.deterministic_algorithms
