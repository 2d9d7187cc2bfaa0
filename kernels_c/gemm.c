/* Chapter 2: the matrix product C = A B, one rung of the ladder per function.
 *
 * Every rung has the same prototype: row-major A (M x K, leading dimension
 * lda), B (K x N, ldb), C (M x N, ldc), and a thread count that the
 * single-threaded rungs ignore. C is overwritten.
 *
 * Rungs 2 to 5 also take the block sizes (mc, kc, nc) and, from rung 4 on, the
 * packing buffer (the `_ex` in their names: both are explicit): Python computes
 * the blocks from the machine's caches and owns the buffer, so nothing here is
 * tuned for one machine and nothing is allocated per call.
 *
 * This file is the ladder, what chapter 2 shows. The package's GEMM (gemm_f32,
 * gemm_bf16: transposes, alpha and beta, bf16 inputs) and the instruments that
 * time its parts are in gemm/, included at the end of this file.
 */
#include <math.h>
#include "common.h"
#include "gemm.h"

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

void gemm_micro_shape(int *mr, int *nr)
{
    *mr = MR;
    *nr = NR;
}

/* --8<-- [start:naive] */
/* Rung 0: the textbook triple loop. The inner loop walks down a column of B,
 * one float per 64-byte cache line, and each sum waits for the previous one: a fused
 * multiply-add (fmaf, one instruction where the ISA has FMA; a compiler left to itself
 * emits a multiply and an add here, whose chain is the add's shorter latency). */
void gemm_naive(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                float *C, int ldc, int nthreads)
{
    (void)nthreads;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float sum = 0.0f;
            for (int k = 0; k < K; k++) sum = fmaf(A[(size_t)i * lda + k], B[(size_t)k * ldb + j], sum);
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

/* How far ahead of its loads the micro-kernel asks for B: 4 KiB of B's rows (32 steps on
 * AVX-512, 64 on AVX2), every line of the row that far ahead. The row order reads a new B
 * sliver from the L3 for every tile, and the hardware's prefetchers alone leave the kernel
 * waiting on the L3's latency (chapter 2's "alone" table measures both levels). Past the
 * sliver's end the lines asked for are the next sliver's, which the next tile reads. */
#define PF_B_BYTES 4096

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
        const char *ahead = (const char *)(b + (size_t)(k + PF_B_BYTES / (4 * NR)) * rs_b);
        for (int l = 0; l < 4 * NR; l += 64) _mm_prefetch(ahead + l, _MM_HINT_T0);
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
        for (int i = 0; i < 16; i++)
            r[i] = i < rows ? _mm512_loadu_ps(p + i * rs + k) : _mm512_setzero_ps();
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
        for (int i = 0; i < 8; i++)
            r[i] = i < rows ? _mm256_loadu_ps(p + i * rs + k) : _mm256_setzero_ps();
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
static SM_NOCLONE void store_tile(int kb, const float *ap, const float *bp, float *c, int ldc,
                                  int mr, int nr, float alpha, float beta)
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

/* ------------------------------------------------------------------ threads */

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

/* The slice of K a block of B holds: kc, shortened so that K falls into equal
 * slices. A thin last slice (64 of K = 1024 with kc = 320) would amortise each
 * tile's update of C over 64 steps instead of 320. */
static int equal_slices(int K, int kc)
{
    const int slices = (K + kc - 1) / kc;
    return (K + slices - 1) / slices;
}

int gemm_equal_slices(int K, int kc) { return equal_slices(K, kc); } /* for Python's mirror */

/* Thread t's block of A in the packing buffer, behind a block of B of b_floats
 * (the layout gemm_work_floats counts: the B block, then one A block per thread,
 * each on its own cache lines). */
static float *a_block(float *bp, size_t b_floats, int mc, int kc, int t)
{
    return align64(bp + b_floats + 16 + (size_t)t * ((size_t)ROUND_UP(mc, MR) * kc + 16));
}

/* --8<-- [start:sharing] */
/* Thread t's share of the NR-column panels of a block of B nb wide: columns [j0, j1). */
static inline void b_share(int nb, int t, int nt, int *j0, int *j1)
{
    const int panels = (nb + NR - 1) / NR;
    *j0 = (int)((long long)panels * t / nt) * NR;
    *j1 = MIN(nb, (int)((long long)panels * (t + 1) / nt) * NR);
}

/* A run of tiles for a thread to compute, [*u0, *u1) in C's row order, taken
 * from the shared counter *next: a 1/nt share of the tiles left (OpenMP's
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
/* --8<-- [end:sharing] */

/* Rung 4 walks its tiles down the columns (ir inside jr): B's sliver stays in L1,
 * but each tile's MR rows of C are lines untouched since the previous K slice, one
 * row of C apart, a stride no prefetcher follows. Rung 5 walks along C's rows: A's
 * sliver (MR x kc, 28 KiB with AVX-512's MR = 14 and kc = 512) is what stays in L1,
 * B's slivers stream in one after another from L2/L3 (consecutive in the packed
 * block), and C is read and written as MR rows left to right, streams the
 * prefetcher follows. A sliver then serves one row of tiles, so no mc x kc block of
 * A is kept in L2, and work can be handed out in runs as short as one tile. */
/* --8<-- [start:threads] */
/* Rung 5: rung 4 on up to nthreads threads (one per tile at most), each running all the
 * loops below. They pack each block of B together (it lives in the shared L3), then claim
 * runs of its tiles in C's row order; a row's A sliver stays in L1 as B's slivers pass. */
void gemm_threads_ex(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                     float *C, int ldc, int nthreads, int mc, int kc, int nc, float *work)
{
    const long long ncr = ROUND_UP(MIN(nc, ROUND_UP(N, NR)), NR), panels = (M + MR - 1) / MR;
    float *bp = align64(work); /* layout: gemm_work_floats */
    long long next = 0;        /* the block's first tile not yet claimed */
    kc = equal_slices(K, kc); /* K in equal slices, at most kc each */
    #pragma omp parallel num_threads(MIN(nthreads, panels * (ncr / NR)))
    for (int jc = 0; jc < N; jc += nc) {
        const int nb = MIN(nc, N - jc);
        const int tiles = (nb + NR - 1) / NR; /* tile u: row u / tiles, column u % tiles */
        int t, nt, j0, j1;
        long long u0, u1;
        team_position(&t, &nt);
        float *ap = a_block(bp, (size_t)ncr * kc, mc, kc, t); /* this thread's A sliver */
        for (int pc = 0; pc < K; pc += kc) {
            const int kb = MIN(kc, K - pc);
            const float beta = pc == 0 ? 0.0f : 1.0f; /* first slice overwrites C */
            b_share(nb, t, nt, &j0, &j1); /* this thread's panels of B */
            pack_b(j1 - j0, kb, B + (size_t)pc * ldb + jc + j0, ldb, 1, bp + (size_t)j0 * kb);
            if (t == 0) __atomic_store_n(&next, 0, __ATOMIC_RELAXED);
            #pragma omp barrier /* B is packed, and the counter reset, before anyone reads */
            while (claim(&next, tiles * panels, RUN_ROWS * tiles, nt, &u0, &u1))
                for (long long u = u0; u < u1; u++) {
                    const int ic = (int)(u / tiles) * MR, jr = (int)(u % tiles) * NR;
                    if (u == u0 || jr == 0) /* a new row of tiles: pack its A sliver */
                        pack_a(MIN(MR, M - ic), kb, A + (size_t)ic * lda + pc, lda, 1, ap);
                    store_tile(kb, ap, bp + (size_t)jr * kb, C + (size_t)ic * ldc + jc + jr, ldc,
                               MIN(MR, M - ic), MIN(NR, nb - jr), 1.0f, beta);
                }
            #pragma omp barrier /* everyone is done with B before it is repacked */
        }
    }
}
/* --8<-- [end:threads] */

/* ------------------------------------------------------------------ the package's GEMM */

/* The package's GEMM and the instruments that time it, built from the pieces
 * above. Included rather than compiled apart: the micro-kernel and the packing
 * functions stay static and are inlined there as in the rungs, and the cffi
 * module stays one file to compile (smallem.build hashes every file in gemm/
 * into its key). */
#include "gemm/bf16.c"
#include "gemm/driver.c"
#include "gemm/instruments.c"
