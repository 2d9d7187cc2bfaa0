/* For tests only: the AVX-512 branches of the kernels, compiled for a CPU that
 * has AVX2 but not AVX-512 (SMALLEM_EMULATE=avx512, see smallem/isa.py).
 *
 * SIMDe (https://github.com/simd-everywhere/simde) defines every _mm512_*
 * intrinsic the kernels use as a function on ordinary vectors, so the exact
 * code a Zen 4 or Xeon runs (its 14 x 32 micro-kernel, its vdpbf16ps pairs,
 * its edge tiles) computes here, slowly, and the tests compare it to numpy.
 * Never for timing: smallem refuses to record a measurement in this mode.
 *
 * SIMDe 0.7 lacks three intrinsics that the kernels use; they are defined
 * below, lane by lane, with the instruction's documented meaning. */
#pragma once
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <math.h>
#include <simde/x86/avx512.h>

#define SM_AVX512 1
#define SM_AVX512_BF16 1
#define SM_AVX512_VNNI 1

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

#define _mm512_cvtps_epi32 sm_emu_cvtps_epi32
#define _mm512_reduce_add_ps sm_emu_reduce_add_ps
#define _mm512_reduce_add_epi32 sm_emu_reduce_add_epi32
