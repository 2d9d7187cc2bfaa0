/* What every file of the one forward builds on: the C library, the kernels' shared headers
 * and forward.h's structs and enums (which cffi reads too). forward.c includes the files of
 * kernels_c/forward/ into one translation unit; each of them also compiles alone (it
 * includes what it uses, each file once), so that a reader can open one and find where
 * every name comes from (tests/test_forward_ids.py compiles each). */
#ifndef SM_FORWARD_INTERNAL_H
#define SM_FORWARD_INTERNAL_H
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <time.h>
#include "../common.h"
#include "../vexp.h"
#include "../rows.h"
#include "../half.h"
#include "../forward.h"

#define INLINE static inline __attribute__((always_inline))
#define PAD(n, m) (((n) + (m) - 1) / (m) * (m))
/* kernels_c/half.h's conversions, by short names */
#define h2f sm_f16_to_f32
#define f2h sm_f32_to_f16
#define bf2f sm_bf16_to_f32
#define f2bf sm_f32_to_bf16

#if defined(SM_AVX2)
/* the sum of a vector's 8 floats */
INLINE float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* Q5_0's fifth bits: byte i is 0x10 where bit i of the 32 at qh4 is set (dots.c's rows,
 * tiles.c's tiles) */
INLINE __m256i fifth_bits(const uint8_t *qh4)
{
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    const __m256i shuf = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
                                            0x0303030303030303LL);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(0x10));
}
#endif

/* The team for a piece of work that reads `bytes`: every thread, unless the bytes are
 * fewer than m->par_min_bytes, below which one core streams them faster than the threads
 * meet (the caller derives the threshold from the measured fork-join and bandwidth). */
static inline int team(const sm_model *m, long long bytes, int nthreads)
{
    const int nt = bytes >= m->par_min_bytes ? nthreads : 1;
    if (m->parts && nt > 1) m->parts[PART_TEAMED] += 1.0;
    return nt;
}

/* The probe of a call's parts (sm_model.parts): the clock where it is on, else nothing read;
 * part_add adds the seconds since t0 to a part. */
static inline double part_now(const sm_model *m)
{
    if (!m->parts) return 0.0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void part_add(const sm_model *m, int part, double t0)
{
    if (m->parts) m->parts[part] += part_now(m) - t0;
}
#endif
