/* Others' weights, part 2: one weight row's dot by its rounded activation row, a function
 * a type and ISA level (vpdpbusd, vpmaddubsw or plain C), on the layouts of quants.c.
 * Included by forward.c (one translation unit); compiles alone too (internal.h). */
#ifndef SM_FORWARD_DOTS_C
#define SM_FORWARD_DOTS_C
#include "internal.h"
#include "quants.c" /* the blocks' layouts and their helpers */

/* ------------------------------------------------------------------ vector helpers */
#if defined(SM_AVX2)
/* 8 int32 lanes, each the sum of 4 products of u8 u by s8 s (bytes 4i..4i+3) */
INLINE __m256i dot_us(__m256i u, __m256i s)
{
#if defined(SM_AVX512_VNNI)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(SM_AVX_VNNI)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
/* the same for signed w by signed x: w's sign moves onto x */
INLINE __m256i dot_ss(__m256i w, __m256i x)
{
    return dot_us(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

INLINE int hsum8i(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}
/* 32 nibbles of a Q4_0/Q5_0 block: elements 0..15 (the low nibbles) then 16..31 */
INLINE __m256i nibbles32(const uint8_t *qs)
{
    const __m128i b = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}
#endif

/* ------------------------------------------------------------------ one row's dot */
/* Q8_0, Q4_0 and Q5_0 weights by a Q8_0 activation: per block the signed weights (q - 8 and
 * q - 16 for the 4- and 5-bit types) times the activation's int8, summed exactly, scaled by
 * d_w d_x. */
#define WEIGHTS_Q8_0(b) _mm256_loadu_si256((const __m256i *)(b)->qs)
#define WEIGHTS_Q4_0(b) _mm256_sub_epi8(nibbles32((b)->qs), _mm256_set1_epi8(8))
#define WEIGHTS_Q5_0(b) _mm256_sub_epi8(_mm256_or_si256(nibbles32((b)->qs), fifth_bits((b)->qh)), \
                                        _mm256_set1_epi8(16))
#if defined(SM_AVX512)
/* two blocks a zmm: signed w by signed x as |w| by x with w's sign, lanes 0-7 one block's
 * sums, 8-15 the other's */
INLINE __m512i dot_ss2(__m256i w0, __m256i w1, __m256i x0, __m256i x1)
{
    const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
    const __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(x0), x1, 1);
    const __m512i xs = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
    const __m512i u = _mm512_abs_epi8(w);
#if defined(SM_AVX512_VNNI)
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, xs);
#else
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, xs), _mm512_set1_epi16(1));
#endif
}
#define DOT32(NAME, BLK, WEIGHTS)                                                              \
    static float NAME(const uint8_t *wp, const void *ap, int nb)                               \
    {                                                                                          \
        const BLK *w = (const BLK *)wp;                                                        \
        const blk_q8_0 *a = ap;                                                                \
        __m512 acc = _mm512_setzero_ps();                                                      \
        int i = 0;                                                                             \
        for (; i + 2 <= nb; i += 2) {                                                          \
            const __m512i p = dot_ss2(WEIGHTS(&w[i]), WEIGHTS(&w[i + 1]),                      \
                                      _mm256_loadu_si256((const __m256i *)a[i].qs),            \
                                      _mm256_loadu_si256((const __m256i *)a[i + 1].qs));       \
            const __m512 d = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(h2f(w[i].d) * h2f(a[i].d)), \
                                                  _mm512_set1_ps(h2f(w[i + 1].d) * h2f(a[i + 1].d))); \
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), d, acc);                              \
        }                                                                                      \
        float s = _mm512_reduce_add_ps(acc);                                                   \
        for (; i < nb; i++) {                                                                  \
            const __m256i p = dot_ss(WEIGHTS(&w[i]), _mm256_loadu_si256((const __m256i *)a[i].qs)); \
            s += (float)hsum8i(p) * (h2f(w[i].d) * h2f(a[i].d));                               \
        }                                                                                      \
        return s;                                                                              \
    }
#elif defined(SM_AVX2)
#define DOT32(NAME, BLK, WEIGHTS)                                                              \
    static float NAME(const uint8_t *wp, const void *ap, int nb)                               \
    {                                                                                          \
        const BLK *w = (const BLK *)wp;                                                        \
        const blk_q8_0 *a = ap;                                                                \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                         \
        int i = 0;                                                                             \
        for (; i + 2 <= nb; i += 2) {                                                          \
            const __m256i p0 = dot_ss(WEIGHTS(&w[i]), _mm256_loadu_si256((const __m256i *)a[i].qs)); \
            const __m256i p1 = dot_ss(WEIGHTS(&w[i + 1]),                                     \
                                      _mm256_loadu_si256((const __m256i *)a[i + 1].qs));       \
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(h2f(w[i].d) * h2f(a[i].d)), acc0); \
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1),                                     \
                                   _mm256_set1_ps(h2f(w[i + 1].d) * h2f(a[i + 1].d)), acc1);   \
        }                                                                                      \
        if (i < nb) {                                                                          \
            const __m256i p = dot_ss(WEIGHTS(&w[i]), _mm256_loadu_si256((const __m256i *)a[i].qs)); \
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(h2f(w[i].d) * h2f(a[i].d)), acc0); \
        }                                                                                      \
        return hsum8(_mm256_add_ps(acc0, acc1));                                               \
    }
#endif

#if defined(SM_AVX512)
/* Q4_0 and Q5_0 by the paired activation (blk_q8_0x2): the two blocks' 16 bytes of nibbles
 * in one ymm, their low nibbles then their high ones in one zmm, unsigned, straight into
 * vpdpbusd against the activation laid out to match, starting from the activation's block
 * sums times -8 (-16): the offset costs one shift, not a subtraction and a sign per block.
 * Q5_0's fifth bits are one 64-bit mask (the two blocks' qh words in the zmm's order) that
 * adds 16 to the bytes it selects. The scale of each lane is the weights' f16 pair widened
 * once times the activation's stored floats. */
INLINE __m512i nibbles64(const uint8_t *q0, const uint8_t *q1)
{
    const __m256i b = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)q0)),
        q1 ? _mm_loadu_si128((const __m128i *)q1) : _mm_setzero_si128(), 1);
    const __m256i m = _mm256_set1_epi8(0x0f);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(b, m)),
                              _mm256_and_si256(_mm256_srli_epi16(b, 4), m), 1);
}
INLINE __m512 scales2(uint16_t d0, uint16_t d1)
{
    const __m256i h = _mm256_mask_blend_epi16(0xF0F0, _mm256_set1_epi16((short)d0),
                                              _mm256_set1_epi16((short)d1));
    return _mm512_cvtph_ps(h);
}
INLINE __m512i dot_u2(__m512i acc, __m512i u, __m512i x)
{
#if defined(SM_AVX512_VNNI)
    return _mm512_dpbusd_epi32(acc, u, x);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, x), _mm512_set1_epi16(1)));
#endif
}
/* one pair: TWO is 1 for blocks i and i + 1, 0 for a last block alone */
#define STEP_Q4_0(TWO)                                                                         \
    do {                                                                                       \
        const __m512i u = nibbles64(w[i].qs, (TWO) ? w[i + 1].qs : NULL);                      \
        const __m512i init = _mm512_slli_epi32(_mm512_loadu_si512(a->init), 3);                \
        const __m512i p = dot_u2(init, u, _mm512_loadu_si512(a->qs));                          \
        const __m512 d = _mm512_mul_ps(scales2(w[i].d, (TWO) ? w[i + 1].d : 0),                \
                                       _mm512_loadu_ps(a->d));                                 \
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), d, acc);                                  \
    } while (0)
static float dot_q4_0(const uint8_t *wp, const void *ap, int nb)
{
    const blk_q4_0 *w = (const blk_q4_0 *)wp;
    const blk_q8_0x2 *a = ap;
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 2 <= nb; i += 2, a++) STEP_Q4_0(1);
    if (i < nb) STEP_Q4_0(0);
    return _mm512_reduce_add_ps(acc);
}
/* Q5_0's fifth bits of blocks i and i + 1 as a mask over the zmm's bytes: the two qh words
 * side by side are the 16-bit groups (i low, i high, i+1 low, i+1 high); the zmm's order wants
 * the middle two swapped (a delta swap), and a masked add of 16 sets them */
INLINE __mmask64 fifth_mask(const uint8_t *qh0, const uint8_t *qh1)
{
    uint32_t h0, h1 = 0;
    memcpy(&h0, qh0, 4);
    if (qh1) memcpy(&h1, qh1, 4);
    uint64_t m = h0 | (uint64_t)h1 << 32;
    const uint64_t t = (m ^ (m >> 16)) & 0x00000000ffff0000ULL;
    m ^= t ^ (t << 16);
    return (__mmask64)m;
}
#define STEP_Q5_0(TWO)                                                                         \
    do {                                                                                       \
        __m512i u = nibbles64(w[i].qs, (TWO) ? w[i + 1].qs : NULL);                            \
        u = _mm512_mask_add_epi8(u, fifth_mask(w[i].qh, (TWO) ? w[i + 1].qh : NULL), u,        \
                                 _mm512_set1_epi8(0x10));                                      \
        const __m512i init = _mm512_slli_epi32(_mm512_loadu_si512(a->init), 4);                \
        const __m512i p = dot_u2(init, u, _mm512_loadu_si512(a->qs));                          \
        const __m512 d = _mm512_mul_ps(scales2(w[i].d, (TWO) ? w[i + 1].d : 0),                \
                                       _mm512_loadu_ps(a->d));                                 \
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), d, acc);                                  \
    } while (0)
static float dot_q5_0(const uint8_t *wp, const void *ap, int nb)
{
    const blk_q5_0 *w = (const blk_q5_0 *)wp;
    const blk_q8_0x2 *a = ap;
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 2 <= nb; i += 2, a++) STEP_Q5_0(1);
    if (i < nb) STEP_Q5_0(0);
    return _mm512_reduce_add_ps(acc);
}
#if defined(SM_AVX512_VNNI)
/* Q8_0 by the paired activation too: the two blocks' 64 weights put in its order (halves of
 * 16 interleaved: one permutation of 64-bit words), flipped to w + 128 so that they are
 * vpdpbusd's unsigned side, and the sum started from -128 times the activation's block sums:
 * sum (w + 128) x - 128 sum x = sum w x, exactly. Against the signed product of the other
 * levels this saves the sign's transfer (three instructions a pair) and widens no scale of
 * the activation, which the pairing stored as floats once for every row. */
INLINE __m512i q8_pair(const blk_q8_0 *w0, const blk_q8_0 *w1)
{
    const __m512i a = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)w0->qs));
    const __m512i b = w1 ? _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)w1->qs))
                         : _mm512_setzero_si512();
    const __m512i order = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    return _mm512_xor_si512(_mm512_permutex2var_epi64(a, order, b), _mm512_set1_epi8((char)0x80));
}
#define STEP_Q8_0(TWO)                                                                         \
    do {                                                                                       \
        const __m512i u = q8_pair(&w[i], (TWO) ? &w[i + 1] : NULL);                           \
        const __m512i init = _mm512_slli_epi32(_mm512_loadu_si512(a->init), 7);               \
        const __m512i p = _mm512_dpbusd_epi32(init, u, _mm512_loadu_si512(a->qs));             \
        const __m512 d = _mm512_mul_ps(scales2(w[i].d, (TWO) ? w[i + 1].d : 0),                \
                                       _mm512_loadu_ps(a->d));                                 \
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), d, acc);                                  \
    } while (0)
/* eight blocks' f16 scales widened at once: two 64-bit words assembled from the blocks
 * (scalar loads and shifts, off the vector ports), one conversion, then one permutation a
 * pair into the activation's lane order ([s0 x4, s1 x4, s0 x4, s1 x4]) */
INLINE __m512 q8_scales8(const blk_q8_0 *w)
{
    uint64_t lo = 0, hi = 0;
    for (int j = 0; j < 4; j++) {
        lo |= (uint64_t)w[j].d << (16 * j);
        hi |= (uint64_t)w[4 + j].d << (16 * j);
    }
    return _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_set_epi64x((long long)hi, (long long)lo)));
}
#define STEP_Q8_0_OF8(P, ACC)                                                                  \
    do {                                                                                       \
        const __m512i u = q8_pair(&w[i + 2 * (P)], &w[i + 2 * (P) + 1]);                       \
        const __m512i init = _mm512_slli_epi32(_mm512_loadu_si512(a[P].init), 7);             \
        const __m512i p = _mm512_dpbusd_epi32(init, u, _mm512_loadu_si512(a[P].qs));           \
        const __m512i pick = _mm512_setr_epi32(2 * (P), 2 * (P), 2 * (P), 2 * (P),             \
            2 * (P) + 1, 2 * (P) + 1, 2 * (P) + 1, 2 * (P) + 1, 2 * (P), 2 * (P), 2 * (P),     \
            2 * (P), 2 * (P) + 1, 2 * (P) + 1, 2 * (P) + 1, 2 * (P) + 1);                      \
        const __m512 d = _mm512_mul_ps(_mm512_permutexvar_ps(pick, s8), _mm512_loadu_ps(a[P].d)); \
        ACC = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), d, ACC);                                  \
    } while (0)
static float dot_q8_0(const uint8_t *wp, const void *ap, int nb)
{
    const blk_q8_0 *w = (const blk_q8_0 *)wp;
    const blk_q8_0x2 *a = ap;
    __m512 acc = _mm512_setzero_ps(), acc1 = acc, acc2 = acc, acc3 = acc;
    int i = 0;
    for (; i + 8 <= nb; i += 8, a += 4) { /* four sums: the adds' latency is not a chain */
        const __m512 s8 = q8_scales8(&w[i]);
        STEP_Q8_0_OF8(0, acc);
        STEP_Q8_0_OF8(1, acc1);
        STEP_Q8_0_OF8(2, acc2);
        STEP_Q8_0_OF8(3, acc3);
    }
    acc = _mm512_add_ps(_mm512_add_ps(acc, acc1), _mm512_add_ps(acc2, acc3));
    for (; i + 2 <= nb; i += 2, a++) STEP_Q8_0(1);
    if (i < nb) STEP_Q8_0(0);
    return _mm512_reduce_add_ps(acc);
}
#else
DOT32(dot_q8_0, blk_q8_0, WEIGHTS_Q8_0)
#endif
#elif defined(SM_AVX2)
DOT32(dot_q8_0, blk_q8_0, WEIGHTS_Q8_0)
DOT32(dot_q4_0, blk_q4_0, WEIGHTS_Q4_0)
DOT32(dot_q5_0, blk_q5_0, WEIGHTS_Q5_0)
#else
static float dot_q8_0(const uint8_t *wp, const void *ap, int nb)
{
    const blk_q8_0 *w = (const blk_q8_0 *)wp, *a = ap;
    float s = 0.0f;
    for (int i = 0; i < nb; i++) {
        int si = 0;
        for (int j = 0; j < 32; j++) si += w[i].qs[j] * a[i].qs[j];
        s += (float)si * (h2f(w[i].d) * h2f(a[i].d));
    }
    return s;
}
static float dot_q4_0(const uint8_t *wp, const void *ap, int nb)
{
    const blk_q4_0 *w = (const blk_q4_0 *)wp;
    const blk_q8_0 *a = ap;
    float s = 0.0f;
    for (int i = 0; i < nb; i++) {
        int si = 0;
        for (int j = 0; j < 16; j++)
            si += ((w[i].qs[j] & 0xF) - 8) * a[i].qs[j] + ((w[i].qs[j] >> 4) - 8) * a[i].qs[j + 16];
        s += (float)si * (h2f(w[i].d) * h2f(a[i].d));
    }
    return s;
}
static float dot_q5_0(const uint8_t *wp, const void *ap, int nb)
{
    const blk_q5_0 *w = (const blk_q5_0 *)wp;
    const blk_q8_0 *a = ap;
    float s = 0.0f;
    for (int i = 0; i < nb; i++) {
        uint32_t qh;
        memcpy(&qh, w[i].qh, 4);
        int si = 0;
        for (int j = 0; j < 16; j++) {
            const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            si += (((w[i].qs[j] & 0xF) | h0) - 16) * a[i].qs[j]
                + (((w[i].qs[j] >> 4) | h1) - 16) * a[i].qs[j + 16];
        }
        s += (float)si * (h2f(w[i].d) * h2f(a[i].d));
    }
    return s;
}
#endif

/* Q4_K's eight 6-bit scales and mins, from its 12 bytes as three words: bytes 0-3 hold the
 * scales of sub-blocks 0-3 (low 6 bits) and the top 2 bits of scales 4-7, bytes 4-7 the same
 * for the mins, bytes 8-11 the low 4 bits of scales 4-7 (low nibbles) and mins 4-7 (high). */
static inline void k4_scales(const uint8_t *q, uint8_t sc[8], uint8_t mn[8])
{
    uint32_t a, b, c, v[4];
    memcpy(&a, q, 4);
    memcpy(&b, q + 4, 4);
    memcpy(&c, q + 8, 4);
    v[0] = a & 0x3f3f3f3fu;
    v[1] = (c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4);
    v[2] = b & 0x3f3f3f3fu;
    v[3] = ((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4);
    memcpy(sc, v, 8);
    memcpy(mn, v + 2, 8);
}

/* Q4_K by Q8_K: per 256 weights, eight sub-blocks of 32 with a 6-bit scale and min each;
 * w = d sc q - dmin m, so the block is d_x (d sum_j sc_j sum q q_x - dmin sum_j m_j sum q_x),
 * the second sum from the activation's bsums (two per sub-block). The nibbles (u8, at most
 * 15) by the activation's int8 go through vpmaddubsw without saturating, and vpmaddwd by the
 * sub-block's scale adds the pairs into int32 with the scale applied: two instructions per
 * 32 weights. */
static float dot_q4_k(const uint8_t *wp, const void *ap, int nb)
{
    const blk_q4_K *w = (const blk_q4_K *)wp;
    const blk_q8_K *a = ap;
    float s = 0.0f;
    for (int i = 0; i < nb; i++) {
        uint8_t sc[8], mn[8];
        k4_scales(w[i].scales, sc, mn);
        int sumi = 0, summ = 0;
#if defined(SM_AVX2)
        const __m128i bs = _mm_loadu_si128((const __m128i *)a[i].bsums);
        const __m128i bs2 = _mm_loadu_si128((const __m128i *)(a[i].bsums + 8));
        const __m128i pairs = _mm_hadd_epi16(bs, bs2); /* one sum per sub-block */
        __m128i m = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn)), pairs);
        m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0x4e));
        m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0xb1));
        summ = _mm_cvtsi128_si32(m);
        __m256i acc = _mm256_setzero_si256();
        const __m256i m4 = _mm256_set1_epi8(0x0f);
        for (int c = 0; c < 4; c++) {
            const __m256i b = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * c));
            const __m256i lo = _mm256_and_si256(b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(a[i].qs + 64 * c));
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)(a[i].qs + 64 * c + 32));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0),
                                                          _mm256_set1_epi16(sc[2 * c])));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1),
                                                          _mm256_set1_epi16(sc[2 * c + 1])));
        }
        sumi = hsum8i(acc);
#else
        for (int j = 0; j < 8; j++) summ += mn[j] * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
        for (int c = 0; c < 4; c++) {
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += (w[i].qs[32 * c + l] & 0xF) * a[i].qs[64 * c + l];
                s1 += (w[i].qs[32 * c + l] >> 4) * a[i].qs[64 * c + 32 + l];
            }
            sumi += sc[2 * c] * s0 + sc[2 * c + 1] * s1;
        }
#endif
        s += a[i].d * (h2f(w[i].d) * (float)sumi - h2f(w[i].dmin) * (float)summ);
    }
    return s;
}

/* Q6_K by Q8_K: per 256 weights, 6-bit q (0..63, w = d sc (q - 32)) with an int8 scale per 16;
 * the block is d_x d (sum_g sc_g sum q q_x - 32 sum_g sc_g bsum_g). q is at most 63, so
 * vpmaddubsw does not saturate either; vpmaddwd applies the two groups' scales. */
static float dot_q6_k(const uint8_t *wp, const void *ap, int nb)
{
    const blk_q6_K *w = (const blk_q6_K *)wp;
    const blk_q8_K *a = ap;
    float s = 0.0f;
    for (int i = 0; i < nb; i++) {
        const int8_t *sc = w[i].scales;
        int sumi = 0, off = 0;
#if defined(SM_AVX2)
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
        off = hsum8i(_mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)a[i].bsums)));
        __m256i acc = _mm256_setzero_si256();
        const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
        for (int n = 0; n < 2; n++) {
            const uint8_t *ql = w[i].ql + 64 * n, *qh = w[i].qh + 32 * n;
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            const __m256i u[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4)),
                _mm256_or_si256(_mm256_and_si256(l1, m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4)),
            };
            for (int c = 0; c < 4; c++) {
                const int g = 8 * n + 2 * c; /* the 32 values' two groups of 16 */
                const __m256i x = _mm256_loadu_si256((const __m256i *)(a[i].qs + 128 * n + 32 * c));
                const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]), _mm_set1_epi16(sc[g]));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u[c], x), scv));
            }
        }
        sumi = hsum8i(acc);
#else
        for (int g = 0; g < 16; g++) off += sc[g] * a[i].bsums[g];
        uint8_t u[256];
        q6_values(&w[i], u);
        for (int g = 0; g < 16; g++) {
            int sg = 0;
            for (int j = 0; j < 16; j++) sg += u[16 * g + j] * a[i].qs[16 * g + j];
            sumi += sc[g] * sg;
        }
#endif
        s += a[i].d * h2f(w[i].d) * (float)(sumi - 32 * off);
    }
    return s;
}

/* F32, F16 and BF16 weights by an activation of the same type: each pair in f32, multiplied
 * and added in f32. */
static float dot_f32(const uint8_t *wp, const void *ap, int K)
{
    const float *w = (const float *)wp, *x = ap;
    float s = 0.0f;
    #pragma omp simd reduction(+:s)
    for (int k = 0; k < K; k++) s += w[k] * x[k];
    return s;
}
static float dot_f16(const uint8_t *wp, const void *ap, int K)
{
    const uint16_t *w = (const uint16_t *)wp, *x = ap;
    int k = 0;
    float s = 0.0f;
#if defined(SM_AVX2)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; k + 16 <= K; k += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + k))),
                               _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + k))), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + k + 8))),
                               _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + k + 8))), acc1);
    }
    s = hsum8(_mm256_add_ps(acc0, acc1));
#endif
    for (; k < K; k++) s += h2f(w[k]) * h2f(x[k]);
    return s;
}
static float dot_bf16(const uint8_t *wp, const void *ap, int K)
{
    const uint16_t *w = (const uint16_t *)wp, *x = ap;
    int k = 0;
    float s = 0.0f;
#if defined(SM_AVX2)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
#define BF8(p) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
    for (; k + 16 <= K; k += 16) {
        acc0 = _mm256_fmadd_ps(BF8(w + k), BF8(x + k), acc0);
        acc1 = _mm256_fmadd_ps(BF8(w + k + 8), BF8(x + k + 8), acc1);
    }
#undef BF8
    s = hsum8(_mm256_add_ps(acc0, acc1));
#endif
    for (; k < K; k++) s += bf2f(w[k]) * bf2f(x[k]);
    return s;
}
#endif /* SM_FORWARD_DOTS_C */
