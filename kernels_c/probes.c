/* Chapter 1: probes for the machine's limits.
 *
 * Each probe returns the number of operations it performed (a multiply and an
 * add count as two, as in every FLOP count of this book) so that Python only
 * divides by the time it measured. Results go to a sink so the compiler cannot
 * drop the work.
 */
#include "common.h"
#include "amx.h"
#include "probes.h"

/* --8<-- [start:add_chain] */
/* The clock, measured: 64 integer adds per iteration, each waiting for the one
 * before. An add of two registers has a latency of one cycle on every core we
 * know of, so adds per second is cycles per second. The step lives in a
 * register the compiler cannot see into: an add of a small constant would not
 * do, because Intel cores since Golden Cove (Alder Lake P, Sapphire and
 * Emerald Rapids) perform such adds while renaming registers, several per
 * cycle, and the chain then runs faster than the clock. The empty asm after
 * each add keeps the compiler from folding the 64 adds into one. */
double probe_add_chain(long long iters)
{
    long long x = 0, step = 1;
    SM_OPAQUE_REG(step);
    for (long long i = 0; i < iters; i++) {
#define ADD1 x += step; SM_OPAQUE_REG(x);
#define ADD8 ADD1 ADD1 ADD1 ADD1 ADD1 ADD1 ADD1 ADD1
        ADD8 ADD8 ADD8 ADD8 ADD8 ADD8 ADD8 ADD8
    }
    return (double)x;
}

/* A second clock, independent of the first: the same chain of 64 dependent
 * operations, multiplies this time. A 64-bit integer multiply takes three
 * cycles on every x86 core since Intel Nehalem and AMD Zen, and no core
 * shortens it at renaming, so the two clocks agree only if both chains
 * measure what they claim. Odd factors keep x from ever becoming 0. */
double probe_mul_chain(long long iters)
{
    unsigned long long x = 1, factor = 3;
    SM_OPAQUE_REG(factor);
    for (long long i = 0; i < iters; i++) {
#define MUL1 x *= factor; SM_OPAQUE_REG(x);
#define MUL8 MUL1 MUL1 MUL1 MUL1 MUL1 MUL1 MUL1 MUL1
        MUL8 MUL8 MUL8 MUL8 MUL8 MUL8 MUL8 MUL8
    }
    return (double)(x & 0xffff);
}
/* --8<-- [end:add_chain] */

/* --8<-- [start:fma] */
/* Peak f32: NACC independent accumulators, each updated acc = acc*a + b.
 * An FMA takes 4 cycles and two can start every cycle, so at least 4*2 = 8
 * chains must be in flight to keep both pipes busy; we use more. a and b keep
 * acc near 1.0 so no denormals (which are slow) ever appear. */
static float fma_one_thread(long long iters)
{
#if defined(SM_AVX512)
    enum { NACC = 16, LANES = 16 };
    __m512 acc[NACC], a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
    for (int k = 0; k < NACC; k++) acc[k] = _mm512_set1_ps(1.0f + k);
    for (long long i = 0; i < iters; i++)
        for (int k = 0; k < NACC; k++) acc[k] = _mm512_fmadd_ps(acc[k], a, b);
    for (int k = 1; k < NACC; k++) acc[0] = _mm512_add_ps(acc[0], acc[k]);
    return _mm512_reduce_add_ps(acc[0]);
#elif defined(SM_AVX2)
    enum { NACC = 12, LANES = 8 };
    __m256 acc[NACC], a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
    for (int k = 0; k < NACC; k++) acc[k] = _mm256_set1_ps(1.0f + k);
    for (long long i = 0; i < iters; i++)
        for (int k = 0; k < NACC; k++) acc[k] = _mm256_fmadd_ps(acc[k], a, b);
    for (int k = 1; k < NACC; k++) acc[0] = _mm256_add_ps(acc[0], acc[k]);
    float out[LANES];
    _mm256_storeu_ps(out, acc[0]);
    float s = 0;
    for (int l = 0; l < LANES; l++) s += out[l];
    return s;
#else
    /* Plain C: the compiler vectorises the inner loop with whatever the
     * baseline ISA offers (SSE2 on x86-64, NEON on arm64). */
    enum { NACC = 12, LANES = 8 };
    float acc[NACC][LANES];
    for (int k = 0; k < NACC; k++)
        for (int l = 0; l < LANES; l++) acc[k][l] = 1.0f + k;
    for (long long i = 0; i < iters; i++)
        for (int k = 0; k < NACC; k++)
            for (int l = 0; l < LANES; l++) acc[k][l] = acc[k][l] * 0.999f + 0.001f;
    float s = 0;
    for (int k = 0; k < NACC; k++)
        for (int l = 0; l < LANES; l++) s += acc[k][l];
    return s;
#endif
}

static int fma_ops_per_iter(void)
{
#if defined(SM_AVX512)
    return 16 * 16 * 2;
#else
    return 12 * 8 * 2;
#endif
}
/* --8<-- [end:fma] */

/* Runs fn on nthreads threads at once; returns the sum of what they return. */
#define ON_THREADS(nthreads, T, expr, sink)                        \
    do {                                                           \
        T total_ = 0;                                              \
        _Pragma("omp parallel num_threads(nthreads) reduction(+:total_)") \
        { total_ += (expr); }                                      \
        *(sink) = total_;                                          \
    } while (0)

double probe_fma_f32(long long iters, int nthreads, float *sink)
{
    ON_THREADS(nthreads, float, fma_one_thread(iters), sink);
    return (double)iters * fma_ops_per_iter() * nthreads;
}

/* Independent chains in the AVX-512 dot probes. A vdpbf16ps or vpdpbusd takes
 * several cycles before its result can be used, and a core may start up to two
 * a cycle, so at least latency x 2 chains must be in flight, or the probe times
 * the latency, not the rate. Too many can be as bad: on Zen 4, 24 chains run
 * about a sixth slower than 8 to 16 (measured; the scheduler, not the pipes,
 * is then full). No count suits every core, so the probe takes the count as an
 * argument, one of DOT_CHAINS below, and chapter 1 keeps the fastest. */
#define DOT_CHAIN_COUNTS 8, 12, 16, 24
static const int DOT_CHAINS[] = {DOT_CHAIN_COUNTS};
enum { N_DOT_CHAINS = sizeof DOT_CHAINS / sizeof DOT_CHAINS[0] };

int probe_dot_chain_count(int i)
{
    return i >= 0 && i < N_DOT_CHAINS ? DOT_CHAINS[i] : 0;
}

static int dot_chains_valid(int chains)
{
    for (int i = 0; i < N_DOT_CHAINS; i++)
        if (DOT_CHAINS[i] == chains) return 1;
    return 0;
}

/* One switch case a chain count: each count its own loop, its accumulators in
 * registers (an array indexed at run time would live in memory). */
#define DOT_SWITCH(chains, BODY) \
    switch (chains) { case 8: BODY(8) case 12: BODY(12) case 16: BODY(16) default: BODY(24) }

/* --8<-- [start:bf16] */
/* bf16 dot: vdpbf16ps multiplies 32 pairs of bf16 and adds them, two by two,
 * into 16 f32 lanes: 64 operations per instruction, twice the f32 FMA's 32.
 * Without it (AVX2, or AVX-512 without BF16) a bf16 number is widened to f32
 * by a 16-bit shift and the product is an ordinary FMA. */
#if defined(SM_AVX512_BF16)
#define BF16_CHAINS(NACC)                                                         \
    {                                                                             \
        __m512 acc[NACC];                                                         \
        for (int k = 0; k < NACC; k++) acc[k] = _mm512_set1_ps(1.0f + k);         \
        for (long long i = 0; i < iters; i++)                                     \
            for (int k = 0; k < NACC; k++) acc[k] = _mm512_dpbf16_ps(acc[k], a, b); \
        for (int k = 1; k < NACC; k++) acc[0] = _mm512_add_ps(acc[0], acc[k]);    \
        return _mm512_reduce_add_ps(acc[0]);                                      \
    }
#endif

static float bf16_one_thread(long long iters, int chains)
{
    (void)chains;
#if defined(SM_AVX512_BF16)
    __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);   /* 1.0 */
    __m512bh b = (__m512bh)_mm512_set1_epi16(0x0000);   /* 0.0: acc stays put */
    DOT_SWITCH(chains, BF16_CHAINS)
#elif defined(SM_AVX2)
    /* 8 f32 lanes per register: each iteration widens a fresh pair of bf16
     * vectors (the empty asm makes them "fresh") into even and odd halves.
     * Each chain is two FMAs deep per iteration (8 cycles), so two pipes need
     * 8 chains; with the 7 other vectors that fills the 16 ymm registers less one. */
    enum { NACC = 8 };
    __m256 acc[NACC];
    __m256i x = _mm256_set1_epi32(0x3f7f3f7f), y = _mm256_set1_epi32(0x3a833a83);
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000);
    for (int k = 0; k < NACC; k++) acc[k] = _mm256_set1_ps(1.0f + k);
    for (long long i = 0; i < iters; i++) {
        SM_OPAQUE_VEC(x);
        SM_OPAQUE_VEC(y);
        __m256 x0 = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
        __m256 x1 = _mm256_castsi256_ps(_mm256_and_si256(x, hi));
        __m256 y0 = _mm256_castsi256_ps(_mm256_slli_epi32(y, 16));
        __m256 y1 = _mm256_castsi256_ps(_mm256_and_si256(y, hi));
        for (int k = 0; k < NACC; k++)
            acc[k] = _mm256_fmadd_ps(x1, y1, _mm256_fmadd_ps(x0, acc[k], y0));
    }
    for (int k = 1; k < NACC; k++) acc[0] = _mm256_add_ps(acc[0], acc[k]);
    float out[8];
    _mm256_storeu_ps(out, acc[0]);
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
#else
    enum { NACC = 8, LANES = 8 };
    float acc[NACC][LANES];
    uint16_t x[2 * LANES], y[2 * LANES];
    for (int l = 0; l < 2 * LANES; l++) { x[l] = 0x3f7f; y[l] = 0x3a83; }
    for (int k = 0; k < NACC; k++)
        for (int l = 0; l < LANES; l++) acc[k][l] = 1.0f + k;
    for (long long i = 0; i < iters; i++) {
        float xf[2 * LANES], yf[2 * LANES];
        for (int l = 0; l < 2 * LANES; l++) {
            uint32_t ux = (uint32_t)x[l] << 16, uy = (uint32_t)y[l] << 16;
            memcpy(&xf[l], &ux, 4);
            memcpy(&yf[l], &uy, 4);
        }
        for (int k = 0; k < NACC; k++)
            for (int l = 0; l < LANES; l++)
                acc[k][l] = xf[2 * l + 1] * yf[2 * l + 1] + (xf[2 * l] * acc[k][l] + yf[2 * l]);
    }
    float s = 0;
    for (int k = 0; k < NACC; k++)
        for (int l = 0; l < LANES; l++) s += acc[k][l];
    return s;
#endif
}

static double bf16_ops_per_iter(int chains)
{
    (void)chains;
#if defined(SM_AVX512_BF16)
    return chains * 64.0;
#elif defined(SM_AVX2)
    return 8 * 2 * 8 * 2;   /* 8 accumulators x 2 FMAs x 8 lanes x 2 ops */
#else
    return 8 * 8 * 2 * 2;
#endif
}
/* --8<-- [end:bf16] */

/* chains: one of DOT_CHAINS (the AVX-512 probe's accumulators; the other paths
 * have their own fixed count and ignore it); any other count returns -1. */
double probe_dot_bf16(long long iters, int nthreads, int chains, float *sink)
{
    if (!dot_chains_valid(chains)) return -1.0;
    ON_THREADS(nthreads, float, bf16_one_thread(iters, chains), sink);
    return (double)iters * bf16_ops_per_iter(chains) * nthreads;
}

/* --8<-- [start:int8] */
/* int8 dot: vpdpbusd multiplies 64 pairs (unsigned x signed bytes) and adds
 * them, four by four, into 16 int32 lanes: 128 operations per instruction.
 * AVX2 needs three instructions for 32 pairs: vpmaddubsw (pairs to int16),
 * vpmaddwd by ones (int16 pairs to int32), vpaddd (accumulate). */
#if defined(SM_AVX512_VNNI)
#define INT8_CHAINS(NACC)                                                          \
    {                                                                              \
        __m512i acc[NACC];                                                         \
        for (int k = 0; k < NACC; k++) acc[k] = _mm512_set1_epi32(k);              \
        for (long long i = 0; i < iters; i++)                                      \
            for (int k = 0; k < NACC; k++) acc[k] = _mm512_dpbusd_epi32(acc[k], a, b); \
        for (int k = 1; k < NACC; k++) acc[0] = _mm512_add_epi32(acc[0], acc[k]);  \
        return _mm512_reduce_add_epi32(acc[0]);                                    \
    }
#endif

static int32_t int8_one_thread(long long iters, int chains)
{
    (void)chains;
#if defined(SM_AVX512_VNNI)
    __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(1);
    DOT_SWITCH(chains, INT8_CHAINS)
#elif defined(SM_AVX2)
    enum { NACC = 6 };
    __m256i acc[NACC], a[NACC];
    __m256i b = _mm256_set1_epi8(1), ones = _mm256_set1_epi16(1);
    for (int k = 0; k < NACC; k++) {
        acc[k] = _mm256_set1_epi32(k);
        a[k] = _mm256_set1_epi8((char)(k + 1));
    }
    for (long long i = 0; i < iters; i++) {
        for (int k = 0; k < NACC; k++) {
            SM_OPAQUE_VEC(a[k]);   /* a fresh input each time, as in a real dot product */
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(a[k], b), ones);
            acc[k] = _mm256_add_epi32(acc[k], p);
        }
    }
    for (int k = 1; k < NACC; k++) acc[0] = _mm256_add_epi32(acc[0], acc[k]);
    int32_t out[8];
    _mm256_storeu_si256((__m256i *)out, acc[0]);
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
#else
    enum { N = 64 };
    uint8_t a[N];
    int8_t b[N];
    uint32_t acc[N / 4] = {0};   /* unsigned: wrapping is defined, signed overflow is not */
    for (int l = 0; l < N; l++) { a[l] = (uint8_t)l; b[l] = (int8_t)(l - 32); }
    for (long long i = 0; i < iters; i++) {
        for (int l = 0; l < N; l++) acc[l / 4] += (uint32_t)((int32_t)a[l] * b[l]);
        a[i & (N - 1)] += 1;   /* keeps the products from being computed once */
    }
    uint32_t s = 0;
    for (int l = 0; l < N / 4; l++) s += acc[l];
    return (int32_t)s;
#endif
}

static double int8_ops_per_iter(int chains)
{
    (void)chains;
#if defined(SM_AVX512_VNNI)
    return chains * 128.0;
#elif defined(SM_AVX2)
    return 6 * 32 * 2;
#else
    return 64 * 2;
#endif
}
/* --8<-- [end:int8] */

double probe_dot_int8(long long iters, int nthreads, int chains, int32_t *sink)
{
    if (!dot_chains_valid(chains)) return -1.0;
    ON_THREADS(nthreads, int32_t, int8_one_thread(iters, chains), sink);
    return (double)iters * int8_ops_per_iter(chains) * nthreads;
}

/* --8<-- [start:amx] */
/* AMX tiles (Sapphire Rapids and later): one tdpbf16ps multiplies a 16 x 32 bf16
 * tile by a 32 x 16 one into a 16 x 16 f32 tile, 16 x 16 x 32 x 2 = 16384
 * operations; tdpbssd does the same with 16 x 64 int8 into int32, 32768. The
 * probe keeps four accumulator tiles, fed by two tiles of A and two of B, and
 * loads nothing in the loop: the tile unit's own rate, not the caches'. Four
 * independent accumulators cover the instruction's latency. A is 1 and B is
 * 2^-10 (bf16) or 1 (int8), so the sums stay exact. */
#define TILE_OPS_BF16 (16.0 * 16 * 32 * 2)
#define TILE_OPS_INT8 (16.0 * 16 * 64 * 2)

#if defined(SM_AMX_TILE)
/* Tiles 4, 5 from a, 6, 7 from b (16 rows of 64 bytes each), 0-3 zero. Tile
 * numbers are part of each instruction, so each is written out. */
static void tiles_fill(const void *a, const void *b)
{
    sm_amx_configure();
    SM_TILE_LOADD(4, a, 64);
    SM_TILE_LOADD(5, a, 64);
    SM_TILE_LOADD(6, b, 64);
    SM_TILE_LOADD(7, b, 64);
    SM_TILE_ZERO(0);
    SM_TILE_ZERO(1);
    SM_TILE_ZERO(2);
    SM_TILE_ZERO(3);
}

/* Each C tile (0-3) from one A tile (4, 5) and one B tile (6, 7): four products
 * that do not wait for each other. */
#define FOUR_TILE_PRODUCTS(OP) do { OP(0, 4, 6); OP(1, 4, 7); OP(2, 5, 6); OP(3, 5, 7); } while (0)

/* The four accumulator tiles, one after the other, into c (4 x 1 KiB); then the
 * tile state is given back. */
static void tiles_store(void *c)
{
    SM_TILE_STORED(0, c, 64);
    SM_TILE_STORED(1, (char *)c + 1024, 64);
    SM_TILE_STORED(2, (char *)c + 2048, 64);
    SM_TILE_STORED(3, (char *)c + 3072, 64);
    SM_TILE_RELEASE();
}
#endif

static float amx_bf16_one_thread(long long iters)
{
#if defined(SM_AMX_BF16)
    uint16_t a[16 * 32], b[16 * 32];
    float c[4 * 256], s = 0;
    for (int i = 0; i < 16 * 32; i++) { a[i] = 0x3f80; b[i] = 0x3a80; } /* 1.0, 2^-10 */
    tiles_fill(a, b);
    for (long long i = 0; i < iters; i++) FOUR_TILE_PRODUCTS(SM_TILE_DPBF16PS);
    tiles_store(c);
    for (int t = 0; t < 4; t++) s += c[256 * t] + c[256 * t + 255];
    return s;
#else
    (void)iters;
    return 0;
#endif
}

static int32_t amx_int8_one_thread(long long iters)
{
#if defined(SM_AMX_INT8)
    int8_t a[16 * 64], b[16 * 64];
    int32_t c[4 * 256];
    uint32_t s = 0; /* unsigned: wrapping is defined */
    for (int i = 0; i < 16 * 64; i++) { a[i] = 1; b[i] = 1; }
    tiles_fill(a, b);
    for (long long i = 0; i < iters; i++) FOUR_TILE_PRODUCTS(SM_TILE_DPBSSD);
    tiles_store(c);
    for (int t = 0; t < 4; t++) s += (uint32_t)c[256 * t] + (uint32_t)c[256 * t + 255];
    return (int32_t)s;
#else
    (void)iters;
    return 0;
#endif
}
/* --8<-- [end:amx] */

/* What the tile probes can run here: bit 0 bf16, bit 1 int8 (0 without AMX, or
 * where the kernel refuses the tile state). */
int probe_has_amx(void)
{
#if defined(SM_AMX_TILE)
    if (!sm_amx_permitted()) return 0;
#endif
    int have = 0;
#if defined(SM_AMX_BF16)
    have |= 1;
#endif
#if defined(SM_AMX_INT8)
    have |= 2;
#endif
    return have;
}

/* 0 operations where this build has no such tiles: Python checks probe_has_amx first. */
double probe_amx_bf16(long long iters, int nthreads, float *sink)
{
    if (!(probe_has_amx() & 1)) return 0;
    ON_THREADS(nthreads, float, amx_bf16_one_thread(iters), sink);
    return (double)iters * 4 * TILE_OPS_BF16 * nthreads;
}

double probe_amx_int8(long long iters, int nthreads, int32_t *sink)
{
    if (!(probe_has_amx() & 2)) return 0;
    ON_THREADS(nthreads, int32_t, amx_int8_one_thread(iters), sink);
    return (double)iters * 4 * TILE_OPS_INT8 * nthreads;
}

int probe_has_native_bf16(void)
{
#if defined(SM_AVX512_BF16)
    return 1;
#else
    return 0;
#endif
}

int probe_has_native_int8(void)
{
#if defined(SM_AVX512_VNNI)
    return 1;
#else
    return 0;
#endif
}
