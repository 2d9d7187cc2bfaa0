/* The arithmetic of one row (or one chunk of a row) of the layers that both the training
 * step (layers.c and layers/) and the decoder (decode.c) run: LayerNorm and RMSNorm, GPT-2's
 * GELU, SwiGLU's gate and the rotary embedding. Each is written here once; the kernels
 * around them differ only in how they walk the rows and split them among threads, and in
 * what they keep for a backward. Static inline, so each includer compiles them into its own
 * loops (the same instructions, so the same bits, in either kernel). Needs common.h and
 * vexp.h before it.
 */
#ifndef SM_ROWS_H
#define SM_ROWS_H

/* Work on long rows goes in chunks of 256 floats (1 KiB, in L1) so that the exp pass is
 * one vectorised call over a buffer rather than a libm call per float. */
#define CHUNK 256

static inline float row_sum(const float *x, int n)
{
    float s = 0.0f;
    #pragma omp simd reduction(+:s)
    for (int i = 0; i < n; i++) s += x[i];
    return s;
}

/* --8<-- [start:norm_row] */
/* y = (x - m) * rstd * w (+ b) over one row of C floats, rstd = 1 / sqrt(var + eps) with
 * var the mean of (x - m)^2. LayerNorm passes the row's mean as m (two passes over the row,
 * mean then the variance of the centred values, rather than E[x^2] - m^2, which cancels
 * catastrophically when the mean is large); RMSNorm passes m = 0 and b = NULL. Returns
 * rstd, which the training step keeps for the backward. */
static inline float norm_row(const float *x, float m, const float *w, const float *b, float *y,
                             int C, float eps)
{
    float var = 0.0f;
    #pragma omp simd reduction(+:var)
    for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
    const float rs = 1.0f / sqrtf(var / C + eps);
    if (b) {
        #pragma omp simd
        for (int c = 0; c < C; c++) y[c] = (x[c] - m) * rs * w[c] + b[c];
    } else if (m == 0.0f) {
        #pragma omp simd
        for (int c = 0; c < C; c++) y[c] = x[c] * rs * w[c];
    } else {
        #pragma omp simd
        for (int c = 0; c < C; c++) y[c] = (x[c] - m) * rs * w[c];
    }
    return rs;
}
/* --8<-- [end:norm_row] */

/* --8<-- [start:gelu_row] */
/* GPT-2's tanh GELU, 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), rewritten
 * as x * sigmoid(2u) = x * (e / (1 + e)), e = exp(2u): one exp and one division per float
 * instead of a libm tanhf call. gelu_arg gives 2u, gelu_of the GELU from x and e. */
static inline float gelu_arg(float x) { return 2.0f * SM_GELU_K * (x + SM_GELU_A * x * x * x); }
static inline float gelu_of(float x, float e) { return x * (e / (1.0f + e)); }

/* out[0..n) = gelu(x[0..n)), n <= CHUNK; out may be x. */
static inline void gelu_chunk(const float *x, float *out, int n)
{
    float e[CHUNK];
    #pragma omp simd
    for (int i = 0; i < n; i++) e[i] = gelu_arg(x[i]);
    exp_inplace(e, n);
    #pragma omp simd
    for (int i = 0; i < n; i++) out[i] = gelu_of(x[i], e[i]);
}
/* --8<-- [end:gelu_row] */

/* --8<-- [start:swiglu_row] */
/* SwiGLU's gate over n <= CHUNK features: g = silu(a) * b, silu(a) = a * sigmoid(a) =
 * a / (1 + exp(-a)). */
static inline void swiglu_chunk(const float *a, const float *b, float *g, int n)
{
    float e[CHUNK];
    #pragma omp simd
    for (int i = 0; i < n; i++) e[i] = -a[i];
    exp_inplace(e, n);
    #pragma omp simd
    for (int i = 0; i < n; i++) g[i] = a[i] / (1.0f + e[i]) * b[i];
}
/* --8<-- [end:swiglu_row] */

/* --8<-- [start:rope_head] */
/* One head's hd = 2 half features turned in place: the pair (2i, 2i+1) by the angle whose
 * cosine and sine are c[i] and s[i], or by its negative when sign = -1 (the backward: the
 * transpose of a rotation is its inverse). */
static inline void rope_head(float *p, const float *c, const float *s, int half, float sign)
{
    #pragma omp simd
    for (int i = 0; i < half; i++) {
        const float a = p[2 * i], b = p[2 * i + 1], si = sign * s[i];
        p[2 * i] = a * c[i] - b * si;
        p[2 * i + 1] = a * si + b * c[i];
    }
}
/* --8<-- [end:rope_head] */

#endif
