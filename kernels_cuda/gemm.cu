/* Chapter 2 on the GPU: C = A B, one rung of the ladder per kernel.
 *
 * Every kernel takes row-major, contiguous A (M x K), B (K x N) and writes C (M x N); the
 * kernels from rung 5 on also come as *_nt (B given as N x K: A B^T) and *_tn (A given as
 * K x M: A^T B). Sizes need not be multiples of any tile: loads outside the matrix read zeros,
 * stores outside it are skipped. tests/test_cuda_emu.py runs this file on the CPU.
 *
 * The file includes no header: NVRTC ships none, and the CUDA headers (cuda_bf16.h, mma.h) are
 * not in every CuPy install. bf16 values travel as their 16 raw bits (unsigned short), and the
 * tensor cores are reached through the PTX instructions that mma.h itself emits.
 */

typedef unsigned short bf16;  /* the top 16 bits of a float32 */

/* --8<-- [start:naive] */
/* Rung 0: one thread per element of C, threadIdx.x walking down a column of C. The 32 threads
 * of a warp read 32 different rows of A, K*4 bytes apart: 32 memory transactions where one
 * would do, and the same for their 32 stores into C. */
extern "C" __global__ void sgemm_naive(int M, int N, int K, const float *A, const float *B,
                                       float *C)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int j = blockIdx.y * blockDim.y + threadIdx.y;
    if (i >= M || j >= N) return;
    float sum = 0.0f;
    for (int k = 0; k < K; k++) sum += A[(size_t)i * K + k] * B[(size_t)k * N + j];
    C[(size_t)i * N + j] = sum;
}
/* --8<-- [end:naive] */

/* --8<-- [start:coalesced] */
/* Rung 1: the same loop with threadIdx.x walking along a row of C. Now a warp reads one A
 * element (a broadcast) and 32 neighbouring B elements, one 128-byte line, per k. */
extern "C" __global__ void sgemm_coalesced(int M, int N, int K, const float *A, const float *B,
                                           float *C)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    int i = blockIdx.y * blockDim.y + threadIdx.y;
    if (i >= M || j >= N) return;
    float sum = 0.0f;
    for (int k = 0; k < K; k++) sum += A[(size_t)i * K + k] * B[(size_t)k * N + j];
    C[(size_t)i * N + j] = sum;
}
/* --8<-- [end:coalesced] */

/* --8<-- [start:smem] */
/* Rung 2: a 32 x 32 block of threads stages 32 x 32 tiles of A and B in shared memory, so each
 * element fetched from global memory is used 32 times instead of once. Launch with 32 x 32
 * threads. */
#define SM_TILE 32
extern "C" __global__ void sgemm_smem(int M, int N, int K, const float *A, const float *B,
                                      float *C)
{
    __shared__ float As[SM_TILE][SM_TILE];
    __shared__ float Bs[SM_TILE][SM_TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int i = blockIdx.y * SM_TILE + ty;
    int j = blockIdx.x * SM_TILE + tx;
    float sum = 0.0f;
    for (int k0 = 0; k0 < K; k0 += SM_TILE) {
        As[ty][tx] = (i < M && k0 + tx < K) ? A[(size_t)i * K + k0 + tx] : 0.0f;
        Bs[ty][tx] = (k0 + ty < K && j < N) ? B[(size_t)(k0 + ty) * N + j] : 0.0f;
        __syncthreads();
        for (int k = 0; k < SM_TILE; k++) sum += As[ty][k] * Bs[k][tx];  /* As: broadcast */
        __syncthreads();
    }
    if (i < M && j < N) C[(size_t)i * N + j] = sum;
}
/* --8<-- [end:smem] */

/* --8<-- [start:block1d] */
/* Rung 3: each thread computes B1_TM = 8 elements of one column of C. A value of B read from
 * shared memory now feeds 8 FMAs (it sits in a register), so shared-memory traffic per FMA
 * drops from 2 loads to 1 + 1/8. Block tile 64 x 64, k-step 8; launch with 512 threads. */
#define B1_BM 64
#define B1_BN 64
#define B1_BK 8
#define B1_TM 8
extern "C" __global__ void __launch_bounds__(512)
sgemm_block1d(int M, int N, int K, const float *A, const float *B, float *C)
{
    __shared__ float As[B1_BM * B1_BK];  /* [row][k] */
    __shared__ float Bs[B1_BK * B1_BN];  /* [k][col] */
    int t = threadIdx.x;
    int bm = blockIdx.y * B1_BM, bn = blockIdx.x * B1_BN;
    int tcol = t % B1_BN, trow = t / B1_BN;  /* trow in 0..7: rows trow*8 .. trow*8+7 */
    int ar = t / B1_BK, ac = t % B1_BK;     /* one A element per thread: 64 x 8 = 512 */
    int br = t / B1_BN, bc = t % B1_BN;     /* one B element per thread: 8 x 64 = 512 */
    float acc[B1_TM] = {0.0f};
    for (int k0 = 0; k0 < K; k0 += B1_BK) {
        As[t] = (bm + ar < M && k0 + ac < K) ? A[(size_t)(bm + ar) * K + k0 + ac] : 0.0f;
        Bs[t] = (k0 + br < K && bn + bc < N) ? B[(size_t)(k0 + br) * N + bn + bc] : 0.0f;
        __syncthreads();
        for (int k = 0; k < B1_BK; k++) {
            float b = Bs[k * B1_BN + tcol];
#pragma unroll
            for (int m = 0; m < B1_TM; m++) acc[m] += As[(trow * B1_TM + m) * B1_BK + k] * b;
        }
        __syncthreads();
    }
    int j = bn + tcol;
#pragma unroll
    for (int m = 0; m < B1_TM; m++) {
        int i = bm + trow * B1_TM + m;
        if (i < M && j < N) C[(size_t)i * N + j] = acc[m];
    }
}
/* --8<-- [end:block1d] */

/* --8<-- [start:block2d] */
/* Rung 4: each thread computes an 8 x 8 block of C from 8 values of A and 8 of B held in
 * registers: 64 FMAs for 16 shared-memory loads. Block tile 128 x 128, k-step 8; launch with
 * 256 threads (16 x 16 threads, each 8 x 8 elements). */
#define B2_BM 128
#define B2_BN 128
#define B2_BK 8
#define B2_TM 8
#define B2_TN 8
extern "C" __global__ void __launch_bounds__(256)
sgemm_block2d(int M, int N, int K, const float *A, const float *B, float *C)
{
    __shared__ float As[B2_BM * B2_BK];  /* [row][k] */
    __shared__ float Bs[B2_BK * B2_BN];  /* [k][col] */
    int t = threadIdx.x;
    int bm = blockIdx.y * B2_BM, bn = blockIdx.x * B2_BN;
    int trow = t / (B2_BN / B2_TN), tcol = t % (B2_BN / B2_TN);
    float acc[B2_TM][B2_TN] = {{0.0f}};
    float a[B2_TM], b[B2_TN];
    for (int k0 = 0; k0 < K; k0 += B2_BK) {
        for (int e = t; e < B2_BM * B2_BK; e += 256) {  /* 4 elements of each tile per thread */
            int r = e / B2_BK, c = e % B2_BK;
            As[e] = (bm + r < M && k0 + c < K) ? A[(size_t)(bm + r) * K + k0 + c] : 0.0f;
            r = e / B2_BN; c = e % B2_BN;
            Bs[e] = (k0 + r < K && bn + c < N) ? B[(size_t)(k0 + r) * N + bn + c] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < B2_BK; k++) {
#pragma unroll
            for (int m = 0; m < B2_TM; m++) a[m] = As[(trow * B2_TM + m) * B2_BK + k];
#pragma unroll
            for (int n = 0; n < B2_TN; n++) b[n] = Bs[k * B2_BN + tcol * B2_TN + n];
#pragma unroll
            for (int m = 0; m < B2_TM; m++)
#pragma unroll
                for (int n = 0; n < B2_TN; n++) acc[m][n] += a[m] * b[n];
        }
        __syncthreads();
    }
#pragma unroll
    for (int m = 0; m < B2_TM; m++) {
        int i = bm + trow * B2_TM + m;
#pragma unroll
        for (int n = 0; n < B2_TN; n++) {
            int j = bn + tcol * B2_TN + n;
            if (i < M && j < N) C[(size_t)i * N + j] = acc[m][n];
        }
    }
}
/* --8<-- [end:block2d] */

/* --8<-- [start:vec] */
/* Rung 5: rung 4 with 16-byte accesses. Both tiles are kept k-major in shared memory (A is
 * transposed on its way in), so a thread's 8 values of A and 8 of B are two float4 loads each;
 * global loads and the stores into C are float4 where the row is long enough and 16-byte
 * aligned. The same body serves A B, A B^T and A^T B: only how a tile is fetched changes.
 *
 * load_kcontig: tile element (x, k) sits at g[x * ld + k] (contiguous along k): A of A B.
 * load_xcontig: tile element (x, k) sits at g[k * ld + x] (contiguous along x): B of A B.
 * Both fill s[k * 128 + x] for a 128 (x) by 8 (k) tile, one float4 per thread. */
#define V_BM 128
#define V_BN 128
#define V_BK 8
#define V_T 8

__device__ __forceinline__ bool aligned16(const void *p, int ld)
{
    return ((unsigned long long)p & 15) == 0 && (ld & 3) == 0;
}

__device__ __forceinline__ void load_kcontig(float *s, const float *g, int ld, int X, int Kd,
                                             int x0, int k0, bool vec)
{
    int t = threadIdx.x;
    int x = t >> 1, k = (t & 1) * 4;          /* 128 rows x 2 float4 */
    int gx = x0 + x, gk = k0 + k;
    float v[4];
    if (vec && gx < X && gk + 3 < Kd) {
        float4 q = *(const float4 *)(g + (size_t)gx * ld + gk);
        v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
    } else {
        for (int q = 0; q < 4; q++)
            v[q] = (gx < X && gk + q < Kd) ? g[(size_t)gx * ld + gk + q] : 0.0f;
    }
    for (int q = 0; q < 4; q++) s[(k + q) * 128 + x] = v[q];  /* transpose into k-major */
}

__device__ __forceinline__ void load_xcontig(float *s, const float *g, int ld, int X, int Kd,
                                             int x0, int k0, bool vec)
{
    int t = threadIdx.x;
    int k = t >> 5, x = (t & 31) * 4;         /* 8 rows x 32 float4 */
    int gx = x0 + x, gk = k0 + k;
    float4 q;
    if (vec && gk < Kd && gx + 3 < X) {
        q = *(const float4 *)(g + (size_t)gk * ld + gx);
    } else {
        const float *row = g + (size_t)gk * ld;
        bool ok = gk < Kd;
        q.x = (ok && gx + 0 < X) ? row[gx + 0] : 0.0f;
        q.y = (ok && gx + 1 < X) ? row[gx + 1] : 0.0f;
        q.z = (ok && gx + 2 < X) ? row[gx + 2] : 0.0f;
        q.w = (ok && gx + 3 < X) ? row[gx + 3] : 0.0f;
    }
    *(float4 *)(s + k * 128 + x) = q;
}

/* Write a thread's 8 x 8 block of C at (i0, j0), float4 where the row allows it. */
__device__ __forceinline__ void sgemm_store(const float (&acc)[V_T][V_T], float *C, int M,
                                            int N, int i0, int j0)
{
    bool vc = aligned16(C, N);
#pragma unroll
    for (int m = 0; m < V_T; m++) {
        int i = i0 + m;
        if (i >= M) break;
        float *row = C + (size_t)i * N;
#pragma unroll
        for (int n = 0; n < V_T; n += 4) {
            int j = j0 + n;
            if (vc && j + 3 < N) {
                *(float4 *)(row + j) = make_float4(acc[m][n], acc[m][n + 1], acc[m][n + 2],
                                                   acc[m][n + 3]);
            } else {
#pragma unroll
                for (int q = 0; q < 4; q++)
                    if (j + q < N) row[j + q] = acc[m][n + q];
            }
        }
    }
}

/* TA: A is given as K x M (we compute A^T B); TB: B is given as N x K (we compute A B^T). */
template <bool TA, bool TB>
__device__ __forceinline__ void sgemm_vec_body(int M, int N, int K, const float *A,
                                               const float *B, float *C)
{
    __shared__ __align__(16) float As[V_BK * V_BM];  /* [k][row] */
    __shared__ __align__(16) float Bs[V_BK * V_BN];  /* [k][col] */
    int t = threadIdx.x;
    int bm = blockIdx.y * V_BM, bn = blockIdx.x * V_BN;
    int trow = t / (V_BN / V_T), tcol = t % (V_BN / V_T);
    int lda = TA ? M : K, ldb = TB ? K : N;
    bool va = aligned16(A, lda), vb = aligned16(B, ldb);
    float acc[V_T][V_T] = {{0.0f}};
    float a[V_T], b[V_T];
    for (int k0 = 0; k0 < K; k0 += V_BK) {
        if (TA) load_xcontig(As, A, lda, M, K, bm, k0, va);
        else    load_kcontig(As, A, lda, M, K, bm, k0, va);
        if (TB) load_kcontig(Bs, B, ldb, N, K, bn, k0, vb);
        else    load_xcontig(Bs, B, ldb, N, K, bn, k0, vb);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < V_BK; k++) {
            float4 a0 = *(const float4 *)(As + k * V_BM + trow * V_T);
            float4 a1 = *(const float4 *)(As + k * V_BM + trow * V_T + 4);
            float4 b0 = *(const float4 *)(Bs + k * V_BN + tcol * V_T);
            float4 b1 = *(const float4 *)(Bs + k * V_BN + tcol * V_T + 4);
            a[0] = a0.x; a[1] = a0.y; a[2] = a0.z; a[3] = a0.w;
            a[4] = a1.x; a[5] = a1.y; a[6] = a1.z; a[7] = a1.w;
            b[0] = b0.x; b[1] = b0.y; b[2] = b0.z; b[3] = b0.w;
            b[4] = b1.x; b[5] = b1.y; b[6] = b1.z; b[7] = b1.w;
#pragma unroll
            for (int m = 0; m < V_T; m++)
#pragma unroll
                for (int n = 0; n < V_T; n++) acc[m][n] += a[m] * b[n];
        }
        __syncthreads();
    }
    sgemm_store(acc, C, M, N, bm + trow * V_T, bn + tcol * V_T);
}

/* Launch with 256 threads and grid (ceil(N / 128), ceil(M / 128)). */
extern "C" __global__ void __launch_bounds__(256)
sgemm_vec(int M, int N, int K, const float *A, const float *B, float *C)
{
    sgemm_vec_body<false, false>(M, N, K, A, B, C);
}
/* --8<-- [end:vec] */

extern "C" __global__ void __launch_bounds__(256)
sgemm_vec_nt(int M, int N, int K, const float *A, const float *B, float *C)
{
    sgemm_vec_body<false, true>(M, N, K, A, B, C);
}

extern "C" __global__ void __launch_bounds__(256)
sgemm_vec_tn(int M, int N, int K, const float *A, const float *B, float *C)
{
    sgemm_vec_body<true, false>(M, N, K, A, B, C);
}

/* --8<-- [start:prefetch] */
/* Rung 6: rung 5 with the next k-tile's global loads in flight while the current one is
 * multiplied. Two shared buffers: at step kt a thread issues its loads of tile kt+1 into
 * registers, runs the 16 k-steps of tile kt from one buffer, then writes the registers into
 * the other buffer; one barrier per tile instead of two, and the ~600-cycle trip to memory
 * is hidden behind 16 x 64 FMAs a thread. k-step 16: 4 x 8 KB of shared memory.
 *
 * fetch_* load a 128 (x) by 16 (k) tile into registers (2 float4 a thread), store_* write
 * them k-major, as load_kcontig / load_xcontig do for 8-deep tiles. */
#define P_BK 16

__device__ __forceinline__ float4 fetch4(const float *g, int ld, int gr, int gc, int rows,
                                         int cols, bool vec)
{   /* 4 consecutive elements (gr, gc..gc+3) of a rows x cols matrix, zeros outside it */
    const float *p = g + (size_t)gr * ld + gc;
    if (vec && gr < rows && gc + 3 < cols) return *(const float4 *)p;
    float4 q;
    q.x = (gr < rows && gc + 0 < cols) ? p[0] : 0.0f;
    q.y = (gr < rows && gc + 1 < cols) ? p[1] : 0.0f;
    q.z = (gr < rows && gc + 2 < cols) ? p[2] : 0.0f;
    q.w = (gr < rows && gc + 3 < cols) ? p[3] : 0.0f;
    return q;
}

/* element (x, k) at g[x * ld + k]: chunk e covers x = e / 4, k = (e % 4) * 4 .. +3 */
__device__ __forceinline__ void fetch_kcontig(float4 (&r)[2], const float *g, int ld, int X,
                                              int Kd, int x0, int k0, bool vec)
{
    for (int p = 0; p < 2; p++) {
        int e = threadIdx.x + 256 * p;
        r[p] = fetch4(g, ld, x0 + e / 4, k0 + (e % 4) * 4, X, Kd, vec);
    }
}

__device__ __forceinline__ void store_kcontig(float *s, const float4 (&r)[2])
{
    for (int p = 0; p < 2; p++) {
        int e = threadIdx.x + 256 * p, x = e / 4, k = (e % 4) * 4;
        s[(k + 0) * 128 + x] = r[p].x;
        s[(k + 1) * 128 + x] = r[p].y;
        s[(k + 2) * 128 + x] = r[p].z;
        s[(k + 3) * 128 + x] = r[p].w;
    }
}

/* element (x, k) at g[k * ld + x]: chunk e covers k = e / 32, x = (e % 32) * 4 .. +3 */
__device__ __forceinline__ void fetch_xcontig(float4 (&r)[2], const float *g, int ld, int X,
                                              int Kd, int x0, int k0, bool vec)
{
    for (int p = 0; p < 2; p++) {
        int e = threadIdx.x + 256 * p;
        r[p] = fetch4(g, ld, k0 + e / 32, x0 + (e % 32) * 4, Kd, X, vec);
    }
}

__device__ __forceinline__ void store_xcontig(float *s, const float4 (&r)[2])
{
    for (int p = 0; p < 2; p++) {
        int e = threadIdx.x + 256 * p;
        *(float4 *)(s + (e / 32) * 128 + (e % 32) * 4) = r[p];
    }
}

template <bool TA, bool TB>
__device__ __forceinline__ void sgemm_prefetch_body(int M, int N, int K, const float *A,
                                                    const float *B, float *C)
{
    __shared__ __align__(16) float As[2][P_BK * V_BM];  /* [buffer][k][row] */
    __shared__ __align__(16) float Bs[2][P_BK * V_BN];  /* [buffer][k][col] */
    int t = threadIdx.x;
    int bm = blockIdx.y * V_BM, bn = blockIdx.x * V_BN;
    int trow = t / (V_BN / V_T), tcol = t % (V_BN / V_T);
    int lda = TA ? M : K, ldb = TB ? K : N;
    bool va = aligned16(A, lda), vb = aligned16(B, ldb);
    float acc[V_T][V_T] = {{0.0f}};
    float4 ra[2], rb[2];
    int tiles = (K + P_BK - 1) / P_BK;
    for (int kt = 0; kt <= tiles; kt++) {
        /* step kt: fetch tile kt (if any), multiply tile kt-1 (if any), store tile kt */
        if (kt < tiles) {
            if (TA) fetch_xcontig(ra, A, lda, M, K, bm, kt * P_BK, va);
            else    fetch_kcontig(ra, A, lda, M, K, bm, kt * P_BK, va);
            if (TB) fetch_kcontig(rb, B, ldb, N, K, bn, kt * P_BK, vb);
            else    fetch_xcontig(rb, B, ldb, N, K, bn, kt * P_BK, vb);
        }
        if (kt > 0) {
            const float *as = As[(kt - 1) & 1], *bs = Bs[(kt - 1) & 1];
#pragma unroll
            for (int k = 0; k < P_BK; k++) {
                float4 a0 = *(const float4 *)(as + k * V_BM + trow * V_T);
                float4 a1 = *(const float4 *)(as + k * V_BM + trow * V_T + 4);
                float4 b0 = *(const float4 *)(bs + k * V_BN + tcol * V_T);
                float4 b1 = *(const float4 *)(bs + k * V_BN + tcol * V_T + 4);
                float a[V_T] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
                float b[V_T] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
                for (int m = 0; m < V_T; m++)
#pragma unroll
                    for (int n = 0; n < V_T; n++) acc[m][n] += a[m] * b[n];
            }
        }
        if (kt < tiles) {
            /* buffer kt&1 was last read at step kt-1, before the barrier that ended it */
            if (TA) store_xcontig(As[kt & 1], ra);
            else    store_kcontig(As[kt & 1], ra);
            if (TB) store_kcontig(Bs[kt & 1], rb);
            else    store_xcontig(Bs[kt & 1], rb);
        }
        __syncthreads();
    }
    sgemm_store(acc, C, M, N, bm + trow * V_T, bn + tcol * V_T);
}

/* Launch with 256 threads and grid (ceil(N / 128), ceil(M / 128)). */
extern "C" __global__ void __launch_bounds__(256)
sgemm_prefetch(int M, int N, int K, const float *A, const float *B, float *C)
{
    sgemm_prefetch_body<false, false>(M, N, K, A, B, C);
}
/* --8<-- [end:prefetch] */

extern "C" __global__ void __launch_bounds__(256)
sgemm_prefetch_nt(int M, int N, int K, const float *A, const float *B, float *C)
{
    sgemm_prefetch_body<false, true>(M, N, K, A, B, C);
}

extern "C" __global__ void __launch_bounds__(256)
sgemm_prefetch_tn(int M, int N, int K, const float *A, const float *B, float *C)
{
    sgemm_prefetch_body<true, false>(M, N, K, A, B, C);
}

/* --8<-- [start:wmma] */
/* Rung 7: bf16 inputs on the tensor cores, f32 sums. One warp instruction multiplies a 16 x 16
 * by a 16 x 16 bf16 tile (8192 FLOP): the fragments are spread over the warp's registers in a
 * layout only the hardware knows, so we load, multiply and store them with the wmma
 * instructions and never touch their elements.
 *
 * Block tile 128 x 128, k-step 64 (36 KB of shared tiles), 8 warps as 2 (rows) x 4 (columns),
 * each warp 64 x 32 of C: 4 x 2 accumulator tiles of 8 floats a thread. Shared rows are padded
 * by 8 elements (16 bytes) so the 8 rows a wmma load reads at once fall in 8 different groups
 * of 4 banks. */
#ifndef SMALLEM_EMU  /* tests/cuda_emu/emu.h replaces these to run the file on a CPU */
struct FragA { unsigned r[4]; };  /* 16 x 16 bf16: two bf16 per 32-bit register */
struct FragB { unsigned r[4]; };
struct FragC { float r[8]; };     /* 16 x 16 f32 */

/* ROW: the tile is row-major in memory (element (r, c) at p[r * ld + c]), else column-major. */
template <bool ROW>
__device__ __forceinline__ void wmma_load_a(FragA &f, const bf16 *p, int ld)
{
    if (ROW)
        asm volatile("wmma.load.a.sync.aligned.row.m16n16k16.bf16 {%0,%1,%2,%3}, [%4], %5;"
                     : "=r"(f.r[0]), "=r"(f.r[1]), "=r"(f.r[2]), "=r"(f.r[3])
                     : "l"(p), "r"(ld) : "memory");
    else
        asm volatile("wmma.load.a.sync.aligned.col.m16n16k16.bf16 {%0,%1,%2,%3}, [%4], %5;"
                     : "=r"(f.r[0]), "=r"(f.r[1]), "=r"(f.r[2]), "=r"(f.r[3])
                     : "l"(p), "r"(ld) : "memory");
}

template <bool ROW>
__device__ __forceinline__ void wmma_load_b(FragB &f, const bf16 *p, int ld)
{
    if (ROW)
        asm volatile("wmma.load.b.sync.aligned.row.m16n16k16.bf16 {%0,%1,%2,%3}, [%4], %5;"
                     : "=r"(f.r[0]), "=r"(f.r[1]), "=r"(f.r[2]), "=r"(f.r[3])
                     : "l"(p), "r"(ld) : "memory");
    else
        asm volatile("wmma.load.b.sync.aligned.col.m16n16k16.bf16 {%0,%1,%2,%3}, [%4], %5;"
                     : "=r"(f.r[0]), "=r"(f.r[1]), "=r"(f.r[2]), "=r"(f.r[3])
                     : "l"(p), "r"(ld) : "memory");
}

#define WMMA_ACC(layout)                                                                      \
    asm("wmma.mma.sync.aligned." layout ".m16n16k16.f32.bf16.bf16.f32 "                      \
        "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, {%12,%13,%14,%15}, "                    \
        "{%0,%1,%2,%3,%4,%5,%6,%7};"                                                          \
        : "+f"(c.r[0]), "+f"(c.r[1]), "+f"(c.r[2]), "+f"(c.r[3]),                             \
          "+f"(c.r[4]), "+f"(c.r[5]), "+f"(c.r[6]), "+f"(c.r[7])                              \
        : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]),                                \
          "r"(b.r[0]), "r"(b.r[1]), "r"(b.r[2]), "r"(b.r[3]))

/* c += a b, with a and b in the given layouts. */
template <bool AROW, bool BROW>
__device__ __forceinline__ void wmma_acc(FragC &c, const FragA &a, const FragB &b)
{
    if (AROW && BROW) WMMA_ACC("row.row");
    else if (AROW) WMMA_ACC("row.col");
    else if (BROW) WMMA_ACC("col.row");
    else WMMA_ACC("col.col");
}

__device__ __forceinline__ void wmma_store(float *p, const FragC &c, int ld)
{
    asm volatile("wmma.store.d.sync.aligned.row.m16n16k16.f32 [%0], "
                 "{%1,%2,%3,%4,%5,%6,%7,%8}, %9;"
                 :: "l"(p), "f"(c.r[0]), "f"(c.r[1]), "f"(c.r[2]), "f"(c.r[3]),
                    "f"(c.r[4]), "f"(c.r[5]), "f"(c.r[6]), "f"(c.r[7]), "r"(ld) : "memory");
}
#endif

#define H_BM 128
#define H_BN 128
#define H_BK 64
#define H_PAD 8
/* elements of one staged operand tile, whichever way it is laid out */
#define H_TILE (H_BM * (H_BK + H_PAD) > H_BK * (H_BN + H_PAD) ? H_BM * (H_BK + H_PAD) \
                                                              : H_BK * (H_BN + H_PAD))

/* Copy an R x CC tile of bf16, element (r, c) at g[(r0 + r) * ld + c0 + c], into
 * s[r * LDS + c], 16 bytes (8 values) per load where the source allows it; zeros outside the
 * rows x cols matrix. 256 threads share the work. */
template <int R, int CC, int LDS>
__device__ __forceinline__ void load_bf16_tile(bf16 *s, const bf16 *g, int ld, int rows,
                                               int cols, int r0, int c0, bool vec)
{
    const int chunks = R * CC / 8;
    for (int e = threadIdx.x; e < chunks; e += 256) {
        int r = e / (CC / 8), c = (e % (CC / 8)) * 8;
        int gr = r0 + r, gc = c0 + c;
        bf16 *dst = s + r * LDS + c;
        const bf16 *src = g + (size_t)gr * ld + gc;
        if (vec && gr < rows && gc + 7 < cols) {
            *(uint4 *)dst = *(const uint4 *)src;
        } else {
            for (int q = 0; q < 8; q++)
                dst[q] = (gr < rows && gc + q < cols) ? src[q] : (bf16)0;
        }
    }
}

/* One 16-deep step of the warp's 64 x 32 tile: 4 A fragments, 2 B fragments, 8 products.
 * The smem tiles are laid out as hgemm_body describes; kk is the step's offset in k. */
template <bool TA, bool TB>
__device__ __forceinline__ void hgemm_k16(FragC (&acc)[4][2], const bf16 *As, const bf16 *Bs,
                                          int lda_s, int ldb_s, int kk, int wm, int wn)
{
    FragA a[4];
    FragB b[2];
#pragma unroll
    for (int mi = 0; mi < 4; mi++) {
        int r = wm * 64 + mi * 16;
        wmma_load_a<!TA>(a[mi], TA ? As + kk * lda_s + r : As + r * lda_s + kk, lda_s);
    }
#pragma unroll
    for (int ni = 0; ni < 2; ni++) {
        int c = wn * 32 + ni * 16;
        wmma_load_b<!TB>(b[ni], TB ? Bs + c * ldb_s + kk : Bs + kk * ldb_s + c, ldb_s);
    }
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 2; ni++) wmma_acc<!TA, !TB>(acc[mi][ni], a[mi], b[ni]);
}

/* Store the warp's 4 x 2 accumulator tiles into C. Each 16 x 16 tile goes through shared
 * memory (1 KB a warp at smem + warp KB, free once the k loop is over) so that the edges of C
 * can be stored element by element with bounds checks. */
__device__ __forceinline__ void hgemm_store(FragC (&acc)[4][2], void *smem, float *C, int M,
                                            int N, int bm, int bn)
{
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int wm = warp / 4, wn = warp % 4;
    float *stage = (float *)smem + warp * 256;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 2; ni++) {
            wmma_store(stage, acc[mi][ni], 16);
            __syncwarp();
            int i0 = bm + wm * 64 + mi * 16, j0 = bn + wn * 32 + ni * 16;
            for (int e = lane; e < 256; e += 32) {
                int i = i0 + e / 16, j = j0 + e % 16;
                if (i < M && j < N) C[(size_t)i * N + j] = stage[e];
            }
            __syncwarp();
        }
}

__device__ __forceinline__ void zero(FragC (&acc)[4][2])
{
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 2; ni++)
#pragma unroll
            for (int q = 0; q < (int)(sizeof(FragC) / sizeof(float)); q++)
                acc[mi][ni].r[q] = 0.0f;
}

/* TA: A is given as K x M (A^T B); TB: B is given as N x K (A B^T). A transposed operand is
 * simply a column-major one, which wmma loads directly: no transposition in our code. */
template <bool TA, bool TB>
__device__ __forceinline__ void hgemm_body(int M, int N, int K, const bf16 *A, const bf16 *B,
                                           float *C)
{
    /* As: [128][64+8] (row) or [64][128+8] (col); Bs: [64][128+8] (row) or [128][64+8] (col);
     * H_TILE elements cover either. */
    __shared__ __align__(128) bf16 smem[2 * H_TILE];
    bf16 *As = smem, *Bs = smem + H_TILE;
    const int LDA_S = TA ? H_BM + H_PAD : H_BK + H_PAD;
    const int LDB_S = TB ? H_BK + H_PAD : H_BN + H_PAD;
    int warp = threadIdx.x / 32;
    int wm = warp / 4, wn = warp % 4;           /* warp tile: rows wm*64.., cols wn*32.. */
    int bm = blockIdx.y * H_BM, bn = blockIdx.x * H_BN;
    int lda = TA ? M : K, ldb = TB ? K : N;
    bool va = ((unsigned long long)A & 15) == 0 && (lda & 7) == 0;
    bool vb = ((unsigned long long)B & 15) == 0 && (ldb & 7) == 0;
    FragC acc[4][2];
    zero(acc);
    for (int k0 = 0; k0 < K; k0 += H_BK) {
        if (TA) load_bf16_tile<H_BK, H_BM, H_BM + H_PAD>(As, A, lda, K, M, k0, bm, va);
        else    load_bf16_tile<H_BM, H_BK, H_BK + H_PAD>(As, A, lda, M, K, bm, k0, va);
        if (TB) load_bf16_tile<H_BN, H_BK, H_BK + H_PAD>(Bs, B, ldb, N, K, bn, k0, vb);
        else    load_bf16_tile<H_BK, H_BN, H_BN + H_PAD>(Bs, B, ldb, K, N, k0, bn, vb);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < H_BK; kk += 16)
            hgemm_k16<TA, TB>(acc, As, Bs, LDA_S, LDB_S, kk, wm, wn);
        __syncthreads();
    }
    hgemm_store(acc, smem, C, M, N, bm, bn);
}

/* Launch with 256 threads and grid (ceil(N / 128), ceil(M / 128)). */
extern "C" __global__ void __launch_bounds__(256)
hgemm_wmma(int M, int N, int K, const bf16 *A, const bf16 *B, float *C)
{
    hgemm_body<false, false>(M, N, K, A, B, C);
}
/* --8<-- [end:wmma] */

extern "C" __global__ void __launch_bounds__(256)
hgemm_wmma_nt(int M, int N, int K, const bf16 *A, const bf16 *B, float *C)
{
    hgemm_body<false, true>(M, N, K, A, B, C);
}

extern "C" __global__ void __launch_bounds__(256)
hgemm_wmma_tn(int M, int N, int K, const bf16 *A, const bf16 *B, float *C)
{
    hgemm_body<true, false>(M, N, K, A, B, C);
}

/* --8<-- [start:async] */
/* Rung 8: rung 7 with the copies taken off the critical path. cp.async (sm_80+) copies 16
 * bytes from global to shared memory without passing through registers and without making
 * the thread wait; we keep HA_STAGES k-tiles in flight, so while the tensor cores work on
 * tile kt the copies of tiles kt+1 and kt+2 are under way. k-step 32, three stages of
 * 2 x 10 KB: 60 KB of dynamic shared memory (over the 48 KB static limit: the caller raises
 * the kernel's limit). */
#define HA_BK 32
#define HA_STAGES 3
#define HA_TILE (H_BM * (HA_BK + H_PAD) > HA_BK * (H_BN + H_PAD) ? H_BM * (HA_BK + H_PAD) \
                                                                 : HA_BK * (H_BN + H_PAD))
#define HA_SMEM_BYTES (HA_STAGES * 2 * HA_TILE * 2)

#ifndef SMALLEM_EMU
__device__ __forceinline__ unsigned smem_u32(const void *p)
{
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

__device__ __forceinline__ void cp_async16(void *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                 :: "r"(smem_u32(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N_PENDING>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;" :: "n"(N_PENDING) : "memory");
}
#endif

/* load_bf16_tile with cp.async for whole in-bounds 16-byte chunks; edge chunks are read
 * element by element and stored with plain stores (the barrier before use covers both). */
template <int R, int CC, int LDS>
__device__ __forceinline__ void load_bf16_tile_async(bf16 *s, const bf16 *g, int ld, int rows,
                                                     int cols, int r0, int c0, bool vec)
{
    const int chunks = R * CC / 8;
    for (int e = threadIdx.x; e < chunks; e += 256) {
        int r = e / (CC / 8), c = (e % (CC / 8)) * 8;
        int gr = r0 + r, gc = c0 + c;
        bf16 *dst = s + r * LDS + c;
        const bf16 *src = g + (size_t)gr * ld + gc;
        if (vec && gr < rows && gc + 7 < cols) {
            cp_async16(dst, src);
        } else {
            for (int q = 0; q < 8; q++)
                dst[q] = (gr < rows && gc + q < cols) ? src[q] : (bf16)0;
        }
    }
}

template <bool TA, bool TB>
__device__ __forceinline__ void ha_load_stage(bf16 *stage, const bf16 *A, const bf16 *B, int M,
                                              int N, int K, int lda, int ldb, int bm, int bn,
                                              int k0, bool va, bool vb)
{
    bf16 *As = stage, *Bs = stage + HA_TILE;
    if (TA) load_bf16_tile_async<HA_BK, H_BM, H_BM + H_PAD>(As, A, lda, K, M, k0, bm, va);
    else    load_bf16_tile_async<H_BM, HA_BK, HA_BK + H_PAD>(As, A, lda, M, K, bm, k0, va);
    if (TB) load_bf16_tile_async<H_BN, HA_BK, HA_BK + H_PAD>(Bs, B, ldb, N, K, bn, k0, vb);
    else    load_bf16_tile_async<HA_BK, H_BN, H_BN + H_PAD>(Bs, B, ldb, K, N, k0, bn, vb);
}

template <bool TA, bool TB>
__device__ __forceinline__ void hgemm_async_body(int M, int N, int K, const bf16 *A,
                                                 const bf16 *B, float *C)
{
    extern __shared__ __align__(128) unsigned char dyn_smem[];
    bf16 *smem = (bf16 *)dyn_smem;
    const int LDA_S = TA ? H_BM + H_PAD : HA_BK + H_PAD;
    const int LDB_S = TB ? HA_BK + H_PAD : H_BN + H_PAD;
    int warp = threadIdx.x / 32;
    int wm = warp / 4, wn = warp % 4;
    int bm = blockIdx.y * H_BM, bn = blockIdx.x * H_BN;
    int lda = TA ? M : K, ldb = TB ? K : N;
    bool va = ((unsigned long long)A & 15) == 0 && (lda & 7) == 0;
    bool vb = ((unsigned long long)B & 15) == 0 && (ldb & 7) == 0;
    int tiles = (K + HA_BK - 1) / HA_BK;
    FragC acc[4][2];
    zero(acc);
    /* prologue: tiles 0 .. HA_STAGES-2 in flight, one commit group each (empty if none) */
    for (int t = 0; t < HA_STAGES - 1; t++) {
        if (t < tiles)
            ha_load_stage<TA, TB>(smem + t * 2 * HA_TILE, A, B, M, N, K, lda, ldb, bm, bn,
                                  t * HA_BK, va, vb);
        cp_async_commit();
    }
    for (int kt = 0; kt < tiles; kt++) {
        /* groups committed so far: HA_STAGES-1+kt; leaving HA_STAGES-2 pending means tile kt
         * has landed (this thread's copies); the barrier makes it everyone's, and it also
         * tells us every warp is done with tile kt-1, whose stage we refill next. */
        cp_async_wait<HA_STAGES - 2>();
        __syncthreads();
        int next = kt + HA_STAGES - 1;
        if (next < tiles)
            ha_load_stage<TA, TB>(smem + (next % HA_STAGES) * 2 * HA_TILE, A, B, M, N, K, lda,
                                  ldb, bm, bn, next * HA_BK, va, vb);
        cp_async_commit();
        const bf16 *As = smem + (kt % HA_STAGES) * 2 * HA_TILE, *Bs = As + HA_TILE;
#pragma unroll
        for (int kk = 0; kk < HA_BK; kk += 16)
            hgemm_k16<TA, TB>(acc, As, Bs, LDA_S, LDB_S, kk, wm, wn);
    }
    cp_async_wait<0>();
    __syncthreads();  /* the stages become the store staging area */
    hgemm_store(acc, smem, C, M, N, bm, bn);
}

/* Launch with 256 threads, grid (ceil(N / 128), ceil(M / 128)) and HA_SMEM_BYTES (61440)
 * bytes of dynamic shared memory. */
extern "C" __global__ void __launch_bounds__(256)
hgemm_async(int M, int N, int K, const bf16 *A, const bf16 *B, float *C)
{
    hgemm_async_body<false, false>(M, N, K, A, B, C);
}
/* --8<-- [end:async] */

extern "C" __global__ void __launch_bounds__(256)
hgemm_async_nt(int M, int N, int K, const bf16 *A, const bf16 *B, float *C)
{
    hgemm_async_body<false, true>(M, N, K, A, B, C);
}

extern "C" __global__ void __launch_bounds__(256)
hgemm_async_tn(int M, int N, int K, const bf16 *A, const bf16 *B, float *C)
{
    hgemm_async_body<true, false>(M, N, K, A, B, C);
}

/* float32 -> bf16 bits, rounding to nearest even (NaN stays a quiet NaN). */
extern "C" __global__ void f32_to_bf16(const float *x, bf16 *y, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (long long)gridDim.x * blockDim.x) {
        unsigned u = __float_as_uint(x[i]);
        if ((u & 0x7fffffffu) > 0x7f800000u) y[i] = (bf16)((u >> 16) | 0x40);
        else y[i] = (bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}
