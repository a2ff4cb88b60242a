// gru.cu: the per-step pointwise kernels of the GRU (torch.nn.GRU's maths, gate order r | z | n).
//
// Forward, for direction d at step s (time t = s for d = 0, t = T - 1 - s for d = 1):
//   r  = sigmoid((gi_r + b_ir) + (gh_r + b_hr))      gi = x_t W_ih^T, gh = h W_hh^T
//   z  = sigmoid((gi_z + b_iz) + (gh_z + b_hz))
//   hn = gh_n + b_hn
//   n  = tanh((gi_n + b_in) + r * hn)
//   h' = (1 - z) * n + z * h
// Backward (the patent's S1), with dh = dy_t + the carried gradient of h:
//   dn = dh (1 - z)(1 - n^2),  dz = dh (h - n) z (1 - z),  dr = dn hn r (1 - r)
//   d_gate_i = [dr, dz, dn],   d_gate_h = [dr, dz, dn r],  carry = dh z  (+ d_gate_h W_hh, a GEMM)
//
// Buffers, row-major, sizes T steps, B batch, H hidden, D directions:
//   gi    (T, B, D, 3H)  input projection of every time step, bias not added (one GEMM)
//   gh    (D, B, 3H)     recurrent product of the current step, bias not added (one GEMM)
//   hs    (D, S, B, H)   hidden states by step: slot s % S holds h before step s;
//                        S = T + 1 when training (all kept for backward), else S = 2
//   gates (D, T, B, 4H)  per step r | z | n | hn (training only): the saved history
//   y     (T, B, D*H)    outputs; direction d fills columns [d*H, (d+1)*H)
//   dgi   (T, B, D, 3H)  d_gate_i by time (the rows of x)
//   dgh   (D, T, B, 3H)  d_gate_h by step (the rows of hs)
//   dh    (D, B, H)      carried gradient of h: read, then overwritten with dh * z
// Launch: grid (ceil(B*H / blockDim.x), D), one thread per (b, j) of one direction; both
// directions run in the same launch. Offsets are long long (T*B*D*3H may pass 2^31).
#include "common.cuh"

template <typename T> __device__ __forceinline__ T gru_sigmoid(T v) {
    return T(1) / (T(1) + ck_exp(-v));
}

// the step's time index in direction d
__device__ __forceinline__ int gru_time(int d, int steps, int s) {
    return d == 0 ? s : steps - 1 - s;
}

template <typename T, bool TRAIN>
__global__ void gru_forward_step(const T* __restrict__ gi, const T* __restrict__ gh,
                                 const T* __restrict__ b_ih, const T* __restrict__ b_hh,
                                 T* __restrict__ hs, T* __restrict__ y, T* __restrict__ gates,
                                 int steps, int B, int H, int S, int s) {
    const int D = gridDim.y, d = blockIdx.y;
    const long long BH = (long long)B * H, H3 = 3LL * H;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BH) return;
    const int b = (int)(i / H), j = (int)(i - (long long)b * H);
    const int t = gru_time(d, steps, s);
    const T* gi_row = gi + ((long long)t * B + b) * D * H3 + d * H3;
    const T* gh_row = gh + ((long long)d * B + b) * H3;
    const T* bi = b_ih + d * H3;
    const T* bh = b_hh + d * H3;

    const T h = hs[((long long)d * S + s % S) * BH + i];
    const T r = gru_sigmoid((gi_row[j] + bi[j]) + (gh_row[j] + bh[j]));
    const T z = gru_sigmoid((gi_row[H + j] + bi[H + j]) + (gh_row[H + j] + bh[H + j]));
    const T hn = gh_row[2 * H + j] + bh[2 * H + j];
    const T n = ck_tanh((gi_row[2 * H + j] + bi[2 * H + j]) + r * hn);
    const T h_new = (T(1) - z) * n + z * h;

    hs[((long long)d * S + (s + 1) % S) * BH + i] = h_new;
    y[((long long)t * B + b) * D * H + (long long)d * H + j] = h_new;
    if (TRAIN) {
        T* g = gates + (((long long)d * steps + s) * B + b) * 4 * H;
        g[j] = r;
        g[H + j] = z;
        g[2 * H + j] = n;
        g[3 * H + j] = hn;
    }
}

template <typename T>
__global__ void gru_backward_step(const T* __restrict__ dy, const T* __restrict__ gates,
                                  const T* __restrict__ hs, T* dh, T* __restrict__ dgi,
                                  T* __restrict__ dgh, int steps, int B, int H, int s) {
    const int D = gridDim.y, d = blockIdx.y;
    const long long BH = (long long)B * H, H3 = 3LL * H;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BH) return;
    const int b = (int)(i / H), j = (int)(i - (long long)b * H);
    const int t = gru_time(d, steps, s);
    const T* g = gates + (((long long)d * steps + s) * B + b) * 4 * H;
    const T r = g[j], z = g[H + j], n = g[2 * H + j], hn = g[3 * H + j];
    const T h = hs[((long long)d * (steps + 1) + s) * BH + i];

    const T dhv = dy[((long long)t * B + b) * D * H + (long long)d * H + j] + dh[d * BH + i];
    const T dn = dhv * (T(1) - z) * (T(1) - n * n);
    const T dz = dhv * (h - n) * z * (T(1) - z);
    const T dr = dn * hn * r * (T(1) - r);

    T* gi_row = dgi + ((long long)t * B + b) * D * H3 + d * H3;
    gi_row[j] = dr;
    gi_row[H + j] = dz;
    gi_row[2 * H + j] = dn;
    T* gh_row = dgh + (((long long)d * steps + s) * B + b) * H3;
    gh_row[j] = dr;
    gh_row[H + j] = dz;
    gh_row[2 * H + j] = dn * r;
    dh[d * BH + i] = dhv * z;
}
