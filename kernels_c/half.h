/* The scalar conversions between f32 and the two 16-bit floats, written once for every
 * kernel file that stores or reads them: the decoder's f16 scales (decode.c), the GGUF
 * blocks' f16 scales and F16/BF16 weights (gguf.c), the training step's bf16 operands
 * (layers.c) and the bf16 GEMM's widening (gemm/bf16.c). Static inline, so each loop that
 * calls them compiles them in (and a simd loop over them vectorises). Needs common.h first.
 */
#ifndef SM_HALF_H
#define SM_HALF_H

#include <math.h>

/* bf16 is the top half of an f32: widening is a 16-bit shift. */
static inline float sm_bf16_to_f32(uint16_t b)
{
    union { uint32_t u; float f; } v = {(uint32_t)b << 16};
    return v.f;
}

/* An f32's bits to bf16, rounded to nearest with ties to even: add 0x7fff plus the lowest
 * kept bit and keep the top 16 bits (a carry out of the mantissa rounds up into the
 * exponent, as it should). A NaN would carry into infinity: it is kept a quiet NaN. The
 * same bits as smallem.gemm.f32_to_bf16 and as vcvtneps2bf16. */
static inline uint16_t sm_bits_to_bf16(uint32_t v)
{
    const int nan = (v & 0x7fffffffu) > 0x7f800000u;
    return (uint16_t)(nan ? (v >> 16) | 0x0040u : (v + 0x7fffu + ((v >> 16) & 1u)) >> 16);
}

static inline uint16_t sm_f32_to_bf16(float f)
{
    union { float f; uint32_t u; } v = {f};
    return sm_bits_to_bf16(v.u);
}

/* f16 to f32 (exact: every f16 is an f32); F16C's vcvtph2ps where the level has it. */
static inline float sm_f16_to_f32(uint16_t h)
{
#if defined(SM_AVX2)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (e == 0) { /* zero or subnormal: m * 2^-24 */
        const float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    v.u = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
    return v.f;
#endif
}

/* f32 to f16, rounded to nearest with ties to even (what vcvtps2ph with imm 0 does). */
static inline uint16_t sm_f32_to_f16(float f)
{
#if defined(SM_AVX2)
    return _cvtss_sh(f, 0);
#else
    union { float f; uint32_t u; } v = {f};
    const uint32_t sign = (v.u >> 16) & 0x8000, a = v.u & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (a > 0x7f800000u ? 0x200 : 0));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds past 65504 */
    if (a < 0x38800000u) { /* a subnormal half (or zero): round a / 2^-24 to an integer */
        union { uint32_t u; float f; } m = {a};
        return (uint16_t)(sign | (uint32_t)nearbyintf(m.f * 16777216.0f));
    }
    const uint32_t r = a + 0x0fffu + ((a >> 13) & 1); /* round the 13 dropped bits to even */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
#endif
}

#endif
