"""A kernel that writes one element past its array, launched as cukernels launches its own
(CuPy RawModule, memory pool off). The GPU script runs it under compute-sanitizer memcheck
and expects a report: proof that the sanitizer runs can see an out-of-bounds access here."""
import cupy as cp

cp.cuda.set_allocator(None)
src = 'extern "C" __global__ void oob(float* a, int n) { if (threadIdx.x == 0) a[n] = 1.0f; }'
a = cp.zeros(1000, dtype=cp.float32)
cp.RawModule(code=src).get_function("oob")((1,), (32,), (a, cp.int32(a.size)))
cp.cuda.Device().synchronize()
print("planted kernel ran")
