/* The prompt in integers: a GEMM whose products are int8 by int8, for ggml's block types whose
 * weights are small integers times scales: Q8_0, Q4_0, Q5_0 (one scale a block of 32), Q4_K (a
 * scale and a min a sub-block of 32) and Q6_K (a scale a sub-block of 16).
 * Included by forward.c (one translation unit), after blocks.c; compiles alone too.
 *
 * y (rows x N) = x (rows x K) W^T, W's N rows in the file's blocks. The activations are
 * rounded as ggml rounds them for a Q8_0 product (one f16 scale and 32 int8 a block); each
 * block of each (row, column) pair is then an exact integer sum of 32 products, scaled by
 * d_w d_x and summed in float, as ggml's own dot does (the order of the float sums differs).
 *
 * The weights are unpacked 32 columns at a time into a panel, one thread's own: per block,
 * 8 steps of 4 consecutive k for each of the 32 columns (the int32 lane of a vector is one
 * column's 4 bytes), then the block's scales as floats, 32 of each kind. The panel is made
 * once per product and read by every row of the prompt, so its cost is shared by the rows (a
 * GEMM's packing). With vpdpbusd (one operand unsigned) the panel holds w + 128 and each row
 * block's integer sum starts from -128 sum(x): the sum of (w + 128) x from there is sum(w x)
 * exactly. Without it, the panel holds w signed and the AVX2 path moves w's sign onto x (|w|
 * by x sign(w), as ggml does, so vpmaddubsw's 16-bit pairs cannot saturate: 2 * 127 * 127 <
 * 32768).
 *
 * Three forms of a block, one kernel each (the form a compile-time argument):
 * - QG_PLAIN (Q8_0, Q4_0, Q5_0): w = d q; the block adds d dx sum(q x).
 * - QG_MIN (Q4_K): w = d s q - dmin m with q in 0..15; the panel holds q - 8 (so that it is a
 *   signed byte like the others) and a bias b = 8 d s - dmin m, and the block adds
 *   d s dx sum((q - 8) x) + b dx sum(x): one more multiply-add a vector.
 * - QG_SPLIT (Q6_K): w = d s_h (q - 32), the scale s_h changing every 16 of k; the block's sum
 *   is two sums, of its first 16 and its last 16 products, each with its own scale. */
#ifndef SM_FORWARD_QGEMM_C
#define SM_FORWARD_QGEMM_C
#include "quants.c" /* the blocks' layouts and unpacking, Q8_0's rounding */


enum { QG_NR = 32, QG_KC = 16 /* blocks of k per pass over the rows: 22 KiB of panel */ };
enum { QG_PLAIN = 0, QG_MIN = 1, QG_SPLIT = 2 };
/* a block's bytes in the panel: the 32 columns' 32 integers, then three rows of 32 floats: the
 * scale (of the first 16 of k, for QG_SPLIT), the second 16's scale (QG_SPLIT), the bias (QG_MIN) */
enum { QG_INTS = QG_NR * 32, QG_BLK = QG_NR * 32 + 3 * QG_NR * 4 };

#if defined(SM_AVX512) && defined(SM_AVX512_VNNI)
#define QG_UNSIGNED 1
#define QG_MR 4
#elif defined(SM_AVX2) && defined(SM_AVX_VNNI)
#define QG_UNSIGNED 1
#define QG_MR 2
#elif defined(SM_AVX2)
#define QG_UNSIGNED 0
#define QG_MR 2
#else
#define QG_UNSIGNED 0
#define QG_MR 4
#endif

static int qg_supported(int type)
{
    return type == T_Q8_0 || type == T_Q4_0 || type == T_Q5_0 || type == T_Q4_K || type == T_Q6_K;
}

/* the types the prompt's integer GEMM takes, for Python (which keeps no copy of them) */
int sm_q_supported(int type)
{
    return qg_supported(type);
}

/* K must be whole blocks: 32, or a K type's 256 */
static int qg_k_multiple(int type)
{
    return type == T_Q4_K || type == T_Q6_K ? 256 : 32;
}

static int qg_form(int type)
{
    return type == T_Q4_K ? QG_MIN : type == T_Q6_K ? QG_SPLIT : QG_PLAIN;
}

/* the integer GEMM runs the instruction chapter 4's int8 tiles run (the same #if chain) */
const char *sm_q_instruction(void) { return sm_int8_instruction(); }

/* bytes of one thread's panel for rows of K */
static long long qg_panel_bytes(int K)
{
    const long long nb = (K + 31) / 32;
    return nb * QG_BLK;
}

/* the 32 integers of block i of a weight row */
static void qg_block_ints(int type, const uint8_t *row, int i, int8_t out[32], float *d)
{
    switch (type) {
    case T_Q8_0: {
        const blk_q8_0 *b = (const blk_q8_0 *)row + i;
        memcpy(out, b->qs, 32);
        *d = h2f(b->d);
        return;
    }
    case T_Q4_0: {
        const blk_q4_0 *b = (const blk_q4_0 *)row + i;
        for (int j = 0; j < 16; j++) {
            out[j] = (int8_t)((b->qs[j] & 0xF) - 8);
            out[j + 16] = (int8_t)((b->qs[j] >> 4) - 8);
        }
        *d = h2f(b->d);
        return;
    }
    default: { /* T_Q5_0 */
        const blk_q5_0 *b = (const blk_q5_0 *)row + i;
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        for (int j = 0; j < 16; j++) {
            out[j] = (int8_t)(((b->qs[j] & 0xF) | ((qh >> j) & 1) << 4) - 16);
            out[j + 16] = (int8_t)(((b->qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16);
        }
        *d = h2f(b->d);
        return;
    }
    }
}

/* Q4_K's and Q6_K's 256 integers of super-block i of a weight row (q - 8 and q - 32), with
 * each 32-block's scales and bias as QG_MIN and QG_SPLIT read them */
static void qg_super_ints(int type, const uint8_t *row, int i, int8_t out[256], float lo[8],
                          float hi[8], float bias[8])
{
    if (type == T_Q4_K) {
        const blk_q4_K *b = (const blk_q4_K *)row + i;
        const float d = h2f(b->d), dmin = h2f(b->dmin);
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            scale_min_k4(j, b->scales, &sc, &mn);
            const uint8_t *qs = b->qs + 32 * (j / 2);
            for (int l = 0; l < 32; l++)
                out[32 * j + l] = (int8_t)(((j & 1) ? qs[l] >> 4 : qs[l] & 0xF) - 8);
            lo[j] = hi[j] = d * (float)sc;
            bias[j] = 8.0f * lo[j] - dmin * (float)mn;
        }
    } else { /* T_Q6_K */
        const blk_q6_K *b = (const blk_q6_K *)row + i;
        uint8_t u[256];
        q6_values(b, u);
        const float d = h2f(b->d);
        for (int l = 0; l < 256; l++) out[l] = (int8_t)(u[l] - 32);
        for (int j = 0; j < 8; j++) {
            lo[j] = d * (float)b->scales[2 * j];
            hi[j] = d * (float)b->scales[2 * j + 1];
            bias[j] = 0.0f;
        }
    }
}

/* one column's block into the panel: its 32 integers as 8 words (flipped to w + 128 where the
 * kernel wants it), its scales and bias */
static void qg_put(uint8_t *pb, int c, const int8_t *src, float lo, float hi, float bias,
                   int unsigned_w)
{
    const uint32_t flip = unsigned_w ? 0x80808080u : 0u;
    for (int s = 0; s < 8; s++) {
        uint32_t word;
        memcpy(&word, src + 4 * s, 4);
        word ^= flip;
        memcpy(pb + (s * QG_NR + c) * 4, &word, 4);
    }
    float *f = (float *)(pb + QG_INTS);
    f[c] = lo;
    f[QG_NR + c] = hi;
    f[2 * QG_NR + c] = bias;
}

/* columns n0 .. n0 + 31 of W (rows past N as zeros) into the panel layout above, w + 128
 * where unsigned_w (vpdpbusd's operand), else w */
static void qg_pack(const sm_mat *W, int n0, uint8_t *panel, int unsigned_w)
{
    const int nb = W->K / 32;
    const int8_t zeros[32] = {0};
    int8_t v[256];
    float d, lo[8], hi[8], bias[8];
    for (int c = 0; c < QG_NR; c++) {
        const int n = n0 + c;
        const uint8_t *row = n < W->N ? W->w + (size_t)n * (size_t)W->row_bytes : NULL;
        if (!row) {
            for (int i = 0; i < nb; i++) qg_put(panel + (size_t)i * QG_BLK, c, zeros, 0, 0, 0, unsigned_w);
        } else if (W->type == T_Q4_K || W->type == T_Q6_K) {
            for (int i = 0; i < nb / 8; i++) {
                qg_super_ints(W->type, row, i, v, lo, hi, bias);
                for (int j = 0; j < 8; j++)
                    qg_put(panel + (size_t)(8 * i + j) * QG_BLK, c, v + 32 * j, lo[j], hi[j], bias[j],
                           unsigned_w);
            }
        } else {
            for (int i = 0; i < nb; i++) {
                const int8_t *src = v;
                if (W->type == T_Q8_0) {
                    const blk_q8_0 *b = (const blk_q8_0 *)row + i;
                    src = b->qs;
                    d = h2f(b->d);
                } else {
                    qg_block_ints(W->type, row, i, v, &d);
                }
                qg_put(panel + (size_t)i * QG_BLK, c, src, d, d, 0.0f, unsigned_w);
            }
        }
    }
}

/* The activations: each row's Q8_0 blocks (ggml's rounding), and per (row, block) the
 * block's scale as a float, -128 times the sum of its integers and of its first 16 (the
 * flipped panel's correction, whole and for QG_SPLIT's first half), and the block's sum of
 * integers times its scale (QG_MIN's bias multiplies it). */
typedef struct {
    const blk_q8_0 *q;    /* rows x nb */
    const float *d;       /* rows x nb */
    const int32_t *neg;   /* rows x nb */
    const int32_t *neglo; /* rows x nb */
    const float *xs;      /* rows x nb */
    int nb;
} qg_act;

static void qg_quantize(const float *x, int rows, int K, blk_q8_0 *q, float *d, int32_t *neg,
                        int32_t *neglo, float *xs)
{
    const int nb = K / 32;
    for (int r = 0; r < rows; r++) {
        blk_q8_0 *qr = q + (size_t)r * nb;
        quantize_q8_0(x + (size_t)r * K, K, qr);
        for (int i = 0; i < nb; i++) {
            int s = 0, slo;
            for (int j = 0; j < 16; j++) s += qr[i].qs[j];
            slo = s;
            for (int j = 16; j < 32; j++) s += qr[i].qs[j];
            const size_t at = (size_t)r * nb + i;
            d[at] = h2f(qr[i].d);
            neg[at] = -128 * s;
            neglo[at] = -128 * slo;
            xs[at] = (float)s * d[at];
        }
    }
}

/* ------------------------------------------------------------------ the micro-kernels */
/* rows r0 .. r0 + R_ - 1 by the panel's 32 columns, blocks b0 .. b1 - 1, blocks of form FORM,
 * into y (+= where add): ncols of the 32 are stored */
#if defined(SM_AVX512) && defined(SM_AVX512_VNNI)
/* --8<-- [start:qgemm] */
INLINE void qg_tile(const int R_, const int FORM, const qg_act *a, int r0, const uint8_t *panel,
                    int b0, int b1, float *y, int ldy, int ncols, int add)
{
    __m512 f[QG_MR][2];
    for (int i = 0; i < R_; i++) f[i][0] = f[i][1] = _mm512_setzero_ps();
    const size_t nb = (size_t)a->nb;
    for (int b = b0; b < b1; b++) {
        const uint8_t *pb = panel + (size_t)b * QG_BLK;
        __m512i s[QG_MR][2], h[QG_MR][2]; /* h: QG_SPLIT's second 16 of k */
        const int8_t *xq[QG_MR];
        for (int i = 0; i < R_; i++) {
            const size_t at = (r0 + i) * nb + b;
            if (FORM == QG_SPLIT) {
                s[i][0] = s[i][1] = _mm512_set1_epi32(a->neglo[at]);
                h[i][0] = h[i][1] = _mm512_set1_epi32(a->neg[at] - a->neglo[at]);
            } else {
                s[i][0] = s[i][1] = _mm512_set1_epi32(a->neg[at]);
            }
            xq[i] = a->q[at].qs;
        }
        for (int k = 0; k < 8; k++) {
            const __m512i w0 = _mm512_loadu_si512(pb + k * 128), w1 = _mm512_loadu_si512(pb + k * 128 + 64);
            for (int i = 0; i < R_; i++) {
                int32_t x4;
                memcpy(&x4, xq[i] + 4 * k, 4);
                const __m512i xb = _mm512_set1_epi32(x4);
                if (FORM == QG_SPLIT && k >= 4) {
                    h[i][0] = _mm512_dpbusd_epi32(h[i][0], w0, xb);
                    h[i][1] = _mm512_dpbusd_epi32(h[i][1], w1, xb);
                } else {
                    s[i][0] = _mm512_dpbusd_epi32(s[i][0], w0, xb);
                    s[i][1] = _mm512_dpbusd_epi32(s[i][1], w1, xb);
                }
            }
        }
        const float *sc = (const float *)(pb + QG_INTS);
        const __m512 d0 = _mm512_loadu_ps(sc), d1 = _mm512_loadu_ps(sc + 16);
        for (int i = 0; i < R_; i++) {
            const size_t at = (r0 + i) * nb + b;
            const __m512 dx = _mm512_set1_ps(a->d[at]);
            f[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i][0]), _mm512_mul_ps(d0, dx), f[i][0]);
            f[i][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i][1]), _mm512_mul_ps(d1, dx), f[i][1]);
            if (FORM == QG_SPLIT) {
                const __m512 e0 = _mm512_loadu_ps(sc + QG_NR), e1 = _mm512_loadu_ps(sc + QG_NR + 16);
                f[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(h[i][0]), _mm512_mul_ps(e0, dx), f[i][0]);
                f[i][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(h[i][1]), _mm512_mul_ps(e1, dx), f[i][1]);
            }
            if (FORM == QG_MIN) {
                const __m512 xs = _mm512_set1_ps(a->xs[at]);
                f[i][0] = _mm512_fmadd_ps(_mm512_loadu_ps(sc + 2 * QG_NR), xs, f[i][0]);
                f[i][1] = _mm512_fmadd_ps(_mm512_loadu_ps(sc + 2 * QG_NR + 16), xs, f[i][1]);
            }
        }
    }
    const __mmask16 m0 = ncols >= 16 ? 0xffff : (__mmask16)((1u << ncols) - 1);
    const __mmask16 m1 = ncols >= 32 ? 0xffff : ncols <= 16 ? 0 : (__mmask16)((1u << (ncols - 16)) - 1);
    for (int i = 0; i < R_; i++) {
        float *yr = y + (size_t)i * ldy;
        if (add) {
            f[i][0] = _mm512_add_ps(f[i][0], _mm512_maskz_loadu_ps(m0, yr));
            f[i][1] = _mm512_add_ps(f[i][1], _mm512_maskz_loadu_ps(m1, yr + 16));
        }
        _mm512_mask_storeu_ps(yr, m0, f[i][0]);
        _mm512_mask_storeu_ps(yr + 16, m1, f[i][1]);
    }
}
/* --8<-- [end:qgemm] */
#elif defined(SM_AVX2)
/* 16 columns a call (two ymm): a 16-register file holds R_ x 2 sums, R_ x 2 floats, the two
 * weight vectors and a broadcast (QG_SPLIT's second sums spill a little) */
INLINE __m256i qg_dot(__m256i acc, __m256i w, __m256i x)
{
#if QG_UNSIGNED
    return _mm256_dpbusd_avx_epi32(acc, w, x);
#else
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#endif
}
INLINE void qg_half(const int R_, const int FORM, const qg_act *a, int r0, const uint8_t *panel,
                    int half, int b0, int b1, float *y, int ldy, int ncols, int add)
{
    __m256 f[QG_MR][2];
    for (int i = 0; i < R_; i++) f[i][0] = f[i][1] = _mm256_setzero_ps();
    const size_t nb = (size_t)a->nb;
    for (int b = b0; b < b1; b++) {
        const uint8_t *pb = panel + (size_t)b * QG_BLK + 64 * half;
        __m256i s[QG_MR][2], h[QG_MR][2];
        const int8_t *xq[QG_MR];
        for (int i = 0; i < R_; i++) {
            const size_t at = (r0 + i) * nb + b;
            if (FORM == QG_SPLIT) {
                s[i][0] = s[i][1] = _mm256_set1_epi32(QG_UNSIGNED ? a->neglo[at] : 0);
                h[i][0] = h[i][1] = _mm256_set1_epi32(QG_UNSIGNED ? a->neg[at] - a->neglo[at] : 0);
            } else {
                s[i][0] = s[i][1] = _mm256_set1_epi32(QG_UNSIGNED ? a->neg[at] : 0);
            }
            xq[i] = a->q[at].qs;
        }
        for (int k = 0; k < 8; k++) {
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(pb + k * 128)),
                          w1 = _mm256_loadu_si256((const __m256i *)(pb + k * 128 + 32));
            for (int i = 0; i < R_; i++) {
                int32_t x4;
                memcpy(&x4, xq[i] + 4 * k, 4);
                const __m256i xb = _mm256_set1_epi32(x4);
                if (FORM == QG_SPLIT && k >= 4) {
                    h[i][0] = qg_dot(h[i][0], w0, xb);
                    h[i][1] = qg_dot(h[i][1], w1, xb);
                } else {
                    s[i][0] = qg_dot(s[i][0], w0, xb);
                    s[i][1] = qg_dot(s[i][1], w1, xb);
                }
            }
        }
        const float *sc = (const float *)(pb - 64 * half + QG_INTS) + 16 * half;
        const __m256 d0 = _mm256_loadu_ps(sc), d1 = _mm256_loadu_ps(sc + 8);
        for (int i = 0; i < R_; i++) {
            const size_t at = (r0 + i) * nb + b;
            const __m256 dx = _mm256_set1_ps(a->d[at]);
            f[i][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i][0]), _mm256_mul_ps(d0, dx), f[i][0]);
            f[i][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i][1]), _mm256_mul_ps(d1, dx), f[i][1]);
            if (FORM == QG_SPLIT) {
                const __m256 e0 = _mm256_loadu_ps(sc + QG_NR), e1 = _mm256_loadu_ps(sc + QG_NR + 8);
                f[i][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h[i][0]), _mm256_mul_ps(e0, dx), f[i][0]);
                f[i][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h[i][1]), _mm256_mul_ps(e1, dx), f[i][1]);
            }
            if (FORM == QG_MIN) {
                const __m256 xs = _mm256_set1_ps(a->xs[at]);
                f[i][0] = _mm256_fmadd_ps(_mm256_loadu_ps(sc + 2 * QG_NR), xs, f[i][0]);
                f[i][1] = _mm256_fmadd_ps(_mm256_loadu_ps(sc + 2 * QG_NR + 8), xs, f[i][1]);
            }
        }
    }
    for (int i = 0; i < R_; i++) {
        float out[16], *yr = y + (size_t)i * ldy;
        _mm256_storeu_ps(out, f[i][0]);
        _mm256_storeu_ps(out + 8, f[i][1]);
        for (int c = 0; c < ncols; c++) yr[c] = add ? yr[c] + out[c] : out[c];
    }
}
INLINE void qg_tile(const int R_, const int FORM, const qg_act *a, int r0, const uint8_t *panel,
                    int b0, int b1, float *y, int ldy, int ncols, int add)
{
    qg_half(R_, FORM, a, r0, panel, 0, b0, b1, y, ldy, ncols < 16 ? ncols : 16, add);
    if (ncols > 16) qg_half(R_, FORM, a, r0, panel, 1, b0, b1, y + 16, ldy, ncols - 16, add);
}
#else
static void qg_tile(const int R_, const int FORM, const qg_act *a, int r0, const uint8_t *panel,
                    int b0, int b1, float *y, int ldy, int ncols, int add)
{
    const size_t nb = (size_t)a->nb;
    for (int i = 0; i < R_; i++) {
        float f[QG_NR] = {0};
        for (int b = b0; b < b1; b++) {
            const uint8_t *pb = panel + (size_t)b * QG_BLK;
            const size_t at = (r0 + i) * nb + b;
            const int8_t *xq = a->q[at].qs;
            const float dx = a->d[at], *sc = (const float *)(pb + QG_INTS);
            for (int c = 0; c < QG_NR; c++) {
                int lo = 0, hi = 0;
                for (int k = 0; k < 32; k++) {
                    const int p = (int8_t)pb[((k / 4) * QG_NR + c) * 4 + k % 4] * xq[k];
                    if (k < 16) lo += p; else hi += p;
                }
                if (FORM == QG_SPLIT)
                    f[c] += (float)lo * (sc[c] * dx) + (float)hi * (sc[QG_NR + c] * dx);
                else
                    f[c] += (float)(lo + hi) * (sc[c] * dx);
                if (FORM == QG_MIN) f[c] += sc[2 * QG_NR + c] * a->xs[at];
            }
        }
        float *yr = y + (size_t)i * ldy;
        for (int c = 0; c < ncols; c++) yr[c] = add ? yr[c] + f[c] : f[c];
    }
}
#endif

/* every row through the panel: QG_MR rows a tile, then the rest, each count its own unrolled tile */
INLINE void qg_rows(const int FORM, const qg_act *a, int rows, const uint8_t *panel, int b0,
                    int b1, float *y, int ldy, int ncols, int add)
{
    int r = 0;
    for (; r + QG_MR <= rows; r += QG_MR)
        qg_tile(QG_MR, FORM, a, r, panel, b0, b1, y + (size_t)r * ldy, ldy, ncols, add);
    float *yr = y + (size_t)r * ldy;
    switch (rows - r) {
#if QG_MR > 3
    case 3: qg_tile(3, FORM, a, r, panel, b0, b1, yr, ldy, ncols, add); break;
    case 2: qg_tile(2, FORM, a, r, panel, b0, b1, yr, ldy, ncols, add); break;
#endif
    case 1: qg_tile(1, FORM, a, r, panel, b0, b1, yr, ldy, ncols, add); break;
    default: break;
    }
}

static void qg_tiles(int form, const qg_act *a, int rows, const uint8_t *panel, int b0, int b1,
                     float *y, int ldy, int ncols, int add)
{
    switch (form) {
    case QG_MIN: qg_rows(QG_MIN, a, rows, panel, b0, b1, y, ldy, ncols, add); break;
    case QG_SPLIT: qg_rows(QG_SPLIT, a, rows, panel, b0, b1, y, ldy, ncols, add); break;
    default: qg_rows(QG_PLAIN, a, rows, panel, b0, b1, y, ldy, ncols, add); break;
    }
}

#if defined(SM_AVX512) && defined(SM_AMX_INT8)
#include "../amx.h"
#define QG_AMX 1
/* --8<-- [start:qgemm_amx] */
/* The same product on AMX tiles: tdpbssd adds to a 16 x 16 tile of int32 the dot products of
 * 16 rows of A's signed bytes with 16 columns of B's, 4 bytes at a time. The panel holds w
 * signed, in the layout above, which is B's: a block's 8 steps of 4 k are 8 tile rows 128
 * bytes apart, columns 0-15 in their first 64 bytes and 16-31 in the next. The activations
 * are laid out for A's tiles once per product: for each 32 rows (zeros past the last) and
 * each block, the 32 rows' 32 integers (1 KiB, read in whole lines), and beside them the
 * rows' scales and sums. A block (a half block for QG_SPLIT, whose scale changes at 16) is a
 * tile product of half the instruction's depth (32 bytes of k of its 64) for each 16 rows by
 * 16 columns; its int32 sums are stored and scaled in float as the vector kernel scales them:
 * each block has its own scales, so no two blocks' sums can be added as integers. */
typedef struct {
    const int8_t *q; /* chunks x nb x 32 x 32 */
    const float *d;  /* chunks x nb x 32: the rows' block scales */
    const float *xs; /* chunks x nb x 32: the rows' block sums times their scales */
} qg_tiles_act;

static void qg_amx_configure(int kb)
{
    struct sm_amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = t == 4 || t == 5 ? kb : 64; /* A: 16 rows of kb bytes */
        c.rows[t] = t == 6 || t == 7 ? kb / 4 : 16; /* B: kb / 4 rows of 16 columns x 4 */
    }
    SM_TILE_LOADCONFIG(&c);
}

/* the activations in qg_tiles_act's layout, from qg_quantize's */
static void qg_amx_layout(const qg_act *a, int rows, int8_t *q, float *d, float *xs)
{
    const int nb = a->nb, chunks = (rows + 31) / 32;
    for (int c = 0; c < chunks; c++)
        for (int b = 0; b < nb; b++) {
            const size_t at = ((size_t)c * nb + b) * 32;
            for (int i = 0; i < 32; i++) {
                const int r = 32 * c + i;
                if (r < rows) {
                    memcpy(q + at * 32 + 32 * i, a->q[(size_t)r * nb + b].qs, 32);
                    d[at + i] = a->d[(size_t)r * nb + b];
                    xs[at + i] = a->xs[(size_t)r * nb + b];
                } else {
                    memset(q + at * 32 + 32 * i, 0, 32);
                    d[at + i] = xs[at + i] = 0.0f;
                }
            }
        }
}

/* rows 32 c .. 32 c + 31 (those below `rows` kept) by the panel's 32 columns, every block, a
 * quarter at a time: 16 rows by 16 columns, one tile product a block (two for QG_SPLIT), whose
 * int32 sums are stored and scaled into 16 float vectors that stay in registers across all the
 * blocks. Two sets of tiles and of stored sums take turns, so that the next block's tile
 * product need not wait for this block's scaling. */
#define QG_AMX_STEP(C, A, B, xa, wb, sums) \
    do {                                   \
        SM_TILE_ZERO(C);                   \
        SM_TILE_LOADD(A, xa, 32);          \
        SM_TILE_LOADD(B, wb, 128);         \
        SM_TILE_DPBSSD(C, A, B);           \
        SM_TILE_STORED(C, sums, 64);       \
    } while (0)
static void qg_amx_rows(int form, const qg_tiles_act *a, int nb, int c, int rows,
                        const uint8_t *panel, float *y, int ldy, int ncols, int add)
{
    const int kb = form == QG_SPLIT ? 16 : 32, valid = rows - 32 * c < 32 ? rows - 32 * c : 32;
    int32_t s[2][16 * 16] __attribute__((aligned(64)));
    for (int q = 0; q < 4; q++) {
        const int rh = q >> 1, ch = q & 1; /* rows 16 rh on, columns 16 ch on */
        const int vr = valid - 16 * rh, vc = ncols - 16 * ch;
        if (vr <= 0 || vc <= 0) continue;
        __m512 acc[16];
        for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
        int u = 0;
        for (int b = 0; b < nb; b++) {
            const size_t at = ((size_t)c * nb + b) * 32 + 16 * (size_t)rh;
            const int8_t *xq = a->q + at * 32;
            const uint8_t *pb = panel + (size_t)b * QG_BLK;
            const float *sc = (const float *)(pb + QG_INTS) + 16 * ch, *dx = a->d + at;
            for (int h = 0; h < 32 / kb; h++, u ^= 1) {
                const uint8_t *wb = pb + (size_t)h * (kb / 4) * 128 + 64 * ch;
                if (u)
                    QG_AMX_STEP(1, 5, 7, xq + kb * h, wb, s[1]);
                else
                    QG_AMX_STEP(0, 4, 6, xq + kb * h, wb, s[0]);
                const __m512 w = _mm512_loadu_ps(sc + h * QG_NR);
                float dl[16] __attribute__((aligned(64))); /* the rows' scales, one base address */
                memcpy(dl, dx, sizeof dl);
                const int32_t *su = s[u];
                for (int i = 0; i < 16; i++)
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(su + 16 * i)),
                                             _mm512_mul_ps(w, _mm512_set1_ps(dl[i])), acc[i]);
            }
            if (form == QG_MIN) { /* the block's bias, once */
                const __m512 bias = _mm512_loadu_ps(sc + 2 * QG_NR);
                for (int i = 0; i < 16; i++)
                    acc[i] = _mm512_fmadd_ps(bias, _mm512_set1_ps(a->xs[at + i]), acc[i]);
            }
        }
        const __mmask16 m = vc >= 16 ? 0xffff : (__mmask16)((1u << vc) - 1);
        for (int i = 0; i < 16; i++) { /* a constant count, so that acc stays in registers */
            if (i >= vr) break;
            float *yr = y + (size_t)(32 * c + 16 * rh + i) * ldy + 16 * ch;
            const __m512 f = add ? _mm512_add_ps(acc[i], _mm512_maskz_loadu_ps(m, yr)) : acc[i];
            _mm512_mask_storeu_ps(yr, m, f);
        }
    }
}
#undef QG_AMX_STEP
/* --8<-- [end:qgemm_amx] */
#endif

/* the bytes of scratch qg_product wants for its activations: the Q8_0 blocks and their
 * sums (qg_act), then, for the tiles, one int8 row per row, up to a multiple of 32 rows */
static long long qg_act_bytes(int rows, int K)
{
    long long n = (long long)rows * (K / 32) * (34 + 4 * 4) + 128;
#ifdef QG_AMX
    n += (long long)(rows + 31) / 32 * 32 * (K + 2 * 4 * (K / 32)) + 192;
#endif
    return n;
}

/* Whether qg_product can take the tiles here: this build has AMX_INT8, Linux granted them. */
static int qg_amx_ok(void)
{
#ifdef QG_AMX
    return sm_amx_permitted();
#else
    return 0;
#endif
}

/* y (rows x N) = x W^T (+ y where acc), with act qg_act_bytes(rows, K) bytes of scratch
 * and panels nthreads * qg_panel_bytes(K) bytes: each thread takes a share of the 32-column
 * groups, packs each once, and runs every row through it: with the vector kernel in passes
 * of QG_KC blocks (the panel's slice stays in L1 while the rows stream past), or on AMX
 * tiles (amx, where qg_amx_ok) 32 rows at a time over every block. */
static void qg_product(const sm_mat *W, const float *x, int rows, float *y, int acc, void *act,
                       uint8_t *panels, int nthreads, int amx)
{
    const int K = W->K, N = W->N, nb = K / 32, form = qg_form(W->type);
    blk_q8_0 *q = act;
    float *d = (float *)((uint8_t *)act + ((size_t)rows * nb * sizeof(blk_q8_0) + 63) / 64 * 64);
    int32_t *neg = (int32_t *)(d + (size_t)rows * nb), *neglo = neg + (size_t)rows * nb;
    float *xs = (float *)(neglo + (size_t)rows * nb);
    qg_quantize(x, rows, K, q, d, neg, neglo, xs);
    const qg_act a = {q, d, neg, neglo, xs, nb};
    const int groups = (N + QG_NR - 1) / QG_NR, nt = nthreads < groups ? nthreads : groups;
#ifdef QG_AMX
    const int padded = (rows + 31) / 32 * 32;
    int8_t *tq = (int8_t *)(((uintptr_t)(xs + (size_t)rows * nb) + 63) / 64 * 64);
    float *td = (float *)(tq + (size_t)padded * K), *txs = td + (size_t)padded * nb;
    const qg_tiles_act ta = {tq, td, txs};
    amx = amx && qg_amx_ok();
    if (amx) qg_amx_layout(&a, rows, tq, td, txs);
#else
    amx = 0;
#endif
    #pragma omp parallel for schedule(static) num_threads(nt)
    for (int t = 0; t < nt; t++) {
        uint8_t *panel = panels + (size_t)t * (size_t)qg_panel_bytes(K);
        const int g0 = (int)((long long)groups * t / nt), g1 = (int)((long long)groups * (t + 1) / nt);
#ifdef QG_AMX
        if (amx) {
            qg_amx_configure(form == QG_SPLIT ? 16 : 32);
            for (int g = g0; g < g1; g++) {
                const int n0 = g * QG_NR, ncols = N - n0 < QG_NR ? N - n0 : QG_NR;
                qg_pack(W, n0, panel, 0);
                for (int c = 0; c < padded / 32; c++)
                    qg_amx_rows(form, &ta, nb, c, rows, panel, y + n0, N, ncols, acc);
            }
            SM_TILE_RELEASE();
            continue;
        }
#endif
        for (int g = g0; g < g1; g++) {
            const int n0 = g * QG_NR, ncols = N - n0 < QG_NR ? N - n0 : QG_NR;
            qg_pack(W, n0, panel, QG_UNSIGNED);
            for (int b0 = 0; b0 < nb; b0 += QG_KC) {
                const int b1 = nb - b0 < QG_KC ? nb : b0 + QG_KC;
                qg_tiles(form, &a, rows, panel, b0, b1, y + n0, N, ncols, acc || b0 > 0);
            }
        }
    }
}

/* Whether the integer GEMM can run on AMX tiles here, for Python. */
int sm_q_amx(void)
{
    return qg_amx_ok();
}

/* One product through the int8 GEMM, for tests and timing: on AMX tiles where amx (-3 where
 * qg_amx_ok says no), else the build's vector kernel. 0, or -1 for a type it does not take
 * or a K that is not whole blocks, -2 where memory ran out. */
int sm_q_matmul_path(const sm_mat *w, const float *x, int rows, float *y, int nthreads, int amx)
{
    if (w->kind != KIND_BLOCKS || !qg_supported(w->type) || w->K % qg_k_multiple(w->type) || rows < 1)
        return -1;
    if (amx && !qg_amx_ok())
        return -3;
    const int nt = nthreads < 1 ? 1 : nthreads;
    void *act = malloc((size_t)qg_act_bytes(rows, w->K));
    uint8_t *panels = malloc((size_t)nt * (size_t)qg_panel_bytes(w->K));
    if (!act || !panels) {
        free(act);
        free(panels);
        return -2;
    }
    qg_product(w, x, rows, y, 0, act, panels, nt, amx);
    free(act);
    free(panels);
    return 0;
}

#endif /* SM_FORWARD_QGEMM_C */
