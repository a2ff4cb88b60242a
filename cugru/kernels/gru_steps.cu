// gru_steps.cu: the per-step path (the patent's structure): one launch of a pointwise kernel
// per step and pass; the recurrent products between them are cuBLAS GEMMs (cugru/_plan.py,
// StepsPlan). Maths and buffers: gru_common.cuh. Besides them:
//   gh    (D, B, 3H)     recurrent product of the current step, bias not added (one GEMM)
//   dh    (D, B, H)      carried gradient of h: read, then overwritten with dh * z
// Grid (ceil(B*H / blockDim.x), n): one thread per (b, j) of one direction, for directions
// d0 .. d0 + n - 1 of the pass's D: both in the same launch (d0 = 0, n = D), or each
// direction in launches of its own (n = 1), on a stream of its own (StepsPlan's streams).
//
// P is the products' element type: T, or double for float data whose products run in
// float64 (cugru/_plan.py, wide_products: the operands widened exactly, the sums kept in
// float64, each product rounded once to float where a cell reads it). Then gh and dh are
// double, and so is the projection gi (GI: double, or T where the pass projects in T, for
// few inputs: cugru/_plan.py, wide_projection); the gate gradients dgi and dgh are stored
// as double (the tail's products run in float64 on them, and each backward step's product
// reads dgh's slot); and the forward kernel also writes what the next step's product
// reads, widened:
//   hw    (2, D, B, H)   forward: h after step s into slot (s + 1) % 2 (slot 0: h0)
#include "gru_common.cuh"

template <typename T, bool TRAIN, bool QAT, typename P, typename GI>
__global__ void gru_forward_step(const GI* __restrict__ gi, const P* __restrict__ gh,
                                 const T* __restrict__ b_ih, const T* __restrict__ b_hh,
                                 T* __restrict__ hs, T* __restrict__ y, T* __restrict__ gates,
                                 P* __restrict__ hw, const int* __restrict__ lengths,
                                 int steps, int B, int H, int S, int D, int d0, int s,
                                 T q_scale, T q_inv, T q_lo, T q_hi, int q_flags) {
    const int d = d0 + blockIdx.y;
    const long long BH = (long long)B * H, H3 = 3LL * H;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BH) return;
    const int b = (int)(i / H), j = (int)(i - (long long)b * H);
    const int t = gru_time(d, steps, s);
    const GI* gi_row = gi + ((long long)t * B + b) * D * H3 + d * H3;
    const P* gh_row = gh + ((long long)d * B + b) * H3;
    const T* bi = b_ih + d * H3;
    const T* bh = b_hh + d * H3;
    const T h = hs[((long long)d * S + s % S) * BH + i];
    const T hn = T(gh_row[2 * H + j]) + bh[2 * H + j];
    T r, z, n;
    const bool run = t < gru_length(lengths, b, steps);
    const T h_new = gru_cell<QAT>(T(gi_row[j]) + bi[j], T(gi_row[H + j]) + bi[H + j],
                                  T(gi_row[2 * H + j]) + bi[2 * H + j], T(gh_row[j]) + bh[j],
                                  T(gh_row[H + j]) + bh[H + j], hn, h, r, z, n, GRU_QUANT(T),
                                  run);
    gru_write_forward<T, TRAIN>(hs, y, gates, h_new, run, r, z, n, hn, d, D, s, t, b, j, steps,
                                B, H, S);
    if (hw) hw[((long long)((s + 1) & 1) * D + d) * BH + i] = P(h_new);
}

template <typename T, bool QAT, typename P>
__global__ void gru_backward_step(const T* __restrict__ dy, const T* __restrict__ gates,
                                  const T* __restrict__ hs, P* dh, P* __restrict__ dgi,
                                  P* __restrict__ dgh, const int* __restrict__ lengths,
                                  int steps, int B, int H, int D, int d0,
                                  int s, T q_scale, T q_inv, T q_lo, T q_hi, int q_flags) {
    const int d = d0 + blockIdx.y;
    const long long BH = (long long)B * H;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BH) return;
    const int b = (int)(i / H), j = (int)(i - (long long)b * H);
    const int t = gru_time(d, steps, s);
    T r, z, n, hn, h, dr, dz, dn, r_used;
    gru_read_history(gates, hs, d, s, b, j, steps, B, H, r, z, n, hn, h);
    const bool run = t < gru_length(lengths, b, steps);
    const T carry = T(dh[d * BH + i]);
    const T dhv = run ? dy[((long long)t * B + b) * D * H + (long long)d * H + j] + carry : carry;
    const T dhz = gru_cell_backward<QAT>(dhv, r, z, n, hn, h, dr, dz, dn, r_used, GRU_QUANT(T),
                                         run);
    gru_write_backward(dgi, dgh, dr, dz, dn, r_used, d, D, s, t, b, j, steps, B, H);
    dh[d * BH + i] = P(dhz);
}

// out[r*n + k] = OUT(in[r*in_stride + k]) for k < n, r < gridDim.y: the wide products'
// conversions (W_hh and h0 widened, the carried gradient widened and rounded back)
template <typename IN, typename OUT>
__global__ void gru_steps_convert(const IN* __restrict__ in, OUT* __restrict__ out,
                                  long long n, long long in_stride) {
    const long long r = blockIdx.y;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (long long)gridDim.x * blockDim.x)
        out[r * n + k] = OUT(in[r * in_stride + k]);
}
