/* Chapter 2 on the GPU, rung 9: C (f32) = A B for bf16 A and B, on the tensor cores through the
 * warp-level mma instruction, fed by ldmatrix from swizzled shared memory and a cp.async
 * pipeline four tiles deep. Same signature, launch and layouts as gemm.cu's hgemm_async (rung
 * 8): row-major A (M x K), B (K x N), C (M x N); *_nt takes B as N x K (A B^T), *_tn takes A as
 * K x M (A^T B). Any M, N, K: what lies outside a matrix reads as zeros, stores outside C are
 * skipped. tests/test_cuda_emu.py runs this file on the CPU.
 *
 * Its own file (a CuPy RawModule of its own) because gemm.cu is long enough; like gemm.cu it
 * includes no header, so NVRTC from a plain CuPy install compiles it.
 */

typedef unsigned short bf16;  /* the top 16 bits of a float32 */

/* --8<-- [start:mma] */
/* Rung 9: rung 8's pipeline, with the fragments handled by hand instead of by wmma.
 *
 * mma.sync.m16n8k16 multiplies a 16 x 16 bf16 tile of A by a 16 x 8 tile of B into a 16 x 8 f32
 * tile of C, each spread over the 32 lanes of a warp in a layout the PTX manual spells out
 * (lane l holds elements of rows l/4 and l/4 + 8). Knowing the layout, we choose how the
 * fragments reach the registers:
 *
 * - ldmatrix.x4: one instruction, and each lane names one 16-byte row of shared memory; the
 *   32 rows are four 8 x 8 matrices, and every lane receives its part of each, exactly where mma
 *   wants it. One ldmatrix.x4 gives a whole 16 x 16 A fragment, or the B fragments of two 16 x 8
 *   tiles; with .trans it transposes on the way, which serves an operand stored the other way
 *   round (B of A B, A of A^T B) at no cost.
 * - Swizzle: the 8 rows one 8 x 8 matrix comes from are read in the same cycle. Shared memory
 *   has 32 banks of 4 bytes, so 16-byte chunk c of a row lands in bank group (byte address / 16)
 *   mod 8; rows 64 or 256 bytes long would put the 8 rows in 2 groups, or 1. Storing chunk c of
 *   row r at chunk c ^ f(r) - f chosen so that the 8 rows differ in the low 3 bits of the
 *   position - spreads them over the 8 groups, without the padding of rung 8: the tiles stay
 *   powers of two, 4 stages x 16 KB = 64 KB.
 * - Stages: a tile's trip from global memory takes several hundred cycles, a few times what
 *   the tensor cores spend on it. With MM_STAGES = 4 tiles in shared memory, three are under
 *   way (cp.async, which neither passes through registers nor makes the thread wait) while the
 *   tensor cores work on the fourth.
 *
 * Block tile 128 x 128, k-step 32, 8 warps as 2 (rows) x 4 (columns), each warp 64 x 32 of C:
 * 4 x 4 mma tiles of 16 x 8, 64 f32 accumulators a lane, stored straight from the registers. */
#define MM_BM 128
#define MM_BN 128
#define MM_BK 32
#define MM_STAGES 4
#define MM_TILE_BYTES (MM_BM * MM_BK * 2)                          /* one operand: 8 KB */
#define MM_SMEM_BYTES (MM_STAGES * 2 * MM_TILE_BYTES)             /* 65536 */
static_assert(MM_BM == MM_BN, "A's and B's tiles share one layout and size");

#ifndef SMALLEM_EMU  /* tests/cuda_emu/mma.h replaces these to run the file on a CPU */
__device__ __forceinline__ unsigned smem_u32(const void *p)
{
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

/* 16 bytes global -> shared, of which the first src_bytes are read and the rest zero-filled
 * (src_bytes 0: nothing is read, the chunk becomes zeros). */
__device__ __forceinline__ void cp_async16_zfill(void *dst, const void *src, unsigned src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(src_bytes) : "memory");
}

/* close the group of this thread's cp.async issued since the last commit */
__device__ __forceinline__ void cp_async_commit_group()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

/* wait until at most N of this thread's committed groups are still in flight */
template <int N>
__device__ __forceinline__ void cp_async_wait_group()
{
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

/* Four 8 x 8 bf16 matrices: lanes 8q .. 8q+7 give the addresses of the 8 rows of matrix q;
 * r[q] receives this lane's two elements of it (transposed first with TRANS). */
template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void *row)
{
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(row)));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(row)));
}

/* c += a b for one 16 x 16 (a) by 16 x 8 (b) product, f32 sums. */
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const unsigned (&a)[4],
                                               unsigned b0, unsigned b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* two f32 into p, p 8-byte aligned: one 8-byte store */
__device__ __forceinline__ void st_global_f32x2(float *p, float x, float y)
{
    asm volatile("st.global.v2.f32 [%0], {%1,%2};" :: "l"(p), "f"(x), "f"(y) : "memory");
}
#endif

/* Byte offset of 16-byte chunk c of row r in a staged tile whose rows hold CPR chunks (CPR * 8
 * bf16). 128 bytes span the 32 banks once: a row of 4 chunks is half of such a line, a row of 16
 * two of them. The XOR moves chunk c by (r / 2) mod 4 (CPR 4) or by r mod 8 (CPR 16), so any 8
 * consecutive rows put a given chunk into 8 different bank groups. */
template <int CPR>
__device__ __forceinline__ int mm_swizzle(int r, int c)
{
    const int rows_per_line = CPR >= 8 ? 1 : 8 / CPR;
    const int mask = (CPR >= 8 ? 8 : CPR) - 1;
    return r * CPR * 16 + ((c ^ ((r / rows_per_line) & mask)) << 4);
}

/* Stage an R x CC tile, element (r, c) at g[(r0 + r) * ld + c0 + c], zeros outside the
 * rows x cols matrix. vec (pointer and ld allow 16-byte loads, and then cols == ld is a
 * multiple of 8): every chunk is whole inside or whole outside the matrix, and cp.async copies
 * it or zero-fills it (src-size 0, reading nothing). Otherwise the chunk is read element by
 * element and stored with a plain 16-byte store; the barrier before use covers both. */
template <int R, int CC>
__device__ __forceinline__ void mm_load_tile(unsigned char *s, const bf16 *g, int ld, int rows,
                                             int cols, int r0, int c0, bool vec)
{
    const int CPR = CC / 8;
#pragma unroll
    for (int p = 0; p < R * CPR / 256; p++) {
        int e = threadIdx.x + 256 * p;
        int r = e / CPR, c = e % CPR;
        int gr = r0 + r, gc = c0 + c * 8;
        unsigned char *dst = s + mm_swizzle<CPR>(r, c);
        if (vec) {
            bool in = gr < rows && gc + 7 < cols;
            cp_async16_zfill(dst, in ? g + (size_t)gr * ld + gc : g, in ? 16 : 0);
        } else {
            unsigned v[4];
            for (int q = 0; q < 4; q++) {
                unsigned lo = 0, hi = 0;
                if (gr < rows && gc + 2 * q < cols) lo = g[(size_t)gr * ld + gc + 2 * q];
                if (gr < rows && gc + 2 * q + 1 < cols) hi = g[(size_t)gr * ld + gc + 2 * q + 1];
                v[q] = lo | hi << 16;
            }
            uint4 u;
            u.x = v[0]; u.y = v[1]; u.z = v[2]; u.w = v[3];
            *(uint4 *)dst = u;
        }
    }
}

/* One ldmatrix.x4 of a 16 (x: rows of A or columns of B) by 16 (k) block at (x0, k0) of a
 * staged tile. KC: the tile is k-contiguous ([x][k], 4 chunks a row, read as is); else it is
 * x-contiguous ([k][x], 16 chunks a row, read with .trans). Matrix q = lane / 8 is the x half
 * xh(q), k half kh(q) of the block; the lane names its row lane % 8. For A, (xh, kh) =
 * (q & 1, q >> 1) gives r[0..3] = a0..a3 of the mma; for B, (q >> 1, q & 1) gives {r[0], r[1]}
 * for columns x0..x0+7 and {r[2], r[3]} for x0+8..x0+15. */
template <bool KC, bool IS_A>
__device__ __forceinline__ void mm_fragment(unsigned (&r)[4], const unsigned char *s, int x0,
                                            int k0)
{
    int lane = threadIdx.x % 32, q = lane / 8, i = lane % 8;
    int xh = IS_A ? q & 1 : q >> 1, kh = IS_A ? q >> 1 : q & 1;
    if (KC) ldmatrix_x4<false>(r, s + mm_swizzle<MM_BK / 8>(x0 + xh * 8 + i, (k0 >> 3) + kh));
    else    ldmatrix_x4<true>(r, s + mm_swizzle<MM_BN / 8>(k0 + kh * 8 + i, (x0 >> 3) + xh));
}

/* TA: A is given as K x M (A^T B); TB: B is given as N x K (A B^T). */
template <bool TA, bool TB>
__device__ __forceinline__ void mm_load_stage(unsigned char *stage, const bf16 *A,
                                              const bf16 *B, int M, int N, int K, int bm,
                                              int bn, int k0, bool va, bool vb)
{
    unsigned char *As = stage, *Bs = stage + MM_TILE_BYTES;
    if (TA) mm_load_tile<MM_BK, MM_BM>(As, A, M, K, M, k0, bm, va);
    else    mm_load_tile<MM_BM, MM_BK>(As, A, K, M, K, bm, k0, va);
    if (TB) mm_load_tile<MM_BN, MM_BK>(Bs, B, K, N, K, bn, k0, vb);
    else    mm_load_tile<MM_BK, MM_BN>(Bs, B, N, K, N, k0, bn, vb);
}

/* The warp's 64 x 32 of C: lane l holds rows l/4 and l/4 + 8, columns 2 (l % 4) and +1, of
 * each 16 x 8 tile; two neighbours go out as one 8-byte store where C allows it. */
__device__ __forceinline__ void mm_store(const float (&acc)[4][4][4], float *C, int M, int N,
                                         int i0, int j0)
{
    int lane = threadIdx.x % 32;
    bool v2 = ((unsigned long long)C & 7) == 0 && (N & 1) == 0;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int i = i0 + mi * 16 + lane / 4 + h * 8;
            if (i >= M) continue;
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                int j = j0 + ni * 8 + (lane % 4) * 2;
                float *p = C + (size_t)i * N + j;
                float x = acc[mi][ni][2 * h], y = acc[mi][ni][2 * h + 1];
                if (v2 && j + 1 < N) {
                    st_global_f32x2(p, x, y);
                } else {
                    if (j < N) p[0] = x;
                    if (j + 1 < N) p[1] = y;
                }
            }
        }
}

template <bool TA, bool TB>
__device__ __forceinline__ void hgemm_mma_body(int M, int N, int K, const bf16 *A,
                                               const bf16 *B, float *C)
{
    extern __shared__ __align__(128) unsigned char dyn_smem[];
    int warp = threadIdx.x / 32;
    int wm = warp / 4, wn = warp % 4;           /* warp tile: rows wm*64.., cols wn*32.. */
    int bm = blockIdx.y * MM_BM, bn = blockIdx.x * MM_BN;
    int lda = TA ? M : K, ldb = TB ? K : N;
    bool va = ((unsigned long long)A & 15) == 0 && (lda & 7) == 0;
    bool vb = ((unsigned long long)B & 15) == 0 && (ldb & 7) == 0;
    int tiles = (K + MM_BK - 1) / MM_BK;
    float acc[4][4][4];
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.0f;
    /* prologue: tiles 0 .. MM_STAGES-2 in flight, one commit group each (empty if none) */
    for (int t = 0; t < MM_STAGES - 1; t++) {
        if (t < tiles)
            mm_load_stage<TA, TB>(dyn_smem + t * 2 * MM_TILE_BYTES, A, B, M, N, K, bm, bn,
                                  t * MM_BK, va, vb);
        cp_async_commit_group();
    }
    for (int kt = 0; kt < tiles; kt++) {
        /* MM_STAGES-1+kt groups committed; at most MM_STAGES-2 pending: tile kt has landed
         * (this thread's part; the barrier makes it the block's, and says that every warp is
         * done with tile kt-1, whose stage is refilled next) */
        cp_async_wait_group<MM_STAGES - 2>();
        __syncthreads();
        int next = kt + MM_STAGES - 1;
        if (next < tiles)
            mm_load_stage<TA, TB>(dyn_smem + (next % MM_STAGES) * 2 * MM_TILE_BYTES, A, B, M,
                                  N, K, bm, bn, next * MM_BK, va, vb);
        cp_async_commit_group();
        const unsigned char *As = dyn_smem + (kt % MM_STAGES) * 2 * MM_TILE_BYTES;
        const unsigned char *Bs = As + MM_TILE_BYTES;
#pragma unroll
        for (int kk = 0; kk < MM_BK; kk += 16) {
            unsigned a[4][4], b[2][4];
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
                mm_fragment<!TA, true>(a[mi], As, wm * 64 + mi * 16, kk);
#pragma unroll
            for (int nj = 0; nj < 2; nj++)
                mm_fragment<TB, false>(b[nj], Bs, wn * 32 + nj * 16, kk);
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
                    mma_bf16_16816(acc[mi][ni], a[mi], b[ni / 2][(ni % 2) * 2],
                                   b[ni / 2][(ni % 2) * 2 + 1]);
        }
    }
    cp_async_wait_group<0>();  /* only empty groups can be pending here; leave none behind */
    mm_store(acc, C, M, N, bm + wm * 64, bn + wn * 32);
}

/* Launch with 256 threads, grid (ceil(N / 128), ceil(M / 128)) and MM_SMEM_BYTES (65536)
 * bytes of dynamic shared memory. */
extern "C" __global__ void __launch_bounds__(256)
hgemm_mma(int M, int N, int K, const bf16 *A, const bf16 *B, float *C)
{
    hgemm_mma_body<false, false>(M, N, K, A, B, C);
}
/* --8<-- [end:mma] */

extern "C" __global__ void __launch_bounds__(256)
hgemm_mma_nt(int M, int N, int K, const bf16 *A, const bf16 *B, float *C)
{
    hgemm_mma_body<false, true>(M, N, K, A, B, C);
}

extern "C" __global__ void __launch_bounds__(256)
hgemm_mma_tn(int M, int N, int K, const bf16 *A, const bf16 *B, float *C)
{
    hgemm_mma_body<true, false>(M, N, K, A, B, C);
}
