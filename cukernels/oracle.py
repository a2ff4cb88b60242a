"""Pure numpy twin of every public function: same names, same signatures, same results.

It is the reference the CUDA kernels are tested against, and the CPU fallback: the public
functions validate their arguments and call these on numpy arrays. Arithmetic stays in the
arrays' dtype. Arguments are assumed valid here (the public functions check them).
"""
from __future__ import annotations

import math

import numpy as np

BOOK_TINY = np.float32(1e-37)  # the documents' epsilon, a float literal in their source


def _into(out, value):
    if out is None:
        return value
    out[...] = value
    return out


def _t(x, like):
    return like.dtype.type(x)


def _rows(a):
    """A 1-D vector as one row; a batch as it is."""
    return a[None, :] if a.ndim == 1 else a


def _shape_like(result, like):
    return result[0] if like.ndim == 1 else result


# ------------------------------------------------------------------------- activations
def line_activation(inputs, a=1.0, b=0.0, *, out=None):
    return _into(out, _t(a, inputs) * inputs + _t(b, inputs))


def sigmoid_activation(inputs, a=1.0, b=0.0, *, out=None):
    one = _t(1, inputs)
    return _into(out, _t(a, inputs) / (one + np.exp(-inputs)) - _t(b, inputs))


def sigmoid_derivative(outputs, output_gr, a=1.0, b=0.0, *, out=None):
    a, b = _t(a, outputs), _t(b, outputs)
    if a == 0:
        return _into(out, np.zeros_like(outputs))
    z = np.clip(outputs + b, _t(0, outputs), a)
    return _into(out, z * (_t(1, outputs) - z / a) * output_gr)


def tanh_activation(inputs, *, out=None):
    return _into(out, np.tanh(inputs))


def tanh_derivative(outputs, output_gr, *, out=None):
    return _into(out, (_t(1, outputs) - outputs * outputs) * output_gr)


def lrelu_activation(inputs, a=0.3, *, out=None):
    return _into(out, np.where(inputs > 0, inputs, _t(a, inputs) * inputs))


def lrelu_derivative(outputs, output_gr, a=0.3, *, out=None):
    return _into(out, np.where(outputs > 0, _t(1, outputs), _t(a, outputs)) * output_gr)


def swish_activation(inputs, b=1.0, *, out=None):
    return _into(out, inputs / (_t(1, inputs) + np.exp(-_t(b, inputs) * inputs)))


def swish_derivative(outputs, output_gr, b, inputs, *, out=None):
    one, b = _t(1, outputs), _t(b, outputs)
    by = b * outputs
    return _into(out, (by + (one - by) / (one + np.exp(-b * inputs))) * output_gr)


def softmax_activation(inputs, *, out=None):
    shifted = inputs - inputs.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return _into(out, e / e.sum(axis=-1, keepdims=True))


def softmax_derivative(outputs, output_gr, *, out=None):
    dot = (outputs * output_gr).sum(axis=-1, keepdims=True)
    return _into(out, outputs * (output_gr - dot))


def mask_mult(inputs, mask, *, out=None):
    return _into(out, inputs * mask)


# ------------------------------------------------------------------------------ losses
def calc_output_gradient(target, outputs, loss_function, *, variant="standard", eps=1e-7,
                         out=None):
    t, o = target, outputs
    one = _t(1, o)
    book = variant == "book"
    tiny = _t(BOOK_TINY, o)
    eps = _t(eps, o)
    if loss_function == 1:
        g = _t(2, o) * (t - o)
    elif loss_function == 2:
        g = -t / (o + tiny) * np.log(o + tiny) if book else t / (o + eps)
    elif loss_function == 3:
        g = (t - o) / (o * (o - one) + tiny) if book else (t - o) / (o * (one - o) + eps)
    else:
        g = t - o
    return _into(out, g)


# ------------------------------------------------------------------------------- dense
def _act(s, activation):
    if activation == 0:
        return np.tanh(s)
    if activation == 1:
        return _t(1, s) / (_t(1, s) + np.exp(-s))
    return s


def perceptron_feed_forward(inputs, weights):
    i = weights.shape[1] - 1
    y = _rows(inputs) @ weights[:, :i].T + weights[:, i]
    return _shape_like(y, inputs)


def calc_hidden_gradient(weights, gradients):
    i = weights.shape[1] - 1
    return _shape_like(_rows(gradients) @ weights[:, :i], gradients)


def calc_delta_weights(inputs, delta_weights, gradients):
    x, g = _rows(inputs), _rows(gradients)
    i = delta_weights.shape[1] - 1
    delta_weights[:, :i] += g.T @ x
    delta_weights[:, i] += g.sum(axis=0)
    return delta_weights


# --------------------------------------------------------------------------- optimizers
def _regularize(w, lr, lambda1, lambda2, book):
    if book:
        return w - (lambda1 + lambda2 * w)
    return w - lr * (lambda1 * np.sign(w) + lambda2 * w)


def _scalars(w, *values):
    return [w.dtype.type(v) for v in values]


def sgd_update(delta_weights, weights, batch_size, learning_rate=3e-4, lambda1=0.0,
               lambda2=0.0, *, variant="standard"):
    bs, lr, l1, l2 = _scalars(weights, batch_size, learning_rate, lambda1, lambda2)
    book = variant == "book"
    w = _regularize(weights, lr, l1, l2, book)
    w = w + (lr / bs) * delta_weights if book else w + lr * (delta_weights / bs)
    weights[...] = w
    delta_weights[...] = 0


def momentum_update(delta_weights, weights, momentum, batch_size, learning_rate=3e-4, beta=0.9,
                    lambda1=0.0, lambda2=0.0, *, variant="standard"):
    bs, lr, beta, l1, l2 = _scalars(weights, batch_size, learning_rate, beta, lambda1, lambda2)
    d = delta_weights / bs
    w = _regularize(weights, lr, l1, l2, variant == "book")
    momentum[...] = lr * d + beta * momentum
    weights[...] = w + momentum
    delta_weights[...] = 0


def adagrad_update(delta_weights, weights, momentum, batch_size, learning_rate=3e-4,
                   lambda1=0.0, lambda2=0.0, *, variant="standard", eps=1e-10):
    bs, lr, l1, l2, eps = _scalars(weights, batch_size, learning_rate, lambda1, lambda2, eps)
    book = variant == "book"
    d = delta_weights / bs
    w = _regularize(weights, lr, l1, l2, book)
    momentum[...] = momentum + d * d
    if book:
        weights[...] = w + lr / np.sqrt(momentum + _t(BOOK_TINY, w))
    else:
        weights[...] = w + lr * d / (np.sqrt(momentum) + eps)
    delta_weights[...] = 0


def rmsprop_update(delta_weights, weights, momentum, batch_size, learning_rate=3e-4, beta=0.9,
                   lambda1=0.0, lambda2=0.0, *, variant="standard", eps=1e-8):
    bs, lr, beta, l1, l2, eps = _scalars(weights, batch_size, learning_rate, beta, lambda1,
                                         lambda2, eps)
    book = variant == "book"
    d = delta_weights / bs
    w = _regularize(weights, lr, l1, l2, book)
    momentum[...] = beta * momentum + (_t(1, w) - beta) * d * d
    weights[...] = w + lr * d / (np.sqrt(momentum) + (_t(BOOK_TINY, w) if book else eps))
    delta_weights[...] = 0


def adadelta_update(delta_weights, weights, momentum_w, momentum_g, batch_size, beta1=0.9,
                    beta2=0.999, lambda1=0.0, lambda2=0.0, *, variant="standard",
                    learning_rate=1.0, eps=1e-6):
    bs, b1, b2, l1, l2, lr, eps = _scalars(weights, batch_size, beta1, beta2, lambda1, lambda2,
                                           learning_rate, eps)
    one = _t(1, weights)
    d = delta_weights / bs
    if variant == "book":
        w = _regularize(weights, lr, l1, l2, True)
        momentum_w[...] = b1 * momentum_w + (one - b1) * w * w
        momentum_g[...] = b2 * momentum_g + (one - b2) * d * d
        weights[...] = w + d * np.sqrt(momentum_w) / (np.sqrt(momentum_g) + _t(BOOK_TINY, w))
    else:
        w = _regularize(weights, lr, l1, l2, False)
        momentum_g[...] = b2 * momentum_g + (one - b2) * d * d
        u = d * np.sqrt(momentum_w + eps) / np.sqrt(momentum_g + eps)
        momentum_w[...] = b1 * momentum_w + (one - b1) * u * u
        weights[...] = w + lr * u
    delta_weights[...] = 0


def adam_bias_factors(learning_rate, beta1, beta2, t):
    """(lr/(1 - beta1^t), 1/sqrt(1 - beta2^t)), computed in float64 on the host."""
    lr, b1, b2 = float(learning_rate), float(beta1), float(beta2)
    return lr / (1.0 - b1 ** t), 1.0 / math.sqrt(1.0 - b2 ** t)


def adam_update(delta_weights, weights, momentum_m, momentum_v, batch_size, learning_rate=3e-4,
                beta1=0.9, beta2=0.999, lambda1=0.0, lambda2=0.0, *, t=None,
                variant="standard", eps=1e-8):
    book = variant == "book"
    c1, c2 = (0.0, 0.0) if book else adam_bias_factors(learning_rate, beta1, beta2, t)
    bs, lr, b1, b2, l1, l2, eps, c1, c2 = _scalars(weights, batch_size, learning_rate, beta1,
                                                   beta2, lambda1, lambda2, eps, c1, c2)
    one = _t(1, weights)
    d = delta_weights / bs
    momentum_m[...] = b1 * momentum_m + (one - b1) * d
    momentum_v[...] = b2 * momentum_v + (one - b2) * d * d
    w = _regularize(weights, lr, l1, l2, book)
    if book:
        m = momentum_m / (one - b1)
        v = momentum_v / (one - b2)
        weights[...] = w + lr * m / (np.sqrt(v) + _t(BOOK_TINY, w))
    else:
        weights[...] = w + c1 * momentum_m / (np.sqrt(momentum_v) * c2 + eps)
    delta_weights[...] = 0


# ----------------------------------------------------------------------------- article
def article_feed_forward(matrix_w, matrix_i, activation):
    return _act(perceptron_feed_forward(matrix_i, matrix_w), activation)


def _article_guards(o):
    hi = _t(1, o) - np.where(o == 1, _t(0.99, o), o)
    lo_sig = np.where(o == 0, _t(0.01, o), o)
    return hi, lo_sig


def article_calc_output_gradient(matrix_t, matrix_o, activation):
    o = matrix_o
    hi, lo_sig = _article_guards(o)
    if activation == 0:
        return (np.clip(matrix_t, -1, 1).astype(o.dtype) - o) * (_t(1, o) + o) * hi
    if activation == 1:
        return (np.clip(matrix_t, 0, 1).astype(o.dtype) - o) * lo_sig * hi
    return matrix_t - o


def article_calc_hidden_gradient(matrix_w, matrix_g, matrix_o, activation):
    s = calc_hidden_gradient(matrix_w, matrix_g)
    o = matrix_o
    hi, lo_sig = _article_guards(o)
    if activation == 0:
        return (np.clip(s + o, -1, 1).astype(o.dtype) - o) * (_t(1, o) + o) * hi
    if activation == 1:
        return (np.clip(s + o, 0, 1).astype(o.dtype) - o) * lo_sig * hi
    return s


def article_update_weights(matrix_w, matrix_g, matrix_i, matrix_dw, learning_rates, momentum):
    lr, mom = _scalars(matrix_w, learning_rates, momentum)
    x, g = _rows(matrix_i), _rows(matrix_g)
    ones = np.ones((x.shape[0], 1), dtype=x.dtype)
    xa = np.concatenate([x, ones], axis=1)          # (B, I + 1): the bias input is 1
    for b in range(x.shape[0]):                     # B single-sample updates in a row
        matrix_dw[...] = lr * g[b][:, None] * xa[b][None, :] + mom * matrix_dw
        matrix_w += matrix_dw
