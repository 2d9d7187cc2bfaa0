/* The modern block's layers (the training step's rung 7): RMSNorm, rotary position
 * embeddings (RoPE) and the SwiGLU MLP. Each has its numpy reference beside its Python
 * entry in smallem/model.py. Included by ../layers.c after exp and GELU, not compiled
 * alone.
 */

/* --8<-- [start:rmsnorm] */
/* y = x * rstd * w over each row of C floats, rstd = 1 / sqrt(mean(x^2) + eps): LayerNorm
 * without the mean and without the shift, one reduction per row instead of two (rows.h's
 * norm_row with m = 0). rstd is kept for the backward. */
void rmsnorm_forward(const float *x, const float *w, float *out, float *rstd, int N, int C,
                     int nthreads)
{
    #pragma omp parallel for schedule(static) num_threads(TEAM((long long)N * C))
    for (int n = 0; n < N; n++)
        rstd[n] = norm_row(x + (size_t)n * C, 0.0f, w, NULL, out + (size_t)n * C, C, SM_LN_EPS);
}
/* --8<-- [end:rmsnorm] */

/* With xh = x * rstd and g = dy * w: dx = rstd * (g - xh * mean(g * xh)), ADDED to dx
 * (the residual stream's gradient, as layernorm_backward does), and dw = the column sums
 * of dy * xh, by stripes of 64 columns so that no two threads write one float. */
void rmsnorm_backward(const float *dy, const float *x, const float *w, const float *rstd,
                      float *dx, float *dw, int N, int C, int nthreads)
{
    #pragma omp parallel num_threads(TEAM((long long)N * C))
    {
        #pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *xr = x + (size_t)n * C, *gr = dy + (size_t)n * C;
            float *dr = dx + (size_t)n * C;
            const float rs = rstd[n];
            float sgx = 0.0f;
            #pragma omp simd reduction(+:sgx)
            for (int c = 0; c < C; c++) sgx += gr[c] * w[c] * xr[c] * rs;
            sgx /= C;
            #pragma omp simd
            for (int c = 0; c < C; c++) dr[c] += rs * (gr[c] * w[c] - xr[c] * rs * sgx);
        }
        const int blocks = (C + 63) / 64;
        #pragma omp for schedule(static)
        for (int blk = 0; blk < blocks; blk++) {
            const int c0 = blk * 64, c1 = MIN(C, c0 + 64);
            float aw[64] = {0};
            for (int n = 0; n < N; n++) {
                const float *xr = x + (size_t)n * C, *gr = dy + (size_t)n * C;
                const float rs = rstd[n];
                #pragma omp simd
                for (int c = c0; c < c1; c++) aw[c - c0] += gr[c] * xr[c] * rs;
            }
            for (int c = c0; c < c1; c++) dw[c] = aw[c - c0];
        }
    }
}

/* --8<-- [start:rope] */
/* Rotary position embedding, in place on q and k (BH x T x hd each): the features of a
 * head go in pairs (2i, 2i+1), and the pair at position t turns by the angle t * theta_i,
 * theta_i = base^(-2i / hd); cos and sin (T x hd/2) hold those angles' cosines and sines,
 * made once per sequence length. Two positions' query and key then meet in their dot
 * product through the difference of their angles only: the score depends on how far
 * apart two tokens are, not on where they are. The backward turns the gradients back by
 * the same angles (the transpose of a rotation is its inverse): sign = -1. */
void rope(float *q, float *k, const float *cos_t, const float *sin_t, int BH, int T, int hd,
          float sign, int nthreads)
{
    const int half = hd / 2;
    #pragma omp parallel for schedule(static) num_threads(TEAM(2LL * BH * T * hd))
    for (long long row = 0; row < (long long)BH * T; row++) {
        const int t = (int)(row % T);
        const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
        rope_head(q + row * hd, c, s, half, sign);
        rope_head(k + row * hd, c, s, half, sign);
    }
}
/* --8<-- [end:rope] */

/* --8<-- [start:swiglu] */
/* The SwiGLU MLP's middle: u (N x 2h) is the product by [W1 | W3] side by side, a = its
 * first h columns, b the other h, and g = silu(a) * b with silu(a) = a * sigmoid(a): a
 * gate learned per feature where GPT-2 has a fixed GELU. One exp per gate. */
void swiglu_forward(const float *u, float *g, int N, int h, int nthreads)
{
    #pragma omp parallel for schedule(static) num_threads(TEAM(8LL * N * h))
    for (int n = 0; n < N; n++) {
        const float *a = u + (size_t)n * 2 * h, *b = a + h;
        float *gr = g + (size_t)n * h;
        for (int c0 = 0; c0 < h; c0 += CHUNK)
            swiglu_chunk(a + c0, b + c0, gr + c0, MIN(CHUNK, h - c0));
    }
}
/* --8<-- [end:swiglu] */

/* With s = sigmoid(a): da = dg * b * s * (1 + a (1 - s)), db = dg * silu(a). */
void swiglu_backward(const float *u, const float *dg, float *du, int N, int h, int nthreads)
{
    #pragma omp parallel for schedule(static) num_threads(TEAM(8LL * N * h))
    for (int n = 0; n < N; n++) {
        const float *a = u + (size_t)n * 2 * h, *b = a + h, *d = dg + (size_t)n * h;
        float *da = du + (size_t)n * 2 * h, *db = da + h;
        for (int c0 = 0; c0 < h; c0 += CHUNK) {
            const int len = MIN(CHUNK, h - c0);
            float e[CHUNK];
            #pragma omp simd
            for (int i = 0; i < len; i++) e[i] = -a[c0 + i];
            exp_inplace(e, len);
            #pragma omp simd
            for (int i = 0; i < len; i++) {
                const float s = 1.0f / (1.0f + e[i]), ai = a[c0 + i];
                da[c0 + i] = d[c0 + i] * b[c0 + i] * s * (1.0f + ai * (1.0f - s));
                db[c0 + i] = d[c0 + i] * ai * s;
            }
        }
    }
}
