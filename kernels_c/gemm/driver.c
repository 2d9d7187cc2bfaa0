/* The package's GEMM: C = alpha op(A) op(B) + beta C, f32 or bf16 inputs, f32 out.
 *
 * Included by ../gemm.c after the ladder, not compiled alone: it is rung 5's
 * algorithm (the same blocks, the same claim, the same micro-kernel and packing
 * functions), generalised. What it adds: transposes, taken in packing through the
 * strides (rs, cs); alpha and beta, applied when a tile is stored; bf16 inputs
 * (gemm/bf16.c); all of B packed at once when it is small (b_whole); and the clock
 * that times each phase when asked (gemm_f32_phases). Python calls gemm_f32 and
 * gemm_bf16 for smallem.matmul and smallem.matmul_bf16.
 */
#include <time.h>

/* --8<-- [start:b_whole] */
/* Whether gemm_driver packs all of B, every K slice, before any tile: when B takes
 * no more than half the L3 space the model gives a kc x nc block of B. */
static int b_whole(int N, int K, int kc, int nc)
{
    return K > kc && 2 * (long long)K * ROUND_UP(N, NR) <= (long long)kc * nc;
}
/* --8<-- [end:b_whole] */

int gemm_b_whole(int N, int K, int kc, int nc) /* for the tests */
{
    return b_whole(N, K, kc, nc);
}

/* Floats the packing buffer needs, for rungs 4 and 5 and gemm_driver: one shared
 * B block (all of B when b_whole), then one A block per thread (see a_block). */
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

/* bf16 inputs take one of two paths: widened to f32 in packing for the FMA
 * micro-kernel, or packed as pairs for vdpbf16ps. The second is not always the
 * faster: a CPU may issue vdpbf16ps at half its FMA rate (see gemm_bf16). */
enum { F32 = 0, BF16 = 1, BF16_PAIRS = 2 };

/* The two orders of the tiles (gemm_driver's order): chosen by smallem.gemm.loop_order. */
enum { ROWS = 0, COLUMNS = 1 };

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

/* Where the driver's time goes, when a caller asks (gemm_f32_phases): each thread
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

/* --8<-- [start:driver] */
/* The package's GEMM: rung 5 (gemm_threads_ex in ../gemm.c), generalised to
 * C = alpha op(A) op(B) + beta C with f32 or bf16 inputs (dtype). The threads pack
 * each block of B together, then claim runs of its tiles; every tile is summed by
 * one thread in the same order, so the results do not change from call to call or
 * with the number of threads, and a plain f32 A B gives rung 5's bits. OpenMP keeps
 * its threads alive between parallel regions (a persistent pool), so a call costs a
 * wake-up, not a thread creation.
 * A block of B is one K slice, kc x nc, or, when all of B fits in half that
 * block's L3 space, every slice at once (b_whole): then a thread carries its
 * tiles through all of K while their C lines stay in its L2, where one slice
 * at a time sends all of C through L3 or DRAM once per slice, with two
 * barriers each. Half, because every slice of B must then stay in L3 for the
 * whole call while A's and C's lines stream past it. */
static void gemm_driver(int dtype, int trans_a, int trans_b, int M, int N, int K, float alpha,
                        const void *A, int lda, const void *B, int ldb, float beta, float *C,
                        int ldc, int nthreads, int order, int mc, int kc, int nc, float *work,
                        double *phases)
{
    const size_t es = dtype == F32 ? 4 : 2; /* element size, bytes */
    const size_t rs_a = trans_a ? 1 : lda, cs_a = trans_a ? lda : 1;
    const size_t rs_b = trans_b ? 1 : ldb, cs_b = trans_b ? ldb : 1;
    const int whole = b_whole(N, K, kc, nc);
    const int ncr = ROUND_UP(MIN(nc, ROUND_UP(N, NR)), NR);
    nc = MIN(nc, ncr);
    float *bp = align64(work);
    const size_t b_floats = whole ? (size_t)ROUND_UP(N, NR) * K : (size_t)ncr * kc;
    /* The rows of A a thread packs at once: one MR sliver, which stays in L1 while the
     * tiles go along C's rows (order ROWS, rung 5), or a block of up to mc rows, which stays
     * in L2 while each B sliver stays in L1 for the tiles down its column (order COLUMNS,
     * rung 4's order). The blocks are then as many as a multiple of the threads, and of
     * equal height: each is a large share of the work, and unequal shares would leave a
     * thread waiting at the end. */
    int ma = MR;
    if (order == COLUMNS) {
        const int blocks = ROUND_UP((M + ROUND_UP(mc, MR) - 1) / ROUND_UP(mc, MR), nthreads);
        ma = ROUND_UP((M + blocks - 1) / blocks, MR);
    }
    const long long panels = (M + ma - 1) / ma; /* blocks of ma rows of C */
    if (nthreads > panels * (ncr / NR)) nthreads = panels * (ncr / NR); /* a unit each at least */
    const int kcs = equal_slices(K, kc);
    const int kstep = whole ? K : kcs; /* the K slices of one block of B */
    long long next = 0;                /* the block's first tile not yet claimed */
    #pragma omp parallel num_threads(nthreads)
    {
        int t, nt, j0, j1;
        long long u0, u1;
        team_position(&t, &nt);
        float *ap = a_block(bp, b_floats, mc, kc, t); /* room for rung 4's mc x kc block */
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
                /* unit u: the tile column u % tiles of the block of rows u / tiles */
                while (claim(&next, tiles * panels, (order == COLUMNS ? 1 : RUN_ROWS) * tiles,
                             nt, &u0, &u1))
                    for (long long u = u0; u < u1;) { /* the run's columns in one block */
                        const int ic = (int)(u / tiles) * ma, mb = MIN(ma, M - ic);
                        const int ja = (int)(u % tiles), jb = (int)MIN(tiles, ja + (u1 - u));
                        for (int pc = p0; pc < p1; pc += kcs) {
                            const int kb = MIN(kcs, K - pc);
                            const float bt = pc == 0 ? beta : 1.0f; /* later slices accumulate */
                            const float *b = bp + (size_t)(pc - p0) * nbr;
                            pack_a_any(dtype, mb, kb,
                                       (const char *)A + (ic * rs_a + pc * cs_a) * es, rs_a,
                                       cs_a, ap);
                            lap(row, PACK_A, &mark);
                            /* ROWS: one sliver (ir = 0 only), the tiles along C's rows;
                             * COLUMNS: each B sliver down the block's slivers of A */
                            for (int j = ja; j < jb; j++)
                                for (int ir = 0; ir < mb; ir += MR)
                                    tile_any(dtype, kb, ap + (size_t)ir * kb,
                                             b + (size_t)j * NR * kb,
                                             C + (size_t)(ic + ir) * ldc + jc + j * NR, ldc,
                                             MIN(MR, mb - ir), MIN(NR, nb - j * NR), alpha, bt);
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
/* --8<-- [end:driver] */

void gemm_f32(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
              int lda, const float *B, int ldb, float beta, float *C, int ldc, int nthreads,
              int order, int mc, int kc, int nc, float *work)
{
    gemm_driver(F32, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nthreads,
                order, mc, kc, nc, work, NULL);
}

/* gemm_f32, timed by phase: phases has PHASES (5) doubles per thread, zeroed by
 * the caller; row t receives thread t's seconds packing B, waiting after it,
 * packing A, in tiles, and waiting at the end of each block of B. */
void gemm_f32_phases(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc,
                     int nthreads, int order, int mc, int kc, int nc, float *work,
                     double *phases)
{
    gemm_driver(F32, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nthreads,
                order, mc, kc, nc, work, phases);
}

/* path 1: vdpbf16ps on pairs, where this build has it (gemm_native_bf16);
 * path 2: AMX tiles, where this build has them and the OS allows (gemm_amx_bf16);
 * otherwise, or with path 0, bf16 is widened to f32 and the FMA kernel runs. */
void gemm_bf16(int path, int trans_a, int trans_b, int M, int N, int K, float alpha,
               const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta, float *C,
               int ldc, int nthreads, int order, int mc, int kc, int nc, float *work)
{
#ifdef AMX_BF16
    if (path == 2 && sm_amx_permitted()) {
        gemm_amx(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nthreads, kc,
                 nc, AMX_VECTOR, work);
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
                order, mc, kc, nc, work, NULL);
}
