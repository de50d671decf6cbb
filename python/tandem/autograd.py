"""Autograd: graphs are recorded as operations run; ``backward`` fills the leaves' gradients."""
from . import _tandem

backward = _tandem.backward
no_grad = _tandem.no_grad
grad_enabled = _tandem.grad_enabled
graph_leaves = _tandem.graph_leaves
