"""An encoder-decoder Transformer written as SINGA's transformer example writes its model: layer.Layer
subclasses whose parameters are tensors they create in initialize (``self.W = Tensor(...,
stores_grad=True)``), held in Python lists as well as in attributes, layer.Embedding tables (the positions'
taken from a sinusoid table by from_pretrained, frozen), attention and normalisation composed from
autograd functions, and masks computed in NumPy from the token indices."""
import math

import numpy as np

from tandem import autograd, layer, model, tensor
from tandem.tensor import Tensor


def sinusoid_table(positions, width):
    """Row p: sin(p / 10000^(2i / width)) in the even columns 2i, cos in the odd ones."""
    p = np.arange(positions, dtype=np.float64)[:, None]
    i = np.arange(width)[None, :]
    angle = p / np.power(10000.0, 2 * (i // 2) / width)
    table = np.where(i % 2 == 0, np.sin(angle), np.cos(angle)).astype(np.float32)
    return Tensor(data=table, requires_grad=False)


def key_padding_mask(queries, keys):
    """[B, Tq, Tk] True where the key is <pad> (index 0), from the index tensors [B, Tq] and [B, Tk]."""
    k = tensor.to_numpy(keys) == 0
    return np.broadcast_to(k[:, None, :], (queries.shape[0], queries.shape[1], keys.shape[1]))


class Projection(layer.Layer):
    """x W (+ b) over the last dimension of a 2-d or 3-d x; W [in, out] is drawn from N(0, 2 / (in +
    out)) at the first call, b starts at zeros."""

    def __init__(self, out_features, bias=True):
        super().__init__()
        self.out_features = out_features
        self.bias = bias

    def initialize(self, x):
        fan_in = x.shape[-1]
        self.W = Tensor(shape=(fan_in, self.out_features), device=x.device, dtype=x.dtype, requires_grad=True,
                        stores_grad=True)
        self.W.gaussian(0.0, math.sqrt(2.0 / (fan_in + self.out_features)))
        self.b = None
        if self.bias:
            self.b = Tensor(shape=(self.out_features,), device=x.device, dtype=x.dtype, requires_grad=True,
                            stores_grad=True)
            self.b.set_value(0.0)

    def forward(self, x):
        self.device_check(x, self.W)
        self.dtype_check(x, self.W)
        y = autograd.matmul(x, self.W)
        return autograd.add(y, self.b) if self.b else y


class TokenScores(Projection):
    """The decoder's scores per target token, computed one sequence at a time (x[i], squeeze, a 2-d
    product and add_bias, unsqueeze, cat), as SINGA's example computes its 3-d products."""

    def forward(self, x):
        self.device_check(x, self.W)
        rows = []
        for i in range(x.shape[0]):
            y = autograd.matmul(autograd.squeeze(x[i], axis=[0]), self.W)
            if self.b:
                y = autograd.add_bias(y, self.b, axis=0)
            rows.append(autograd.unsqueeze(y, axis=[0]))
        return autograd.cat(rows, axis=0)


class LayerNorm(layer.Layer):
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last dimension, from autograd's reductions
    (the gradient goes through the mean and the variance); gamma and beta are trained."""

    def __init__(self, n_features, eps=1e-6):
        super().__init__()
        self.n_features = n_features
        self.eps = eps

    def initialize(self, x):
        self.gamma = Tensor(shape=(self.n_features,), device=x.device, requires_grad=True, stores_grad=True)
        self.beta = Tensor(shape=(self.n_features,), device=x.device, requires_grad=True, stores_grad=True)
        self.gamma.set_value(1.0)
        self.beta.set_value(0.0)
        self.eps_t = Tensor(shape=(1,), device=x.device, requires_grad=False)
        self.eps_t.set_value(self.eps)

    def forward(self, x):
        centred = autograd.sub(x, autograd.reduce_mean(x, axes=[-1], keepdims=1))
        var = autograd.reduce_mean(autograd.mul(centred, centred), axes=[-1], keepdims=1)
        normed = autograd.div(centred, autograd.sqrt(autograd.add(var, self.eps_t)))
        return autograd.add(autograd.mul(self.gamma, normed), self.beta)


class Attention(layer.Layer):
    """Multi-head attention with a residual connection and LayerNorm: softmax(Q K^T / sqrt(d_k)) V with
    the masked scores set to -1e9 by autograd.where."""

    def __init__(self, d_model, n_head):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model ({d_model}) must be a multiple of n_head ({n_head})")
        self.d_model, self.n_head, self.d_k = d_model, n_head, d_model // n_head
        self.q, self.k, self.v = Projection(d_model, bias=False), Projection(d_model, bias=False), \
            Projection(d_model, bias=False)
        self.out = Projection(d_model)
        self.residual = layer.Add()
        self.norm = LayerNorm(d_model)

    def heads(self, t, batch):
        """[B, T, D] -> [B, H, T, d_k]."""
        return autograd.transpose(autograd.reshape(t, [batch, -1, self.n_head, self.d_k]), [0, 2, 1, 3])

    def forward(self, query, key, value, mask):
        b = query.shape[0]
        q, k, v = self.heads(self.q(query), b), self.heads(self.k(key), b), self.heads(self.v(value), b)
        scores = autograd.matmul(q, autograd.transpose(k, [0, 1, 3, 2]))
        root = Tensor(shape=(1,), device=query.device, requires_grad=False)
        root.set_value(math.sqrt(self.d_k))
        scores = autograd.div(scores, root)
        masked = np.broadcast_to(mask[:, None], scores.shape)  # the same mask for every head
        fill = Tensor(shape=scores.shape, device=query.device, requires_grad=False)
        fill.set_value(-1e9)
        weights = autograd.softmax(autograd.where(fill, scores, masked), axis=-1)
        context = autograd.transpose(autograd.matmul(weights, v), [0, 2, 1, 3])
        context = autograd.reshape(context, [b, -1, self.d_model])
        return self.norm(self.residual(self.out(context), query)), weights


class FeedForward(layer.Layer):
    def __init__(self, d_model, dim_feedforward):
        super().__init__()
        self.up, self.relu, self.down = Projection(dim_feedforward), layer.ReLU(), Projection(d_model)
        self.residual = layer.Add()
        self.norm = LayerNorm(d_model)

    def forward(self, x):
        return self.norm(self.residual(self.down(self.relu(self.up(x))), x))


class EncoderLayer(layer.Layer):
    def __init__(self, d_model, n_head, dim_feedforward):
        super().__init__()
        self.attention = Attention(d_model, n_head)
        self.ffn = FeedForward(d_model, dim_feedforward)

    def forward(self, x, mask):
        y, weights = self.attention(x, x, x, mask)
        return self.ffn(y), weights


class DecoderLayer(layer.Layer):
    def __init__(self, d_model, n_head, dim_feedforward):
        super().__init__()
        self.self_attention = Attention(d_model, n_head)
        self.cross_attention = Attention(d_model, n_head)
        self.ffn = FeedForward(d_model, dim_feedforward)

    def forward(self, x, memory, self_mask, cross_mask):
        y, self_weights = self.self_attention(x, x, x, self_mask)
        y, cross_weights = self.cross_attention(y, memory, memory, cross_mask)
        return self.ffn(y), self_weights, cross_weights


class Stack(layer.Layer):
    """Token embeddings plus frozen sinusoid position embeddings, then n_layers layers kept in a list (they
    become sublayers at the first call)."""

    def __init__(self, n_token, n_position, d_model, n_layers, make_layer):
        super().__init__()
        self.n_position, self.d_model = n_position, d_model
        self.tokens = layer.Embedding(n_token, d_model)
        self.positions = layer.Embedding(n_position, d_model)
        self.layers = [make_layer() for _ in range(n_layers)]

    def initialize(self, x, *rest):
        self.positions.initialize(x)
        self.positions.from_pretrained(W=sinusoid_table(self.n_position, self.d_model), freeze=True)

    def embed(self, x):
        steps = np.broadcast_to(np.arange(x.shape[1], dtype=np.int32), x.shape)
        return autograd.add(self.tokens(x), self.positions(tensor.from_numpy(steps, x.device)))


class Encoder(Stack):
    def forward(self, src):
        y = self.embed(src)
        mask = key_padding_mask(src, src)
        weights = []
        for block in self.layers:
            y, w = block(y, mask)
            weights.append(w)
        return y, weights


class Decoder(Stack):
    def forward(self, tgt, src, memory):
        y = self.embed(tgt)
        # A position sees neither <pad> keys nor later positions: an integer mask and a float one added
        # (tensors of two dtypes, as SINGA's example adds them) and compared with 0.
        pads = tensor.from_numpy(key_padding_mask(tgt, tgt).astype(np.int32), tgt.device)
        later = tensor.from_numpy(np.triu(np.ones((tgt.shape[0], tgt.shape[1], tgt.shape[1])), k=1), tgt.device)
        self_mask = tensor.to_numpy(tensor.gt(pads + later, 0)) > 0
        cross_mask = key_padding_mask(tgt, src)
        self_weights, cross_weights = [], []
        for block in self.layers:
            y, ws, wc = block(y, memory, self_mask, cross_mask)
            self_weights.append(ws)
            cross_weights.append(wc)
        return y, self_weights, cross_weights


class Transformer(model.Model):
    """Encoder and decoder stacks and the token scores; train_one_batch steps the optimizer given to
    set_optimizer on the mean cross-entropy over every target position and returns the accuracy over
    the positions that are not <pad>."""

    def __init__(self, src_n_token, tgt_n_token, n_position, d_model=32, n_head=2, dim_feedforward=64, n_layers=1):
        super().__init__()
        self.tgt_n_token = tgt_n_token
        self.encoder = Encoder(src_n_token, n_position, d_model, n_layers,
                               lambda: EncoderLayer(d_model, n_head, dim_feedforward))
        self.decoder = Decoder(tgt_n_token, n_position, d_model, n_layers,
                               lambda: DecoderLayer(d_model, n_head, dim_feedforward))
        self.scores = TokenScores(tgt_n_token, bias=False)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, src, tgt):
        memory, enc_weights = self.encoder(src)
        y, dec_weights, cross_weights = self.decoder(tgt, src, memory)
        return self.scores(y), enc_weights, dec_weights, cross_weights

    def train_one_batch(self, src, tgt_in, tgt_out, pad):
        out, _, _, _ = self.forward(src, tgt_in)
        logits = autograd.reshape(out, [-1, self.tgt_n_token])
        targets = tensor.to_numpy(tgt_out).reshape(-1)
        loss = self.loss(logits, tensor.from_numpy(targets, src.device))
        self.optimizer(loss)
        keep = targets != pad
        acc = float(np.sum((np.argmax(tensor.to_numpy(logits), -1) == targets) & keep) / max(np.sum(keep), 1))
        return out, loss, acc
