/* bf16 inputs for the package's GEMM (gemm_bf16 in gemm/driver.c): packing that
 * widens bf16 to f32 for the f32 micro-kernel, the vdpbf16ps micro-kernel on pairs
 * (AVX512_BF16), and AMX tiles (AMX_BF16).
 *
 * Included by ../gemm.c after the ladder, before gemm/driver.c, not compiled alone.
 */
#include "../amx.h"
#include "../half.h"

/* AMX (bf16 inputs only, see gemm_amx): with the AVX-512 build, on CPUs that have it. */
#if defined(SM_AMX_BF16) && defined(SM_AVX512) && defined(SM_AVX512_BF16)
#define AMX_BF16 1
#define AMX_MR 32 /* rows of C per block: two tiles of 16 */
#define AMX_KB 32 /* bf16 along k in one 64-byte tile row */
#endif


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
                    ap[(size_t)k * MR + r] = sm_bf16_to_f32(p[r * rs + k * cs]);
            else
                for (int r = 0; r < MR; r++)
                    ap[(size_t)k * MR + r] = r < mr ? sm_bf16_to_f32(p[r * rs + k * cs]) : 0.0f;
    }
}

static void pack_b_panel_bf16(int nr, int kb, const uint16_t *b, size_t rs, size_t cs, float *bp)
{
    for (int k = 0; k < kb; k++)
        if (nr == NR)
            for (int j = 0; j < NR; j++) bp[(size_t)k * NR + j] = sm_bf16_to_f32(b[k * rs + j * cs]);
        else
            for (int j = 0; j < NR; j++)
                bp[(size_t)k * NR + j] = j < nr ? sm_bf16_to_f32(b[k * rs + j * cs]) : 0.0f;
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

#ifdef AMX_BF16
/* AMX (Sapphire Rapids and later): eight tile registers of up to 16 rows of 64
 * bytes, and tdpbf16ps, which multiplies a 16 x 32 bf16 tile of A by a 32 x 16
 * tile of B (in pairs along k, as vdpbf16ps takes them) into a 16 x 16 f32 tile
 * of C: 8192 multiply-adds in one instruction, where a zmm FMA does 16. Four C
 * tiles make a 32 x 32 block of C, fed by two tiles of A and two of B. */
#if NR != 32
#error "the AMX block reads B in the 32-column panels of the AVX-512 build"
#endif

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

/* --8<-- [start:amx_put] */
/* What gemm_amx does with a finished 32 x 32 block of C, stored from the tiles into t
 * (the AMX ladder's rungs, chapter 2): AMX_VECTOR, sixteen floats at a time, masked at
 * the edges; AMX_STREAM, the same with non-temporal stores on C's last K slice, which
 * write whole lines to memory without reading them first (for a C larger than the
 * caches, whose lines no later slice or reader would find there). */
enum { AMX_VECTOR = 0, AMX_STREAM = 1 };

static void amx_put(int epilogue, int last, int mb, int nr, const float *t, float *c, int ldc,
                    float alpha, float beta)
{
    const __mmask16 m[2] = {nr >= 16 ? 0xFFFF : (__mmask16)((1u << nr) - 1),
                            nr >= 32 ? 0xFFFF : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1)};
    const int stream = epilogue == AMX_STREAM && last;
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int r = 0; r < mb; r++, c += ldc, t += NR)
        for (int v = 0; v < 2 && m[v]; v++) {
            __m512 y = _mm512_mul_ps(va, _mm512_load_ps(t + 16 * v));
            if (beta != 0.0f) y = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m[v], c + 16 * v), y);
            if (stream && m[v] == 0xFFFF && ((uintptr_t)(c + 16 * v) & 63) == 0)
                _mm512_stream_ps(c + 16 * v, y); /* one whole line, not read first */
            else
                _mm512_mask_storeu_ps(c + 16 * v, m[v], y);
        }
}
/* --8<-- [end:amx_put] */

/* gemm_driver's loops with 32-row panels of A and the AMX block: the threads
 * pack a block of B together, then take 32 rows of C at a time. K and N are cut into
 * equal slices of at most kc and nc (smallem.gemm.amx_blocks sizes them). */
static void gemm_amx(int trans_a, int trans_b, int M, int N, int K, float alpha,
                     const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta,
                     float *C, int ldc, int nthreads, int kc, int nc, int epilogue, float *work)
{
    const size_t rs_a = trans_a ? 1 : lda, cs_a = trans_a ? lda : 1;
    const size_t rs_b = trans_b ? 1 : ldb, cs_b = trans_b ? ldb : 1;
    const int ncr = ROUND_UP(MIN(nc, ROUND_UP(N, NR)), NR), kcw = ROUND_UP(kc, AMX_KB);
    const int kca = ROUND_UP(equal_slices(K, kc), AMX_KB); /* <= kcw, what the buffer holds */
    nc = MIN(ncr, ROUND_UP(equal_slices(N, nc), NR));
    uint16_t *bp = (uint16_t *)align64(work); /* layout: gemm_work_floats */
    const int panels = (M + AMX_MR - 1) / AMX_MR;
    if (nthreads > panels) nthreads = panels;
    #pragma omp parallel num_threads(nthreads)
    {
        int t, nt, j0, j1;
        team_position(&t, &nt);
        uint16_t *ap = (uint16_t *)align64(work + (size_t)ncr * kcw / 2 + 16 +
                                           (size_t)t * (AMX_MR / 2 * (size_t)kcw + 16));
        float tile[AMX_MR * NR] __attribute__((aligned(64)));
        sm_amx_configure(); /* tile shapes are per thread */
        for (int jc = 0; jc < N; jc += nc) {
            const int nb = MIN(nc, N - jc);
            for (int pc = 0; pc < K; pc += kca) {
                const int kb = MIN(kca, K - pc), kp = ROUND_UP(kb, AMX_KB);
                const float bt = pc == 0 ? beta : 1.0f;
                const int last = pc + kb == K;
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
                        amx_block(kp, ap, bp + (size_t)jr * kp, tile);
                        amx_put(epilogue, last, mb, MIN(NR, nb - jr), tile,
                                C + (size_t)ic * ldc + jc + jr, ldc, alpha, bt);
                    }
                }
                #pragma omp barrier
            }
        }
        if (epilogue == AMX_STREAM) _mm_sfence(); /* the streamed lines before any reader */
        SM_TILE_RELEASE();
    }
}
#endif

/* The AMX block with nothing around it, for chapter 2's AMX ladder (as gemm_kernel_alone
 * is for the f32 micro-kernel): each thread makes reps passes of amx_block over its own
 * packed A panel (32 x kp) and the same `panels` packed B panels (kp x 32 each, shared),
 * with no packing and no C: the tiles go to a buffer, as in gemm_amx. The last pass
 * copies thread t's blocks into c (threads x panels x 32 x 32), for the tests. -1 where
 * this build or the OS has no AMX tiles. */
int gemm_amx_alone(int kp, int panels, int reps, int nthreads, const uint16_t *a,
                   const uint16_t *b, float *c)
{
#ifdef AMX_BF16
    if (!sm_amx_permitted() || kp % AMX_KB) return -1;
    #pragma omp parallel num_threads(nthreads)
    {
        int t0, nt;
        team_position(&t0, &nt);
        float tile[AMX_MR * NR] __attribute__((aligned(64)));
        sm_amx_configure();
        for (int t = t0; t < nthreads; t += nt) /* without OpenMP one thread does all */
            for (int r = 0; r < reps; r++)
                for (int j = 0; j < panels; j++) {
                    amx_block(kp, a + (size_t)t * AMX_MR * kp, b + (size_t)j * NR * kp, tile);
                    if (r == reps - 1)
                        memcpy(c + ((size_t)t * panels + j) * AMX_MR * NR, tile, sizeof tile);
                }
        SM_TILE_RELEASE();
    }
    return 0;
#else
    (void)kp, (void)panels, (void)reps, (void)nthreads, (void)a, (void)b, (void)c;
    return -1;
#endif
}

int gemm_native_bf16(void)
{
#ifdef NATIVE_BF16
    return 1;
#else
    return 0;
#endif
}

/* The AMX path alone, with its own blocks and epilogue (amx_put's numbers): for
 * smallem.matmul_bf16 and chapter 2's AMX ladder. -1 where this build or the OS has no
 * AMX tiles, else 0. */
int gemm_bf16_amx(int trans_a, int trans_b, int M, int N, int K, float alpha, const uint16_t *A,
                  int lda, const uint16_t *B, int ldb, float beta, float *C, int ldc,
                  int nthreads, int kc, int nc, int epilogue, float *work)
{
#ifdef AMX_BF16
    if (sm_amx_permitted() && epilogue >= AMX_VECTOR && epilogue <= AMX_STREAM) {
        gemm_amx(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nthreads, kc,
                 nc, epilogue, work);
        return 0;
    }
#else
    (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda;
    (void)B, (void)ldb, (void)beta, (void)C, (void)ldc, (void)nthreads, (void)kc, (void)nc;
    (void)epilogue, (void)work;
#endif
    return -1;
}

int gemm_amx_bf16(void)
{
#ifdef AMX_BF16
    return sm_amx_permitted();
#else
    return 0;
#endif
}

