/* Chapter 4's weights: repacked once into tiles of 16 output columns, f32 (kind 0) or int8
 * with an f16 scale per block of 32 (kind 1); the layout and the instructions are described
 * in forward.c's opening comment. Included by forward.c (one translation unit); compiles alone
 * too (internal.h). */
#ifndef SM_FORWARD_TILES_C
#define SM_FORWARD_TILES_C
#include "internal.h"

#define TILE 16
#define QBLOCK 32
#define TILE_ROWS 32 /* the prefill's rows per pass: a tile's weights are reused by all of them */
#define MAXRB 4
#define MAXNT 8
/* tiles per decode block: a group's 8 (GROUP), whose lines lie side by side, so that a
 * decode block reads them once, front to back: 8 accumulators of 16 lanes where there are 32
 * vector registers; where there are 16 (AVX2), 16 ymm halves, which the compiler keeps in
 * L1 between their uses. A block of 2 tiles read 2 lines of every 8 and came back three
 * times for the rest (on a Zen 3, a Q8_0 file decoded through the tiles at half the speed of
 * its rows; 2 tiles a pass over each block's lines, 0.86 of it; a whole group, 1.09: the lines
 * must come in order). */
#define DNT 8

int sm_rows(void) { return TILE_ROWS; }
int sm_block_rows(void) { return MAXRB; }
const char *sm_int8_instruction(void)
{
#if defined(SM_AVX512_VNNI)
    return "vpdpbusd (AVX512-VNNI)";
#elif defined(SM_AVX2) && defined(SM_AVX_VNNI)
    return "vpdpbusd (AVX-VNNI)";
#elif defined(SM_AVX2)
    return "vpmaddubsw (AVX2)";
#else
    return "plain C";
#endif
}

int sm_tile(void) { return TILE; }

/* 32 floats as one of ggml's Q8_0 blocks: d = max|x| / 127 kept as an f16, and
 * q = round-half-even(x 127 / max|x|), as llama.cpp's x86 code quantises an activation. */
static void q8_0_of(const float *x, int8_t *q, uint16_t *d)
{
#if defined(SM_AVX2)
    /* the same arithmetic in vectors: |x| max, x id rounded to nearest even by the conversion
     * (the default rounding mode, as nearbyintf), packed to bytes (values within +-127, so the
     * saturating packs are exact; the permute undoes their 128-bit lane order) */
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8),
                 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
    const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                   _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    *d = sm_f32_to_f16(amax / 127.0f);
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    const __m256i q01 = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v0, id)),
                                           _mm256_cvtps_epi32(_mm256_mul_ps(v1, id)));
    const __m256i q23 = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v2, id)),
                                           _mm256_cvtps_epi32(_mm256_mul_ps(v3, id)));
    const __m256i v = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q01, q23),
                                                  _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, v);
#else
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    *d = sm_f32_to_f16(amax / 127.0f);
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < 32; j++) q[j] = (int8_t)(int)nearbyintf(x[j] * id);
#endif
}

/* Each row of K floats to int8 per block of 32, as ggml's Q8_0 (q8_0_of): the row's int8
 * values zero-padded to K32 (so the product never reads past a block) and each block's
 * scale a_b, the f16 widened to a float. */
void sm_quantize_rows(const float *x, int rows, int K, int8_t *xq, float *xs)
{
    const int K32 = PAD(K, QBLOCK), nb = K32 / QBLOCK;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * K;
        int8_t *p = xq + (size_t)r * K32;
        for (int b = 0; b < nb; b++) {
            float tail[QBLOCK];
            const float *src = xr + (size_t)b * QBLOCK;
            if ((b + 1) * QBLOCK > K) { /* the last block of a K that is not a multiple of 32 */
                memset(tail, 0, sizeof tail);
                memcpy(tail, src, sizeof(float) * (size_t)(K - b * QBLOCK));
                src = tail;
            }
            uint16_t d;
            q8_0_of(src, p + (size_t)b * QBLOCK, &d);
            xs[(size_t)r * nb + b] = sm_f16_to_f32(d);
        }
    }
}

#define GROUP 8

/* Where tile t0's lines start, in lines, and how many lines apart its consecutive rows are
 * (the tiles in its group, n_g); tiles t0 .. t0+NT-1 of one block sit side by side. */
static inline void lines_of(int t0, int tiles, size_t rows, size_t *base, size_t *stride)
{
    const int first = t0 / GROUP * GROUP;
    const int ng = tiles - first < GROUP ? tiles - first : GROUP;
    *base = (size_t)first * rows + (size_t)(t0 - first);
    *stride = (size_t)ng;
}

/* y[j0 .. j0+16) of one row = v (+ bias) (+ y itself when accumulating), cut at N. */
INLINE void finish(const float *v, float *y, const float *bias, int j0, int N, int accumulate)
{
    const int n = N - j0 < TILE ? N - j0 : TILE;
    for (int l = 0; l < n; l++)
        y[j0 + l] = (accumulate ? y[j0 + l] : 0.0f) + (bias ? bias[j0 + l] : 0.0f) + v[l];
}

/* one tile's 16 outputs of one row from its accumulator(s) into y, as finish */
#if defined(SM_AVX512)
INLINE void finish_zmm(__m512 f, float *y, const float *bias, int j0, int N, int accumulate)
{
    float v[TILE];
    _mm512_storeu_ps(v, f);
    finish(v, y, bias, j0, N, accumulate);
}
#endif
#if defined(SM_AVX2)
INLINE void finish_ymm2(__m256 f0, __m256 f1, float *y, const float *bias, int j0, int N, int accumulate)
{
    float v[TILE];
    _mm256_storeu_ps(v, f0);
    _mm256_storeu_ps(v + 8, f1);
    finish(v, y, bias, j0, N, accumulate);
}
#endif

/* ------------------------------------------------------------------ f32 tiles */
/* --8<-- [start:f32_block] */
/* Rows 0..RB-1 of y, tiles t0..t0+NT-1: RB x NT accumulators of 16 floats; each weight
 * line is loaded once and used by every row. */
INLINE void f32_block(const sm_mat *w, int t0, const int NT, const int RB, const float *x,
                      int ldx, float *y, int ldy, int accumulate)
{
    const int K = w->K;
    size_t base, ls;
    lines_of(t0, PAD(w->N, TILE) / TILE, (size_t)K, &base, &ls);
    const float *wt = w->f + base * TILE;  /* tile t0+i, row k: wt + (k ls + i) TILE */
#if defined(SM_AVX512)
    __m512 acc[MAXRB][MAXNT];
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NT; i++) acc[r][i] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
        __m512 wv[MAXNT];
        for (int i = 0; i < NT; i++) wv[i] = _mm512_loadu_ps(wt + ((size_t)k * ls + i) * TILE);
        for (int r = 0; r < RB; r++) {
            const __m512 xb = _mm512_set1_ps(x[(size_t)r * ldx + k]);
            for (int i = 0; i < NT; i++) acc[r][i] = _mm512_fmadd_ps(xb, wv[i], acc[r][i]);
        }
    }
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NT; i++) {
            float v[TILE];
            _mm512_storeu_ps(v, acc[r][i]);
            finish(v, y + (size_t)r * ldy, w->bias, (t0 + i) * TILE, w->N, accumulate);
        }
#elif defined(SM_AVX2)
    __m256 acc[MAXRB][MAXNT][2];
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NT; i++) acc[r][i][0] = acc[r][i][1] = _mm256_setzero_ps();
    for (int k = 0; k < K; k++) {
        __m256 wv[MAXNT][2];
        for (int i = 0; i < NT; i++) {
            wv[i][0] = _mm256_loadu_ps(wt + ((size_t)k * ls + i) * TILE);
            wv[i][1] = _mm256_loadu_ps(wt + ((size_t)k * ls + i) * TILE + 8);
        }
        for (int r = 0; r < RB; r++) {
            const __m256 xb = _mm256_set1_ps(x[(size_t)r * ldx + k]);
            for (int i = 0; i < NT; i++) {
                acc[r][i][0] = _mm256_fmadd_ps(xb, wv[i][0], acc[r][i][0]);
                acc[r][i][1] = _mm256_fmadd_ps(xb, wv[i][1], acc[r][i][1]);
            }
        }
    }
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NT; i++) {
            float v[TILE];
            _mm256_storeu_ps(v, acc[r][i][0]);
            _mm256_storeu_ps(v + 8, acc[r][i][1]);
            finish(v, y + (size_t)r * ldy, w->bias, (t0 + i) * TILE, w->N, accumulate);
        }
#else
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NT; i++) {
            float v[TILE] = {0};
            const float *xr = x + (size_t)r * ldx;
            for (int k = 0; k < K; k++)
                for (int l = 0; l < TILE; l++) v[l] += xr[k] * wt[((size_t)k * ls + i) * TILE + l];
            finish(v, y + (size_t)r * ldy, w->bias, (t0 + i) * TILE, w->N, accumulate);
        }
#endif
}
/* --8<-- [end:f32_block] */

/* ------------------------------------------------------------------ int8 tiles */
/* --8<-- [start:q8_block] */
/* Rows 0..RB-1 (int8 per block of 32, row r's block b scaled by xs[r nb + b]), tiles
 * t0..t0+NT-1: each block's sums exact in int32, then scaled by s_jb a_b into a float
 * accumulator, as ggml's Q8_0 dot does. */
INLINE void q8_block(const sm_mat *w, int t0, const int NT, const int RB, const int8_t *xq,
                     int ldq, const float *xs, float *y, int ldy, int accumulate, long long ahead)
{
    const int K32 = PAD(w->K, QBLOCK), nb = K32 / QBLOCK, lds = ldq / QBLOCK;
    size_t base, ls, sbase, ss;
    lines_of(t0, PAD(w->N, TILE) / TILE, (size_t)K32 / 4, &base, &ls);
    lines_of(t0, PAD(w->N, TILE) / TILE, (size_t)nb, &sbase, &ss);
    const int8_t *wt = w->q + base * 64;            /* tile t0+i, k-group kk: (kk ls + i) 64 */
    const uint16_t *st = w->s + sbase * TILE;       /* its block b's scales: (b ss + i) 16 */
#if defined(SM_AVX512_VNNI)
    /* the activations go in as p + 128 (unsigned); the block's weight sums, counted by one
     * more vpdpbusd against ones and shared by every row, take 128 sum q back out */
    const __m512i x80 = _mm512_set1_epi8((char)0x80), ones = _mm512_set1_epi8(1);
    __m512 facc[MAXRB][MAXNT];
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NT; i++) facc[r][i] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m512i iacc[MAXRB][MAXNT], qsum[MAXNT];
        for (int i = 0; i < NT; i++) {
            qsum[i] = _mm512_setzero_si512();
            for (int r = 0; r < RB; r++) iacc[r][i] = _mm512_setzero_si512();
        }
        for (int g = 0; g < QBLOCK / 4; g++) {
            const size_t kk = (size_t)b * (QBLOCK / 4) + g;
            __m512i wv[MAXNT];
            for (int i = 0; i < NT; i++) {
                wv[i] = _mm512_loadu_si512((const void *)(wt + (kk * ls + i) * 64));
                if (ahead > 0) __builtin_prefetch(wt + (kk * ls + i) * 64 + ahead, 0, 1);
                qsum[i] = _mm512_dpbusd_epi32(qsum[i], ones, wv[i]);
            }
            for (int r = 0; r < RB; r++) {
                int32_t x4;
                memcpy(&x4, xq + (size_t)r * ldq + kk * 4, 4);
                const __m512i xb = _mm512_xor_si512(_mm512_set1_epi32(x4), x80); /* p + 128 */
                for (int i = 0; i < NT; i++) iacc[r][i] = _mm512_dpbusd_epi32(iacc[r][i], xb, wv[i]);
            }
        }
        for (int i = 0; i < NT; i++) {
            const __m512 sc = _mm512_cvtph_ps(
                _mm256_loadu_si256((const __m256i *)(st + ((size_t)b * ss + i) * TILE)));
            const __m512i q128 = _mm512_slli_epi32(qsum[i], 7);
            for (int r = 0; r < RB; r++) {
                const __m512 d = _mm512_mul_ps(sc, _mm512_set1_ps(xs[(size_t)r * lds + b]));
                facc[r][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(iacc[r][i], q128)),
                                             d, facc[r][i]);
            }
        }
    }
    for (int i = 0; i < NT; i++)
        for (int r = 0; r < RB; r++)
            finish_zmm(facc[r][i], y + (size_t)r * ldy, w->bias, (t0 + i) * TILE, w->N, accumulate);
#elif defined(SM_AVX2)
    /* Each 64-byte line is two ymm halves of 8 outputs. With AVX-VNNI the same vpdpbusd on
     * ymm, activations as p + 128 and the weight sums taken back out per block; without it
     * vpmaddubsw on |q| (unsigned, so a GGUF file's -128 is exact) and p with q's sign
     * (vpsignb), pairs of int16 summed to int32 by vpmaddwd, exact with nothing to take out. */
#if defined(SM_AVX_VNNI)
    const __m256i x80 = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi8(1);
#define Q8_ROW(x4) _mm256_xor_si256(_mm256_set1_epi32(x4), x80) /* p + 128 */
#define Q8_DOT(acc, xb, wv) _mm256_dpbusd_avx_epi32(acc, xb, wv)
#define Q8_SUM(s, wv) ((s) = _mm256_dpbusd_avx_epi32(s, ones, wv))
#define Q8_EXACT(acc, s) _mm256_sub_epi32(acc, _mm256_slli_epi32(s, 7))
#else
    const __m256i ones = _mm256_set1_epi16(1);
#define Q8_ROW(x4) _mm256_set1_epi32(x4)
#define Q8_DOT(acc, xb, wv) _mm256_add_epi32(acc, _mm256_madd_epi16(                     \
        _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xb, wv)), ones))
#define Q8_SUM(s, wv) ((void)(s))
#define Q8_EXACT(acc, s) (acc)
#endif
    __m256 facc[MAXRB][MAXNT][2];
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NT; i++) facc[r][i][0] = facc[r][i][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m256i iacc[MAXRB][MAXNT][2], qsum[MAXNT][2];
        for (int i = 0; i < NT; i++) {
            qsum[i][0] = qsum[i][1] = _mm256_setzero_si256();
            for (int r = 0; r < RB; r++) iacc[r][i][0] = iacc[r][i][1] = _mm256_setzero_si256();
        }
        for (int g = 0; g < QBLOCK / 4; g++) {
            const size_t kk = (size_t)b * (QBLOCK / 4) + g;
            __m256i wv[MAXNT][2];
            for (int i = 0; i < NT; i++) {
                if (ahead > 0) __builtin_prefetch(wt + (kk * ls + i) * 64 + ahead, 0, 1);
                for (int hh = 0; hh < 2; hh++) {
                    wv[i][hh] = _mm256_loadu_si256((const __m256i *)(wt + (kk * ls + i) * 64 + 32 * hh));
                    Q8_SUM(qsum[i][hh], wv[i][hh]);
                }
            }
            for (int r = 0; r < RB; r++) {
                int32_t x4;
                memcpy(&x4, xq + (size_t)r * ldq + kk * 4, 4);
                const __m256i xb = Q8_ROW(x4);
                for (int i = 0; i < NT; i++)
                    for (int hh = 0; hh < 2; hh++)
                        iacc[r][i][hh] = Q8_DOT(iacc[r][i][hh], xb, wv[i][hh]);
            }
        }
        for (int i = 0; i < NT; i++)
            for (int hh = 0; hh < 2; hh++) {
                const __m256 sc = _mm256_cvtph_ps(
                    _mm_loadu_si128((const __m128i *)(st + ((size_t)b * ss + i) * TILE + 8 * hh)));
                for (int r = 0; r < RB; r++) {
                    const __m256 d = _mm256_mul_ps(sc, _mm256_set1_ps(xs[(size_t)r * lds + b]));
                    facc[r][i][hh] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(Q8_EXACT(iacc[r][i][hh], qsum[i][hh])), d, facc[r][i][hh]);
                }
            }
    }
#undef Q8_ROW
#undef Q8_DOT
#undef Q8_SUM
#undef Q8_EXACT
    for (int i = 0; i < NT; i++)
        for (int r = 0; r < RB; r++)
            finish_ymm2(facc[r][i][0], facc[r][i][1], y + (size_t)r * ldy, w->bias, (t0 + i) * TILE, w->N, accumulate);
#else
    (void)ahead;
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NT; i++) {
            float v[TILE] = {0};
            const int8_t *xr = xq + (size_t)r * ldq;
            for (int b = 0; b < nb; b++)
                for (int l = 0; l < TILE; l++) {
                    int32_t acc = 0;
                    for (int k = b * QBLOCK; k < (b + 1) * QBLOCK; k++)
                        acc += (int32_t)xr[k] * wt[((size_t)(k / 4) * ls + i) * 64 + l * 4 + k % 4];
                    const float d = sm_f16_to_f32(st[((size_t)b * ss + i) * TILE + l]) *
                                    xs[(size_t)r * lds + b];
                    v[l] = fmaf((float)acc, d, v[l]);
                }
            finish(v, y + (size_t)r * ldy, w->bias, (t0 + i) * TILE, w->N, accumulate);
        }
#endif
}
/* --8<-- [end:q8_block] */

/* A Q4_0 matrix in tiles (blocks.c, sm_g_tile_q4_0): as q8_block, but each 64-byte line holds
 * 16 rows' 4 bytes of one block's nibbles, the low nibbles values 4g..4g+3 of the block, the
 * high ones 16+4g..16+4g+3, so a line is two vpdpbusd of 16 outputs, the weights unsigned
 * (q, 0..15) against the activation signed; each block's sum starts from -8 times the
 * activation's block sum, which takes the 8 out of q - 8 exactly. A Q5_0 matrix (FIVE):
 * each block has a fifth line, the fifth bits of the four lines as 64-bit masks over their
 * bytes (low nibbles, then high, line by line), which set 16 in the bytes they select; q - 16. */
INLINE int32_t block_sum8(const int8_t *x)
{
#if defined(SM_AVX2)
    /* the 32 bytes + 128 summed by vpsadbw against zero, less 32 x 128 */
    const __m256i u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)x), _mm256_set1_epi8((char)0x80));
    const __m256i s = _mm256_sad_epu8(u, _mm256_setzero_si256());
    const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    return (int32_t)(_mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1)) - 32 * 128;
#else
    int32_t t = 0;
    for (int k = 0; k < QBLOCK; k++) t += x[k];
    return t;
#endif
}
INLINE void q4_block(const sm_mat *w, int t0, const int NT, const int RB, const int8_t *xq,
                     int ldq, const float *xs, float *y, int ldy, int accumulate, long long ahead,
                     const int FIVE)
{
    const int K32 = PAD(w->K, QBLOCK), nb = K32 / QBLOCK, lds = ldq / QBLOCK;
    const int LB = 4 + FIVE, OFF = FIVE ? 16 : 8; /* lines a block, the offset of q */
    size_t base, ls, sbase, ss;
    lines_of(t0, PAD(w->N, TILE) / TILE, (size_t)nb * (size_t)LB, &base, &ls);
    lines_of(t0, PAD(w->N, TILE) / TILE, (size_t)nb, &sbase, &ss);
    const uint8_t *wt = (const uint8_t *)w->q + base * 64; /* tile t0+i, line kk: (kk ls + i) 64 */
    const uint16_t *st = w->s + sbase * TILE;              /* its block b's scales: (b ss + i) 16 */
#if defined(SM_AVX512_VNNI)
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512 facc[MAXRB][MAXNT];
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NT; i++) facc[r][i] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m512i iacc[MAXRB][MAXNT];
        for (int r = 0; r < RB; r++) {
            const __m512i init = _mm512_set1_epi32(-OFF * block_sum8(xq + (size_t)r * ldq + (size_t)b * QBLOCK));
            for (int i = 0; i < NT; i++) iacc[r][i] = init;
        }
        for (int g = 0; g < QBLOCK / 8; g++) {
            const size_t kk = (size_t)b * (size_t)LB + g;
            __m512i lo[MAXNT], hi[MAXNT];
            for (int i = 0; i < NT; i++) {
                const __m512i v = _mm512_loadu_si512((const void *)(wt + (kk * ls + i) * 64));
                if (ahead > 0) __builtin_prefetch(wt + (kk * ls + i) * 64 + ahead, 0, 1);
                if (FIVE && g == 0 && ahead > 0) /* the block's fifth line, read ahead as the four are */
                    __builtin_prefetch(wt + (((size_t)b * LB + 4) * ls + i) * 64 + ahead, 0, 1);
                lo[i] = _mm512_and_si512(v, m4);
                hi[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if (FIVE) { /* this line's fifth bits: two masks in the block's last line */
                    const uint64_t *fm = (const uint64_t *)(const void *)(wt + (((size_t)b * LB + 4) * ls + i) * 64);
                    lo[i] = _mm512_mask_add_epi8(lo[i], (__mmask64)fm[2 * g], lo[i], _mm512_set1_epi8(16));
                    hi[i] = _mm512_mask_add_epi8(hi[i], (__mmask64)fm[2 * g + 1], hi[i], _mm512_set1_epi8(16));
                }
            }
            for (int r = 0; r < RB; r++) {
                const int8_t *xb = xq + (size_t)r * ldq + (size_t)b * QBLOCK + 4 * g;
                int32_t x0, x1;
                memcpy(&x0, xb, 4);
                memcpy(&x1, xb + 16, 4);
                const __m512i a0 = _mm512_set1_epi32(x0), a1 = _mm512_set1_epi32(x1);
                for (int i = 0; i < NT; i++)
                    iacc[r][i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(iacc[r][i], lo[i], a0), hi[i], a1);
            }
        }
        for (int i = 0; i < NT; i++) {
            const __m512 sc = _mm512_cvtph_ps(
                _mm256_loadu_si256((const __m256i *)(st + ((size_t)b * ss + i) * TILE)));
            for (int r = 0; r < RB; r++)
                facc[r][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[r][i]),
                                             _mm512_mul_ps(sc, _mm512_set1_ps(xs[(size_t)r * lds + b])),
                                             facc[r][i]);
        }
    }
    for (int i = 0; i < NT; i++)
        for (int r = 0; r < RB; r++)
            finish_zmm(facc[r][i], y + (size_t)r * ldy, w->bias, (t0 + i) * TILE, w->N, accumulate);
#elif defined(SM_AVX2)
    /* each line as two ymm halves of 8 outputs: vpdpbusd on ymm with AVX-VNNI, else
     * vpmaddubsw (q unsigned, at most 15 x 128 x 2 a pair: no saturation) and vpmaddwd */
#if defined(SM_AVX_VNNI)
#define Q4_DOT(acc, u, x) _mm256_dpbusd_avx_epi32(acc, u, x)
#else
#define Q4_DOT(acc, u, x) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), \
                                                                   _mm256_set1_epi16(1)))
#endif
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 facc[MAXRB][MAXNT][2];
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NT; i++) facc[r][i][0] = facc[r][i][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m256i iacc[MAXRB][MAXNT][2];
        for (int r = 0; r < RB; r++) {
            const __m256i init = _mm256_set1_epi32(-OFF * block_sum8(xq + (size_t)r * ldq + (size_t)b * QBLOCK));
            for (int i = 0; i < NT; i++) iacc[r][i][0] = iacc[r][i][1] = init;
        }
        for (int g = 0; g < QBLOCK / 8; g++) {
            const size_t kk = (size_t)b * (size_t)LB + g;
            __m256i lo[MAXNT][2], hi[MAXNT][2];
            for (int i = 0; i < NT; i++) {
                if (ahead > 0) __builtin_prefetch(wt + (kk * ls + i) * 64 + ahead, 0, 1);
                if (FIVE && g == 0 && ahead > 0) /* the block's fifth line, read ahead as the four are */
                    __builtin_prefetch(wt + (((size_t)b * LB + 4) * ls + i) * 64 + ahead, 0, 1);
                for (int hh = 0; hh < 2; hh++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(wt + (kk * ls + i) * 64 + 32 * hh));
                    lo[i][hh] = _mm256_and_si256(v, m4);
                    hi[i][hh] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    if (FIVE) { /* the masks' 32 bits of this half, as bytes of 16 (dots.c's fifth_bits) */
                        const uint8_t *fm = wt + (((size_t)b * LB + 4) * ls + i) * 64 + 16 * g + 4 * hh;
                        lo[i][hh] = _mm256_or_si256(lo[i][hh], fifth_bits(fm));
                        hi[i][hh] = _mm256_or_si256(hi[i][hh], fifth_bits(fm + 8));
                    }
                }
            }
            for (int r = 0; r < RB; r++) {
                const int8_t *xb = xq + (size_t)r * ldq + (size_t)b * QBLOCK + 4 * g;
                int32_t x0, x1;
                memcpy(&x0, xb, 4);
                memcpy(&x1, xb + 16, 4);
                const __m256i a0 = _mm256_set1_epi32(x0), a1 = _mm256_set1_epi32(x1);
                for (int i = 0; i < NT; i++)
                    for (int hh = 0; hh < 2; hh++)
                        iacc[r][i][hh] = Q4_DOT(Q4_DOT(iacc[r][i][hh], lo[i][hh], a0), hi[i][hh], a1);
            }
        }
        for (int i = 0; i < NT; i++)
            for (int hh = 0; hh < 2; hh++) {
                const __m256 sc = _mm256_cvtph_ps(
                    _mm_loadu_si128((const __m128i *)(st + ((size_t)b * ss + i) * TILE + 8 * hh)));
                for (int r = 0; r < RB; r++)
                    facc[r][i][hh] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[r][i][hh]),
                                                     _mm256_mul_ps(sc, _mm256_set1_ps(xs[(size_t)r * lds + b])),
                                                     facc[r][i][hh]);
            }
    }
#undef Q4_DOT
    for (int i = 0; i < NT; i++)
        for (int r = 0; r < RB; r++)
            finish_ymm2(facc[r][i][0], facc[r][i][1], y + (size_t)r * ldy, w->bias, (t0 + i) * TILE, w->N, accumulate);
#else
    (void)ahead;
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NT; i++) {
            float v[TILE] = {0};
            const int8_t *xr = xq + (size_t)r * ldq;
            for (int b = 0; b < nb; b++)
                for (int l = 0; l < TILE; l++) {
                    int32_t acc = -OFF * block_sum8(xr + (size_t)b * QBLOCK);
                    const uint8_t *fm = wt + (((size_t)b * LB + 4) * ls + i) * 64; /* FIVE: masks */
                    for (int j = 0; j < QBLOCK / 2; j++) { /* byte j of the row's block */
                        const int g = j / 4, bit = l * 4 + j % 4; /* the byte's place in its line */
                        const uint8_t q = wt[(((size_t)b * LB + (size_t)g) * ls + i) * 64 + bit];
                        const int f0 = FIVE ? (fm[16 * g + bit / 8] >> (bit % 8)) & 1 : 0;
                        const int f1 = FIVE ? (fm[16 * g + 8 + bit / 8] >> (bit % 8)) & 1 : 0;
                        acc += (int32_t)((q & 15) | f0 << 4) * xr[b * QBLOCK + j] +
                               (int32_t)((q >> 4) | f1 << 4) * xr[b * QBLOCK + 16 + j];
                    }
                    const float d = sm_f16_to_f32(st[((size_t)b * ss + i) * TILE + l]) *
                                    xs[(size_t)r * lds + b];
                    v[l] = fmaf((float)acc, d, v[l]);
                }
            finish(v, y + (size_t)r * ldy, w->bias, (t0 + i) * TILE, w->N, accumulate);
        }
#endif
}


/* One block of work, its shape chosen from a few compiled ones. */
#define Q4_TILES(w) ((w)->kind == KIND_BLOCKS && (w)->type == T_Q4_0)
#define Q5_TILES(w) ((w)->kind == KIND_BLOCKS && (w)->type == T_Q5_0)
#define INT_BLOCK(w, t0, NT, RB, xq, ldq, xs, y, ldy, acc)                                    \
    (Q4_TILES(w)   ? q4_block(w, t0, NT, RB, xq, ldq, xs, y, ldy, acc, ahead, 0)              \
     : Q5_TILES(w) ? q4_block(w, t0, NT, RB, xq, ldq, xs, y, ldy, acc, ahead, 1)              \
                   : q8_block(w, t0, NT, RB, xq, ldq, xs, y, ldy, acc, ahead))
#define BLOCK(NT, RB) (w->kind ? INT_BLOCK(w, t0, NT, RB, xq, K32, xs, y, N, acc) \
                               : f32_block(w, t0, NT, RB, x, K, y, N, acc))
static void run_block(const sm_mat *w, int t0, int nt, int rb, const float *x,
                      const int8_t *xq, const float *xs, float *y, int acc, long long ahead)
{
    const int K = w->K, N = w->N, K32 = PAD(K, QBLOCK);
    if (rb == MAXRB && nt == 2) BLOCK(2, MAXRB);
    else if (rb == MAXRB) for (int i = 0; i < nt; i++, t0++) BLOCK(1, MAXRB);
    else if (nt == DNT) for (int r = 0; r < rb; r++) {
        const float *xr = x + (size_t)r * K; const int8_t *qr = xq + (size_t)r * K32;
        float *yr = y + (size_t)r * N;
        (w->kind ? INT_BLOCK(w, t0, DNT, 1, qr, K32, xs + (size_t)r * (K32 / QBLOCK), yr, N, acc)
                 : f32_block(w, t0, DNT, 1, xr, K, yr, N, acc));
    }
    else for (int r = 0; r < rb; r++) for (int i = 0; i < nt; i++) {
        const float *xr = x + (size_t)r * K; const int8_t *qr = xq + (size_t)r * K32;
        float *yr = y + (size_t)r * N;
        (w->kind ? INT_BLOCK(w, t0 + i, 1, 1, qr, K32, xs + (size_t)r * (K32 / QBLOCK), yr, N, acc)
                 : f32_block(w, t0 + i, 1, 1, xr, K, yr, N, acc));
    }
}

/* --8<-- [start:matmul] */
/* y (rows x N) = x (rows x K) W (+ bias) (+ y when accumulate). For int8 weights the rows
 * come already quantised (xq, xs: sm_quantize_rows). One decode row takes the tiles DNT
 * at a time; prefill rows four by four, two tiles at a time, tile-major so that a thread
 * keeps its tiles in cache across the row groups. */
void sm_matmul(const sm_mat *w, const float *x, const int8_t *xq, const float *xs, float *y,
               int rows, int accumulate, int nthreads)
{
    const int tiles = PAD(w->N, TILE) / TILE;
    const int G = rows == 1 ? DNT : 2, groups = (tiles + G - 1) / G;
    const int rgroups = (rows + MAXRB - 1) / MAXRB, items = groups * rgroups;
    const int K = w->K, K32 = PAD(K, QBLOCK);
    #pragma omp parallel for schedule(static) num_threads(nthreads < items ? nthreads : items)
    for (int it = 0; it < items; it++) {
        const int t0 = (it / rgroups) * G, r0 = (it % rgroups) * MAXRB;
        const int nt = tiles - t0 < G ? tiles - t0 : G, rb = rows - r0 < MAXRB ? rows - r0 : MAXRB;
        run_block(w, t0, nt, rb, x ? x + (size_t)r0 * K : NULL,
                  xq ? xq + (size_t)r0 * K32 : NULL, xs ? xs + (size_t)r0 * (K32 / QBLOCK) : NULL,
                  y + (size_t)r0 * w->N, accumulate, 0);
    }
}
/* --8<-- [end:matmul] */
#endif /* SM_FORWARD_TILES_C */
