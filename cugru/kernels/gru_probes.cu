// gru_probes.cu: barriers alone, for the benchmark (bench/gru.py): the floor of a
// persistent pass's step is one barrier of its scope, timed here with nothing else.
#include "gru_common.cuh"

// n barriers of a block (C = 1) or of a thread-block cluster of C blocks: the tile kernels'
// scope at block and cluster scope (GRU_TILE_MAX_THREADS: the most threads a tile kernel's
// block has)
template <int C>
__global__ void __launch_bounds__(GRU_TILE_MAX_THREADS, 1) GRU_CLUSTER_DIMS(C)
gru_cluster_barrier_probe(int n) {
    for (int i = 0; i < n; ++i) gru_cluster_barrier<C>();
}

// n barriers through a counter in global memory across the gridDim.x blocks of each grid row
// (a cooperative launch): the persist kernels' barrier, and the tile kernels' at grid scope
__global__ void __launch_bounds__(GRU_PERSIST_THREADS, 1)
gru_counter_barrier_probe(unsigned int* barrier, int n) {
    unsigned int target = 0;
    for (int i = 0; i < n; ++i) gru_group_barrier(barrier + blockIdx.y, gridDim.x, target);
}
