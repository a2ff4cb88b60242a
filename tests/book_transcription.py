"""A literal transcription of the book's OpenCL kernels into Python (float64, TYPE = double).

Used only by the tests: it follows the documents' arithmetic step by step, including the
4-element chunks of ToVect4/D4ToArray and SoftMax's work-group reduction, so that the
book variants can be checked against the documents and their defects can be shown.
Reads past the end of a buffer are recorded in `Buffer.oob` (and read as 0, where the device
would read whatever lies there); writes past the end are recorded and dropped.
"""
import math

import numpy as np

TINY = float(np.float32(1e-37))  # the documents write 1.0e-37f


class Buffer:
    def __init__(self, values):
        self.v = [float(x) for x in np.ravel(values)]
        self.oob = []

    def __getitem__(self, i):
        if 0 <= i < len(self.v):
            return self.v[i]
        self.oob.append(i)
        return 0.0

    def __setitem__(self, i, x):
        if 0 <= i < len(self.v):
            self.v[i] = x
        else:
            self.oob.append(i)

    def array(self, shape=None):
        a = np.array(self.v)
        return a.reshape(shape) if shape is not None else a


def to_vect4(array, start, step, size, shift):
    result = [0.0, 0.0, 0.0, 0.0]
    step = max(1, step)
    st = start * step + shift
    if st < size:
        k = (size - shift + step - 1) // step   # (D1) counts the whole view, not what is left
        for j in range(min(k, 4)):
            result[j] = array[st + j * step]
    return result


def d4_to_array(array, value, start, step, size, shift):
    step = max(1, step)
    st = start * step + shift
    if st < size:
        k = (size - shift + step - 1) // step
        for j in range(min(k, 4)):
            array[st + j * step] = value[j]


def perceptron_feed_forward(inputs, weights, n_out, inputs_total):
    weights_total = n_out * (inputs_total + 1)
    out = []
    for n in range(n_out):
        shift = n * (inputs_total + 1)
        s = weights[shift + inputs_total]
        for i in range(0, inputs_total, 4):
            a = to_vect4(inputs, i, 1, inputs_total, 0)
            b = to_vect4(weights, i, 1, weights_total, shift)
            s += sum(p * q for p, q in zip(a, b))
        out.append(s)
    return out


def softmax_row(inputs, ls):
    """SoftMaxActivation for one row and a work-group of `ls` threads, run in lock-step."""
    total = len(inputs)
    temp = [float("nan")] * ls            # uninitialised local memory
    for l in range(ls):
        count = l
        while count < total and l < ls:
            temp[l] = (temp[l] if count > l else 0.0) + math.exp(inputs[count])
            count += ls
    count = ls
    while True:
        count = (count + 1) // 2
        snapshot = list(temp)
        for l in range(ls):
            temp[l] = snapshot[l] + (snapshot[l + count] if (l < count and l + count < ls) else 0.0)
        if count <= 1:
            break
    s = temp[0]
    return [math.exp(x) / (s + TINY) for x in inputs]


def calc_output_gradient(t, o, loss_function):
    if loss_function == 0:
        return t - o
    if loss_function == 1:
        return 2 * (t - o)
    if loss_function == 2:
        return -t / (o + TINY) * math.log(o + TINY)
    if loss_function == 3:
        return (t - o) / (o * (o - 1) + TINY)
    return t - o


def _update(kernel, total, buffers, scalars):
    """Run an update kernel the way the book launches it: (total + 3)/4 work items."""
    for gid in range((total + 3) // 4):
        kernel(4 * gid, total, buffers, **scalars)


def _vec(op, *xs):
    return [op(*parts) for parts in zip(*xs)]


def sgd(start, total, bufs, batch_size, learningRate, Lambda1, Lambda2):
    D, W = bufs
    delta4 = to_vect4(D, start, 1, total, 0)
    weights4 = to_vect4(W, start, 1, total, 0)
    lr = learningRate / batch_size
    weights4 = _vec(lambda w: w - (Lambda1 + Lambda2 * w), weights4)
    weights4 = _vec(lambda w, d: w + lr * d, weights4, delta4)
    d4_to_array(W, weights4, start, 1, total, 0)
    d4_to_array(D, [0.0] * 4, start, 1, total, 0)


def momentum(start, total, bufs, batch_size, learningRate, beta, Lambda1, Lambda2):
    D, W, M = bufs
    delta4 = [d / batch_size for d in to_vect4(D, start, 1, total, 0)]
    weights4 = to_vect4(W, start, 1, total, 0)
    momentum4 = to_vect4(M, start, 1, total, 0)
    weights4 = _vec(lambda w: w - (Lambda1 + Lambda2 * w), weights4)
    momentum4 = _vec(lambda d, m: learningRate * d + beta * m, delta4, momentum4)
    weights4 = _vec(lambda w, m: w + m, weights4, momentum4)
    d4_to_array(W, weights4, start, 1, total, 0)
    d4_to_array(M, momentum4, start, 1, total, 0)
    d4_to_array(D, [0.0] * 4, start, 1, total, 0)


def adagrad(start, total, bufs, batch_size, learningRate, Lambda1, Lambda2):
    D, W, M = bufs
    delta4 = [d / batch_size for d in to_vect4(D, start, 1, total, 0)]
    weights4 = to_vect4(W, start, 1, total, 0)
    momentum4 = to_vect4(M, start, 1, total, 0)
    weights4 = _vec(lambda w: w - (Lambda1 + Lambda2 * w), weights4)
    momentum4 = _vec(lambda m, d: m + d ** 2, momentum4, delta4)
    weights4 = _vec(lambda w, m: w + learningRate / math.sqrt(m + TINY), weights4, momentum4)
    d4_to_array(W, weights4, start, 1, total, 0)
    d4_to_array(M, momentum4, start, 1, total, 0)
    d4_to_array(D, [0.0] * 4, start, 1, total, 0)


def rmsprop(start, total, bufs, batch_size, learningRate, beta, Lambda1, Lambda2):
    D, W, M = bufs
    delta4 = [d / batch_size for d in to_vect4(D, start, 1, total, 0)]
    weights4 = to_vect4(W, start, 1, total, 0)
    momentum4 = to_vect4(M, start, 1, total, 0)
    weights4 = _vec(lambda w: w - (Lambda1 + Lambda2 * w), weights4)
    momentum4 = _vec(lambda m, d: beta * m + (1 - beta) * d ** 2, momentum4, delta4)
    weights4 = _vec(lambda w, d, m: w + d * learningRate / (math.sqrt(m) + TINY),
                    weights4, delta4, momentum4)
    d4_to_array(W, weights4, start, 1, total, 0)
    d4_to_array(M, momentum4, start, 1, total, 0)
    d4_to_array(D, [0.0] * 4, start, 1, total, 0)


def adadelta(start, total, bufs, batch_size, beta1, beta2, Lambda1, Lambda2):
    D, W, MW, MG = bufs
    delta4 = [d / batch_size for d in to_vect4(D, start, 1, total, 0)]
    weights4 = to_vect4(W, start, 1, total, 0)
    mw4 = to_vect4(MW, start, 1, total, 0)
    mg4 = to_vect4(MG, start, 1, total, 0)
    weights4 = _vec(lambda w: w - (Lambda1 + Lambda2 * w), weights4)
    mw4 = _vec(lambda m, w: beta1 * m + (1 - beta1) * w ** 2, mw4, weights4)
    mg4 = _vec(lambda m, d: beta2 * m + (1 - beta2) * d ** 2, mg4, delta4)
    weights4 = _vec(lambda w, d, a, b: w + d * math.sqrt(a) / (math.sqrt(b) + TINY),
                    weights4, delta4, mw4, mg4)
    d4_to_array(W, weights4, start, 1, total, 0)
    d4_to_array(MW, mw4, start, 1, total, 0)
    d4_to_array(MG, mg4, start, 1, total, 0)
    d4_to_array(D, [0.0] * 4, start, 1, total, 0)


def adam(start, total, bufs, batch_size, learningRate, beta1, beta2, Lambda1, Lambda2):
    D, W, MM, MV = bufs
    delta4 = [d / batch_size for d in to_vect4(D, start, 1, total, 0)]
    weights4 = to_vect4(W, start, 1, total, 0)
    mm4 = to_vect4(MM, start, 1, total, 0)
    mv4 = to_vect4(MV, start, 1, total, 0)
    mm4 = _vec(lambda m, d: beta1 * m + (1 - beta1) * d, mm4, delta4)
    mv4 = _vec(lambda v, d: beta2 * v + (1 - beta2) * d ** 2, mv4, delta4)
    m = [x / (1 - beta1) for x in mm4]
    v = [x / (1 - beta2) for x in mv4]
    weights4 = _vec(lambda w: w - (Lambda1 + Lambda2 * w), weights4)
    weights4 = _vec(lambda w, a, b: w + learningRate * a / (math.sqrt(b) + TINY), weights4, m, v)
    d4_to_array(W, weights4, start, 1, total, 0)
    d4_to_array(MM, mm4, start, 1, total, 0)
    d4_to_array(MV, mv4, start, 1, total, 0)
    d4_to_array(D, [0.0] * 4, start, 1, total, 0)


UPDATES = {"sgd": (sgd, 0), "momentum": (momentum, 1), "adagrad": (adagrad, 1),
           "rmsprop": (rmsprop, 1), "adadelta": (adadelta, 2), "adam": (adam, 2)}


def run_update(name, D, W, moments, scalars):
    """Apply the transcribed book kernel `name` to numpy arrays; returns the OOB accesses."""
    kernel, _ = UPDATES[name]
    bufs = [Buffer(D), Buffer(W)] + [Buffer(m) for m in moments]
    _update(kernel, W.size, bufs, scalars)
    D[...] = bufs[0].array(D.shape)
    W[...] = bufs[1].array(W.shape)
    for m, b in zip(moments, bufs[2:]):
        m[...] = b.array(m.shape)
    return sum((b.oob for b in bufs), [])
