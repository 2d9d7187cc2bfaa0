/* Chapter 4: generating one sequence. The whole model's forward pass for n new tokens
 * (n = 1 when decoding, a chunk of the prompt when prefilling) in one C call, against a
 * key/value cache the caller owns.
 *
 * Decoding one token is a matrix-vector product per weight matrix: every weight is read
 * once and used for two operations (a multiply and an add), so the time per token is the
 * weight bytes divided by the bandwidth of whatever level of the memory holds them. Two
 * things follow, and this file is built on them:
 *
 * - The weights are repacked once into the order the product reads them: tiles of
 *   TILE = 16 output columns, each tile's K rows one after another. One tile row is one
 *   64-byte line (16 f32, or for int8 16 outputs x 4 inputs), so the product streams
 *   every matrix front to back with one vector load per line.
 * - Fewer bytes per weight is the only lever left once the stream runs at the level's
 *   bandwidth: int8 weights (kind 1) read a quarter of f32's bytes. A weight column is
 *   cut into blocks of QBLOCK = 32 along K, each with its own scale s (an f16, as in
 *   llama.cpp's Q8_0, so the same bytes can be exported): w = s q, q in [-127, 127].
 *   The activation row is quantised once per matrix with one scale a: x = a p.
 *   Then y_j = a sum_b s_jb sum_{k in b} p_k q_kj, the inner sums exact in int32.
 *
 * The inner sum is vpdpbusd on AVX512-VNNI: four u8 x s8 products added into each of 16
 * int32 lanes, one instruction per 64 weights. It wants the activations unsigned, so
 * they go in as p + 128 (p xor 0x80), which adds 128 sum_{k in b} q_kj to each block's
 * sum: the correction corr_j = sum_b s_jb sum_{k in b} q_kj is computed when the weights
 * are packed, and y_j = a (sum_b s_jb acc_jb - 128 corr_j). On AVX2 there is no VNNI;
 * vpmaddubsw multiplies u8 by s8 into pairs of int16 that would overflow with p + 128,
 * so it takes |p| and moves p's sign onto q (vpsignb), and needs no correction. Where the
 * CPU has AVX-VNNI (vpdpbusd on ymm, VEX: Alder Lake and later, Zen 5) the AVX2 level takes
 * vpdpbusd with the same +128 and correction, on two ymm halves of each line. Plain C
 * does the same sums with ints.
 *
 * Layouts (N16 = N rounded up to 16, K32 = K rounded up to 32, zero-padded). A line is
 * one tile's 64 bytes for one k (f32) or one group of four k (int8). The tiles go in groups
 * of GROUP = 8 (the last group may hold fewer, n_g), and a group's lines are interleaved:
 * first line 0 of its n_g tiles, then line 1 of each, ... so that a block of a group's tiles
 * reads one stream, front to back, that the hardware prefetcher follows:
 *   f32:  f[group][K][n_g][16]
 *   int8: q[group][K32/4][n_g][16][4]  (four consecutive k per output, as vpdpbusd wants)
 *         s[group][K32/32][n_g][16]    (f16 scale per output and block)
 *         corr[N16]
 * Threads split a product's tiles (static schedule: a thread reads the same slice of
 * every matrix at every token), attention's heads, and the prefill's rows.
 */
#include <math.h>
#include <time.h>
#include "common.h"
#include "vexp.h"
#include "rows.h"
#include "half.h"
#include "decode.h"

#define TILE 16
#define QBLOCK 32
#define ROWS 32 /* the prefill's rows per pass: a tile's weights are reused by all of them */
#define PAD(n, m) (((n) + (m) - 1) / (m) * (m))
#define MAXRB 4
#define MAXNT 8
/* tiles per decode block: 8 accumulators of 16 lanes where there are 32 vector registers,
 * 2 (of two ymm halves each) where there are 16 */
#if defined(SM_AVX512)
#define DNT 8
#else
#define DNT 2
#endif
#define INLINE static inline __attribute__((always_inline))

int sm_rows(void) { return ROWS; }
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

/* --8<-- [start:quantize] */
/* Each row of K floats to int8 with one scale: a = max|x| / 127, p = round(x / a);
 * the row is zero-padded to K32 so that the product never reads past a block. */
void sm_quantize_rows(const float *x, int rows, int K, int8_t *xq, float *xs)
{
    const int K32 = PAD(K, QBLOCK);
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * K;
        int8_t *p = xq + (size_t)r * K32;
        float amax = 0.0f;
        #pragma omp simd reduction(max:amax)
        for (int k = 0; k < K; k++) {
            const float a = fabsf(xr[k]);
            amax = a > amax ? a : amax;
        }
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        #pragma omp simd
        for (int k = 0; k < K; k++) {
            const float v = xr[k] * inv;
            p[k] = (int8_t)(int)(v + (v >= 0.0f ? 0.5f : -0.5f));
        }
        for (int k = K; k < K32; k++) p[k] = 0;
        xs[r] = amax / 127.0f;
    }
}
/* --8<-- [end:quantize] */

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
INLINE void q8_block(const sm_mat *w, int t0, const int NT, const int RB, const int8_t *xq,
                     int ldq, const float *xs, float *y, int ldy, int accumulate)
{
    const int K32 = PAD(w->K, QBLOCK), nb = K32 / QBLOCK;
    size_t base, ls, sbase, ss;
    lines_of(t0, PAD(w->N, TILE) / TILE, (size_t)K32 / 4, &base, &ls);
    lines_of(t0, PAD(w->N, TILE) / TILE, (size_t)nb, &sbase, &ss);
    const int8_t *wt = w->q + base * 64;            /* tile t0+i, k-group kk: (kk ls + i) 64 */
    const uint16_t *st = w->s + sbase * TILE;       /* its block b's scales: (b ss + i) 16 */
#if defined(SM_AVX512_VNNI)
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    __m512 facc[MAXRB][MAXNT];
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NT; i++) facc[r][i] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m512i iacc[MAXRB][MAXNT];
        for (int r = 0; r < RB; r++)
            for (int i = 0; i < NT; i++) iacc[r][i] = _mm512_setzero_si512();
        for (int g = 0; g < QBLOCK / 4; g++) {
            const size_t kk = (size_t)b * (QBLOCK / 4) + g;
            __m512i wv[MAXNT];
            for (int i = 0; i < NT; i++)
                wv[i] = _mm512_loadu_si512((const void *)(wt + (kk * ls + i) * 64));
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
            for (int r = 0; r < RB; r++)
                facc[r][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[r][i]), sc, facc[r][i]);
        }
    }
    for (int i = 0; i < NT; i++) {
        const __m512 c = _mm512_mul_ps(_mm512_loadu_ps(w->corr + (size_t)(t0 + i) * TILE),
                                       _mm512_set1_ps(128.0f));
        for (int r = 0; r < RB; r++) {
            float v[TILE];
            _mm512_storeu_ps(v, _mm512_mul_ps(_mm512_sub_ps(facc[r][i], c), _mm512_set1_ps(xs[r])));
            finish(v, y + (size_t)r * ldy, w->bias, (t0 + i) * TILE, w->N, accumulate);
        }
    }
#elif defined(SM_AVX2)
    /* Each 64-byte line is two ymm halves of 8 outputs. With AVX-VNNI the same vpdpbusd on
     * ymm, activations as p + 128 and the correction at the end; without it vpmaddubsw on
     * |p| and q with p's sign (vpsignb), pairs of int16 summed to int32 by vpmaddwd. */
#if defined(SM_AVX_VNNI)
    const __m256i x80 = _mm256_set1_epi8((char)0x80);
#define Q8_ROW(x4) _mm256_xor_si256(_mm256_set1_epi32(x4), x80) /* p + 128 */
#define Q8_DOT(acc, xb, wv) _mm256_dpbusd_avx_epi32(acc, xb, wv)
#else
    const __m256i ones = _mm256_set1_epi16(1);
#define Q8_ROW(x4) _mm256_set1_epi32(x4)
#define Q8_DOT(acc, xb, wv) _mm256_add_epi32(acc, _mm256_madd_epi16(                     \
        _mm256_maddubs_epi16(_mm256_abs_epi8(xb), _mm256_sign_epi8(wv, xb)), ones))
#endif
    __m256 facc[MAXRB][MAXNT][2];
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NT; i++) facc[r][i][0] = facc[r][i][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m256i iacc[MAXRB][MAXNT][2];
        for (int r = 0; r < RB; r++)
            for (int i = 0; i < NT; i++) iacc[r][i][0] = iacc[r][i][1] = _mm256_setzero_si256();
        for (int g = 0; g < QBLOCK / 4; g++) {
            const size_t kk = (size_t)b * (QBLOCK / 4) + g;
            for (int r = 0; r < RB; r++) {
                int32_t x4;
                memcpy(&x4, xq + (size_t)r * ldq + kk * 4, 4);
                const __m256i xb = Q8_ROW(x4);
                for (int i = 0; i < NT; i++)
                    for (int hh = 0; hh < 2; hh++) {
                        const __m256i wv = _mm256_loadu_si256(
                            (const __m256i *)(wt + (kk * ls + i) * 64 + 32 * hh));
                        iacc[r][i][hh] = Q8_DOT(iacc[r][i][hh], xb, wv);
                    }
            }
        }
        for (int i = 0; i < NT; i++)
            for (int hh = 0; hh < 2; hh++) {
                const __m256 sc = _mm256_cvtph_ps(
                    _mm_loadu_si128((const __m128i *)(st + ((size_t)b * ss + i) * TILE + 8 * hh)));
                for (int r = 0; r < RB; r++)
                    facc[r][i][hh] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[r][i][hh]), sc,
                                                     facc[r][i][hh]);
            }
    }
#undef Q8_ROW
#undef Q8_DOT
    for (int i = 0; i < NT; i++) {
#if defined(SM_AVX_VNNI)
        const float *corr = w->corr + (size_t)(t0 + i) * TILE;
        const __m256 c0 = _mm256_mul_ps(_mm256_loadu_ps(corr), _mm256_set1_ps(128.0f));
        const __m256 c1 = _mm256_mul_ps(_mm256_loadu_ps(corr + 8), _mm256_set1_ps(128.0f));
#else
        const __m256 c0 = _mm256_setzero_ps(), c1 = c0; /* no +128: nothing to correct */
#endif
        for (int r = 0; r < RB; r++) {
            float v[TILE];
            _mm256_storeu_ps(v, _mm256_mul_ps(_mm256_sub_ps(facc[r][i][0], c0), _mm256_set1_ps(xs[r])));
            _mm256_storeu_ps(v + 8, _mm256_mul_ps(_mm256_sub_ps(facc[r][i][1], c1), _mm256_set1_ps(xs[r])));
            finish(v, y + (size_t)r * ldy, w->bias, (t0 + i) * TILE, w->N, accumulate);
        }
    }
#else
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NT; i++) {
            float v[TILE] = {0};
            const int8_t *xr = xq + (size_t)r * ldq;
            for (int b = 0; b < nb; b++)
                for (int l = 0; l < TILE; l++) {
                    int32_t acc = 0;
                    for (int k = b * QBLOCK; k < (b + 1) * QBLOCK; k++)
                        acc += (int32_t)xr[k] * wt[((size_t)(k / 4) * ls + i) * 64 + l * 4 + k % 4];
                    v[l] += (float)acc * sm_f16_to_f32(st[((size_t)b * ss + i) * TILE + l]);
                }
            for (int l = 0; l < TILE; l++) v[l] *= xs[r];
            finish(v, y + (size_t)r * ldy, w->bias, (t0 + i) * TILE, w->N, accumulate);
        }
#endif
}
/* --8<-- [end:q8_block] */

/* One block of work, its shape chosen from a few compiled ones. */
#define BLOCK(NT, RB) (w->kind ? q8_block(w, t0, NT, RB, xq, K32, xs, y, N, acc) \
                               : f32_block(w, t0, NT, RB, x, K, y, N, acc))
static void run_block(const sm_mat *w, int t0, int nt, int rb, const float *x,
                      const int8_t *xq, const float *xs, float *y, int acc)
{
    const int K = w->K, N = w->N, K32 = PAD(K, QBLOCK);
    if (rb == MAXRB && nt == 2) BLOCK(2, MAXRB);
    else if (rb == MAXRB) for (int i = 0; i < nt; i++, t0++) BLOCK(1, MAXRB);
    else if (nt == DNT) for (int r = 0; r < rb; r++) {
        const float *xr = x + (size_t)r * K; const int8_t *qr = xq + (size_t)r * K32;
        float *yr = y + (size_t)r * N;
        (w->kind ? q8_block(w, t0, DNT, 1, qr, K32, xs + r, yr, N, acc)
                 : f32_block(w, t0, DNT, 1, xr, K, yr, N, acc));
    }
    else for (int r = 0; r < rb; r++) for (int i = 0; i < nt; i++) {
        const float *xr = x + (size_t)r * K; const int8_t *qr = xq + (size_t)r * K32;
        float *yr = y + (size_t)r * N;
        (w->kind ? q8_block(w, t0 + i, 1, 1, qr, K32, xs + r, yr, N, acc)
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
                  xq ? xq + (size_t)r0 * K32 : NULL, xs ? xs + r0 : NULL,
                  y + (size_t)r0 * w->N, accumulate);
    }
}
/* --8<-- [end:matmul] */

/* Seconds per one-row product on one thread, the best of `reps` (for the threshold below). */
double sm_time_matmul(const sm_mat *w, const float *x, const int8_t *xq, const float *xs,
                      float *y, int reps)
{
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        sm_matmul(w, x, xq, xs, y, 1, 0, 1);
        clock_gettime(CLOCK_MONOTONIC, &b);
        const double t = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
        best = t < best ? t : best;
    }
    return best;
}

/* ------------------------------------------------------------------ the layers */
static void norm_rows(const float *x, const float *w, const float *b, float *out, int rows,
                      int C, int rms)
{
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * C;
        norm_row(xr, rms ? 0.0f : row_sum(xr, C) / C, w, b, out + (size_t)r * C, C, SM_LN_EPS);
    }
}

/* GPT-2's tanh GELU, in place, or SwiGLU's g = silu(a) b from u = [a | b], each row 2h
 * wide: rows.h's chunks, the training step's arithmetic. */
static void activation(float *u, float *g, int rows, int h, int swiglu)
{
    for (int r = 0; r < rows; r++) {
        const float *a = u + (size_t)r * (swiglu ? 2 * h : h), *bb = a + h;
        float *o = g + (size_t)r * h;
        for (int i0 = 0; i0 < h; i0 += CHUNK) {
            const int n = h - i0 < CHUNK ? h - i0 : CHUNK;
            if (swiglu)
                swiglu_chunk(a + i0, bb + i0, o + i0, n);
            else
                gelu_chunk(a + i0, o + i0, n);
        }
    }
}

/* RoPE on a row's q and k (the first 2d floats of its qkv row) at position p: each head
 * turned by rows.h's rope_head, as the training step's kernels_c/layers/modern.c does. */
static void rope_row(const sm_model *m, float *qk, int p)
{
    const int hd = m->d / m->n_head, half = hd / 2;
    const float *c = m->rope_cos + (size_t)p * half, *s = m->rope_sin + (size_t)p * half;
    for (int h = 0; h < 2 * m->n_head; h++) rope_head(qk + (size_t)h * hd, c, s, half, 1.0f);
}

/* --8<-- [start:attend] */
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

static void attend(const sm_model *m, int l, const float *qkv, float *att, float *scores,
                   int rows, int pos, int nthreads)
{
#if defined(SM_AVX512)
    if (rows > 1) {  /* the prefill: heads x blocks of four rows */
        const int d = m->d, H = m->n_head, hd = d / H, ctx = m->context, ctx16 = PAD(ctx, KT);
        const int blocks = (rows + 3) / 4, items = H * blocks;
        const float scale = 1.0f / sqrtf((float)hd);
        #pragma omp parallel for schedule(static) num_threads(nthreads < items ? nthreads : items)
        for (int it = 0; it < items; it++) {
            const int h = it % H, r0 = it / H * 4, nr = rows - r0 < 4 ? rows - r0 : 4;
            const float *q[4];
            float *sc[4], *o[4];
            for (int r = 0; r < 4; r++) {
                const int rr = r0 + (r < nr ? r : 0);
                q[r] = qkv + (size_t)rr * 3 * d + (size_t)h * hd;
                sc[r] = scores + ((size_t)rr * H + h) * ctx16;
                o[r] = att + (size_t)rr * d + (size_t)h * hd;
            }
            attend_rows4(q, nr, pos + r0, m->k_cache + (size_t)(l * H + h) * hd * ctx16,
                         m->v_cache + (size_t)(l * H + h) * ctx * hd, hd, scale, sc, o);
        }
        return;
    }
#endif
{
    const int d = m->d, H = m->n_head, hd = d / H, ctx = m->context, items = rows * H;
    const float scale = 1.0f / sqrtf((float)hd);
    #pragma omp parallel for schedule(static) num_threads(nthreads < items ? nthreads : items)
    for (int it = 0; it < items; it++) {
        const int r = it / H, h = it % H, p = pos + r;
        const float *q = qkv + (size_t)r * 3 * d + (size_t)h * hd;
        const int ctx16 = PAD(ctx, KT);
        const float *Kc = m->k_cache + (size_t)(l * H + h) * hd * ctx16;  /* [ctx/16][hd][16] */
        const float *Vc = m->v_cache + (size_t)(l * H + h) * ctx * hd;    /* [ctx][hd] */
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
        float *o = att + (size_t)r * d + (size_t)h * hd;
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
/* --8<-- [end:attend] */

/* ------------------------------------------------------------------ the model */
typedef struct {
    float *x, *h, *qkv, *att, *u, *g, *xs, *scores;
    int8_t *xq;
} work_t;

static long long carve(const sm_model *m, work_t *w)
{
    const int d = m->d, hid = m->hidden, in = m->modern ? 2 * hid : hid;
    const long long kq = PAD(d > hid ? d : hid, QBLOCK);
    const long long sizes[9] = {(long long)ROWS * d, (long long)ROWS * d, 3LL * ROWS * d,
                                (long long)ROWS * d, (long long)ROWS * in, (long long)ROWS * hid,
                                ROWS, (long long)ROWS * m->n_head * PAD(m->context, 16),
                                ROWS * kq / 4};
    float **dst[9] = {&w->x, &w->h, &w->qkv, &w->att, &w->u, &w->g, &w->xs, &w->scores, NULL};
    long long off = 0;
    for (int i = 0; i < 9; i++) {
        if (m->work) {
            if (dst[i]) *dst[i] = m->work + off;
            else w->xq = (int8_t *)(m->work + off);
        }
        off += PAD(sizes[i], 16); /* each buffer on a 64-byte line */
    }
    return off;
}

long long sm_work_floats(const sm_model *m)
{
    work_t w;
    sm_model probe = *m;
    probe.work = NULL;
    return carve(&probe, &w);
}

/* The team for a piece of work that reads `bytes`: every thread, unless the bytes are
 * fewer than m->par_min_bytes, below which one core streams them faster than the threads
 * meet (the caller derives the threshold from the measured fork-join and bandwidth). */
static int team(const sm_model *m, long long bytes, int nthreads)
{
    return bytes >= m->par_min_bytes ? nthreads : 1;
}

/* One product, the input rows quantised first when the weights are int8. */
static void product(const sm_model *m, const sm_mat *W, const float *x, work_t *w, float *y,
                    int rows, int acc, int nthreads)
{
    const long long bytes = (long long)PAD(W->K, QBLOCK) * PAD(W->N, TILE) * (W->kind ? 1 : 4);
    if (W->kind) sm_quantize_rows(x, rows, W->K, w->xq, w->xs);
    sm_matmul(W, x, W->kind ? w->xq : NULL, W->kind ? w->xs : NULL, y, rows, acc,
              team(m, bytes * rows, nthreads));
}

/* --8<-- [start:forward] */
/* Tokens tokens[0..n) at positions pos..pos+n-1: their keys and values go into the cache,
 * and the logits of the last one (or of all n, all_logits) into logits. Returns 0, or a
 * negative code for bad arguments (checked before anything is written). */
int sm_forward(const sm_model *m, const int *tokens, int n, int pos, float *logits,
               int all_logits, int nthreads)
{
    if (n < 1) return -1;
    if (pos < 0 || pos + n > m->context) return -2;
    if (!m->work || m->work_floats < sm_work_floats(m)) return -3;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->vocab) return -4;
    const int d = m->d, H = m->n_head, hd = d / H, ctx = m->context, hid = m->hidden;
    work_t w;
    carve(m, &w);
    for (int r0 = 0; r0 < n; r0 += ROWS) {
        const int rows = n - r0 < ROWS ? n - r0 : ROWS, p0 = pos + r0;
        for (int r = 0; r < rows; r++) {          /* embedding */
            const float *e = m->wte + (size_t)tokens[r0 + r] * d;
            const float *pe = m->wpe ? m->wpe + (size_t)(p0 + r) * d : NULL;
            for (int c = 0; c < d; c++) w.x[(size_t)r * d + c] = e[c] + (pe ? pe[c] : 0.0f);
        }
        for (int l = 0; l < m->n_layer; l++) {
            const sm_layer *L = m->layers + l;
            norm_rows(w.x, L->ln1_w, L->ln1_b, w.h, rows, d, m->modern);
            product(m, &L->qkv, w.h, &w, w.qkv, rows, 0, nthreads);
            for (int r = 0; r < rows; r++) {      /* RoPE, then k and v into the cache */
                float *row = w.qkv + (size_t)r * 3 * d;
                if (m->modern) rope_row(m, row, p0 + r);
                for (int h = 0; h < H; h++) {
                    const size_t at = ((size_t)(l * H + h) * ctx + p0 + r) * hd;
                    const int t = p0 + r;  /* key tiles: [ctx/16][hd][16] per head */
                    float *kt = m->k_cache + (size_t)(l * H + h) * hd * PAD(ctx, KT)
                                + (size_t)(t / KT) * hd * KT + t % KT;
                    for (int i = 0; i < hd; i++) kt[(size_t)i * KT] = row[d + h * hd + i];
                    memcpy(m->v_cache + at, row + 2 * d + (size_t)h * hd, hd * sizeof(float));
                }
            }
            attend(m, l, w.qkv, w.att, w.scores, rows, p0,   /* reads 2 (p0+rows) d floats */
                   team(m, 8LL * (p0 + rows) * d * rows, nthreads));
            product(m, &L->proj, w.att, &w, w.x, rows, 1, nthreads);   /* x += att Wo */
            norm_rows(w.x, L->ln2_w, L->ln2_b, w.h, rows, d, m->modern);
            product(m, &L->fc, w.h, &w, w.u, rows, 0, nthreads);
            activation(w.u, w.g, rows, hid, m->modern);
            product(m, &L->fc2, w.g, &w, w.x, rows, 1, nthreads);      /* x += g W2 */
        }
        const int first = all_logits ? 0 : rows - 1;                /* the head */
        if (!all_logits && r0 + rows < n) continue;
        norm_rows(w.x + (size_t)first * d, m->lnf_w, m->lnf_b, w.h, rows - first, d, m->modern);
        product(m, &m->head, w.h, &w, logits + (all_logits ? (size_t)r0 * m->vocab : 0),
                rows - first, 0, nthreads);
    }
    return 0;
}
/* --8<-- [end:forward] */
