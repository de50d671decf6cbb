"""What every example model shares: a softmax cross-entropy loss and one training step per call, whose
gradient exchange is chosen by the distributed option (train_mpi.py's -d)."""
from tandem import layer, model

# The step each -d option takes with a DistOpt; a plain optimizer knows only "plain".
DIST_OPTIONS = ("plain", "half", "partialUpdate", "sparseTopK", "sparseThreshold")


def take_step(optimizer, loss, dist_option="plain", spars=None):
    """Back-propagates from loss and updates the parameters the way dist_option names."""
    if dist_option == "plain":
        optimizer(loss)
    elif dist_option == "half":
        optimizer.backward_and_update_half(loss)
    elif dist_option == "partialUpdate":
        optimizer.backward_and_partial_update(loss)
    elif dist_option in ("sparseTopK", "sparseThreshold"):
        optimizer.backward_and_sparse_update(loss, topK=dist_option == "sparseTopK", spars=spars)
    else:
        raise ValueError(f"unknown dist_option {dist_option!r}; choose one of {', '.join(DIST_OPTIONS)}")


class Classifier(model.Model):
    """A model that maps images (dimension 4) or flat vectors (dimension 2) to class scores.

    Subclasses set ``input_size`` (the image side the trainer resizes to) and ``dimension``, and
    define ``forward``."""

    input_size = 28
    dimension = 4

    def __init__(self, num_classes=10):
        super().__init__()
        self.num_classes = num_classes
        self.loss_fn = layer.SoftMaxCrossEntropy()

    def train_one_batch(self, x, y, dist_option="plain", spars=None):
        scores = self.forward(x)
        loss = self.loss_fn(scores, y)
        take_step(self.optimizer, loss, dist_option, spars)
        return scores, loss
