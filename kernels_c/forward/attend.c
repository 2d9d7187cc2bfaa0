/* The attention of the one forward, one function a cache behind one signature (ATTEND,
 * indexed by sm_model.cache): each takes the block's q, k and v rows (normed and turned by
 * RoPE where the model has them), puts k and v in its cache and writes each row's attention
 * into att.
 * - CACHE_TILES (chapter 4's models): keys in f32 tiles, values f32 rows (attend_f32);
 * - CACHE_F16 (others' models, as llama.cpp keeps them): f16 rows, a prompt's rows 16 keys
 *   at a time where AVX-512 has them (attend_block), else row by row (attend_f16);
 * - CACHE_STATE (appendix D's recurrent block): no keys kept, a state per head (recur).
 * Included by forward.c (one translation unit); compiles alone too (internal.h). */
#ifndef SM_FORWARD_ATTEND_C
#define SM_FORWARD_ATTEND_C
#include "internal.h"

/* a block's rows of q, k and v (each row's heads side by side; qs, ks, vs floats from one
 * row to the next) and, for the recurrent block, each row's gate logits (H a row) */
typedef struct {
    float *q;
    const float *k, *v;
    size_t qs, ks, vs;
    const float *gate;
} sm_qkv;

static void to_half(const float *x, uint16_t *o, int n)
{
    int i = 0;
#if defined(SM_AVX2)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(o + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), 0));
#endif
    for (; i < n; i++) o[i] = f2h(x[i]);
}

/* ------------------------------------------------------------------ attention, cache 0 */
/* Each new row's query against the cached keys 0..p of its head: scores, softmax, the
 * weighted sum of the cached values. The rows' own keys and values are already in. The
 * keys are kept in tiles of KT = 16 positions, each tile [hd][16] (the scores of 16
 * positions are then 16 lanes of multiply-adds, one query feature at a time, with no sum
 * across a vector, and a head's tiles are one stream); the values stay [context][hd], a
 * weighted sum of rows. */
#define KT 16
#if defined(SM_AVX512)
static inline __mmask16 lanes(int n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n > 0 ? n : 0)) - 1); }

/* out[0..n) = the scores of the n <= 16 positions of one key tile ([hd][16] floats, one
 * stream): four chains of multiply-adds over the features, added at the end. */
static inline void score_tile(const float *q, const float *tile, int n, int hd, float *out)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 4 <= hd; i += 4) {
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(q[i]), _mm512_loadu_ps(tile + (size_t)i * 16), a0);
        a1 = _mm512_fmadd_ps(_mm512_set1_ps(q[i + 1]), _mm512_loadu_ps(tile + (size_t)(i + 1) * 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_set1_ps(q[i + 2]), _mm512_loadu_ps(tile + (size_t)(i + 2) * 16), a2);
        a3 = _mm512_fmadd_ps(_mm512_set1_ps(q[i + 3]), _mm512_loadu_ps(tile + (size_t)(i + 3) * 16), a3);
    }
    for (; i < hd; i++)
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(q[i]), _mm512_loadu_ps(tile + (size_t)i * 16), a0);
    _mm512_mask_storeu_ps(out, lanes(n), _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/* o[0..n) = sum over t < np of w[t] V[t][0..n) (n <= 64 features of a row of hd). */
static inline void value_chunk(const float *w, const float *V, int np, int hd, int n, float *o)
{
    const __mmask16 m0 = lanes(n), m1 = lanes(n - 16), m2 = lanes(n - 32), m3 = lanes(n - 48);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int t = 0; t < np; t++) {
        const __m512 wt = _mm512_set1_ps(w[t]);
        const float *vr = V + (size_t)t * hd;
        a0 = _mm512_fmadd_ps(wt, _mm512_maskz_loadu_ps(m0, vr), a0);
        a1 = _mm512_fmadd_ps(wt, _mm512_maskz_loadu_ps(m1, vr + 16), a1);
        a2 = _mm512_fmadd_ps(wt, _mm512_maskz_loadu_ps(m2, vr + 32), a2);
        a3 = _mm512_fmadd_ps(wt, _mm512_maskz_loadu_ps(m3, vr + 48), a3);
    }
    _mm512_mask_storeu_ps(o, m0, a0);
    _mm512_mask_storeu_ps(o + 16, m1, a1);
    _mm512_mask_storeu_ps(o + 32, m2, a2);
    _mm512_mask_storeu_ps(o + 48, m3, a3);
}

/* s[0..n) = softmax(s[0..n)), in place, vector by vector. */
static inline void softmax_row(float *s, int n)
{
    __m512 vm = _mm512_set1_ps(-INFINITY);
    int t = 0;
    for (; t + 16 <= n; t += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(s + t));
    float mx = _mm512_reduce_max_ps(vm);
    for (; t < n; t++) mx = s[t] > mx ? s[t] : mx;
    const __m512 vmx = _mm512_set1_ps(mx);
    for (t = 0; t + 16 <= n; t += 16) _mm512_storeu_ps(s + t, _mm512_sub_ps(_mm512_loadu_ps(s + t), vmx));
    for (; t < n; t++) s[t] -= mx;
    exp_inplace(s, n);
    __m512 vs = _mm512_setzero_ps();
    for (t = 0; t + 16 <= n; t += 16) vs = _mm512_add_ps(vs, _mm512_loadu_ps(s + t));
    float sum = _mm512_reduce_add_ps(vs);
    for (; t < n; t++) sum += s[t];
    const __m512 inv = _mm512_set1_ps(1.0f / sum);
    for (t = 0; t + 16 <= n; t += 16) _mm512_storeu_ps(s + t, _mm512_mul_ps(_mm512_loadu_ps(s + t), inv));
    for (; t < n; t++) s[t] *= 1.0f / sum;
}

/* Four prefill rows of one head at once (rows at positions p0 .. p0+nr-1, nr <= 4): each
 * key tile and value row is loaded once for all of them. A row's scores past its own
 * position are computed with the others' and then given weight 0 (causal). */
INLINE void attend_rows(const int nr, const float *const q[4], int p0, const float *Kc,
                        const float *Vc, int hd, float scale, float *const s[4],
                        float *const o[4])
{
    const int plast = p0 + nr - 1;
    for (int t0 = 0; t0 <= plast; t0 += KT) {
        const int n = plast + 1 - t0 < KT ? plast + 1 - t0 : KT;
        const float *tile = Kc + (size_t)t0 * hd;
        __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                       _mm512_setzero_ps()};
        for (int i = 0; i < hd; i++) {
            const __m512 kv = _mm512_loadu_ps(tile + (size_t)i * KT);
            for (int r = 0; r < 4; r++)
                if (r < nr) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][i]), kv, a[r]);
        }
        for (int r = 0; r < nr; r++)
            _mm512_mask_storeu_ps(s[r] + t0, lanes(n), _mm512_mul_ps(a[r], _mm512_set1_ps(scale)));
    }
    for (int r = 0; r < nr; r++) {
        softmax_row(s[r], p0 + r + 1);
        for (int t = p0 + r + 1; t <= plast; t++) s[r][t] = 0.0f;
    }
    for (int i0 = 0; i0 < hd; i0 += 64) {
        const int w = hd - i0 < 64 ? hd - i0 : 64;
        const __mmask16 m[4] = {lanes(w), lanes(w - 16), lanes(w - 32), lanes(w - 48)};
        __m512 acc[4][4];
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
        for (int t = 0; t <= plast; t++) {
            const float *vr = Vc + (size_t)t * hd + i0;
            for (int c = 0; c < 4; c++) {
                const __m512 v = _mm512_maskz_loadu_ps(m[c], vr + 16 * c);
                for (int r = 0; r < 4; r++)
                    if (r < nr) acc[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(s[r][t]), v, acc[r][c]);
            }
        }
        for (int r = 0; r < nr; r++)
            for (int c = 0; c < 4; c++) _mm512_mask_storeu_ps(o[r] + i0 + 16 * c, m[c], acc[r][c]);
    }
}

static void attend_rows4(const float *const q[4], int nr, int p0, const float *Kc,
                         const float *Vc, int hd, float scale, float *const s[4],
                         float *const o[4])
{
    switch (nr) {  /* a constant count of rows keeps the accumulators in registers */
    case 4: attend_rows(4, q, p0, Kc, Vc, hd, scale, s, o); break;
    case 3: attend_rows(3, q, p0, Kc, Vc, hd, scale, s, o); break;
    case 2: attend_rows(2, q, p0, Kc, Vc, hd, scale, s, o); break;
    default: attend_rows(1, q, p0, Kc, Vc, hd, scale, s, o); break;
    }
}
#endif

static void attend_f32(const sm_model *m, int l, const float *qb, size_t qs, float *att,
                       float *scores, int rows, int pos, int nthreads)
{
#if defined(SM_AVX512)
    if (rows > 1) {  /* the prefill: heads x blocks of four rows */
        const int H = m->n_head, hd = m->head_dim, G = H / m->n_kv_head, ctx = m->context, ctx16 = PAD(ctx, KT);
        const int blocks = (rows + 3) / 4, items = H * blocks;
        const float scale = m->attn_scale;
        #pragma omp parallel for schedule(static) num_threads(nthreads < items ? nthreads : items)
        for (int it = 0; it < items; it++) {
            const int h = it % H, r0 = it / H * 4, nr = rows - r0 < 4 ? rows - r0 : 4;
            const float *q[4];
            float *sc[4], *o[4];
            for (int r = 0; r < 4; r++) {
                const int rr = r0 + (r < nr ? r : 0);
                q[r] = qb + (size_t)rr * qs + (size_t)h * hd;
                sc[r] = scores + ((size_t)rr * H + h) * ctx16;
                o[r] = att + ((size_t)rr * H + h) * hd;
            }
            attend_rows4(q, nr, pos + r0, (const float *)m->k_cache + (size_t)(l * (H / G) + h / G) * hd * ctx16,
                         (const float *)m->v_cache + (size_t)(l * (H / G) + h / G) * ctx * hd, hd, scale, sc, o);
        }
        return;
    }
#endif
{
    const int H = m->n_head, hd = m->head_dim, G = H / m->n_kv_head, ctx = m->context, items = rows * H;
    const float scale = m->attn_scale;
    #pragma omp parallel for schedule(static) num_threads(nthreads < items ? nthreads : items)
    for (int it = 0; it < items; it++) {
        const int r = it / H, h = it % H, p = pos + r;
        const float *q = qb + (size_t)r * qs + (size_t)h * hd;
        const int ctx16 = PAD(ctx, KT);
        const float *Kc = (const float *)m->k_cache + (size_t)(l * (H / G) + h / G) * hd * ctx16;  /* [ctx/16][hd][16] */
        const float *Vc = (const float *)m->v_cache + (size_t)(l * (H / G) + h / G) * ctx * hd;    /* [ctx][hd] */
        float *s = scores + (size_t)it * ctx16, mx = -INFINITY, sum = 0.0f;
        for (int t0 = 0; t0 <= p; t0 += KT) {
            const int n = p + 1 - t0 < KT ? p + 1 - t0 : KT;
            const float *tile = Kc + (size_t)t0 * hd;
#if defined(SM_AVX512)
            score_tile(q, tile, n, hd, s + t0);
#else
            for (int j = 0; j < n; j++) s[t0 + j] = 0.0f;
            for (int i = 0; i < hd; i++) {
                const float qi = q[i], *kr = tile + (size_t)i * KT;
                #pragma omp simd
                for (int j = 0; j < n; j++) s[t0 + j] += qi * kr[j];
            }
#endif
        }
#if defined(SM_AVX512)
        (void)mx, (void)sum;
        for (int t = 0; t <= p; t++) s[t] *= scale;
        softmax_row(s, p + 1);
#else
        for (int t = 0; t <= p; t++) {
            s[t] *= scale;
            mx = s[t] > mx ? s[t] : mx;
        }
        for (int t = 0; t <= p; t++) s[t] -= mx;
        exp_inplace(s, p + 1);
        for (int t = 0; t <= p; t++) sum += s[t];
        const float inv = 1.0f / sum;
        for (int t = 0; t <= p; t++) s[t] *= inv;
#endif
        float *o = att + ((size_t)r * H + h) * hd;
#if defined(SM_AVX512)
        for (int i0 = 0; i0 < hd; i0 += 64)
            value_chunk(s, Vc + i0, p + 1, hd, hd - i0 < 64 ? hd - i0 : 64, o + i0);
#else
        for (int i = 0; i < hd; i++) o[i] = 0.0f;
        for (int t = 0; t <= p; t++) {
            #pragma omp simd
            for (int i = 0; i < hd; i++) o[i] += s[t] * Vc[(size_t)t * hd + i];
        }
#endif
    }
}
}

/* ------------------------------------------------------------------ attention, cache 1 */
/* --8<-- [start:attend_f16] */
/* Row r's query of head h against the cached keys 0..p of its kv head, as ggml's CPU flash
 * attention computes it (llama.cpp's default), so that the attention's output, and every
 * activation rounded after it, is llama.cpp's: the keys in order, an online softmax (M the
 * largest score so far, S the sum of exp(score - M)), and the weighted values summed in an
 * f16 accumulator: each step is one f32 fused multiply-add rounded back to f16, and a new
 * largest score first scales the accumulator by exp(M_old - M), rounded to f16 too. The sum
 * is divided by S at the end, in f32. The query arrives rounded to f16 (as ggml rounds the
 * operand an f16 matrix meets), in place by the caller, and already scaled by 1/sqrt(hd)
 * where the architecture scales it first (q_prescaled: phi3, gemma3). One expf a key, as ggml's.
 * The same sums in the same order, in three passes over AT_KEYS keys at a time: the scores
 * (each key's dot on its own, so the core overlaps them), the factors in order, then the
 * values with the accumulator held in registers; in one pass a key each, every step waited
 * on the one before through memory.
 * A sliding window (gemma3's local layers) starts the keys at lo: ggml skips the keys its mask
 * hides, so the sum is the same one over the visible keys in order. */
static inline float round_f16(float x) { return h2f(f2h(x)); }

#define AT_KEYS 64 /* keys a pass: their scores, then their factors, then their values */

/* one key's score: the query's dot with the key (f16), 8 lanes at a time, then the rest */
static inline float key_dot(const float *q, const uint16_t *kt, int hd)
{
    float d = 0.0f;
    int i = 0;
#if defined(SM_AVX2)
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= hd; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kt + i))), acc);
    d = hsum8(acc);
#endif
    for (; i < hd; i++) d += q[i] * h2f(kt[i]);
    return d;
}

/* The accumulator o (vd features, f16 values in f32) through n keys' values: at key j, first
 * o = f16(o ms[j]) where a new largest score came (ms[j] != 1: an f16 value times 1 is
 * itself), then o = f16(o + ws[j] v_j). 64 features at a time stay in registers across the
 * keys, so a step waits on the one before only through its own lanes. */
static void accumulate_f16(float *o, const uint16_t *V, size_t vstride, const float *ms,
                           const float *ws, int n, int vd)
{
    int i = 0;
#if defined(SM_AVX2)
    for (; i + 64 <= vd; i += 64) {
        __m256 a[8];
        for (int b = 0; b < 8; b++) a[b] = _mm256_loadu_ps(o + i + 8 * b);
        for (int j = 0; j < n; j++) {
            const uint16_t *vt = V + (size_t)j * vstride + i;
            if (ms[j] != 1.0f) {
                const __m256 f = _mm256_set1_ps(ms[j]);
                for (int b = 0; b < 8; b++)
                    a[b] = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(a[b], f), 0));
            }
            const __m256 w = _mm256_set1_ps(ws[j]);
            for (int b = 0; b < 8; b++)
                a[b] = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_fmadd_ps(
                    _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vt + 8 * b))), w, a[b]), 0));
        }
        for (int b = 0; b < 8; b++) _mm256_storeu_ps(o + i + 8 * b, a[b]);
    }
#endif
    if (i == vd) return;
    for (int j = 0; j < n; j++) {  /* the features past the last 64, in memory */
        const uint16_t *vt = V + (size_t)j * vstride;
        if (ms[j] != 1.0f)
            for (int c = i; c < vd; c++) o[c] = round_f16(o[c] * ms[j]);
        for (int c = i; c < vd; c++) o[c] = round_f16(fmaf(h2f(vt[c]), ws[j], o[c]));
    }
}

static void attend_f16(const sm_model *m, int l, const float *q, int lo, int p, int kvh, float *o)
{
    const int hd = m->head_dim, vd = m->v_dim, nkv = m->n_kv_head;
    const size_t kstride = (size_t)nkv * hd, vstride = (size_t)nkv * vd;
    const uint16_t *K = (const uint16_t *)m->k_cache + (size_t)l * m->context * kstride + (size_t)kvh * hd;
    const uint16_t *V = (const uint16_t *)m->v_cache + (size_t)l * m->context * vstride + (size_t)kvh * vd;
    const float scale = m->q_prescaled ? 1.0f : m->attn_scale;
    float M = -INFINITY, S = 0.0f, sc[AT_KEYS], ms[AT_KEYS], ws[AT_KEYS];
    for (int i = 0; i < vd; i++) o[i] = 0.0f; /* the accumulator: f16 values, kept in f32 */
    for (int t0 = lo; t0 <= p; t0 += AT_KEYS) {
        const int n = p + 1 - t0 < AT_KEYS ? p + 1 - t0 : AT_KEYS;
        for (int j = 0; j < n; j++)  /* the scores: no key's waits on another's */
            sc[j] = key_dot(q, K + (size_t)(t0 + j) * kstride, hd) * scale;
        for (int j = 0; j < n; j++) { /* the factors, in order */
            if (sc[j] > M) { /* a new largest score: what is summed so far shrinks by exp(M_old - M) */
                ms[j] = expf(M - sc[j]), ws[j] = 1.0f;
                M = sc[j];
            } else {
                ms[j] = 1.0f, ws[j] = expf(sc[j] - M);
            }
            S = S * ms[j] + ws[j];
        }
        accumulate_f16(o, V + (size_t)t0 * vstride, vstride, ms, ws, n, vd);
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int i = 0; i < vd; i++) o[i] *= inv;
}
/* --8<-- [end:attend_f16] */

#if defined(SM_AVX512)
/* --8<-- [start:attend_block] */
/* The prompt's attention (the GEMM branch's calls, cache 1): the same softmax over the same
 * keys, taken 16 at a time. One work item is a kv head and up to AT_Q of its queries (a few
 * rows times the G heads that share the kv head). For each block of 16 keys the keys are
 * widened once into a (hd x 16) f32 tile and the values into 16 f32 rows; then each query
 * scores the 16 keys in one vector (hd multiply-adds of a broadcast query feature, four
 * chains), masks the keys past its position or before its window, rescales its running sum
 * once a block, and adds the 16 values weighted. Row by row, each key costs a horizontal sum
 * and an expf; here both are vectors shared by 16 keys, and the widening by every query of
 * the item. The sum is kept in f32, not in ggml's f16 accumulator. */
enum { AT_Q = 64, AT_MAXD = 256 };

static void attend_block(const sm_model *m, int l, const float *qb, size_t qs, float *att,
                         int r0, int r1, int p0, int window, int kvh)
{
    const int H = m->n_head, nkv = m->n_kv_head, hd = m->head_dim, vd = m->v_dim, G = H / nkv;
    const size_t kstride = (size_t)nkv * hd, vstride = (size_t)nkv * vd;
    const uint16_t *K = (const uint16_t *)m->k_cache + (size_t)l * m->context * kstride + (size_t)kvh * hd;
    const uint16_t *V = (const uint16_t *)m->v_cache + (size_t)l * m->context * vstride + (size_t)kvh * vd;
    const float scale = m->q_prescaled ? 1.0f : m->attn_scale;
    float kt[AT_MAXD * 16], vt[16 * AT_MAXD], row[AT_MAXD], Mx[AT_Q], S[AT_Q];
    const int nq = (r1 - r0) * G;
    for (int i = 0; i < nq; i++) {
        Mx[i] = -INFINITY;
        S[i] = 0.0f;
        float *o = att + ((size_t)(r0 + i / G) * H + kvh * G + i % G) * vd;
        memset(o, 0, sizeof(float) * (size_t)vd);
    }
    const int hi = p0 + r1 - 1, first = p0 + r0;
    const int lo = window > 0 && first - window + 1 > 0 ? first - window + 1 : 0;
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int t0 = lo / 16 * 16; t0 <= hi; t0 += 16) {
        const int n = hi + 1 - t0 < 16 ? hi + 1 - t0 : 16;
        for (int j = 0; j < 16; j++) {      /* the keys widened and turned: kt[i][j] */
            if (j < n) {
                for (int i = 0; i < hd; i += 16)
                    _mm512_storeu_ps(row + i, _mm512_cvtph_ps(_mm256_loadu_si256(
                                                  (const __m256i *)(K + (size_t)(t0 + j) * kstride + i))));
                for (int i = 0; i < hd; i++) kt[i * 16 + j] = row[i];
                for (int i = 0; i < vd; i += 16)
                    _mm512_storeu_ps(vt + j * vd + i, _mm512_cvtph_ps(_mm256_loadu_si256(
                                                  (const __m256i *)(V + (size_t)(t0 + j) * vstride + i))));
            } else {
                for (int i = 0; i < hd; i++) kt[i * 16 + j] = 0.0f;
                memset(vt + j * vd, 0, sizeof(float) * (size_t)vd);
            }
        }
        for (int qi = 0; qi < nq; qi++) {
            const int r = r0 + qi / G, h = kvh * G + qi % G, p = p0 + r;
            const int lo_q = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
            if (t0 > p || t0 + 15 < lo_q) continue;
            const float *q = qb + (size_t)r * qs + (size_t)h * hd;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int i = 0; i < hd; i += 4) {
                a0 = _mm512_fmadd_ps(_mm512_set1_ps(q[i]), _mm512_loadu_ps(kt + i * 16), a0);
                a1 = _mm512_fmadd_ps(_mm512_set1_ps(q[i + 1]), _mm512_loadu_ps(kt + i * 16 + 16), a1);
                a2 = _mm512_fmadd_ps(_mm512_set1_ps(q[i + 2]), _mm512_loadu_ps(kt + i * 16 + 32), a2);
                a3 = _mm512_fmadd_ps(_mm512_set1_ps(q[i + 3]), _mm512_loadu_ps(kt + i * 16 + 48), a3);
            }
            const __m512 sc = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                            _mm512_set1_ps(scale));
            const __m512i t = _mm512_add_epi32(lane, _mm512_set1_epi32(t0));
            const __mmask16 ok = _mm512_cmple_epi32_mask(t, _mm512_set1_epi32(p))
                                 & _mm512_cmpge_epi32_mask(t, _mm512_set1_epi32(lo_q));
            const float mb = _mm512_reduce_max_ps(_mm512_mask_blend_ps(ok, _mm512_set1_ps(-INFINITY), sc));
            const float Mn = mb > Mx[qi] ? mb : Mx[qi];
            const float f = Mx[qi] == -INFINITY ? 0.0f : expf(Mx[qi] - Mn);
            const __m512 pr = _mm512_maskz_mov_ps(ok, exp_vec(_mm512_sub_ps(sc, _mm512_set1_ps(Mn))));
            Mx[qi] = Mn;
            S[qi] = S[qi] * f + _mm512_reduce_add_ps(pr);
            float pj[16];
            _mm512_storeu_ps(pj, pr);
            float *o = att + ((size_t)r * H + h) * vd;
            for (int i = 0; i < vd; i += 16) {
                __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(o + i), _mm512_set1_ps(f));
                for (int j = 0; j < n; j++)
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(pj[j]), _mm512_loadu_ps(vt + j * vd + i), acc);
                _mm512_storeu_ps(o + i, acc);
            }
        }
    }
    for (int qi = 0; qi < nq; qi++) {
        const int r = r0 + qi / G, h = kvh * G + qi % G;
        float *o = att + ((size_t)r * H + h) * vd;
        const float inv = S[qi] == 0.0f ? 0.0f : 1.0f / S[qi];
        for (int i = 0; i < vd; i++) o[i] *= inv;
    }
}
/* --8<-- [end:attend_block] */
#endif

/* --8<-- [start:recur] */
/* The recurrent block's mixer (appendix D) for rows at consecutive positions: per head a
 * state S (hd x hd, the cache: [layer][head][hd][hd]), decayed by sigmoid(z) of the head's
 * gate logit z and added k v^T, then read by the scaled query: o = S^T q attn_scale. The
 * same work at every position, whatever the context: 2 hd^2 multiply-adds a head a token,
 * and the state's hd^2 floats read and written. Heads in parallel, rows in order. */
static void recur(const sm_model *m, int l, const float *qb, size_t qs, const float *kb,
                  size_t ks, const float *vb, size_t vs, const float *z, float *att, int rows,
                  int nthreads)
{
    const int H = m->n_head, hd = m->head_dim;
    const int nt = team(m, 8LL * H * hd * hd * rows, nthreads);
    #pragma omp parallel for schedule(static) num_threads(nt < H ? nt : H)
    for (int h = 0; h < H; h++) {
        float *S = (float *)m->k_cache + ((size_t)l * H + h) * hd * hd;
        for (int r = 0; r < rows; r++) {
            const float a = 1.0f / (1.0f + expf(-z[(size_t)r * H + h]));
            const float *q = qb + (size_t)r * qs + (size_t)h * hd;
            const float *k = kb + (size_t)r * ks + (size_t)h * hd;
            const float *v = vb + (size_t)r * vs + (size_t)h * hd;
            float *o = att + ((size_t)r * H + h) * hd;
            for (int j = 0; j < hd; j++) o[j] = 0.0f;
            for (int i = 0; i < hd; i++) {
                float *Si = S + (size_t)i * hd;
                const float ki = k[i], qi = q[i] * m->attn_scale;
                #pragma omp simd
                for (int j = 0; j < hd; j++) {
                    Si[j] = a * Si[j] + ki * v[j];
                    o[j] += qi * Si[j];
                }
            }
        }
    }
}
/* --8<-- [end:recur] */

/* --8<-- [start:attend] */
/* cache 0: each row's key into its head's tiles [ctx/16][hd][16], its value a row, then
 * attend_f32 (which reads 2 (p0 + rows) hd H floats a row) */
static void attend_tiles(const sm_model *m, int l, const sm_qkv *x, float *att, float *scores,
                         int rows, int p0, int nthreads)
{
    const int H = m->n_head, nkv = m->n_kv_head, hd = m->head_dim, vd = m->v_dim, ctx = m->context;
    for (int r = 0; r < rows; r++) {
        const int p = p0 + r;
        const float *kr = x->k + (size_t)r * x->ks, *vr = x->v + (size_t)r * x->vs;
        for (int h = 0; h < nkv; h++) {
            float *kt = (float *)m->k_cache + (size_t)(l * nkv + h) * hd * PAD(ctx, KT)
                        + (size_t)(p / KT) * hd * KT + p % KT;
            for (int i = 0; i < hd; i++) kt[(size_t)i * KT] = kr[h * hd + i];
            memcpy((float *)m->v_cache + ((size_t)(l * nkv + h) * ctx + p) * vd,
                   vr + (size_t)h * vd, vd * sizeof(float));
        }
    }
    attend_f32(m, l, x->q, x->qs, att, scores, rows, p0,
               team(m, 8LL * (p0 + rows) * H * hd * rows, nthreads));
}

/* cache 1: k and v as f16 rows [layer][position][kv head][feature], each query rounded to
 * f16 (after its scale, where the model scales the query), then a prompt's rows 16 keys at a
 * time or each (row, head) alone */
static void attend_cache_f16(const sm_model *m, int l, const sm_qkv *x, float *att,
                             float *scores, int rows, int p0, int nthreads)
{
    const sm_layer *L = m->layers + l;
    const int H = m->n_head, nkv = m->n_kv_head, hd = m->head_dim, vd = m->v_dim, ctx = m->context;
    const int kd = nkv * hd, vdt = nkv * vd, G = H / nkv, items = rows * H;
    (void)scores;
    for (int r = 0; r < rows; r++) {
        const size_t at = (size_t)l * ctx + p0 + r;
        to_half(x->k + (size_t)r * x->ks, (uint16_t *)m->k_cache + at * kd, kd);
        to_half(x->v + (size_t)r * x->vs, (uint16_t *)m->v_cache + at * vdt, vdt);
    }
    float *const qb = x->q;
    const size_t qs = x->qs;
    const float qscale = m->q_prescaled ? m->attn_scale : 1.0f;
    const long long bytes = 2LL * (p0 + rows) * H * (hd + vd) * rows;
    const int nt = team(m, bytes, nthreads);
#if defined(SM_AVX512)
    if (m->gemm_block_rows > 0 && rows >= m->gemm_rows && hd % 16 == 0 && vd % 16 == 0
        && hd <= AT_MAXD && vd <= AT_MAXD && G <= AT_Q) {   /* a prompt: keys 16 at a time */
        const int qd = H * hd;
        for (int r = 0; r < rows; r++)
            for (int i = 0; i < qd; i++) qb[(size_t)r * qs + i] = h2f(f2h(qb[(size_t)r * qs + i] * qscale));
        const int per = AT_Q / G, blocks = (rows + per - 1) / per, work = nkv * blocks;
        #pragma omp parallel for schedule(dynamic, 1) num_threads(nt < work ? nt : work)
        for (int it = 0; it < work; it++) {
            const int kvh = it % nkv, r0 = it / nkv * per, r1 = r0 + per < rows ? r0 + per : rows;
            attend_block(m, l, qb, qs, att, r0, r1, p0, L->window, kvh);
        }
        return;
    }
#endif
    #pragma omp parallel for schedule(static) num_threads(nt < items ? nt : items)
    for (int it = 0; it < items; it++) {
        const int r = it / H, h = it % H, p = p0 + r;
        const int lo = L->window > 0 && p - L->window + 1 > 0 ? p - L->window + 1 : 0;
        float *q = qb + (size_t)r * qs + (size_t)h * hd;
        for (int i = 0; i < hd; i++) q[i] = h2f(f2h(q[i] * qscale));
        attend_f16(m, l, q, lo, p, h / G, att + ((size_t)r * H + h) * vd);
    }
}

/* cache 2: the recurrent block's state, decayed by each row's gates */
static void attend_state(const sm_model *m, int l, const sm_qkv *x, float *att, float *scores,
                         int rows, int p0, int nthreads)
{
    (void)scores, (void)p0;
    recur(m, l, x->q, x->qs, x->k, x->ks, x->v, x->vs, x->gate, att, rows, nthreads);
}

/* the one signature, one function a cache (sm_model.cache) */
typedef void attend_fn(const sm_model *m, int l, const sm_qkv *x, float *att, float *scores,
                       int rows, int p0, int nthreads);
static attend_fn *const ATTEND[] = {[CACHE_TILES] = attend_tiles, [CACHE_F16] = attend_cache_f16,
                                    [CACHE_STATE] = attend_state};
/* --8<-- [end:attend] */
#endif /* SM_FORWARD_ATTEND_C */
