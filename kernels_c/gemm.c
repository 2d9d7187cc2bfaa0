/* Chapter 2: the matrix product C = A B, one rung of the ladder per function.
 *
 * Every rung has the same prototype: row-major A (M x K, leading dimension
 * lda), B (K x N, ldb), C (M x N, ldc), and a thread count that the
 * single-threaded rungs ignore. C is overwritten.
 *
 * Rungs 2 to 5 also have an `_ex` form that takes the block sizes (mc, kc, nc)
 * and, from rung 4 on, the packing buffer: Python computes the blocks from the
 * machine's caches and owns the buffer, so nothing here is tuned for one machine
 * and nothing is allocated per call. The short forms use defaults that Python
 * sets once (gemm_set_defaults) and allocate their own buffer.
 */
#include <stdlib.h>
#include <time.h>
#include "common.h"
#include "gemm.h"

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <pthread.h>

/* The micro-kernel's shape: MR rows of A times NR columns of B, kept in
 * registers. smallem.gemm.micro_shape derives the same numbers from the
 * register file (test_gemm checks that they agree). */
#if defined(SM_AVX512)
#define MR 14 /* 14 x 2 zmm accumulators + 2 for B + 1 for A = 31 of 32 registers */
#define NR 32
#elif defined(SM_AVX2)
#define MR 6 /* 6 x 2 ymm accumulators + 2 for B + 1 for A = 15 of 16 registers */
#define NR 16
#else
#define MR 6 /* plain C; the compiler's SSE2 has 16 xmm of 4 floats: 6 x 2 + 2 + 1 */
#define NR 8
#endif

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define ROUND_UP(x, m) (((x) + (m) - 1) / (m) * (m))

/* AMX (bf16 inputs only, see gemm_amx): with the AVX-512 build, on CPUs that have it. */
#if defined(SM_AMX_BF16) && defined(SM_AVX512) && defined(SM_AVX512_BF16)
#define AMX_BF16 1
#define AMX_MR 32 /* rows of C per block: two tiles of 16 */
#define AMX_KB 32 /* bf16 along k in one 64-byte tile row */
#endif

void gemm_micro_shape(int *mr, int *nr)
{
    *mr = MR;
    *nr = NR;
}

/* --8<-- [start:naive] */
/* Rung 0: the textbook triple loop. The inner loop walks down a column of B,
 * one float per 64-byte cache line, and each sum waits for the previous add. */
void gemm_naive(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                float *C, int ldc, int nthreads)
{
    (void)nthreads;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float sum = 0.0f;
            for (int k = 0; k < K; k++) sum += A[(size_t)i * lda + k] * B[(size_t)k * ldb + j];
            C[(size_t)i * ldc + j] = sum;
        }
}
/* --8<-- [end:naive] */

/* --8<-- [start:loop_order] */
/* Rung 1: the same sums in the order (i, k, j). The inner loop now reads a row
 * of B and updates a row of C, both contiguous: every byte of each 64-byte
 * line is used, and the N independent updates vectorise (8 lanes with AVX2). */
void gemm_loop_order(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                     float *C, int ldc, int nthreads)
{
    (void)nthreads;
    for (int i = 0; i < M; i++) {
        float *c = C + (size_t)i * ldc;
        for (int j = 0; j < N; j++) c[j] = 0.0f;
        for (int k = 0; k < K; k++) {
            const float a = A[(size_t)i * lda + k];
            const float *b = B + (size_t)k * ldb;
            for (int j = 0; j < N; j++) c[j] += a * b[j];
        }
    }
}
/* --8<-- [end:loop_order] */

/* Block sizes for the short forms; Python replaces them with the cache model's.
 * Rungs 2 to 4 keep B's sliver in L1, rung 5 A's (see gemm_driver), so rung 5
 * has blocks of its own. */
static int default_mc = 96, default_kc = 256, default_nc = 4096;
static int rows_mc = 96, rows_kc = 512, rows_nc = 4096;

void gemm_set_defaults(int rung5, int mc, int kc, int nc)
{
    if (mc <= 0 || kc <= 0 || nc <= 0) return;
    if (rung5) {
        rows_mc = mc, rows_kc = kc, rows_nc = nc;
    } else {
        default_mc = mc, default_kc = kc, default_nc = nc;
    }
}

/* --8<-- [start:blocked] */
/* Rung 2: the Goto/BLIS loop nest. A kc x nc block of B (kept in L3), an
 * mc x kc block of A (kept in L2); inside, rung 1's loops on the blocks. */
void gemm_blocked_ex(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                     float *C, int ldc, int nthreads, int mc, int kc, int nc)
{
    (void)nthreads;
    for (int i = 0; i < M; i++) memset(C + (size_t)i * ldc, 0, sizeof(float) * N);
    for (int jc = 0; jc < N; jc += nc) {
        const int nb = MIN(nc, N - jc);
        for (int pc = 0; pc < K; pc += kc) {
            const int kb = MIN(kc, K - pc);
            for (int ic = 0; ic < M; ic += mc) {
                const int mb = MIN(mc, M - ic);
                for (int i = ic; i < ic + mb; i++) {
                    float *c = C + (size_t)i * ldc + jc;
                    for (int k = pc; k < pc + kb; k++) {
                        const float a = A[(size_t)i * lda + k];
                        const float *b = B + (size_t)k * ldb + jc;
                        for (int j = 0; j < nb; j++) c[j] += a * b[j];
                    }
                }
            }
        }
    }
}
/* --8<-- [end:blocked] */

/* ------------------------------------------------------------------ micro-kernel */

/* --8<-- [start:microkernel] */
/* The micro-kernel: an MR x NR tile of C, held in registers for all kc steps.
 * Each step loads NR floats of B (NR/VL vectors), broadcasts MR floats of A and
 * issues MR x NR/VL independent FMAs, enough to cover the FMA latency (4 cycles)
 * times the 2 FMA pipes. a(r, k) is a[r*rs_a + k*cs_a]; row k of b is b + k*rs_b.
 * The tile then goes to C once: c = alpha*ab (beta == 0) or alpha*ab + beta*c.
 * `rows` is MR but at C's bottom edge (see edge_rows), and a constant wherever
 * the kernel is inlined, so its loops unroll. */
#if defined(SM_AVX512) || defined(SM_AVX2)
#if defined(SM_AVX512)
typedef __m512 vec;
#define VL 16
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vset1 _mm512_set1_ps
#define vzero _mm512_setzero_ps
#define vfma _mm512_fmadd_ps
#define vmul _mm512_mul_ps
#else
typedef __m256 vec;
#define VL 8
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vset1 _mm256_set1_ps
#define vzero _mm256_setzero_ps
#define vfma _mm256_fmadd_ps
#define vmul _mm256_mul_ps
#endif
#define NV (NR / VL)

static inline __attribute__((always_inline)) void
micro_kernel(int rows, int kc, const float *a, int rs_a, int cs_a, const float *b, int rs_b,
             float *c, int ldc, float alpha, float beta)
{
    vec acc[MR][NV];
#pragma GCC unroll 32
    for (int r = 0; r < rows; r++) { /* C's rows arrive from L2/L3 while the FMAs run */
        _mm_prefetch((const char *)(c + (size_t)r * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + (size_t)r * ldc + NR - 1), _MM_HINT_T0);
        for (int v = 0; v < NV; v++) acc[r][v] = vzero();
    }
    /* Two steps per pass: the loop's pointer and counter updates and its branch are
     * paid once per two, leaving more of the core's window to loads still in flight
     * from L2/L3. Timed in turn against one step per pass on Zen 3 it was slightly the
     * faster; four and eight steps were not. */
#pragma GCC unroll 2
    for (int k = 0; k < kc; k++) {
        vec bv[NV];
        for (int v = 0; v < NV; v++) bv[v] = vload(b + (size_t)k * rs_b + v * VL);
#pragma GCC unroll 32
        for (int r = 0; r < rows; r++) {
            const vec ar = vset1(a[(size_t)r * rs_a + (size_t)k * cs_a]);
            for (int v = 0; v < NV; v++) acc[r][v] = vfma(ar, bv[v], acc[r][v]);
        }
    }
    const vec va = vset1(alpha), vb = vset1(beta);
#pragma GCC unroll 32
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < NV; v++) {
            float *cp = c + (size_t)r * ldc + v * VL;
            vec t = vmul(va, acc[r][v]);
            if (beta != 0.0f) t = vfma(vb, vload(cp), t);
            vstore(cp, t);
        }
}
#else
/* Plain C: the same tile as an array the compiler keeps in (SSE2) registers. */
static inline void micro_kernel(int rows, int kc, const float *a, int rs_a, int cs_a,
                                const float *b, int rs_b, float *c, int ldc, float alpha,
                                float beta)
{
    float acc[MR][NR] = {{0}};
    for (int k = 0; k < kc; k++)
        for (int r = 0; r < rows; r++) {
            const float ar = a[(size_t)r * rs_a + (size_t)k * cs_a];
            for (int j = 0; j < NR; j++) acc[r][j] += ar * b[(size_t)k * rs_b + j];
        }
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < NR; j++) {
            float *cp = c + (size_t)r * ldc + j;
            *cp = beta != 0.0f ? alpha * acc[r][j] + beta * *cp : alpha * acc[r][j];
        }
}
#endif
/* --8<-- [end:microkernel] */

/* Rung 3's edge: a tile cut short by M or N, done with scalar loops. */
static void edge_tile(int mr, int nr, int kc, const float *a, int lda, const float *b,
                      int ldb, float *c, int ldc, float beta)
{
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) {
            float sum = beta != 0.0f ? c[(size_t)r * ldc + j] : 0.0f;
            for (int k = 0; k < kc; k++) sum += a[(size_t)r * lda + k] * b[(size_t)k * ldb + j];
            c[(size_t)r * ldc + j] = sum;
        }
}

/* --8<-- [start:registers] */
/* Rung 3: rung 2's blocks, now cut into MR x NR tiles (jr, ir loops), each
 * computed by the micro-kernel straight from A and B. The kc x NR sliver of B
 * is reused by every tile of the column (ir loop) and stays in L1. */
void gemm_registers_ex(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                       float *C, int ldc, int nthreads, int mc, int kc, int nc)
{
    (void)nthreads;
    for (int jc = 0; jc < N; jc += nc) {
        const int nb = MIN(nc, N - jc);
        for (int pc = 0; pc < K; pc += kc) {
            const int kb = MIN(kc, K - pc);
            const float beta = pc == 0 ? 0.0f : 1.0f; /* first slice overwrites C */
            for (int ic = 0; ic < M; ic += mc) {
                const int mb = MIN(mc, M - ic);
                for (int jr = 0; jr < nb; jr += NR)
                    for (int ir = 0; ir < mb; ir += MR) {
                        const float *a = A + (size_t)(ic + ir) * lda + pc;
                        const float *b = B + (size_t)pc * ldb + jc + jr;
                        float *c = C + (size_t)(ic + ir) * ldc + jc + jr;
                        if (ir + MR <= mb && jr + NR <= nb)
                            micro_kernel(MR, kb, a, lda, 1, b, ldb, c, ldc, 1.0f, beta);
                        else
                            edge_tile(MIN(MR, mb - ir), MIN(NR, nb - jr), kb, a, lda, b, ldb,
                                      c, ldc, beta);
                    }
            }
        }
    }
}
/* --8<-- [end:registers] */

/* ------------------------------------------------------------------ packing */

/* A panel whose values of k lie along its rows in memory (A as stored, B
 * transposed) packs as a transpose: VL values of k from each of `rows` rows
 * (rows <= VL, the rest zeros), turned in registers into VL columns, each stored
 * at dst + k * ld. The shuffles below do in 4 (or 3) passes what a scalar loop
 * does with one load and one store per float. Each column is stored whole, VL
 * floats, even where ld < VL (A's MR rows): the extra lanes land on the next
 * column's place, which the next store overwrites. So the last column of a panel
 * is left to the caller's scalar loop; returns how many values of k were packed. */
#if defined(SM_AVX512)
static int transpose_rows(int rows, int kb, const float *p, size_t rs, float *dst, int ld)
{
    int k = 0;
    for (; k + 16 < kb; k += 16) {
        __m512 r[16], t[16];
        for (int i = 0; i < 16; i++) r[i] = i < rows ? _mm512_loadu_ps(p + i * rs + k) : _mm512_setzero_ps();
        for (int i = 0; i < 16; i += 2) { /* pairs of rows, within each 4-float lane */
            t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
            t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
        }
        for (int i = 0; i < 16; i += 4) { /* r[i + j]: rows i..i+3 of column 4L + j, lane L */
            const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
            const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
            r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
            r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
            r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
            r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
        }
        for (int j = 0; j < 4; j++) { /* gather lane L of r[j], r[4+j], r[8+j], r[12+j] */
            const __m512 x = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x44);
            const __m512 y = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xEE);
            const __m512 z = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x44);
            const __m512 w = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xEE);
            t[j] = _mm512_shuffle_f32x4(x, z, 0x88);
            t[4 + j] = _mm512_shuffle_f32x4(x, z, 0xDD);
            t[8 + j] = _mm512_shuffle_f32x4(y, w, 0x88);
            t[12 + j] = _mm512_shuffle_f32x4(y, w, 0xDD);
        }
        for (int c = 0; c < 16; c++) _mm512_storeu_ps(dst + (size_t)(k + c) * ld, t[c]);
    }
    return k;
}
#elif defined(SM_AVX2)
static int transpose_rows(int rows, int kb, const float *p, size_t rs, float *dst, int ld)
{
    int k = 0;
    for (; k + 8 < kb; k += 8) {
        __m256 r[8], t[8];
        for (int i = 0; i < 8; i++) r[i] = i < rows ? _mm256_loadu_ps(p + i * rs + k) : _mm256_setzero_ps();
        for (int i = 0; i < 8; i += 2) {
            t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
            t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
        }
        for (int i = 0; i < 8; i += 4) { /* r[i + j]: rows i..i+3 of column 4L + j, lane L */
            r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
            r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
            r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
            r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
        }
        for (int j = 0; j < 4; j++) {
            t[j] = _mm256_permute2f128_ps(r[j], r[4 + j], 0x20);
            t[4 + j] = _mm256_permute2f128_ps(r[j], r[4 + j], 0x31);
        }
        for (int c = 0; c < 8; c++) _mm256_storeu_ps(dst + (size_t)(k + c) * ld, t[c]);
    }
    return k;
}
#else
static int transpose_rows(int rows, int kb, const float *p, size_t rs, float *dst, int ld)
{
    (void)rows, (void)kb, (void)p, (void)rs, (void)dst, (void)ld;
    return 0;
}
#endif

/* --8<-- [start:packing] */
/* Packing copies a block into the order the micro-kernel reads it: A as MR-row
 * panels (for each k, MR floats side by side), B as NR-column panels (for each
 * k, NR floats). Rows or columns past the matrix's edge are zeros, so every
 * tile is a full MR x NR tile and one micro-kernel serves every shape.
 * Element (i, k) of op(A) is a[i*rs + k*cs]: (lda, 1) as stored, (1, lda)
 * transposed; the transpose costs nothing beyond this index arithmetic. */
static void pack_a(int mb, int kb, const float *a, size_t rs, size_t cs, float *ap)
{
    for (int ir = 0; ir < mb; ir += MR, ap += (size_t)MR * kb) {
        const int mr = MIN(MR, mb - ir);
        const float *p = a + ir * rs;
        int k = 0;
        if (mr == MR && cs == 1) /* A as stored: a transpose (see transpose_rows) */
            k = transpose_rows(MR, kb, p, rs, ap, MR);
        else if (mr == MR && rs == 1) /* A transposed: each k's MR values lie side by side */
            for (; k < kb; k++) memcpy(ap + (size_t)k * MR, p + k * cs, sizeof(float) * MR);
        for (; k < kb; k++)
            if (mr == MR) /* a full panel: no test per element */
                for (int r = 0; r < MR; r++) ap[(size_t)k * MR + r] = p[r * rs + k * cs];
            else
                for (int r = 0; r < MR; r++)
                    ap[(size_t)k * MR + r] = r < mr ? p[r * rs + k * cs] : 0.0f;
    }
}

static void pack_b_panel(int nr, int kb, const float *b, size_t rs, size_t cs, float *bp)
{
    int k = 0;
#ifdef VL
    if (nr == NR && rs == 1) /* B transposed: its NR columns are rows in memory, VL at a time */
        for (int h = 0; h < NR; h += VL)
            k = transpose_rows(VL, kb, b + h * cs, cs, bp + h, NR);
#endif
    for (; k < kb; k++)
        for (int j = 0; j < NR; j++) bp[(size_t)k * NR + j] = j < nr ? b[k * rs + j * cs] : 0.0f;
}

/* B as stored (cs == 1) is packed PACK_ROWS rows of B at a time, left to right:
 * a few streams the hardware prefetcher follows, cut into NR-float pieces, PACK_ROWS
 * consecutive pieces per panel. Panel by panel instead, each k would jump a whole
 * row of B (8 KiB at N = 2048): a new cache line and a new page every step. One
 * row at a time, each k would store one piece into every panel, kb * NR floats
 * apart; when that is a multiple of 4 KiB (kb a multiple of 32: 512, 768) all
 * those stores share their low 12 address bits, so they fall in one L1 set, and
 * there are more panels than the set has ways. Timed alone from cache on Zen 5,
 * one row at a time was far slower at kb = 512 than at kb = 511, and eight rows at
 * a time were as fast at 512 as one row at 511. */
#define PACK_ROWS 8
static void pack_b(int nb, int kb, const float *b, size_t rs, size_t cs, float *bp)
{
    const int full = cs == 1 ? nb / NR * NR : 0;
    for (int k0 = 0; k0 < kb; k0 += PACK_ROWS)
        for (int jr = 0; jr < full; jr += NR)
            for (int k = k0; k < MIN(kb, k0 + PACK_ROWS); k++)
                memcpy(bp + (size_t)jr * kb + (size_t)k * NR, b + k * rs + jr,
                       sizeof(float) * NR);
    for (int jr = full; jr < nb; jr += NR) /* transposed B, and the last, narrow panel */
        pack_b_panel(MIN(NR, nb - jr), kb, b + jr * cs, rs, cs, bp + (size_t)jr * kb);
}
/* --8<-- [end:packing] */

/* A full-width tile with fewer than MR rows, at C's bottom edge (with MR = 14,
 * M = 1024 leaves 2 rows for the last panel): a copy of the micro-kernel per
 * row count, which issues the FMAs of the rows there are, not MR rows' worth. */
static SM_NOCLONE void edge_rows(int mr, int kb, const float *ap, const float *bp, float *c,
                                 int ldc, float alpha, float beta)
{
#define ROWS(n) case n: micro_kernel(n, kb, ap, 1, MR, bp, NR, c, ldc, alpha, beta); return;
    switch (mr) {
        ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5)
#if MR > 6
        ROWS(6) ROWS(7) ROWS(8) ROWS(9) ROWS(10) ROWS(11) ROWS(12) ROWS(13)
#endif
    }
#undef ROWS
}

/* A tile cut short by the matrix edge to fewer than NR columns (and any rows).
 * Compute the full tile into a scratch tile, then copy the part inside C. Not
 * cloned: GCC 12's copy for rung 4 (alpha = 1) kept scalars in vector registers
 * through the k loop and, with AVX-512's 28 accumulators, spilled a B vector to
 * the stack on every step. */
static SM_NOCLONE void store_tile(int kb, const float *ap, const float *bp, float *c, int ldc, int mr,
                       int nr, float alpha, float beta)
{
    if (mr == MR && nr == NR) {
        micro_kernel(MR, kb, ap, 1, MR, bp, NR, c, ldc, alpha, beta);
        return;
    }
    if (nr == NR) {
        edge_rows(mr, kb, ap, bp, c, ldc, alpha, beta);
        return;
    }
    float t[MR * NR] __attribute__((aligned(64)));
    micro_kernel(MR, kb, ap, 1, MR, bp, NR, t, NR, 1.0f, 0.0f);
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) {
            float *cp = c + (size_t)r * ldc + j;
            *cp = beta != 0.0f ? alpha * t[r * NR + j] + beta * *cp : alpha * t[r * NR + j];
        }
}

/* Packed blocks start on a 64-byte boundary: whole cache lines, aligned loads. */
static float *align64(float *p)
{
    return (float *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
}

/* Whether rung 5 packs all of B, every K slice, before any tile: when B takes no
 * more than half the L3 space the model gives a kc x nc block of B (see
 * gemm_driver). */
static int b_whole(int N, int K, int kc, int nc)
{
    return K > kc && 2 * (long long)K * ROUND_UP(N, NR) <= (long long)kc * nc;
}

int gemm_b_whole(int N, int K, int kc, int nc) /* for the tests */
{
    return b_whole(N, K, kc, nc);
}

/* Floats the packing buffer needs: one A block per thread, one shared B block. */
long long gemm_work_floats(int N, int K, int mc, int kc, int nc, int nthreads)
{
    const long long mcr = ROUND_UP(mc, MR), ncr = ROUND_UP(MIN(nc, ROUND_UP(N, NR)), NR);
    const long long b = b_whole(N, K, kc, nc) ? (long long)ROUND_UP(N, NR) * K : ncr * kc;
    const long long f32 = (long long)nthreads * (mcr * kc + 16) + b + 32;
#ifdef AMX_BF16
    /* gemm_amx: a bf16 block of B, then per thread 32 rows of A in bf16 */
    const long long kca = ROUND_UP(kc, AMX_KB);
    const long long amx = (long long)nthreads * (AMX_MR / 2 * kca + 16) + ncr * kca / 2 + 32;
    return MAX(f32, amx);
#else
    return f32;
#endif
}

/* --8<-- [start:packed] */
/* Rung 4: rung 3 with both blocks packed. The micro-kernel now reads A and B
 * as two contiguous streams, 64-byte aligned, and edge tiles are zero-padded. */
void gemm_packed_ex(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                    float *C, int ldc, int nthreads, int mc, int kc, int nc, float *work)
{
    (void)nthreads;
    float *ap = align64(work);
    float *bp = align64(ap + (size_t)ROUND_UP(mc, MR) * kc);
    for (int jc = 0; jc < N; jc += nc) {
        const int nb = MIN(nc, N - jc);
        for (int pc = 0; pc < K; pc += kc) {
            const int kb = MIN(kc, K - pc);
            const float beta = pc == 0 ? 0.0f : 1.0f; /* first slice overwrites C */
            pack_b(nb, kb, B + (size_t)pc * ldb + jc, ldb, 1, bp);
            for (int ic = 0; ic < M; ic += mc) {
                const int mb = MIN(mc, M - ic);
                pack_a(mb, kb, A + (size_t)ic * lda + pc, lda, 1, ap);
                for (int jr = 0; jr < nb; jr += NR)
                    for (int ir = 0; ir < mb; ir += MR)
                        store_tile(kb, ap + (size_t)ir * kb, bp + (size_t)jr * kb,
                                   C + (size_t)(ic + ir) * ldc + jc + jr, ldc,
                                   MIN(MR, mb - ir), MIN(NR, nb - jr), 1.0f, beta);
            }
        }
    }
}
/* --8<-- [end:packed] */

/* ------------------------------------------------------------------ bf16 inputs */

/* bf16 is the top half of an f32: widening is a 16-bit shift. */
static inline float bf16_to_f32(uint16_t h)
{
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

/* The same packing for bf16 inputs, widened to f32 on the way: the micro-kernel
 * is the f32 one, and the widening costs O(mk + kn) per block, not O(mnk). */
static void pack_a_bf16(int mb, int kb, const uint16_t *a, size_t rs, size_t cs, float *ap)
{
    for (int ir = 0; ir < mb; ir += MR, ap += (size_t)MR * kb) {
        const int mr = MIN(MR, mb - ir);
        const uint16_t *p = a + ir * rs;
        for (int k = 0; k < kb; k++)
            if (mr == MR)
                for (int r = 0; r < MR; r++)
                    ap[(size_t)k * MR + r] = bf16_to_f32(p[r * rs + k * cs]);
            else
                for (int r = 0; r < MR; r++)
                    ap[(size_t)k * MR + r] = r < mr ? bf16_to_f32(p[r * rs + k * cs]) : 0.0f;
    }
}

static void pack_b_panel_bf16(int nr, int kb, const uint16_t *b, size_t rs, size_t cs, float *bp)
{
    for (int k = 0; k < kb; k++)
        if (nr == NR)
            for (int j = 0; j < NR; j++) bp[(size_t)k * NR + j] = bf16_to_f32(b[k * rs + j * cs]);
        else
            for (int j = 0; j < NR; j++)
                bp[(size_t)k * NR + j] = j < nr ? bf16_to_f32(b[k * rs + j * cs]) : 0.0f;
}

#if defined(SM_AVX512) && defined(SM_AVX512_BF16)
/* --8<-- [start:bf16_kernel] */
/* Native bf16: vdpbf16ps multiplies pairs of bf16 (k, k+1) and adds both
 * products into one f32 lane, so A is packed as 32-bit pairs (broadcast once
 * per pair) and B as NR columns of pairs. kc is padded to even with a zero. */
#define NATIVE_BF16 1

/* x[0] and x[step] as one 32-bit pair, x[0] in the low half (x86 is little-endian). */
static inline uint32_t bf16_pair(const uint16_t *x, size_t step)
{
    return x[0] | (uint32_t)x[step] << 16;
}

static void pack_a_pairs(int mb, int kb, const uint16_t *a, size_t rs, size_t cs, uint16_t *ap)
{
    const int kp = (kb + 1) / 2, whole = kb / 2; /* pairs, and pairs with no padding */
    /* panels stay MR*kb floats apart, as the driver expects: MR*kp pairs fit in that */
    for (int ir = 0; ir < mb; ir += MR, ap += (size_t)MR * kb * 2) {
        const int mr = MIN(MR, mb - ir);
        uint32_t *dst = (uint32_t *)ap;
        for (int p = 0; p < kp; p++)
            for (int r = 0; r < MR; r++) {
                const uint16_t *x = a + (ir + r) * rs + 2 * p * cs;
                dst[(size_t)p * MR + r] = r >= mr ? 0 : p < whole ? bf16_pair(x, cs) : x[0];
            }
    }
}

/* B's rows two at a time, left to right across every panel, as pack_b reads
 * f32 (panel by panel, each pair of rows would be a jump of two rows of B). */
static void pack_b_pairs(int nb, int kb, const uint16_t *b, size_t rs, size_t cs, float *bp)
{
    const int kp = (kb + 1) / 2, whole = kb / 2;
    for (int p = 0; p < kp; p++)
        for (int jr = 0; jr < nb; jr += NR) {
            const int nr = MIN(NR, nb - jr);
            const uint16_t *x = b + 2 * p * rs + jr * cs;
            uint32_t *dst = (uint32_t *)(bp + (size_t)jr * kb) + (size_t)p * NR;
            if (nr == NR && p < whole && cs == 1) /* B as stored: this loop vectorises */
                for (int j = 0; j < NR; j++) dst[j] = x[j] | (uint32_t)x[rs + j] << 16;
            else
                for (int j = 0; j < NR; j++)
                    dst[j] = j >= nr ? 0 : p < whole ? bf16_pair(x + j * cs, rs) : x[j * cs];
        }
}

static void micro_kernel_bf16(int kb, const uint16_t *a, const uint16_t *b, float *c, int ldc,
                              float alpha, float beta)
{
    const int kp = (kb + 1) / 2;
    __m512 acc[MR][2];
#pragma GCC unroll 32
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const uint32_t *a32 = (const uint32_t *)a;
    for (int p = 0; p < kp; p++) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + (size_t)p * NR * 2);
        const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + (size_t)p * NR * 2 + 32);
#pragma GCC unroll 32
        for (int r = 0; r < MR; r++) {
            const __m512bh ar = (__m512bh)_mm512_set1_epi32((int)a32[(size_t)p * MR + r]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], ar, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], ar, b1);
        }
    }
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 32
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < 2; v++) {
            float *cp = c + (size_t)r * ldc + v * 16;
            __m512 t = _mm512_mul_ps(va, acc[r][v]);
            if (beta != 0.0f) t = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cp), t);
            _mm512_storeu_ps(cp, t);
        }
}
/* --8<-- [end:bf16_kernel] */
#endif

/* ------------------------------------------------------------------ the final GEMM */

/* bf16 inputs take one of two paths: widened to f32 in packing for the FMA
 * micro-kernel, or packed as pairs for vdpbf16ps. The second is not always the
 * faster: a CPU may issue vdpbf16ps at half its FMA rate (see gemm_bf16). */
enum { F32 = 0, BF16 = 1, BF16_PAIRS = 2 };

/* One packing call for any input type. */
static void pack_a_any(int dtype, int mb, int kb, const void *a, size_t rs, size_t cs, float *ap)
{
#ifdef NATIVE_BF16
    if (dtype == BF16_PAIRS) {
        pack_a_pairs(mb, kb, (const uint16_t *)a, rs, cs, (uint16_t *)ap);
        return;
    }
#endif
    if (dtype == BF16)
        pack_a_bf16(mb, kb, (const uint16_t *)a, rs, cs, ap);
    else
        pack_a(mb, kb, (const float *)a, rs, cs, ap);
}

static void pack_b_any(int dtype, int nb, int kb, const void *b, size_t rs, size_t cs, float *bp)
{
    if (dtype == F32) {
        pack_b(nb, kb, (const float *)b, rs, cs, bp);
        return;
    }
#ifdef NATIVE_BF16
    if (dtype == BF16_PAIRS) {
        pack_b_pairs(nb, kb, (const uint16_t *)b, rs, cs, bp);
        return;
    }
#endif
    for (int jr = 0; jr < nb; jr += NR)
        pack_b_panel_bf16(MIN(NR, nb - jr), kb, (const uint16_t *)b + jr * cs, rs, cs,
                          bp + (size_t)jr * kb);
}

static void tile_any(int dtype, int kb, const float *ap, const float *bp, float *c, int ldc,
                     int mr, int nr, float alpha, float beta)
{
#ifdef NATIVE_BF16
    if (dtype == BF16_PAIRS) {
        if (mr == MR && nr == NR) {
            micro_kernel_bf16(kb, (const uint16_t *)ap, (const uint16_t *)bp, c, ldc, alpha, beta);
            return;
        }
        float t[MR * NR] __attribute__((aligned(64)));
        micro_kernel_bf16(kb, (const uint16_t *)ap, (const uint16_t *)bp, t, NR, 1.0f, 0.0f);
        for (int r = 0; r < mr; r++)
            for (int j = 0; j < nr; j++) {
                float *cp = c + (size_t)r * ldc + j;
                *cp = beta != 0.0f ? alpha * t[r * NR + j] + beta * *cp : alpha * t[r * NR + j];
            }
        return;
    }
#endif
    (void)dtype;
    store_tile(kb, ap, bp, c, ldc, mr, nr, alpha, beta);
}

/* This thread's number in the team, and the team's size (0 and 1 without OpenMP). */
static inline void team_position(int *t, int *nt)
{
#ifdef _OPENMP
    *t = omp_get_thread_num();
    *nt = omp_get_num_threads();
#else
    *t = 0;
    *nt = 1;
#endif
}

/* Thread t's share of the NR-column panels of a block of B nb wide: columns [j0, j1). */
static inline void b_share(int nb, int t, int nt, int *j0, int *j1)
{
    const int panels = (nb + NR - 1) / NR;
    *j0 = (int)((long long)panels * t / nt) * NR;
    *j1 = MIN(nb, (int)((long long)panels * (t + 1) / nt) * NR);
}

/* Where rung 5's time goes, when a caller asks (gemm_f32_phases): each thread
 * adds the seconds since its last mark to the phase it has just finished. The
 * clock is read at the edges of packing calls, runs of tiles and barriers:
 * hundreds of times in a product of tens of milliseconds, never when row is NULL. */
enum { PACK_B, WAIT_B, PACK_A, TILES, WAIT_END, PHASES };

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void lap(double *row, int phase, double *mark)
{
    if (!row) return;
    const double now = seconds_now();
    row[phase] += now - *mark;
    *mark = now;
}

/* --8<-- [start:threads] */
/* A run of tiles for a thread of rung 5 to compute, [*u0, *u1) in C's row order,
 * taken from the shared counter *next: a 1/nt share of the tiles left (OpenMP's
 * guided rule), but no more than `most`, so single tiles at the end, where a
 * thread that finishes early would otherwise wait for the others, and no run so
 * long that a thread the host slows down holds up the rest. One atomic add a run.
 * Returns 0 when no tiles are left. */
#define RUN_ROWS 2 /* the longest run: two rows of tiles, MR rows of C each */
static int claim(long long *next, long long units, long long most, int nt, long long *u0,
                 long long *u1)
{
    const long long left = units - __atomic_load_n(next, __ATOMIC_RELAXED);
    const long long run = MAX(1, MIN(most, left / nt));
    *u0 = __atomic_fetch_add(next, run, __ATOMIC_RELAXED);
    *u1 = MIN(units, *u0 + run);
    return *u0 < units;
}

/* Rung 5 and the package's GEMM: C = alpha op(A) op(B) + beta C on nthreads
 * threads. The L3 is shared: the threads pack a block of B together (it lives
 * in L3, read by all). Then they share out its tiles in runs (claim), each
 * thread packing the A panel of the tiles it took and walking them along the
 * rows of C. Every tile is summed by one thread in the same order, so the
 * results do not change from call to call. OpenMP keeps its threads alive
 * between parallel regions (a persistent pool), so a call costs a wake-up, not
 * a thread creation.
 * A block of B is one K slice, kc x nc, or, when all of B fits in half that
 * block's L3 space, every slice at once (b_whole): then a thread carries its
 * tiles through all of K while their C lines stay in its L2, where one slice
 * at a time sends all of C through L3 or DRAM once per slice, with two
 * barriers each. Half, because every slice of B must then stay in L3 for the
 * whole call while A's and C's lines stream past it. */
static void gemm_driver(int dtype, int trans_a, int trans_b, int M, int N, int K, float alpha,
                        const void *A, int lda, const void *B, int ldb, float beta, float *C,
                        int ldc, int nthreads, int mc, int kc, int nc, float *work,
                        double *phases)
{
    const size_t es = dtype == F32 ? 4 : 2; /* element size, bytes */
    const size_t rs_a = trans_a ? 1 : lda, cs_a = trans_a ? lda : 1;
    const size_t rs_b = trans_b ? 1 : ldb, cs_b = trans_b ? ldb : 1;
    const int whole = b_whole(N, K, kc, nc);
    const int mcr = ROUND_UP(mc, MR), ncr = ROUND_UP(MIN(nc, ROUND_UP(N, NR)), NR);
    nc = MIN(nc, ncr);
    float *bp = align64(work);
    const size_t b_floats = whole ? (size_t)ROUND_UP(N, NR) * K : (size_t)ncr * kc;
    const long long panels = (M + MR - 1) / MR; /* MR-row panels of C */
    if (nthreads > panels * (ncr / NR)) nthreads = panels * (ncr / NR); /* a tile each at least */
    /* K in equal slices of at most kc: a thin last slice (64 of K = 1024 with kc = 320)
     * would amortise each tile's C update over 64 steps instead of kc. */
    const int kcs = (K + (K + kc - 1) / kc - 1) / ((K + kc - 1) / kc);
    const int kstep = whole ? K : kcs; /* the K slices of one block of B */
    long long next = 0;                /* the block's first tile not yet claimed */
    #pragma omp parallel num_threads(nthreads)
    {
        int t, nt, j0, j1;
        long long u0, u1;
        team_position(&t, &nt);
        /* this thread's A panel (the buffer has room for an mc x kc block, rung 4's) */
        float *ap = align64(bp + b_floats + 16 + (size_t)t * (mcr * (size_t)kc + 16));
        double *row = phases ? phases + (size_t)t * PHASES : NULL, mark = row ? seconds_now() : 0;
        for (int jc = 0; jc < N; jc += nc) {
            const int nb = MIN(nc, N - jc), nbr = ROUND_UP(nb, NR);
            const long long tiles = nbr / NR; /* tile u is panel u / tiles, column u % tiles */
            for (int p0 = 0; p0 < K; p0 += kstep) {
                const int p1 = MIN(K, p0 + kstep);
                b_share(nb, t, nt, &j0, &j1); /* each thread packs its share of B */
                for (int pc = p0; pc < p1 && j0 < j1; pc += kcs) {
                    const int kb = MIN(kcs, K - pc); /* slice pc sits at (pc - p0) * nbr */
                    pack_b_any(dtype, j1 - j0, kb,
                               (const char *)B + (pc * rs_b + (jc + j0) * cs_b) * es, rs_b, cs_b,
                               bp + (size_t)(pc - p0) * nbr + (size_t)j0 * kb);
                }
                if (t == 0) __atomic_store_n(&next, 0, __ATOMIC_RELAXED);
                lap(row, PACK_B, &mark);
                #pragma omp barrier /* B is packed, and the counter reset, before anyone reads */
                lap(row, WAIT_B, &mark);
                /* Tiles from a shared counter, not a fixed share: when the host slows
                 * one core for a while, the others take more of the tiles instead of
                 * waiting for it at the barrier below. */
                while (claim(&next, tiles * panels, RUN_ROWS * tiles, nt, &u0, &u1))
                    for (long long u = u0; u < u1;) { /* the run's tiles in one panel */
                        const int ic = (int)(u / tiles) * MR, mb = MIN(MR, M - ic);
                        const int ja = (int)(u % tiles), jb = (int)MIN(tiles, ja + (u1 - u));
                        for (int pc = p0; pc < p1; pc += kcs) {
                            const int kb = MIN(kcs, K - pc);
                            const float bt = pc == 0 ? beta : 1.0f; /* later slices accumulate */
                            const float *b = bp + (size_t)(pc - p0) * nbr;
                            pack_a_any(dtype, mb, kb,
                                       (const char *)A + (ic * rs_a + pc * cs_a) * es, rs_a,
                                       cs_a, ap);
                            lap(row, PACK_A, &mark);
                            /* Tiles along C's rows: the A sliver stays in L1 (rung 5's kc
                             * is sized for it, not for B's sliver as in rung 4), B's
                             * slivers stream in from L2/L3, and C is read and written as
                             * MR rows left to right, streams the prefetcher follows. Down
                             * the columns (rung 4's order), each tile's C rows are new
                             * lines at a stride the prefetcher cannot follow. */
                            for (int j = ja; j < jb; j++)
                                tile_any(dtype, kb, ap, b + (size_t)j * NR * kb,
                                         C + (size_t)ic * ldc + jc + j * NR, ldc, mb,
                                         MIN(NR, nb - j * NR), alpha, bt);
                            lap(row, TILES, &mark);
                        }
                        u += jb - ja;
                    }
                #pragma omp barrier /* everyone is done with B before it is repacked */
                lap(row, WAIT_END, &mark);
            }
        }
    }
}
/* --8<-- [end:threads] */

#ifdef AMX_BF16
/* AMX (Sapphire Rapids and later): eight tile registers of up to 16 rows of 64
 * bytes, and tdpbf16ps, which multiplies a 16 x 32 bf16 tile of A by a 32 x 16
 * tile of B (in pairs along k, as vdpbf16ps takes them) into a 16 x 16 f32 tile
 * of C: 8192 multiply-adds in one instruction, where a zmm FMA does 16. Four C
 * tiles make a 32 x 32 block of C, fed by two tiles of A and two of B. */
#if NR != 32
#error "the AMX block reads B in the 32-column panels of the AVX-512 build"
#endif

struct amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16]; /* bytes per row of each tile */
    uint8_t rows[16];
};

static void amx_configure(void)
{
    struct amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    SM_TILE_LOADCONFIG(&c);
}

/* Linux gives the tiles' 8 KB of register state only to a process that asks. */
static int amx_permitted(void)
{
#if defined(SM_EMULATE_AVX512)
    return 1;
#elif defined(__linux__)
    static int state = -1;
    if (state < 0)
        state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                        18 /* XFEATURE_XTILEDATA */) == 0;
    return state;
#else
    return 0;
#endif
}

/* 32 rows of A as they are, bf16, each padded with zeros to kp (a multiple of
 * 32): a tile row is then 32 consecutive k of one row of A. */
static void pack_a_amx(int mb, int kb, int kp, const uint16_t *a, size_t rs, size_t cs,
                       uint16_t *ap)
{
    for (int r = 0; r < AMX_MR; r++, ap += kp) {
        int k = 0;
        if (r < mb && cs == 1) {
            memcpy(ap, a + r * rs, (size_t)kb * sizeof *ap);
            k = kb;
        } else if (r < mb) {
            for (; k < kb; k++) ap[k] = a[r * rs + k * cs];
        }
        for (; k < kp; k++) ap[k] = 0;
    }
}

/* B in pack_b_pairs' layout (NR columns of pairs for each pair of rows), padded
 * with zero pairs to kp / 2, so that a tile of 16 pair rows stays in its panel. */
static void pack_b_amx(int nb, int kb, int kp, const uint16_t *b, size_t rs, size_t cs,
                       uint16_t *bp)
{
    const int whole = kb / 2;
    for (int jr = 0; jr < nb; jr += NR) {
        const int nr = MIN(NR, nb - jr);
        uint32_t *dst = (uint32_t *)(bp + (size_t)jr * kp);
        for (int p = 0; p < kp / 2; p++, dst += NR)
            for (int j = 0; j < NR; j++) {
                const uint16_t *x = b + 2 * (size_t)p * rs + (size_t)(jr + j) * cs;
                dst[j] = j >= nr || 2 * p >= kb ? 0 : p < whole ? bf16_pair(x, rs) : x[0];
            }
    }
}

/* --8<-- [start:amx] */
/* A 32 x 32 block of C into t (32 x 32 floats) from a packed A panel and B panel. */
static void amx_block(int kp, const uint16_t *a, const uint16_t *b, float *t)
{
    SM_TILE_ZERO(0);
    SM_TILE_ZERO(1);
    SM_TILE_ZERO(2);
    SM_TILE_ZERO(3);
    for (int k = 0; k < kp; k += AMX_KB) {
        SM_TILE_LOADD(4, a + k, (long)kp * 2);                   /* rows 0-15 of A */
        SM_TILE_LOADD(5, a + (size_t)16 * kp + k, (long)kp * 2); /* rows 16-31 */
        SM_TILE_LOADD(6, b + (size_t)k * NR, NR * 4);            /* columns 0-15 of B */
        SM_TILE_LOADD(7, b + (size_t)k * NR + 32, NR * 4);       /* columns 16-31 */
        SM_TILE_DPBF16PS(0, 4, 6);
        SM_TILE_DPBF16PS(1, 4, 7);
        SM_TILE_DPBF16PS(2, 5, 6);
        SM_TILE_DPBF16PS(3, 5, 7);
    }
    SM_TILE_STORED(0, t, NR * 4);
    SM_TILE_STORED(1, t + 16, NR * 4);
    SM_TILE_STORED(2, t + 16 * NR, NR * 4);
    SM_TILE_STORED(3, t + 16 * NR + 16, NR * 4);
}
/* --8<-- [end:amx] */

/* gemm_driver's loops with 32-row panels of A and the AMX block: the threads
 * pack a block of B together, then take 32 rows of C at a time. */
static void gemm_amx(int trans_a, int trans_b, int M, int N, int K, float alpha,
                     const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta,
                     float *C, int ldc, int nthreads, int kc, int nc, float *work)
{
    const size_t rs_a = trans_a ? 1 : lda, cs_a = trans_a ? lda : 1;
    const size_t rs_b = trans_b ? 1 : ldb, cs_b = trans_b ? ldb : 1;
    const int ncr = ROUND_UP(MIN(nc, ROUND_UP(N, NR)), NR), kca = ROUND_UP(kc, AMX_KB);
    nc = MIN(nc, ncr);
    uint16_t *bp = (uint16_t *)align64(work); /* layout: gemm_work_floats */
    const int panels = (M + AMX_MR - 1) / AMX_MR;
    if (nthreads > panels) nthreads = panels;
    #pragma omp parallel num_threads(nthreads)
    {
        int t, nt, j0, j1;
        team_position(&t, &nt);
        uint16_t *ap = (uint16_t *)align64(work + (size_t)ncr * kca / 2 + 16 +
                                           (size_t)t * (AMX_MR / 2 * (size_t)kca + 16));
        float tile[AMX_MR * NR] __attribute__((aligned(64)));
        amx_configure(); /* tile shapes are per thread */
        for (int jc = 0; jc < N; jc += nc) {
            const int nb = MIN(nc, N - jc);
            for (int pc = 0; pc < K; pc += kca) {
                const int kb = MIN(kca, K - pc), kp = ROUND_UP(kb, AMX_KB);
                const float bt = pc == 0 ? beta : 1.0f;
                b_share(nb, t, nt, &j0, &j1);
                if (j0 < j1)
                    pack_b_amx(j1 - j0, kb, kp, B + pc * rs_b + (jc + j0) * cs_b, rs_b, cs_b,
                               bp + (size_t)j0 * kp);
                #pragma omp barrier
                #pragma omp for schedule(dynamic, 1) nowait
                for (int ic = 0; ic < M; ic += AMX_MR) {
                    const int mb = MIN(AMX_MR, M - ic);
                    pack_a_amx(mb, kb, kp, A + ic * rs_a + pc * cs_a, rs_a, cs_a, ap);
                    for (int jr = 0; jr < nb; jr += NR) {
                        const int nr = MIN(NR, nb - jr);
                        amx_block(kp, ap, bp + (size_t)jr * kp, tile);
                        for (int r = 0; r < mb; r++) {
                            float *c = C + (size_t)(ic + r) * ldc + jc + jr;
                            const float *x = tile + r * NR;
                            if (bt != 0.0f)
                                for (int j = 0; j < nr; j++) c[j] = alpha * x[j] + bt * c[j];
                            else
                                for (int j = 0; j < nr; j++) c[j] = alpha * x[j];
                        }
                    }
                }
                #pragma omp barrier
            }
        }
        SM_TILE_RELEASE();
    }
}
#endif

void gemm_threads_ex(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                     float *C, int ldc, int nthreads, int mc, int kc, int nc, float *work)
{
    gemm_driver(F32, 0, 0, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc, nthreads, mc, kc, nc,
                work, NULL);
}

void gemm_f32(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
              int lda, const float *B, int ldb, float beta, float *C, int ldc, int nthreads,
              int mc, int kc, int nc, float *work)
{
    gemm_driver(F32, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nthreads,
                mc, kc, nc, work, NULL);
}

/* gemm_f32, timed by phase: phases has PHASES (5) doubles per thread, zeroed by
 * the caller; row t receives thread t's seconds packing B, waiting after it,
 * packing A, in tiles, and waiting at the end of each block of B. */
void gemm_f32_phases(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc,
                     int nthreads, int mc, int kc, int nc, float *work, double *phases)
{
    gemm_driver(F32, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nthreads,
                mc, kc, nc, work, phases);
}

/* path 1: vdpbf16ps on pairs, where this build has it (gemm_native_bf16);
 * path 2: AMX tiles, where this build has them and the OS allows (gemm_amx_bf16);
 * otherwise, or with path 0, bf16 is widened to f32 and the FMA kernel runs. */
void gemm_bf16(int path, int trans_a, int trans_b, int M, int N, int K, float alpha,
               const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta, float *C,
               int ldc, int nthreads, int mc, int kc, int nc, float *work)
{
#ifdef AMX_BF16
    if (path == 2 && amx_permitted()) {
        gemm_amx(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nthreads, kc,
                 nc, work);
        return;
    }
#endif
#ifdef NATIVE_BF16
    const int dtype = path == 1 ? BF16_PAIRS : BF16;
#else
    const int dtype = BF16;
    (void)path;
#endif
    gemm_driver(dtype, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nthreads,
                mc, kc, nc, work, NULL);
}

int gemm_native_bf16(void)
{
#ifdef NATIVE_BF16
    return 1;
#else
    return 0;
#endif
}

int gemm_amx_bf16(void)
{
#ifdef AMX_BF16
    return amx_permitted();
#else
    return 0;
#endif
}

/* ------------------------------------------------------------------ short forms */

void gemm_blocked(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                  float *C, int ldc, int nthreads)
{
    gemm_blocked_ex(M, N, K, A, lda, B, ldb, C, ldc, nthreads, default_mc, default_kc,
                    default_nc);
}

void gemm_registers(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                    float *C, int ldc, int nthreads)
{
    gemm_registers_ex(M, N, K, A, lda, B, ldb, C, ldc, nthreads, default_mc, default_kc,
                      default_nc);
}

void gemm_packed(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                 float *C, int ldc, int nthreads)
{
    float *work = malloc(sizeof(float) *
                         gemm_work_floats(N, K, default_mc, default_kc, default_nc, 1));
    if (!work) return;
    gemm_packed_ex(M, N, K, A, lda, B, ldb, C, ldc, 1, default_mc, default_kc, default_nc, work);
    free(work);
}

void gemm_threads(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                  float *C, int ldc, int nthreads)
{
    float *work = malloc(sizeof(float) * gemm_work_floats(N, K, rows_mc, rows_kc, rows_nc, nthreads));
    if (!work) return;
    gemm_threads_ex(M, N, K, A, lda, B, ldb, C, ldc, nthreads, rows_mc, rows_kc, rows_nc, work);
    free(work);
}

/* ---------------------------------------------------- the micro-kernel alone */

/* The micro-kernel with nothing around it, to see what the caches cost it: each of
 * nthreads threads runs `reps` passes over `slivers` tiles, its own A sliver
 * (MR x kc, packed: MR floats per k) against packed B slivers (kc x NR each),
 * either one set that every thread reads (shared_b, as rung 5 shares its block
 * of B) or a set per thread. Thread t's tiles sum into its C, MR x (slivers * NR)
 * floats at c + t * MR * slivers * NR, so the caller can check the arithmetic:
 * after the call C = C0 + reps * A_t B. No packing, no edges, no barriers in the
 * passes: the B slivers' size decides where they come from (L2 or L3). */
void gemm_kernel_alone(int kc, int slivers, int reps, int nthreads, int shared_b,
                       const float *a, const float *b, float *c)
{
    const int ldc = slivers * NR;
    #pragma omp parallel num_threads(nthreads)
    {
        int t0, nt;
        team_position(&t0, &nt);
        for (int t = t0; t < nthreads; t += nt) { /* without OpenMP one thread does all */
            const float *at = a + (size_t)t * MR * kc;
            const float *bt = b + (shared_b ? 0 : (size_t)t * slivers * NR * kc);
            float *ct = c + (size_t)t * MR * ldc;
            for (int r = 0; r < reps; r++)
                for (int j = 0; j < slivers; j++)
                    store_tile(kc, at, bt + (size_t)j * NR * kc, ct + j * NR, ldc, MR, NR,
                               1.0f, 1.0f); /* the call rung 5 makes for a full tile */
        }
    }
}

/* ------------------------------------------------------------------ the thread pool */

/* The kernel-thread id of each OpenMP thread: equal ids on two calls show that
 * the pool's threads were reused, not created again. */
int gemm_pool_ids(int nthreads, long long *ids)
{
    int n = 1;
    #pragma omp parallel num_threads(nthreads)
    {
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
        #pragma omp single
        n = omp_get_num_threads();
#endif
#if defined(__linux__)
        ids[t] = (long long)syscall(SYS_gettid);
#else
        ids[t] = (long long)t;
#endif
    }
    return n;
}

/* What a parallel region costs once the pool exists: an empty one, `reps` times. */
void gemm_empty_regions(int reps, int nthreads)
{
    for (int r = 0; r < reps; r++) {
        #pragma omp parallel num_threads(nthreads)
        {
            int x = r;
            SM_OPAQUE(x);
        }
    }
}

static void *noop(void *arg) { return arg; }

/* What it would cost without a pool: create and join nthreads - 1 threads. */
void gemm_spawn_join(int reps, int nthreads)
{
    pthread_t th[256];
    if (nthreads > 256) nthreads = 256;
    for (int r = 0; r < reps; r++) {
        for (int t = 1; t < nthreads; t++) pthread_create(&th[t], NULL, noop, NULL);
        for (int t = 1; t < nthreads; t++) pthread_join(th[t], NULL);
    }
}
