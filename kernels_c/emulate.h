/* For tests only: the AVX-512 branches of the kernels, compiled for a CPU that
 * has AVX2 but not AVX-512 (SMALLEM_EMULATE=avx512, see smallem/isa.py).
 *
 * SIMDe (https://github.com/simd-everywhere/simde) defines every _mm512_*
 * intrinsic the kernels use as a function on ordinary vectors, so the exact
 * code a Zen 4 or Xeon runs (its 14 x 32 micro-kernel, its vdpbf16ps pairs,
 * its edge tiles) computes here, slowly, and the tests compare it to numpy.
 * Never for timing: smallem refuses to record a measurement in this mode.
 *
 * SIMDe 0.7 lacks eleven intrinsics that the kernels use, and AMX; they are
 * defined below, lane by lane, with the instructions' documented meaning. */
#pragma once
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <math.h>
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>

#define SM_AVX512 1
#define SM_AVX512_BF16 1
#define SM_AVX512_VNNI 1
#define SM_AMX_TILE 1
#define SM_AMX_BF16 1
#define SM_AMX_INT8 1

/* vcvtps2dq: round to nearest even (the default MXCSR mode), as nearbyintf does */
static inline simde__m512i sm_emu_cvtps_epi32(simde__m512 a)
{
    float f[16];
    int32_t r[16];
    simde_mm512_storeu_ps(f, a);
    for (int i = 0; i < 16; i++) r[i] = (int32_t)nearbyintf(f[i]);
    return simde_mm512_loadu_si512(r);
}

static inline float sm_emu_reduce_add_ps(simde__m512 a)
{
    float f[16], s = 0.0f;
    simde_mm512_storeu_ps(f, a);
    for (int i = 0; i < 16; i++) s += f[i];
    return s;
}

static inline int sm_emu_reduce_add_epi32(simde__m512i a)
{
    int32_t v[16];
    uint32_t s = 0; /* wraps like the instruction's adds */
    simde_mm512_storeu_si512(v, a);
    for (int i = 0; i < 16; i++) s += (uint32_t)v[i];
    return (int)s;
}

/* vshuff32x4: 128-bit lanes imm[1:0], imm[3:2] of a, then imm[5:4], imm[7:6] of b */
static inline simde__m512 sm_emu_shuffle_f32x4(simde__m512 a, simde__m512 b, int imm)
{
    float x[16], y[16], r[16];
    simde_mm512_storeu_ps(x, a);
    simde_mm512_storeu_ps(y, b);
    for (int l = 0; l < 4; l++)
        memcpy(r + 4 * l, (l < 2 ? x : y) + 4 * ((imm >> (2 * l)) & 3), 4 * sizeof(float));
    return simde_mm512_loadu_ps(r);
}

#define _mm512_cvtps_epi32 sm_emu_cvtps_epi32

/* vcvtdq2ps (exact for |x| < 2^24, rounded to nearest even above, as C's conversion) */
static inline simde__m512 sm_emu_cvtepi32_ps(simde__m512i a)
{
    int32_t r[16];
    float f[16];
    simde_mm512_storeu_si512(r, a);
    for (int i = 0; i < 16; i++) f[i] = (float)r[i];
    return simde_mm512_loadu_ps(f);
}
#define _mm512_cvtepi32_ps sm_emu_cvtepi32_ps

/* vpmovzxbd: 16 bytes zero-extended to 16 int32 */
static inline simde__m512i sm_emu_cvtepu8_epi32(simde__m128i a)
{
    uint8_t b[16];
    int32_t r[16];
    simde_mm_storeu_si128((simde__m128i *)b, a);
    for (int i = 0; i < 16; i++) r[i] = b[i];
    return simde_mm512_loadu_si512(r);
}
#define _mm512_cvtepu8_epi32 sm_emu_cvtepu8_epi32

/* vcvtph2ps on 16 halves: SIMDe's F16C conversion of each 8 */
static inline simde__m512 sm_emu_cvtph_ps(simde__m256i a)
{
    float f[16];
    simde_mm256_storeu_ps(f, simde_mm256_cvtph_ps(simde_mm256_castsi256_si128(a)));
    simde_mm256_storeu_ps(f + 8, simde_mm256_cvtph_ps(simde_mm256_extracti128_si256(a, 1)));
    return simde_mm512_loadu_ps(f);
}
#define _mm512_cvtph_ps sm_emu_cvtph_ps

/* a store of the lanes set in m only */
static inline void sm_emu_mask_storeu_ps(void *p, simde__mmask16 m, simde__m512 a)
{
    float f[16];
    simde_mm512_storeu_ps(f, a);
    for (int i = 0; i < 16; i++)
        if (m >> i & 1) ((float *)p)[i] = f[i];
}
#define _mm512_mask_storeu_ps sm_emu_mask_storeu_ps

/* a load of the lanes set in m only (the others zero, and never read) */
static inline simde__m512 sm_emu_maskz_loadu_ps(simde__mmask16 m, const void *p)
{
    float f[16];
    for (int i = 0; i < 16; i++) f[i] = m >> i & 1 ? ((const float *)p)[i] : 0.0f;
    return simde_mm512_loadu_ps(f);
}
#define _mm512_maskz_loadu_ps sm_emu_maskz_loadu_ps

static inline float sm_emu_reduce_max_ps(simde__m512 a)
{
    float f[16], m;
    simde_mm512_storeu_ps(f, a);
    m = f[0];
    for (int i = 1; i < 16; i++) m = f[i] > m ? f[i] : m;
    return m;
}
/* vmovntps: the same bytes in memory; bypassing the caches is not emulated */
static inline void sm_emu_stream_ps(void *p, simde__m512 a)
{
    simde_mm512_storeu_ps(p, a);
}
#define _mm512_stream_ps sm_emu_stream_ps

#define _mm512_reduce_max_ps sm_emu_reduce_max_ps
#define _mm512_reduce_add_ps sm_emu_reduce_add_ps
#define _mm512_reduce_add_epi32 sm_emu_reduce_add_epi32
#undef _mm512_shuffle_f32x4 /* GCC defines it as a macro without -O */
#define _mm512_shuffle_f32x4 sm_emu_shuffle_f32x4

/* AMX, which SIMDe does not have: eight tiles per thread, each up to 16 rows of
 * 64 bytes, configured, loaded, stored and multiplied as the instructions do. */
struct sm_emu_tile {
    int rows, colsb;
    unsigned char bytes[16][64];
};
static _Thread_local struct sm_emu_tile sm_emu_tiles[8];

static inline void sm_emu_tile_loadconfig(const void *cfg)
{
    const unsigned char *c = (const unsigned char *)cfg;
    for (int t = 0; t < 8; t++) {
        sm_emu_tiles[t].colsb = c[16 + 2 * t] | c[17 + 2 * t] << 8;
        sm_emu_tiles[t].rows = c[48 + t];
    }
}

static inline void sm_emu_tile_loadd(int t, const void *base, long stride)
{
    for (int r = 0; r < sm_emu_tiles[t].rows; r++)
        memcpy(sm_emu_tiles[t].bytes[r], (const char *)base + r * stride, sm_emu_tiles[t].colsb);
}

static inline void sm_emu_tile_stored(int t, void *base, long stride)
{
    for (int r = 0; r < sm_emu_tiles[t].rows; r++)
        memcpy((char *)base + r * stride, sm_emu_tiles[t].bytes[r], sm_emu_tiles[t].colsb);
}

static inline float sm_emu_bf16(const unsigned char *p)
{
    uint32_t u = (uint32_t)(p[0] | p[1] << 8) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* tdpbf16ps: c[m][n] += a[m] pair k . b[k] pair n, over the pairs of a's rows */
static inline void sm_emu_tile_dpbf16ps(int c, int a, int b)
{
    struct sm_emu_tile *tc = &sm_emu_tiles[c], *ta = &sm_emu_tiles[a], *tb = &sm_emu_tiles[b];
    for (int m = 0; m < tc->rows; m++)
        for (int n = 0; n < tc->colsb / 4; n++) {
            float acc;
            memcpy(&acc, &tc->bytes[m][4 * n], 4);
            for (int k = 0; k < ta->colsb / 4; k++) {
                acc += sm_emu_bf16(&ta->bytes[m][4 * k]) * sm_emu_bf16(&tb->bytes[k][4 * n]);
                acc += sm_emu_bf16(&ta->bytes[m][4 * k + 2]) * sm_emu_bf16(&tb->bytes[k][4 * n + 2]);
            }
            memcpy(&tc->bytes[m][4 * n], &acc, 4);
        }
}

/* tdpbssd: c[m][n] += a[m] quad k . b[k] quad n, signed bytes into int32 */
static inline void sm_emu_tile_dpbssd(int c, int a, int b)
{
    struct sm_emu_tile *tc = &sm_emu_tiles[c], *ta = &sm_emu_tiles[a], *tb = &sm_emu_tiles[b];
    for (int m = 0; m < tc->rows; m++)
        for (int n = 0; n < tc->colsb / 4; n++) {
            int32_t acc;
            memcpy(&acc, &tc->bytes[m][4 * n], 4);
            for (int k = 0; k < ta->colsb / 4; k++)
                for (int q = 0; q < 4; q++)
                    acc += (int8_t)ta->bytes[m][4 * k + q] * (int8_t)tb->bytes[k][4 * n + q];
            memcpy(&tc->bytes[m][4 * n], &acc, 4);
        }
}

#define SM_TILE_LOADCONFIG(cfg) sm_emu_tile_loadconfig(cfg)
#define SM_TILE_RELEASE() ((void)0)
#define SM_TILE_ZERO(t) memset(sm_emu_tiles[t].bytes, 0, sizeof sm_emu_tiles[t].bytes)
#define SM_TILE_LOADD(t, base, stride) sm_emu_tile_loadd(t, base, stride)
#define SM_TILE_STORED(t, base, stride) sm_emu_tile_stored(t, base, stride)
#define SM_TILE_DPBF16PS(c, a, b) sm_emu_tile_dpbf16ps(c, a, b)
#define SM_TILE_DPBSSD(c, a, b) sm_emu_tile_dpbssd(c, a, b)
