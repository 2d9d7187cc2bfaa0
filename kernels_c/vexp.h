/* exp(x) for float vectors, shared by the kernel files that need it (softmax, the
 * cross-entropy, GELU, SiLU): an AVX-512, an AVX2 and a plain-C branch. Include after
 * common.h. Defines VW, VEC, VLOAD, VSTORE, VFMA and VSET1 for the level's vectors. */
#pragma once
#include <math.h>
#include "common.h"

/* ------------------------------------------------------------------ exp */
/* --8<-- [start:exp] */
/* exp(x) = 2^n * exp(r), n = round(x / ln 2), |r| <= ln2 / 2, exp(r) by a
 * degree-6 polynomial (Cephes' expf coefficients, about 1 ulp); 2^n is built
 * by writing n + 127 into the float's exponent bits. Inputs are clamped to
 * [-87, 88] so that 2^n stays a normal float. */
#define EXP_HI 88.0f
#define EXP_LO -87.0f
#define LOG2E 1.44269504089f
#define LN2_HI 0.693359375f
#define LN2_LO -2.12194440e-4f
#define P0 1.9875691500e-4f
#define P1 1.3981999507e-3f
#define P2 8.3334519073e-3f
#define P3 4.1665795894e-2f
#define P4 1.6666665459e-1f
#define P5 5.0000001201e-1f

static inline float exp_scalar(float x)
{
    x = x > EXP_HI ? EXP_HI : (x < EXP_LO ? EXP_LO : x);
    float n = nearbyintf(x * LOG2E);
    float r = x - n * LN2_HI - n * LN2_LO;
    float p = ((((P0 * r + P1) * r + P2) * r + P3) * r + P4) * r + P5;
    p = p * r * r + r + 1.0f;
    union { float f; int32_t i; } u = {p};
    u.i += (int32_t)((uint32_t)(int32_t)n << 23); /* shifted unsigned: no UB for n < 0 */
    return u.f;
}

#if defined(SM_AVX512)
static inline __m512 exp_vec(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(EXP_LO)), _mm512_set1_ps(EXP_HI));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    __m512 p = _mm512_set1_ps(P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P5));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23);
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), e));
}
#define VW 16
#define VEC __m512
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VFMA _mm512_fmadd_ps
#define VSET1 _mm512_set1_ps
#elif defined(SM_AVX2)
static inline __m256 exp_vec(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    __m256 p = _mm256_set1_ps(P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P5));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
}
#define VW 8
#define VEC __m256
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VFMA _mm256_fmadd_ps
#define VSET1 _mm256_set1_ps
#endif

/* In place, x[i] = exp(x[i]) for a contiguous run. */
static inline void exp_inplace(float *x, long long n)
{
    long long i = 0;
#if defined(VW)
    for (; i + VW <= n; i += VW) VSTORE(x + i, exp_vec(VLOAD(x + i)));
#endif
    for (; i < n; i++) x[i] = exp_scalar(x[i]);
}
/* --8<-- [end:exp] */
