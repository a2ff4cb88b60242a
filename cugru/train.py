"""The main job: train a sequence classifier with cugru and cukernels, on the GPU or the CPU.

    python -m cugru.train [--device auto|gpu|cpu] [--optimizer adam] [--epochs 15]
                          [--hidden 64] [--batch 32] [--lr LR] [--seed 0]
                          [--data FILE.npz] [--save FILE.npz] [--plot FILE.png]
                          [--dtype float32|float16|bfloat16] [--math strict|tf32]
                          [--qat [--qat-epochs 4] [--freeze-epochs 2] [--export FILE.npz]]

By default it reads scikit-learn's handwritten digits, each 8x8 image as a sequence of 8 rows
of 8 features. ``--data`` takes your own sequences instead: an .npz with ``X`` (N, T, I) and
integer labels ``y`` (N,) in 0..C-1. A fifth of the samples (at least one) is held out.

Model and the calls that compute it:

    x (T, B, I) -> bidirectional GRU          cugru.gru_forward / gru_backward
      -> last hidden states [h_fwd, h_bwd]    (B, 2H)
      -> dense layer W (C, 2H + 1)            perceptron_feed_forward
      -> softmax, cross-entropy               softmax_activation
    backward: calc_output_gradient (cross-entropy) and softmax_derivative give t - p;
    calc_delta_weights accumulates W's step; calc_hidden_gradient carries it to the GRU's
    h_n; gru_backward gives the GRU's gradients. Every parameter is updated by one of
    cukernels' six optimizers (Adam by default), whose accumulators hold the descent
    direction -dL/dw summed over the batch.

numpy arrays run every call on the CPU (the oracles), cupy arrays on the GPU: the same code
runs both, from the same seed and data order.

``--dtype float16`` or ``bfloat16`` trains in mixed precision: the weights, the optimizer
and the dense layer stay float32, and each step runs the GRU on x and the weights rounded to
that dtype (h_n and the GRU's gradients come back in it and are widened). ``--math tf32``
lets the GRU's cuBLAS products round their inputs to TF32 (cugru's math=; the CPU computes
them strict).

``--qat`` goes on after the float epochs with quantization-aware training (cugru.QuantSpec:
8-bit weights per row, x, the state and the gates fake-quantized) for ``--qat-epochs``
epochs at a fifth of the learning rate: observers (cugru.qat.Observer) set the grids of x and
of the state from a pass over the training set and keep moving them, then the grids are
frozen for the last ``--freeze-epochs``. A float twin of the model trains beside it from the
same weights, with the same batches and learning rate, unquantized. It prints the twin's and
the QAT model's held-out accuracy side by side, and how often an integer inference of
the int8 export (int8 operands, int32 accumulation, cugru.qat.integer_gru; the dense layer
in float) predicts what the fake-quant model predicts. ``--export`` writes that export.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

import cukernels as ck
from cukernels import runtime

from . import _dist, _half, gru_backward, gru_forward, qat
from ._args import HALF_DTYPES, MATHS, default_math
from .quant import QuantSpec

OPTIMIZERS = ("sgd", "momentum", "adagrad", "rmsprop", "adadelta", "adam")
#: --dtype: the GRU's data type (the model's weights stay float32)
DTYPES = ("float32", "float16", "bfloat16")
#: learning rates that train the default model well in the default epochs
#: (each reaches 98-99% held-out accuracy on the digits in 15 epochs, seed 0)
DEFAULT_LR = {"sgd": 1.0, "momentum": 0.1, "adagrad": 0.1, "rmsprop": 1e-2,
              "adadelta": 2.0, "adam": 5e-3}


#: eps of the cross-entropy gradient t / (p + eps): far below any probability that matters,
#: above float32's smallest normal number (the GPU flushes denormals to zero)
CE_EPS = 1e-30
#: the most classes (labels 0 .. C-1) a --data file may have: the output layer has C units
MAX_CLASSES = 4096


class FlatGrads:
    """Every parameter's gradient accumulator as a view of one flat buffer, so that a
    data-parallel step reduces one buffer across processes (one all-reduce) and the
    training code writes the gradients where they are reduced (no copy in or out).

    Each view starts on a 16-byte boundary (cukernels' kernels then move 16-byte packs);
    the padding between views is zero and stays zero. `pack` copies arrays in, `unpack`
    gives the views of a flat buffer (this one, or one received from elsewhere)."""

    ALIGN = 16

    def __init__(self, xp, shapes, dtype):
        dt = np.dtype(dtype)
        step = max(1, self.ALIGN // dt.itemsize)
        self.layout, n = {}, 0
        for name, shape in shapes.items():
            shape = tuple(int(d) for d in shape)
            size = math.prod(shape)
            self.layout[name] = (n, shape)
            n += -(-size // step) * step
        self.flat = xp.zeros(n, dt)
        self.views = self.unpack(self.flat)

    def unpack(self, flat):
        """The views of `flat` (a buffer of this layout), by parameter name."""
        if flat.shape != self.flat.shape or flat.dtype != self.flat.dtype:
            raise ValueError(f"flat has shape {flat.shape} and dtype {flat.dtype}; this "
                             f"layout needs {self.flat.shape} {self.flat.dtype}")
        return {name: flat[o:o + math.prod(shape)].reshape(shape)
                for name, (o, shape) in self.layout.items()}

    def pack(self, arrays):
        """Copy `arrays` (by parameter name, each of its view's shape) into the buffer;
        returns the buffer."""
        if set(arrays) != set(self.layout):
            raise ValueError(f"arrays must name {sorted(self.layout)}, got {sorted(arrays)}")
        for name, a in arrays.items():
            view = self.views[name]
            if tuple(a.shape) != view.shape:
                raise ValueError(f"arrays[{name!r}] has shape {tuple(a.shape)}, expected "
                                 f"{view.shape}")
            view[...] = a
        return self.flat


class Param:
    """One parameter array with its optimizer accumulator (descent direction) and moments;
    `d`: the accumulator, where the caller keeps it (a view of a FlatGrads buffer)."""

    def __init__(self, xp, value, d=None):
        self.w = xp.asarray(value)
        self.d = xp.zeros_like(self.w) if d is None else d
        self.m = [xp.zeros_like(self.w), xp.zeros_like(self.w)]

    def copy(self, d=None):
        """A twin with copies of the weights and of the optimizer's state (its accumulator
        `d` where given, holding a copy of this one's)."""
        twin = object.__new__(Param)
        twin.w, twin.m = self.w.copy(), [a.copy() for a in self.m]
        if d is None:
            twin.d = self.d.copy()
        else:
            d[...] = self.d
            twin.d = d
        return twin

    def step(self, name, batch, lr, t):
        w, d, (m, v) = self.w, self.d, self.m
        if name == "sgd":
            ck.sgd_update(d, w, batch, lr)
        elif name == "momentum":
            ck.momentum_update(d, w, m, batch, lr)
        elif name == "adagrad":
            ck.adagrad_update(d, w, m, batch, lr)
        elif name == "rmsprop":
            ck.rmsprop_update(d, w, m, batch, lr)
        elif name == "adadelta":
            ck.adadelta_update(d, w, m, v, batch, 0.9, 0.9, learning_rate=lr)
        else:
            ck.adam_update(d, w, m, v, batch, lr, t=t)


class Model:
    """Bidirectional GRU, its last hidden states into a dense layer, softmax."""

    GRU_PARAMS = ("w_ih", "w_hh", "b_ih", "b_hh")

    def __init__(self, xp, rng, n_features, hidden, n_classes, dtype=np.float32,
                 gru_dtype=None, math=None):
        self.xp, self.hidden = xp, hidden
        self.quant = None                  # a QuantSpec: quantization-aware passes
        # the GRU's data type where it is not the weights' (mixed precision), and its math=
        self.gru_dtype = None if gru_dtype is None else np.dtype(gru_dtype)
        self.math = math
        k = 1 / np.sqrt(hidden)            # torch.nn.GRU's initial range
        u = lambda *s: rng.uniform(-k, k, s).astype(dtype)  # noqa: E731
        dense = rng.uniform(-1, 1, (n_classes, 2 * hidden + 1)) * np.sqrt(3 / (2 * hidden))
        dense[:, -1] = 0
        values = {"w_ih": u(2, 3 * hidden, n_features), "w_hh": u(2, 3 * hidden, hidden),
                  "b_ih": u(2, 3 * hidden), "b_hh": u(2, 3 * hidden),
                  "dense": dense.astype(dtype)}
        # (the gradients in one buffer: what a data-parallel step reduces across processes)
        self.grads = FlatGrads(xp, {k: v.shape for k, v in values.items()}, dtype)
        self.params = {k: Param(xp, v, self.grads.views[k]) for k, v in values.items()}

    def _cast(self, dtype, *arrays):
        """`arrays` (C-contiguous) in `dtype`: the weights' dtype and the GRU's, either way
        (on the GPU by cugru's conversions, which round to nearest, ties to even)."""
        if self.xp is np:
            return [a.astype(dtype) for a in arrays]
        if np.dtype(dtype) == np.float32:
            return _half.widen(*arrays)
        return _half.narrow(dtype, *arrays)

    def _gru(self, x, training):
        w = [self.params[n].w for n in self.GRU_PARAMS]
        if self.gru_dtype is not None:
            x, *w = self._cast(self.gru_dtype, x, *w)
        y, h_n, saved = gru_forward(x, None, *w, bidirectional=True, training=training,
                                    quant=self.quant, math=self.math)
        if self.gru_dtype is not None:
            h_n, = self._cast(self.params["dense"].w.dtype, h_n)
        return y, h_n, saved

    def probabilities(self, x, training=False):
        """Class probabilities (B, C) for x (T, B, I); with the cache backward needs."""
        y, h_n, saved = self._gru(x, training)
        B = x.shape[1]
        features = self.xp.ascontiguousarray(h_n.transpose(1, 0, 2).reshape(B, 2 * self.hidden))
        p = ck.softmax_activation(ck.perceptron_feed_forward(features, self.params["dense"].w))
        return p, (y, features, saved)

    def backward(self, p, targets, cache):
        """Accumulate every parameter's descent direction -dL/dw, L = summed cross-entropy."""
        xp, H = self.xp, self.hidden
        y, features, saved = cache
        B = features.shape[0]
        # cross-entropy's t / (p + eps), then through softmax: t - p. eps = 1e-30 keeps t = 0,
        # p = 0 (an underflowed probability) at 0 instead of 0/0, and errs by eps/p otherwise
        g_out = ck.calc_output_gradient(targets, p, 2, eps=CE_EPS)
        g_logits = ck.softmax_derivative(p, g_out)
        dense = self.params["dense"]
        ck.calc_delta_weights(features, dense.d, g_logits)
        g_features = ck.calc_hidden_gradient(dense.w, g_logits)     # -dL/d[h_fwd, h_bwd]
        dh_n = xp.ascontiguousarray(-g_features.reshape(B, 2, H).transpose(1, 0, 2))
        if self.gru_dtype is not None:
            dh_n, = self._cast(self.gru_dtype, dh_n)
        grads = gru_backward(xp.zeros_like(y), dh_n, saved)[2:]
        if self.gru_dtype is not None:
            grads = self._cast(dense.w.dtype, *grads)
        for name, g in zip(self.GRU_PARAMS, grads):
            xp.negative(g, out=self.params[name].d)

    def step(self, optimizer, batch, lr, t):
        for p in self.params.values():
            p.step(optimizer, batch, lr, t)

    def copy(self):
        """A twin: the same weights and optimizer state, trained apart from here."""
        twin = object.__new__(Model)
        twin.xp, twin.hidden, twin.quant = self.xp, self.hidden, self.quant
        twin.gru_dtype, twin.math = self.gru_dtype, self.math
        twin.grads = FlatGrads(self.xp, {k: p.w.shape for k, p in self.params.items()},
                               self.grads.flat.dtype)
        twin.params = {name: p.copy(twin.grads.views[name]) for name, p in self.params.items()}
        return twin

    def accuracy(self, x, labels):
        p, _ = self.probabilities(x)
        return float((p.argmax(axis=1) == labels).mean()), p

    def state(self):
        to_host = (lambda a: a) if self.xp is np else (lambda a: self.xp.asnumpy(a))
        return {name: to_host(p.w) for name, p in self.params.items()}


def load_digits():
    """Digits as (N, 8 rows, 8 features) in [0, 1], and labels."""
    try:
        from sklearn.datasets import load_digits as sk_digits
    except ImportError:
        raise SystemExit("the digits data set needs scikit-learn: pip install -e '.[main]'")
    d = sk_digits()
    return (d.images / 16.0).astype(np.float32), d.target.astype(np.int64)


def load_npz(path):
    """X (N, T, I) and y (N,) from a user's .npz, with errors that say what is wrong.

    Labels are the integers 0 .. C-1 (C = the largest label + 1, at most MAX_CLASSES); a
    label in that range that no sample has still gets its output unit, which learns to
    predict it never (load_npz's caller reports how many there are)."""
    if os.path.isdir(path):
        raise ValueError(f"--data {path}: a directory; give an .npz file")
    if not os.path.isfile(path):
        raise ValueError(f"--data {path}: no such file")
    try:
        loaded = np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 (not a numpy file, truncated, pickled objects...)
        raise ValueError(f"--data {path}: not a readable .npz file ({e})") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(f"--data {path}: a single array (.npy), not an .npz archive; save "
                         "both arrays with numpy.savez(path, X=X, y=y)")
    with loaded as f:
        try:
            arrays = {k: f[k] for k in f.files if k in ("X", "y")}
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"--data {path}: not a readable .npz file ({e})") from None
        keys = sorted(f.files)
    missing = {"X", "y"} - set(arrays)
    if missing:
        raise ValueError(f"--data {path}: missing array(s) {sorted(missing)}; it must hold "
                         f"X (N, T, I) and y (N,), found {keys}")
    X, y = arrays["X"], arrays["y"]
    if X.ndim != 3 or 0 in X.shape:
        raise ValueError(f"--data {path}: X must have shape (N, T, I) with sizes > 0, "
                         f"got {X.shape}")
    if not (np.issubdtype(X.dtype, np.number) and np.isfinite(X).all()):
        raise ValueError(f"--data {path}: X must hold finite numbers (dtype {X.dtype})")
    with np.errstate(over="ignore"):
        X32 = X.astype(np.float32)
    if not np.isfinite(X32).all():
        raise ValueError(f"--data {path}: X has values beyond float32's range (largest "
                         f"|X| = {np.abs(X).max():.3g} > {np.finfo(np.float32).max:.3g}); "
                         "the model trains in float32: scale X first")
    if y.shape != (X.shape[0],):
        raise ValueError(f"--data {path}: y must have shape (N,) = ({X.shape[0]},), "
                         f"got {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        if not (np.issubdtype(y.dtype, np.floating) and np.isfinite(y).all()
                and np.all(np.mod(y, 1) == 0)):
            raise ValueError(f"--data {path}: y must hold integer class labels, got {y.dtype}")
    if y.min() < 0:
        raise ValueError(f"--data {path}: labels must be >= 0, found {y.min()}")
    if y.max() >= MAX_CLASSES:
        raise ValueError(f"--data {path}: labels must be below {MAX_CLASSES} (classes 0 .. "
                         f"C-1, one output unit each), found {y.max():.0f}")
    y = y.astype(np.int64)
    if X.shape[0] < 2:
        raise ValueError(f"--data {path}: need at least 2 samples (one is held out)")
    return X32, y


#: quantization-aware fine-tuning: its learning rate against the float epochs', and the
#: grid the observers give x and the state
QAT_LR_FACTOR = 0.2
QAT_LEVELS = (-128, 127)


def gru_dtype_of(name):
    """The GRU's dtype for --dtype `name`: None for float32 (the weights' own), else
    float16 or bfloat16 (a ValueError where bfloat16 lacks ml_dtypes, or for another name)."""
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {name!r}")
    if name == "float32":
        return None
    for dt in HALF_DTYPES:
        if dt.name == name:
            return dt
    raise ValueError(f"--dtype {name} needs the ml_dtypes package (pip install ml_dtypes)")


def train(device="auto", optimizer="adam", epochs=15, hidden=64, batch=32, lr=None, seed=0,
          data=None, progress=True, qat_epochs=0, freeze_epochs=2, group=None, dog=None,
          dtype="float32", math=None):
    """Train and evaluate; returns a dict with the history, accuracy, timings and model.
    With qat_epochs, quantization-aware epochs follow (see the module's doc). `group` (a
    cugru._dist.Group): data-parallel, this process training on its slice of every batch
    (batch / processes rows), the loss and the gradients summed over the processes before
    each step. `dog` (a cugru._dist.Watchdog) is told of every step and evaluation.
    `dtype` (DTYPES): the GRU's data type, float16 and bfloat16 in mixed precision; `math`:
    its math= (cugru._args.MATHS; None: cugru's default for the dtype)."""
    gru_dtype = gru_dtype_of(dtype)
    if math is not None and math not in MATHS:
        raise ValueError(f"math must be one of {MATHS}, got {math!r}")
    if qat_epochs and gru_dtype is not None:
        raise ValueError(f"--qat trains in float32; --dtype {dtype} cannot go with it")
    if device == "auto":
        device = "gpu" if ck.gpu_available() else "cpu"
    if device == "gpu" and not ck.gpu_available():
        raise SystemExit("--device gpu: no CUDA GPU with CuPy on this machine")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    xp = runtime.cupy_module() if device == "gpu" else np
    lr = DEFAULT_LR[optimizer] if lr is None else lr
    X, labels = load_digits() if data is None else load_npz(data)
    n_classes = int(labels.max()) + 1
    unused = n_classes - len(np.unique(labels))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(X))
    n_test = max(1, len(X) // 5)
    test, tr = order[:n_test], order[n_test:]
    batch = min(batch, len(tr))
    rank, world = (0, 1) if group is None else (group.rank, group.world)
    if batch % world:
        raise ValueError(f"--batch {batch} is not a multiple of the {world} processes "
                         "(each takes an equal slice of every batch)")
    if world > 1 and qat_epochs:
        raise ValueError("--qat runs in one process (its observers see every batch)")
    share = batch // world
    eye = np.eye(n_classes, dtype=np.float32)
    model = Model(xp, rng, X.shape[2], hidden, n_classes, gru_dtype=gru_dtype, math=math)
    x_test = xp.asarray(np.ascontiguousarray(X[test].transpose(1, 0, 2)))
    y_test = xp.asarray(labels[test])
    history, batch_losses, t, start = [], [], 0, time.perf_counter()
    epoch_seconds, mark = [], start
    bar = _progress((epochs + qat_epochs) * (len(tr) // batch), progress and rank == 0)
    batches = lambda idx: xp.asarray(np.ascontiguousarray(X[idx].transpose(1, 0, 2)))  # noqa
    observers = twin = None
    if dog is not None:
        dog.beat()      # (the first step's all-reduce waits for the others from here)
    for epoch in range(epochs + qat_epochs):
        if epoch == epochs:         # quantization-aware from here: the observers' first look
            float_epochs_accuracy = history[-1][1]
            observers = _calibrate(model, batches, tr, batch)
            lr *= QAT_LR_FACTOR
            twin = model.copy()     # the float model, trained on beside it the same way
        observing = observers is not None and epoch < epochs + qat_epochs - freeze_epochs
        perm = rng.permutation(tr)
        losses = []
        for k in range(0, len(perm) - batch + 1, batch):
            idx = perm[k:k + batch]
            if world > 1:
                idx = idx[rank * share:(rank + 1) * share]         # (this process's slice)
            x = batches(idx)                                       # (T, B, I)
            targets = xp.asarray(eye[labels[idx]])
            if observers is not None:
                model.quant = _spec(observers)
            p, cache = model.probabilities(x, training=True)
            if observing:
                observers[0].observe(x)
                observers[1].observe(qat.states_before_quant(cache[2]))
            loss = -(targets * xp.log(p + 1e-12)).sum()
            model.backward(p, targets, cache)
            if group is not None:   # (the batch's loss and gradients, over the processes)
                loss = xp.reshape(loss, (1,)).astype(model.grads.flat.dtype)
                group.all_reduce(loss)
                group.all_reduce(model.grads.flat)
            losses.append(float(loss.sum() if group is not None else loss) / batch)
            if dog is not None:
                dog.beat()
            batch_losses.append(losses[-1])
            t += 1
            model.step(optimizer, batch, lr, t)
            if twin is not None:
                tp, tcache = twin.probabilities(x, training=True)
                twin.backward(tp, targets, tcache)
                twin.step(optimizer, batch, lr, t)
            bar.update(1)
            bar.set_postfix(epoch=epoch + 1, loss=f"{np.mean(losses):.4f}")
        p, _ = model.probabilities(x_test)
        accuracy = float((p.argmax(axis=1) == y_test).mean())   # (waits for the device)
        if dog is not None:
            dog.beat()
        history.append((float(np.mean(losses)), accuracy))
        now = time.perf_counter()
        epoch_seconds.append(now - mark)
        mark = now
    bar.close()
    seconds = time.perf_counter() - start
    # the first epoch also compiles the kernels on a machine that has not cached them
    steady = epoch_seconds[1:epochs] or epoch_seconds[:1]
    out = {"device": device, "optimizer": optimizer, "history": history,
           "batch_losses": batch_losses,
           "accuracy": history[-1][1], "seconds": seconds, "epoch_seconds": epoch_seconds,
           "seconds_per_epoch": float(np.median(steady)), "model": model,
           "classes": n_classes, "unused_classes": unused}
    if qat_epochs:
        out.update(float_epochs_accuracy=float_epochs_accuracy,
                   float_accuracy=twin.accuracy(x_test, y_test)[0],
                   qat_accuracy=history[-1][1], spec=model.quant,
                   **_integer_check(model, X[test], p))
    return out


def _spec(observers):
    """The QuantSpec of the observers' grids (8-bit weights, x, the state and the gates)."""
    return QuantSpec(8, observers[0].qparams(), observers[1].qparams(), gates=True)


def _calibrate(model, batches, rows, batch):
    """Observers of x and of the state, set from a pass of the float model over the
    training set."""
    observers = (qat.Observer(*QAT_LEVELS), qat.Observer(*QAT_LEVELS))
    for k in range(0, len(rows), batch):
        x = batches(rows[k:k + batch])
        y, _, _ = model._gru(x, False)
        observers[0].observe(x)
        observers[1].observe(y)
    return observers


def _integer_check(model, X_test, p_fake):
    """The int8 export of the trained QAT model, and how often its integer inference
    (cugru.qat.integer_gru; the dense layer in float) predicts the class the fake-quant model
    predicts (p_fake: its held-out probabilities)."""
    state = model.state()
    exported = qat.export(model.quant, state["w_ih"], state["w_hh"], state["b_ih"],
                          state["b_hh"], dense=state["dense"])
    x = np.ascontiguousarray(X_test.transpose(1, 0, 2)).astype(np.float64)
    h_n, _ = qat.integer_gru(exported, x)
    features = h_n.transpose(1, 0, 2).reshape(x.shape[1], -1)
    logits = features @ state["dense"][:, :-1].T + state["dense"][:, -1]
    fake = p_fake if isinstance(p_fake, np.ndarray) else runtime.cupy_module().asnumpy(p_fake)
    agree = float((logits.argmax(axis=1) == fake.argmax(axis=1)).mean())
    return {"export": exported, "integer_agreement": agree}


def _grid(qparams):
    s, zp, lo, hi = qparams
    return f"scale {s:.4g}, zero point {zp}, [{lo}, {hi}]"


class _NoBar:
    def update(self, n):
        pass

    def set_postfix(self, **kw):
        pass

    def close(self):
        pass


def _progress(total, enabled):
    """A tqdm bar on a terminal where tqdm is installed; else a bar that shows nothing (a
    pipe or a log file would fill with its updates)."""
    if not enabled or not sys.stderr.isatty():
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, unit="batch", dynamic_ncols=True)


def plot(history, path, title):
    """A PNG of the loss and held-out accuracy per epoch; False where matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    epochs = range(1, len(history) + 1)
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    a.plot(epochs, [h[0] for h in history], marker="o")
    a.set(xlabel="epoch", ylabel="training loss (cross-entropy)", yscale="log")
    b.plot(epochs, [h[1] for h in history], marker="o", color="tab:green")
    b.set(xlabel="epoch", ylabel="held-out accuracy", ylim=(0, 1))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _writable(ap, flag, path, suffixes=None):
    """Check before training that `path` can be written: its folder exists, and its suffix
    is one of `suffixes` where given (errors name the flag)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        ap.error(f"{flag} {path}: a directory; give a file name")
    if not os.path.isdir(folder):
        ap.error(f"{flag} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        ap.error(f"{flag} {path}: the folder {folder} is not writable")
    if suffixes and os.path.splitext(path)[1].lower() not in suffixes:
        ap.error(f"{flag} {path}: the file name must end in one of {', '.join(suffixes)}")


def _plot_formats():
    """The file suffixes matplotlib writes, or None where matplotlib is missing."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    return tuple("." + k for k in Figure().canvas.get_supported_filetypes())


class _Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each option's default, unless its help text says it already."""

    def _get_help_string(self, action):
        if "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def parser():
    ap = argparse.ArgumentParser(
        prog="cugru-train", description=__doc__.splitlines()[0], formatter_class=_Defaults)
    ap.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto",
                    help="where to train: the GPU if there is one (auto), or as told")
    ap.add_argument("--optimizer", choices=OPTIMIZERS, default="adam",
                    help="cukernels' update for every parameter")
    ap.add_argument("--epochs", type=int, default=15, help="passes over the training set")
    ap.add_argument("--hidden", type=int, default=64, help="the GRU's hidden size H")
    ap.add_argument("--batch", type=int, default=32, help="sequences per step")
    ap.add_argument("--lr", type=float, default=None,
                    help="learning rate (default: the optimizer's, " + ", ".join(
                        f"{k} {v:g}" for k, v in DEFAULT_LR.items()) + ")")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the weights, the held-out split and the batch order")
    ap.add_argument("--data", default=None,
                    help=".npz with X (N, T, I) and integer labels y (N,) in 0..C-1 "
                         "(default: scikit-learn's digits)")
    ap.add_argument("--save", default=None, help="write the trained weights to this .npz")
    ap.add_argument("--plot", default="training-curves.png",
                    help="image of the loss and accuracy curves ('' for none)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--dtype", choices=DTYPES, default="float32",
                    help="the GRU's data type: float16 and bfloat16 train in mixed precision "
                         "(float32 weights, the GRU on their rounded copies)")
    ap.add_argument("--math", choices=MATHS, default=None,
                    help="the GRU's math=: tf32 lets its cuBLAS products round their inputs "
                         "to TF32 on the GPU (default: tf32 for float16 and bfloat16, strict "
                         "for float32)")
    ap.add_argument("--qat", action="store_true",
                    help="quantization-aware epochs after the float ones (8-bit weights, x, "
                         "the state and the gates fake-quantized)")
    ap.add_argument("--qat-epochs", type=int, default=4, help="quantization-aware epochs")
    ap.add_argument("--freeze-epochs", type=int, default=2,
                    help="the last quantization-aware epochs, with the grids frozen")
    ap.add_argument("--export", default=None,
                    help="with --qat: write the int8 export (cugru.qat.export) to this .npz")
    ap.add_argument("--gpus", type=int, default=None,
                    help="data-parallel over this many GPUs (1 too: the same path): one "
                         "process each, each on its slice of every batch, gradients summed "
                         "through NCCL (under a launcher such as torchrun, its processes are "
                         "used instead); default: one process, no reduction")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="data-parallel: seconds a process waits for a step of the others "
                         "before it stops with an error")
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    for name in ("epochs", "hidden", "batch"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.hidden > 65536:
        ap.error(f"--hidden must be <= 65536, got {args.hidden}")
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        ap.error(f"--lr must be a finite number > 0, got {args.lr}")
    if args.seed < 0:
        ap.error(f"--seed must be >= 0, got {args.seed}")
    if args.qat:
        if args.qat_epochs < 1:
            ap.error(f"--qat-epochs must be >= 1, got {args.qat_epochs}")
        if not 0 <= args.freeze_epochs <= args.qat_epochs:
            ap.error(f"--freeze-epochs must lie in [0, --qat-epochs = {args.qat_epochs}], "
                     f"got {args.freeze_epochs}")
    if args.export:
        if not args.qat:
            ap.error("--export needs --qat (it writes the quantized model)")
        _writable(ap, "--export", args.export, (".npz",))
    if args.save:
        _writable(ap, "--save", args.save, (".npz",))
    if args.plot:
        formats = _plot_formats()
        if formats is None:
            ap.error("--plot needs matplotlib (pip install matplotlib), or --plot ''")
        _writable(ap, "--plot", args.plot, formats)
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        ap.error(f"--timeout must be a finite number > 0, got {args.timeout}")
    launched = _dist.launched()
    world = int(os.environ.get("WORLD_SIZE", "1")) if launched else (args.gpus or 1)
    if args.gpus is not None:
        if args.gpus < 1:
            ap.error(f"--gpus must be >= 1, got {args.gpus}")
        if launched and args.gpus != world:
            ap.error(f"--gpus {args.gpus}, but the launcher started {world} process(es)")
        if args.device == "cpu":
            ap.error("--gpus runs one process per GPU; --device cpu trains in one process "
                     "(under a launcher, CPU processes reduce through gloo)")
    if args.batch % world:
        ap.error(f"--batch {args.batch} is not a multiple of the {world} processes (each "
                 "takes an equal slice of every batch)")
    if args.qat and args.dtype != "float32":
        ap.error(f"--qat trains in float32; --dtype {args.dtype} cannot go with it")
    if args.qat and world > 1:
        ap.error("--qat runs in one process (its observers see every batch)")
    if args.gpus is not None and not launched:
        if not ck.gpu_available():
            ap.error(f"--gpus {args.gpus}: no CUDA GPU with CuPy here")
        have = runtime.cupy_module().cuda.runtime.getDeviceCount()
        if args.gpus > have:
            ap.error(f"--gpus {args.gpus}: this machine has {have} GPU(s)")
        return _dist.launch(sys.argv[1:] if argv is None else list(argv), args.gpus)
    device = args.device
    if device == "auto":
        device = "gpu" if ck.gpu_available() else "cpu"
    group = dog = None
    if launched:
        # (watched from the rendezvous on: a process that never comes must not leave the
        # others waiting there for ever)
        _dist.preload(device)   # (the backend's imports: seconds on some hosts, not a wait)
        dog = _dist.Watchdog(int(os.environ.get("RANK", "0")), args.timeout)
        dog.beat(extra=args.timeout)    # (gloo's rendezvous times out first, with its reason)
        try:
            group = _dist.from_env(device, args.timeout)
        except RuntimeError as e:
            dog.stop()
            print(f"cugru-train, rank {os.environ.get('RANK')}: the processes did not all "
                  f"meet ({str(e).strip()})", file=sys.stderr)
            return 1
        dog.pause()     # (until train's first step: its loading is this process's own)
    try:
        r = train(device, args.optimizer, args.epochs, args.hidden, args.batch, args.lr,
                  args.seed, args.data, progress=not args.no_progress,
                  qat_epochs=args.qat_epochs if args.qat else 0,
                  freeze_epochs=args.freeze_epochs, group=group, dog=dog,
                  dtype=args.dtype, math=args.math)
    except ValueError as e:
        ap.error(str(e))
    finally:
        if dog is not None:
            dog.stop()
        if group is not None:
            group.close()
    if group is not None and group.rank != 0:
        return 0            # (rank 0 reports, saves and plots)
    if r["unused_classes"]:
        print(f"note: {r['unused_classes']} of the {r['classes']} classes (labels 0 .. "
              f"{r['classes'] - 1}) have no sample; their output units learn to predict "
              "them never", file=sys.stderr)
    for epoch, (loss, acc) in enumerate(r["history"], 1):
        tag = "  (quantization-aware)" if epoch > args.epochs else ""
        print(f"epoch {epoch:3d}  loss {loss:.9g}  held-out accuracy {acc:.3f}{tag}")
    accuracy = r["float_epochs_accuracy"] if args.qat else r["accuracy"]
    over = "" if group is None else f", data-parallel over {group.world} processes"
    if args.dtype != "float32" or args.math is not None:
        maths = default_math(np.dtype(np.float32) if r["model"].gru_dtype is None
                             else r["model"].gru_dtype) if args.math is None else args.math
        over += f", GRU in {args.dtype} with math={maths}" + (
            " (computed strict on the CPU)" if r["device"] == "cpu" and maths == "tf32" else "")
    print(f"device {r['device']}{over}: held-out accuracy {accuracy:.3f} after {args.epochs} "
          f"epochs ({args.optimizer}), {r['seconds_per_epoch'] * 1e3:.0f} ms per epoch "
          f"(median after the first, which took {r['epoch_seconds'][0] * 1e3:.0f} ms), "
          f"{r['seconds']:.1f} s in all")
    if args.qat:
        spec = r["spec"]
        print(f"QAT: held-out accuracy float {r['float_accuracy']:.3f}, QAT "
              f"{r['qat_accuracy']:.3f} ({(r['qat_accuracy'] - r['float_accuracy']) * 100:+.1f}"
              f" points) after {args.qat_epochs} more epochs each, from the same float model "
              f"(held-out {r['float_epochs_accuracy']:.3f} after its {args.epochs}) with the "
              f"same batches and learning rate, quantization-aware or not (8-bit weights; x "
              f"on {_grid(spec.x_qparams)}, the state on {_grid(spec.h_qparams)}, the gates "
              f"on their fixed grids); the integer inference of the int8 export agrees "
              f"with the fake-quant model on {r['integer_agreement'] * 100:.1f}% of the "
              "held-out samples")
    if not all(math.isfinite(loss) for loss, _ in r["history"]):
        print("error: the loss is not finite (NaN or inf): the model diverged; try a "
              "smaller --lr", file=sys.stderr)
        return 1
    if args.save:
        np.savez(args.save, **r["model"].state())
        print(f"weights written to {args.save}")
    if args.export:
        np.savez(args.export, **r["export"])
        print(f"int8 export written to {args.export}")
    if args.plot and plot(r["history"], args.plot, f"GRU classifier, {r['device']}, "
                          f"{args.optimizer}"):
        print(f"curves written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
