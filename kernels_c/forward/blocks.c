/* Others' weights: ggml's blocks, read straight from the file's mapping (kind 2); the types,
 * their activations and the instructions are described in forward.c's opening comment.
 * Included by forward.c (one translation unit). */

/* the types' ids (T_*) are forward.h's enum, which Python reads from the library */

typedef struct { uint16_t d; int8_t qs[32]; } blk_q8_0;
typedef struct { uint16_t d; uint8_t qs[16]; } blk_q4_0;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_0;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } blk_q4_K;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } blk_q6_K;
typedef struct { float d; int8_t qs[256]; int16_t bsums[16]; } blk_q8_K;
/* Two Q8_0 activation blocks a and b (the same values, rounded as Q8_0), laid out so that one
 * zmm of 4-bit weights meets them without a shuffle: qs holds a[0..15] b[0..15] a[16..31]
 * b[16..31] (the order in which the two weight blocks' low nibbles, then high nibbles, come
 * out of one load); init puts minus each block's sum in the first of its int32 lanes (lanes
 * 0-3 and 8-11 are a's, 4-7 and 12-15 b's), so that the integer product that starts from
 * init shifted by 3 (Q4_0) or 4 (Q5_0) is sum (q - 8) x or sum (q - 16) x exactly; d is each
 * lane's block scale as a float. */
typedef struct { int8_t qs[64]; int32_t init[16]; float d[16]; } blk_q8_0x2;
_Static_assert(sizeof(blk_q8_0) == 34 && sizeof(blk_q4_0) == 18 && sizeof(blk_q5_0) == 22 &&
               sizeof(blk_q4_K) == 144 && sizeof(blk_q6_K) == 210 && sizeof(blk_q8_K) == 292 &&
               sizeof(blk_q8_0x2) == 192,
               "GGUF block sizes");

const char *sm_g_instruction(void)
{
#if defined(SM_AVX512) && defined(SM_AVX512_VNNI)
    return "vpdpbusd (AVX512-VNNI)";
#elif defined(SM_AVX512)
    return "vpmaddubsw (AVX-512)";
#elif defined(SM_AVX2) && defined(SM_AVX_VNNI)
    return "vpdpbusd (AVX-VNNI)";
#elif defined(SM_AVX2)
    return "vpmaddubsw (AVX2)";
#else
    return "plain C";
#endif
}

int sm_g_supported(int type)
{
    switch (type) {
    case T_F32: case T_F16: case T_BF16: case T_Q8_0: case T_Q4_0: case T_Q5_0: case T_Q4_K:
    case T_Q6_K:
        return 1;
    }
    return 0;
}

/* a type's block as the products read it: its weights and its bytes (0 where they read none) */
int sm_g_block_weights(int type)
{
    switch (type) {
    case T_F32: case T_F16: case T_BF16: return 1;
    case T_Q8_0: case T_Q4_0: case T_Q5_0: return 32;
    case T_Q4_K: case T_Q6_K: return 256;
    }
    return 0;
}

int sm_g_block_bytes(int type)
{
    switch (type) {
    case T_F32: return 4;
    case T_F16: case T_BF16: return 2;
    case T_Q8_0: return (int)sizeof(blk_q8_0);
    case T_Q4_0: return (int)sizeof(blk_q4_0);
    case T_Q5_0: return (int)sizeof(blk_q5_0);
    case T_Q4_K: return (int)sizeof(blk_q4_K);
    case T_Q6_K: return (int)sizeof(blk_q6_K);
    }
    return 0;
}

int sm_g_act_type(int type)
{
    switch (type) {
    case T_F16: return T_F16;
    case T_BF16: return T_BF16;
#if defined(SM_AVX512) && defined(SM_AVX512_VNNI)
    case T_Q8_0: return T_Q8_0X2;
#else
    case T_Q8_0: return T_Q8_0;
#endif
#if defined(SM_AVX512)
    case T_Q4_0: case T_Q5_0: return T_Q8_0X2;
#else
    case T_Q4_0: case T_Q5_0: return T_Q8_0;
#endif
    case T_Q4_K: case T_Q6_K: return T_Q8_K;
    }
    return T_F32;
}

/* ------------------------------------------------------------------ halves */
#define h2f sm_f16_to_f32 /* kernels_c/half.h */
#define f2h sm_f32_to_f16
#define bf2f sm_bf16_to_f32
#define f2bf sm_f32_to_bf16

/* ------------------------------------------------------------------ activations */
static inline int nearest_even(float v) { return (int)nearbyintf(v); }

long long sm_g_act_bytes(int type, int K)
{
    switch (sm_g_act_type(type)) {
    case T_F16: case T_BF16: return 2LL * K;
    case T_Q8_0: return (long long)(K / 32) * sizeof(blk_q8_0);
    case T_Q8_0X2: return (long long)((K / 32 + 1) / 2) * sizeof(blk_q8_0x2);
    case T_Q8_K: return (long long)(K / 256) * sizeof(blk_q8_K);
    }
    return 4LL * K;
}

/* Q8_0 blocks (nb of them) in pairs, as blk_q8_0x2 says; an odd last block pairs with zeros. */
static void pair_q8_0(const blk_q8_0 *q, int nb, blk_q8_0x2 *o)
{
    for (int i = 0; i < nb; i += 2, o++) {
        memset(o, 0, sizeof *o);
        for (int h = 0; h < 2 && i + h < nb; h++) {
            const blk_q8_0 *b = &q[i + h];
            int sum = 0;
            for (int j = 0; j < 16; j++) {
                o->qs[16 * h + j] = b->qs[j];
                o->qs[32 + 16 * h + j] = b->qs[16 + j];
            }
            for (int j = 0; j < 32; j++) sum += b->qs[j];
            o->init[4 * h] = -sum;
            for (int l = 0; l < 4; l++) o->d[4 * h + l] = o->d[8 + 4 * h + l] = h2f(b->d);
        }
    }
}

/* One row of K floats as ggml's Q8_0 blocks (K a multiple of 32): tiles.c's q8_0_of. */
static void quantize_q8_0(const float *x, int K, blk_q8_0 *b)
{
    for (int i = 0; i < K / 32; i++, x += 32) q8_0_of(x, b[i].qs, &b[i].d);
}

/* One activation row of K floats in the form the weights' type pairs with. */
void sm_g_quantize(int type, const float *x, int K, void *act)
{
    switch (sm_g_act_type(type)) {
    case T_F32:
        memcpy(act, x, sizeof(float) * (size_t)K);
        break;
    case T_F16: {
        uint16_t *o = act;
        for (int k = 0; k < K; k++) o[k] = f2h(x[k]);
        break;
    }
    case T_BF16: {
        uint16_t *o = act;
        for (int k = 0; k < K; k++) o[k] = f2bf(x[k]);
        break;
    }
    case T_Q8_0:
        quantize_q8_0(x, K, act);
        break;
    case T_Q8_0X2: {
        blk_q8_0 tmp[2];
        blk_q8_0x2 *o = act;
        for (int i = 0; i < K / 32; i += 2, x += 64, o++) {
            const int n = K / 32 - i < 2 ? K / 32 - i : 2;
            quantize_q8_0(x, 32 * n, tmp);
            pair_q8_0(tmp, n, o);
        }
        break;
    }
    case T_Q8_K: {
        blk_q8_K *b = act;
        for (int i = 0; i < K / 256; i++, x += 256) {
            float amax = 0.0f, vmax = 0.0f;
            for (int j = 0; j < 256; j++)
                if (fabsf(x[j]) > amax) amax = fabsf(x[j]), vmax = x[j];
            if (amax == 0.0f) {
                memset(&b[i], 0, sizeof b[i]);
                continue;
            }
            const float is = -127.0f / vmax;
            for (int j = 0; j < 256; j++) {
                const int v = nearest_even(is * x[j]);
                b[i].qs[j] = (int8_t)(v < 127 ? v : 127);
            }
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int j = 0; j < 16; j++) s += b[i].qs[16 * g + j];
                b[i].bsums[g] = (int16_t)s;
            }
            b[i].d = 1.0f / is;
        }
        break;
    }
    }
}

/* The values the rounded activation stands for (for the tests' float64 references). */
void sm_g_act_values(int type, const void *act, int K, double *out)
{
    switch (sm_g_act_type(type)) {
    case T_F32:
        for (int k = 0; k < K; k++) out[k] = ((const float *)act)[k];
        break;
    case T_F16:
        for (int k = 0; k < K; k++) out[k] = h2f(((const uint16_t *)act)[k]);
        break;
    case T_BF16:
        for (int k = 0; k < K; k++) out[k] = bf2f(((const uint16_t *)act)[k]);
        break;
    case T_Q8_0:
        for (int k = 0; k < K; k++) {
            const blk_q8_0 *b = (const blk_q8_0 *)act + k / 32;
            out[k] = (double)h2f(b->d) * b->qs[k % 32];
        }
        break;
    case T_Q8_K:
        for (int k = 0; k < K; k++) {
            const blk_q8_K *b = (const blk_q8_K *)act + k / 256;
            out[k] = (double)b->d * b->qs[k % 256];
        }
        break;
    case T_Q8_0X2:
        for (int k = 0; k < K; k++) {
            const blk_q8_0x2 *b = (const blk_q8_0x2 *)act + k / 64;
            const int h = (k / 32) % 2, j = k % 32;
            out[k] = (double)b->d[4 * h] * b->qs[(j < 16 ? 0 : 32) + 16 * h + j % 16];
        }
        break;
    }
}

/* ------------------------------------------------------------------ block helpers */
/* Q4_K's 6-bit scale and min of sub-block j (of 8), packed in 12 bytes */
static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q6_K's 256 values, 0..63 (the -32 is applied by the caller), in the file's order */
static inline void q6_values(const blk_q6_K *b, uint8_t *u)
{
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = b->ql + 64 * n, *qh = b->qh + 32 * n;
        uint8_t *y = u + 128 * n;
        for (int l = 0; l < 32; l++) {
            y[l] = (uint8_t)((ql[l] & 0xF) | ((qh[l] & 3) << 4));
            y[l + 32] = (uint8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
            y[l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            y[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
    }
}

/* One row of weights as floats (an embedding lookup; the tests' dequantisation). Compiled
 * without fused multiply-adds, so that d sc q - dmin m rounds twice, as the gguf package's
 * reference dequantiser does. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
void sm_g_row(const sm_mat *w, int row, float *out)
{
    const uint8_t *p = w->w + (size_t)row * (size_t)w->row_bytes;
    const int K = w->K;
    switch (w->type) {
    case T_F32: memcpy(out, p, sizeof(float) * (size_t)K); break;
    case T_F16: for (int k = 0; k < K; k++) out[k] = h2f(((const uint16_t *)p)[k]); break;
    case T_BF16: for (int k = 0; k < K; k++) out[k] = bf2f(((const uint16_t *)p)[k]); break;
    case T_Q8_0:
        for (int i = 0; i < K / 32; i++) {
            const blk_q8_0 *b = (const blk_q8_0 *)p + i;
            for (int j = 0; j < 32; j++) out[32 * i + j] = h2f(b->d) * b->qs[j];
        }
        break;
    case T_Q4_0:
        for (int i = 0; i < K / 32; i++) {
            const blk_q4_0 *b = (const blk_q4_0 *)p + i;
            const float d = h2f(b->d);
            for (int j = 0; j < 16; j++) {
                out[32 * i + j] = d * ((b->qs[j] & 0xF) - 8);
                out[32 * i + j + 16] = d * ((b->qs[j] >> 4) - 8);
            }
        }
        break;
    case T_Q5_0:
        for (int i = 0; i < K / 32; i++) {
            const blk_q5_0 *b = (const blk_q5_0 *)p + i;
            uint32_t qh;
            memcpy(&qh, b->qh, 4);
            const float d = h2f(b->d);
            for (int j = 0; j < 16; j++) {
                const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
                out[32 * i + j] = d * (((b->qs[j] & 0xF) | h0) - 16);
                out[32 * i + j + 16] = d * (((b->qs[j] >> 4) | h1) - 16);
            }
        }
        break;
    case T_Q4_K:
        for (int i = 0; i < K / 256; i++) {
            const blk_q4_K *b = (const blk_q4_K *)p + i;
            const float d = h2f(b->d), dmin = h2f(b->dmin);
            for (int c = 0; c < 4; c++) {
                int s0, m0, s1, m1;
                scale_min_k4(2 * c, b->scales, &s0, &m0);
                scale_min_k4(2 * c + 1, b->scales, &s1, &m1);
                float *y = out + 256 * i + 64 * c;
                for (int l = 0; l < 32; l++) {
                    y[l] = d * s0 * (b->qs[32 * c + l] & 0xF) - dmin * m0;
                    y[l + 32] = d * s1 * (b->qs[32 * c + l] >> 4) - dmin * m1;
                }
            }
        }
        break;
    case T_Q6_K:
        for (int i = 0; i < K / 256; i++) {
            const blk_q6_K *b = (const blk_q6_K *)p + i;
            uint8_t u[256];
            q6_values(b, u);
            const float d = h2f(b->d);
            for (int j = 0; j < 256; j++) out[256 * i + j] = d * b->scales[j / 16] * (u[j] - 32);
        }
        break;
    }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

/* Rows r0..r1 of the matrix as floats into out ((r1 - r0) x K), threads splitting the rows:
 * the panels a prompt's GEMM multiplies (smallem/generating/forward.py). */
static void sm_g_rows(const sm_mat *w, int r0, int r1, float *out, int nthreads)
{
    const int n = r1 - r0, nt = nthreads < n ? nthreads : (n > 0 ? n : 1);
    #pragma omp parallel for schedule(static) num_threads(nt)
    for (int r = r0; r < r1; r++) sm_g_row(w, r, out + (size_t)(r - r0) * w->K);
}

/* The same rows rounded to bf16 (nearest even) for the bf16 GEMM; scratch holds K floats
 * for each thread. */
static void sm_g_rows_bf16(const sm_mat *w, int r0, int r1, uint16_t *out, float *scratch, int nthreads)
{
    const int n = r1 - r0, nt = nthreads < n ? nthreads : (n > 0 ? n : 1);
    #pragma omp parallel for schedule(static) num_threads(nt)
    for (int r = r0; r < r1; r++) {
        float *row = scratch + (size_t)omp_get_thread_num() * w->K;
        uint16_t *o = out + (size_t)(r - r0) * w->K;
        sm_g_row(w, r, row);
        for (int k = 0; k < w->K; k++) o[k] = f2bf(row[k]);
    }
}

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
INLINE float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
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
/* Q5_0's fifth bits: byte i is 0x10 where bit i of qh is set */
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

typedef float (*dot_fn)(const uint8_t *, const void *, int);

/* the row's dot and its count argument (blocks, or weights for the float types) */
static dot_fn dot_of(int type, int K, int *count)
{
    switch (type) {
    case T_Q8_0: *count = K / 32; return dot_q8_0;
    case T_Q4_0: *count = K / 32; return dot_q4_0;
    case T_Q5_0: *count = K / 32; return dot_q5_0;
    case T_Q4_K: *count = K / 256; return dot_q4_k;
    case T_Q6_K: *count = K / 256; return dot_q6_k;
    case T_F16: *count = K; return dot_f16;
    case T_BF16: *count = K; return dot_bf16;
    }
    *count = K;
    return dot_f32;
}

/* ------------------------------------------------------------------ products */
#define RB 4 /* weight rows kept in L1 while every activation row passes them */

/* --8<-- [start:ahead] */
/* A thread's rows are one stream of bytes, but the hardware prefetchers stop at each 4 KiB
 * page, and the loads the dots issue themselves do not run far enough ahead to cover a miss
 * to memory: at every page the stream starts again from such misses, and the time of the
 * memory adds to the time of the arithmetic instead of hiding under it. So each row of a
 * decode step (each group of RB rows of a short prompt) first asks for the bytes
 * PREFETCH_AHEAD further on, one page, never past the thread's last row: the next page's
 * lines are in flight while the dots work through this one. The hint is prefetcht2 (locality
 * 1): the lines need not come into L1, where the activation row every dot reads lives. Appendix B times the distances 0 to 16 KiB on each
 * machine. */
#define PREFETCH_AHEAD 4096

static inline void prefetch_span(const uint8_t *p, size_t n, const uint8_t *end)
{
    for (const uint8_t *q = p; q < p + n && q < end; q += 64) __builtin_prefetch(q, 0, 1);
}
/* --8<-- [end:ahead] */

/* y (rows, N) = act (rows, already rounded, ab bytes each) by w's rows j0..j1, each group
 * of rows after a prefetch of the bytes `ahead` further on (0: none) */
static void rows_span(const sm_mat *w, const uint8_t *act, long long ab, int rows, float *y,
                      int j0, int j1, long long ahead)
{
    int count;
    const dot_fn dot = dot_of(w->type, w->K, &count);
    const size_t rb = (size_t)w->row_bytes;
    const uint8_t *end = w->w + (size_t)j1 * rb;
    if (rows == 1) { /* a decode step: row by row, each after its own prefetch */
        for (int j = j0; j < j1; j++) {
            const uint8_t *row = w->w + (size_t)j * rb;
            if (ahead > 0) prefetch_span(row + (size_t)ahead, rb, end);
            y[j] = dot(row, act, count);
        }
        return;
    }
    for (int j = j0; j < j1; j += RB) {
        const int nj = j1 - j < RB ? j1 - j : RB;
        if (ahead > 0) prefetch_span(w->w + (size_t)j * rb + (size_t)ahead, (size_t)nj * rb, end);
        for (int r = 0; r < rows; r++)
            for (int jj = 0; jj < nj; jj++)
                y[(size_t)r * w->N + j + jj] =
                    dot(w->w + (size_t)(j + jj) * (size_t)w->row_bytes, act + (size_t)r * ab, count);
    }
}

/* --8<-- [start:tile_q8_0] */
/* A Q8_0 matrix's decode layout: its rows repacked once into chapter 4's int8 tiles (tiles.c,
 * forward.c's opening comment), the same int8 values and f16 scales in the order the tile
 * product streams them: 16 rows side by side, four values of each in a 4-byte group, so one
 * 64-byte line meets one broadcast of four activations and no row ends in a reduction. q
 * holds N16 K bytes and s N16 K / 32 halves, both zeroed by the caller (the padding rows stay
 * zero). Returns 0, or -1 for a matrix that is not Q8_0 of a K a multiple of 32. */
int sm_g_tile_q8_0(const sm_mat *w, int8_t *q, uint16_t *s)
{
    if (w->kind != KIND_BLOCKS || w->type != T_Q8_0 || w->K % QBLOCK) return -1;
    const int nb = w->K / QBLOCK, tiles = PAD(w->N, TILE) / TILE;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < tiles; t++) {
        size_t base, ls, sbase, ss;
        lines_of(t, tiles, (size_t)w->K / 4, &base, &ls);
        lines_of(t, tiles, (size_t)nb, &sbase, &ss);
        for (int l = 0; l < TILE && t * TILE + l < w->N; l++) {
            const blk_q8_0 *row = (const blk_q8_0 *)(w->w + (size_t)(t * TILE + l) * (size_t)w->row_bytes);
            for (int b = 0; b < nb; b++) {
                s[(sbase + (size_t)b * ss) * TILE + l] = row[b].d;
                for (int g = 0; g < QBLOCK / 4; g++)
                    memcpy(q + (base + ((size_t)b * (QBLOCK / 4) + g) * ls) * 64 + 4 * l,
                           row[b].qs + 4 * g, 4);
            }
        }
    }
    return 0;
}
/* --8<-- [end:tile_q8_0] */

/* y (rows, N) = the int8 rows (xq, their block scales xs: sm_quantize_rows) by w's tiles,
 * for its rows j0..j1 (j0 a multiple of 16 TILE_RUN: whole runs of tiles inside a group),
 * tile-major: one decode row takes DNT tiles at a time, a prompt's rows four at a time
 * against two tiles (tiles.c's run_block). */
#define TILE_RUN DNT
static void tiles_span(const sm_mat *w, const int8_t *xq, const float *xs, int rows, float *y,
                       int j0, int j1)
{
    const int K32 = PAD(w->K, QBLOCK), nb = K32 / QBLOCK, G = rows == 1 ? DNT : 2;
    const int t1 = (j1 + TILE - 1) / TILE;
    for (int t = j0 / TILE; t < t1; t += G) {
        const int nt = t1 - t < G ? t1 - t : G;
        for (int r0 = 0; r0 < rows; r0 += MAXRB)
            run_block(w, t, nt, rows - r0 < MAXRB ? rows - r0 : MAXRB, NULL,
                      xq + (size_t)r0 * K32, xs + (size_t)r0 * nb, y + (size_t)r0 * w->N, 0);
    }
}

static void block_product(const sm_mat *w, const uint8_t *act, long long ab, int rows, float *y,
                          int nthreads, long long ahead)
{
    const int chunks = (w->N + 15) / 16;
    const int nt = nthreads < chunks ? nthreads : chunks;
    if (nt <= 1) {
        rows_span(w, act, ab, rows, y, 0, w->N, ahead);
        return;
    }
    #pragma omp parallel for schedule(static) num_threads(nt)
    for (int t = 0; t < nt; t++) {
        /* contiguous slices of 16-row chunks, one a thread */
        const int c0 = (int)((long long)chunks * t / nt), c1 = (int)((long long)chunks * (t + 1) / nt);
        const int j0 = 16 * c0, j1 = 16 * c1 < w->N ? 16 * c1 : w->N;
        rows_span(w, act, ab, rows, y, j0, j1, ahead);
    }
}

static void quantize_rows(int type, const float *x, int rows, int K, uint8_t *act)
{
    const long long ab = sm_g_act_bytes(type, K);
    for (int r = 0; r < rows; r++) sm_g_quantize(type, x + (size_t)r * K, K, act + (size_t)r * ab);
}

/* y (rows, N) = x (rows, K) by the matrix: the rows rounded as the type wants, then the
 * product (act is scratch of rows * sm_g_act_bytes bytes). */
static void matmul_with(const sm_mat *w, const float *x, int rows, float *y, uint8_t *act,
                        int nthreads, long long ahead)
{
    quantize_rows(w->type, x, rows, w->K, act);
    block_product(w, act, sm_g_act_bytes(w->type, w->K), rows, y, nthreads, ahead);
}

/* the product on its own, prefetching `ahead` bytes further on (-1: PREFETCH_AHEAD); a
 * matrix with tiles (sm_g_tile_q8_0) takes them, in runs of TILE_RUN tiles a thread */
void sm_g_matmul(const sm_mat *w, const float *x, int rows, float *y, int nthreads, long long ahead)
{
    const int K32 = PAD(w->K, QBLOCK);
    const size_t bytes = w->q ? (size_t)rows * ((size_t)K32 + sizeof(float) * (size_t)(K32 / QBLOCK)) + 64
                              : (size_t)rows * (size_t)sm_g_act_bytes(w->type, w->K) + 64;
    uint8_t *act = malloc(bytes);
    if (!act) return;
    if (w->q) {
        float *xs = (float *)(void *)(act + ((size_t)rows * K32 + 63) / 64 * 64);
        sm_quantize_rows(x, rows, w->K, (int8_t *)act, xs);
        const int runs = (w->N + TILE * TILE_RUN - 1) / (TILE * TILE_RUN);
        const int nt = nthreads < runs ? nthreads : runs;
        #pragma omp parallel for schedule(static) num_threads(nt > 0 ? nt : 1)
        for (int t = 0; t < nt; t++) {
            const int c0 = (int)((long long)runs * t / nt), c1 = (int)((long long)runs * (t + 1) / nt);
            const int j1 = TILE * TILE_RUN * c1 < w->N ? TILE * TILE_RUN * c1 : w->N;
            tiles_span(w, (int8_t *)act, xs, rows, y, TILE * TILE_RUN * c0, j1);
        }
    } else {
        matmul_with(w, x, rows, y, act, nthreads, ahead < 0 ? PREFETCH_AHEAD : ahead);
    }
    free(act);
}
