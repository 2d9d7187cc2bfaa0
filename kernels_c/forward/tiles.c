/* Chapter 4's weights: repacked once into tiles of 16 output columns, f32 (kind 0) or int8
 * with an f16 scale per block of 32 (kind 1); the layout and the instructions are described
 * in forward.c's opening comment. Included by forward.c (one translation unit). */
#define TILE 16
#define QBLOCK 32
#define TILE_ROWS 32 /* the prefill's rows per pass: a tile's weights are reused by all of them */
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
