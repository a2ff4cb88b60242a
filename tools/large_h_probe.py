"""Where a large-H train step's time goes on the per-step path, and two ways of
speeding it up measured against the float32 products it runs now.

    python tools/large_h_probe.py [S10 S9 S8 ...]   (GPU needed; default S10 S9)

For each shape (bench/shapes.py's SHAPES, or the off-table OFF_TABLE ids): the forward pass
with history and the backward pass (events around back-to-back calls), the backward's tail
(dx and the weight gradients) and the weight gradients alone; then the weight gradients'
row chunking (cugru._passes.WGRAD_CHUNKS, WGRAD_PARTIAL_BYTES) varied, each with the
backward's time and the normwise error of dW_ih and dW_hh against the float64 pass.

The passes run with their products in float32 (cugru._plan.WIDE off): the float32 tail and
its chunks are what this measures; where a pass is wide its tail runs in float64, in one
product per result, and has no chunks (tools/tail_probe.py measures those products).

Last, "split TF32" (each float32 operand as a TF32 high part plus a TF32 low part, three
TF32 products summed on tensor cores: a_hi b_hi + a_lo b_hi + a_hi b_lo) against cuBLAS'
float32 GEMM on the products of S9 and S10: time, and the normwise error against float64.
"""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: the products timed for split TF32: name -> (M, K, N) of a row-major (M, K) @ (K, N)
PRODUCTS = {"S10 step (B x 3H, K = H)": (256, 512, 1536),
            "S10 projection (TB x 3H, K = I)": (12800, 512, 1536),
            "S10 weight gradient (3H x (I+H), K = TB)": (1536, 12800, 1024),
            "S9 step (B x 3H, K = H)": (64, 1024, 3072),
            "S9 weight gradient (3H x (I+H), K = TB)": (3072, 6400, 2048)}

_SPLIT = r'''
extern "C" __global__ void split_tf32(const float* a, float* hi, float* lo, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = a[i];
  unsigned h, l;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(h) : "f"(v));
  float rest = v - __uint_as_float(h);
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(l) : "f"(rest));
  hi[i] = __uint_as_float(h);
  lo[i] = __uint_as_float(l);
}
'''


def event_ms(cp, fn, n=10):
    for _ in range(2):
        fn()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / n


def normwise(cp, got, ref):
    return float(cp.abs(got - ref).max() / cp.abs(ref).max())


def step_parts(cp, sid, shape):
    import cugru
    from bench.shapes import make_problem
    from cugru import _passes
    T, B, I, H, bi = shape
    prob = make_problem(T, B, I, H, bi)
    g = {k: cp.asarray(v) for k, v in prob.items() if k != "bi"}

    def run(dt):
        a = {k: v.astype(dt) for k, v in g.items()}
        w = (a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])
        return a, (lambda: cugru.gru_forward(a["x"], a["h0"], *w, bidirectional=bi))
    a, forward = run(np.float32)
    saved = forward()[2]
    backward = lambda: cugru.gru_backward(a["dy"], None, saved)  # noqa: E731
    t_fwd, t_bwd = event_ms(cp, forward), event_ms(cp, backward)
    spans = {"tail": [], "weight gradients": []}

    def timed(fn, name):
        def wrapped(*args, **kw):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            out = fn(*args, **kw)
            end.record()
            end.synchronize()
            spans[name].append(cp.cuda.get_elapsed_time(start, end))
            return out
        return wrapped
    real_tail, real_wg = _passes.tail, _passes.weight_grads
    _passes.tail = timed(real_tail, "tail")
    _passes.weight_grads = timed(real_wg, "weight gradients")
    try:
        for _ in range(5):
            backward()
    finally:
        _passes.tail, _passes.weight_grads = real_tail, real_wg
    print(f"{sid} {shape}: forward with history {t_fwd:.3f} ms, backward {t_bwd:.3f} ms "
          f"(tail {np.median(spans['tail']):.3f}, of it the weight gradients "
          f"{np.median(spans['weight gradients']):.3f})")
    a64, forward64 = run(np.float64)
    ref = cugru.gru_backward(a64["dy"], None, forward64()[2])
    kept = _passes.WGRAD_CHUNKS, _passes.WGRAD_PARTIAL_BYTES
    try:
        for chunks, partial in ((8, kept[1]), (8, 1 << 31), (16, 1 << 31), (1, 0)):
            _passes.WGRAD_CHUNKS, _passes.WGRAD_PARTIAL_BYTES = chunks, partial
            t = event_ms(cp, backward)
            got = backward()
            print(f"  {chunks:2d} chunks, partials up to {partial >> 20:5d} MiB: backward "
                  f"{t:.3f} ms, dW_ih error {normwise(cp, got[2], ref[2]):.2e}, dW_hh "
                  f"{normwise(cp, got[3], ref[3]):.2e}")
    finally:
        _passes.WGRAD_CHUNKS, _passes.WGRAD_PARTIAL_BYTES = kept


def split_tf32(cp):
    from cupy_backends.cuda.libs import cublas
    handle = cp.cuda.device.get_cublas_handle()
    one = np.array(1.0, np.float32)
    compute = {"float32": 68, "tf32": 77}   # CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32
    split = cp.RawKernel(_SPLIT, "split_tf32")

    def parts(a):
        hi, lo = cp.empty_like(a), cp.empty_like(a)
        split(((a.size + 255) // 256,), (256,), (a, hi, lo, np.int64(a.size)))
        return hi, lo

    def gemm(A, B, C, kind, beta=0.0):
        """row-major C (M, N) = A (M, K) @ B (K, N) + beta C"""
        (M, K), N = A.shape, B.shape[1]
        b = np.array(beta, np.float32)
        cublas.gemmEx(handle, 0, 0, N, M, K, one.ctypes.data, B.data.ptr, 0, N, A.data.ptr,
                      0, K, b.ctypes.data, C.data.ptr, 0, N, compute[kind], -1)
    rng = np.random.default_rng(0)
    print("split TF32 against cuBLAS' float32 GEMM: µs per product, normwise error "
          "against float64")
    for name, (M, K, N) in PRODUCTS.items():
        a = rng.uniform(-1, 1, (M, K)).astype(np.float32)
        b = rng.uniform(-0.1, 0.1, (K, N)).astype(np.float32)
        ref = cp.asarray(a.astype(np.float64) @ b.astype(np.float64))
        A, B, C = cp.asarray(a), cp.asarray(b), cp.empty((M, N), np.float32)
        t32 = event_ms(cp, lambda: gemm(A, B, C, "float32"), 50) * 1e3
        e32 = normwise(cp, C, ref)
        gemm(A, B, C, "tf32")
        e_tf = normwise(cp, C, ref)
        (a_hi, a_lo), (b_hi, b_lo) = parts(A), parts(B)
        # one product over 3K terms: [a_hi | a_lo | a_hi] @ [b_hi; b_hi; b_lo]
        A3 = cp.concatenate([a_hi, a_lo, a_hi], axis=1)
        B3 = cp.concatenate([b_hi, b_hi, b_lo], axis=0)
        t3 = event_ms(cp, lambda: gemm(A3, B3, C, "tf32"), 50) * 1e3
        e3 = normwise(cp, C, ref)

        def three():
            gemm(a_lo, b_hi, C, "tf32")
            gemm(a_hi, b_lo, C, "tf32", 1.0)
            gemm(a_hi, b_hi, C, "tf32", 1.0)
        t3s = event_ms(cp, three, 50) * 1e3
        e3s = normwise(cp, C, ref)
        print(f"  {name:42s} float32 {t32:7.1f} µs ({e32:.1e}) | one TF32 product "
              f"({e_tf:.1e}) | split, one product of 3K {t3:7.1f} µs ({e3:.1e}) | split, "
              f"three products {t3s:7.1f} µs ({e3s:.1e})")


def main(argv):
    import cupy as cp

    from bench.offtable import OFF_TABLE
    from bench.shapes import SHAPES
    from cugru import _plan
    table = {**SHAPES, **{k: v[0] for k, v in OFF_TABLE.items()}}
    _plan.WIDE = False      # (the float32 products and tail: the module docstring)
    for sid in argv or ["S10", "S9"]:
        step_parts(cp, sid, table[sid])
    split_tf32(cp)


if __name__ == "__main__":
    main(sys.argv[1:])
