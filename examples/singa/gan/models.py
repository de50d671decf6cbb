"""Multilayer-perceptron GANs written as SINGA's GAN examples write theirs: one model.Model holding the
generator's and the discriminator's layers, told apart by their names ("gen_net..." / "dis_net..."), so
that each training step walks autograd.backward over its loss and hands the optimizer (optimizer.apply)
only the parameters of its own side.

kind "vanilla": a sigmoid discriminator and binary cross-entropy (real 1, fake 0; the generator aims at
1). kind "lsgan": a linear discriminator and the mean squared error (real 1, fake -1; the generator aims
at 0), the least-squares GAN."""
from tandem import autograd, layer, model

KINDS = ("vanilla", "lsgan")


class MLPGAN(model.Model):

    def __init__(self, kind="vanilla", noise_size=32, feature_size=784, hidden_size=64):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        self.kind = kind
        self.noise_size, self.feature_size, self.hidden_size = noise_size, feature_size, hidden_size
        # generator: noise -> hidden -> an image of values in (0, 1)
        self.gen_net_hidden = layer.Linear(hidden_size)
        self.gen_net_relu = layer.ReLU()
        self.gen_net_pixels = layer.Linear(feature_size)
        self.gen_net_sigmoid = layer.Sigmoid()
        # discriminator: image -> hidden -> one score (a probability for the vanilla GAN)
        self.dis_net_hidden = layer.Linear(hidden_size)
        self.dis_net_relu = layer.ReLU()
        self.dis_net_score = layer.Linear(1)
        if kind == "vanilla":
            self.dis_net_sigmoid = layer.Sigmoid()
            self.criterion = layer.BinaryCrossEntropy()
        else:
            self.criterion = layer.MeanSquareError()

    def forward_gen(self, noise):
        return self.gen_net_sigmoid(self.gen_net_pixels(self.gen_net_relu(self.gen_net_hidden(noise))))

    def forward_dis(self, images):
        y = self.dis_net_score(self.dis_net_relu(self.dis_net_hidden(images)))
        return self.dis_net_sigmoid(y) if self.kind == "vanilla" else y

    def forward(self, noise):
        return self.forward_dis(self.forward_gen(noise))

    def _update(self, loss, side):
        """Applies the gradients of the parameters whose names hold `side`; the others stay as they are."""
        for p, g in autograd.backward(loss):
            if side in p.name:
                self.optimizer.apply(p.name, p, g)

    def train_one_batch(self, noise, targets):
        """A generator step: the discriminator's verdict on generated images against `targets`."""
        out = self.forward(noise)
        loss = self.criterion(out, targets)
        self._update(loss, "gen_net")
        return out, loss

    def train_one_batch_dis(self, images, targets):
        """A discriminator step on a batch of real or generated images."""
        out = self.forward_dis(images)
        loss = self.criterion(out, targets)
        self._update(loss, "dis_net")
        return out, loss

    def set_optimizer(self, optimizer):
        self.optimizer = optimizer
