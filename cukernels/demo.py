"""The main job (for now): train a small dense classifier on scikit-learn's handwritten digits
with cukernels alone, on the GPU when CuPy sees one, else on the CPU (numpy oracle path).

    python -m cukernels.demo [--device auto|gpu|cpu] [--epochs 30] [--optimizer adam] [--seed 0]

Model: 64 pixels -> dense 64 (tanh) -> dense 10 -> softmax, cross-entropy. Forward:
perceptron_feed_forward, tanh_activation, softmax_activation. Backward: calc_output_gradient
(code 2), softmax_derivative, calc_delta_weights, calc_hidden_gradient, tanh_derivative.
Update: any of the six optimizers (standard variant).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import cukernels as ck

OPTIMIZERS = ("sgd", "momentum", "adagrad", "rmsprop", "adadelta", "adam")
DEFAULT_LR = {"sgd": 0.1, "momentum": 0.02, "adagrad": 0.05, "rmsprop": 2e-3,
              "adadelta": 1.0, "adam": 3e-3}


def load_digits():
    try:
        from sklearn.datasets import load_digits as sk_digits
    except ImportError:
        sys.exit("the demo needs scikit-learn: pip install -e '.[demo]'")
    d = sk_digits()
    return (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)


class Param:
    """A weight matrix (N, I + 1) with its gradient accumulator and optimizer moments."""

    def __init__(self, xp, rng, n, i):
        w = rng.uniform(-1, 1, (n, i + 1)) * np.sqrt(3.0 / i)
        w[:, i] = 0.0
        self.w = xp.asarray(w.astype(np.float32))
        self.d = xp.zeros_like(self.w)
        self.m = [xp.zeros_like(self.w), xp.zeros_like(self.w)]

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


def train(device="auto", epochs=30, optimizer="adam", seed=0, batch=32, hidden=64, lr=None,
          verbose=True):
    if device == "auto":
        device = "gpu" if ck.gpu_available() else "cpu"
    if device == "gpu":
        if not ck.gpu_available():
            raise SystemExit("--device gpu: no CUDA GPU with CuPy on this machine")
        import cupy as xp
    else:
        xp = np
    lr = DEFAULT_LR[optimizer] if lr is None else lr
    X, y = load_digits()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(X))
    n_test = len(X) // 5
    test, tr = order[:n_test], order[n_test:]
    Xtr, ytr, Xte, yte = X[tr], y[tr], X[test], y[test]
    eye = np.eye(10, dtype=np.float32)
    l1, l2 = Param(xp, rng, hidden, 64), Param(xp, rng, 10, hidden)
    history, t, start = [], 0, time.perf_counter()
    for epoch in range(epochs):
        perm = rng.permutation(len(Xtr))
        losses = []
        for k in range(0, len(perm) - batch + 1, batch):
            idx = perm[k:k + batch]
            x, tgt = xp.asarray(Xtr[idx]), xp.asarray(eye[ytr[idx]])
            h = ck.tanh_activation(ck.perceptron_feed_forward(x, l1.w))
            p = ck.softmax_activation(ck.perceptron_feed_forward(h, l2.w))
            losses.append(float(-(tgt * xp.log(p + 1e-12)).sum()) / batch)
            g_out = ck.softmax_derivative(p, ck.calc_output_gradient(tgt, p, 2))
            ck.calc_delta_weights(h, l2.d, g_out)
            g_h = ck.tanh_derivative(h, ck.calc_hidden_gradient(l2.w, g_out))
            ck.calc_delta_weights(x, l1.d, g_h)
            t += 1
            l1.step(optimizer, batch, lr, t)
            l2.step(optimizer, batch, lr, t)
        h = ck.tanh_activation(ck.perceptron_feed_forward(xp.asarray(Xte), l1.w))
        pred = ck.perceptron_feed_forward(h, l2.w).argmax(axis=1)
        acc = float((xp.asarray(yte) == pred).mean())
        history.append((float(np.mean(losses)), acc))
        if verbose:
            print(f"epoch {epoch + 1:3d}  loss {history[-1][0]:.4f}  held-out accuracy {acc:.3f}")
    seconds = time.perf_counter() - start
    return {"device": device, "history": history, "accuracy": history[-1][1],
            "seconds": seconds, "seconds_per_epoch": seconds / epochs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--optimizer", choices=OPTIMIZERS, default="adam")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    r = train(args.device, args.epochs, args.optimizer, args.seed, lr=args.lr)
    print(f"device {r['device']}: held-out accuracy {r['accuracy']:.3f} after {args.epochs} "
          f"epochs, {r['seconds_per_epoch'] * 1e3:.0f} ms per epoch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
