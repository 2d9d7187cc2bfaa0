/* Fused element-wise work: the training step's rung 5. Each kernel does in one pass
 * over memory what two or three of layers.c's kernels do in turn, where the tensor
 * between them is larger than the L2 and so would go out to L3 or DRAM and come back.
 * Included by ../layers.c after GELU and the attention in tiles, not compiled alone.
 *
 * Every kernel here has its unfused composition in smallem.model (UnfusedElementwise),
 * and the tests hold the two to the same numbers.
 */

/* --8<-- [start:bias_gelu] */
/* The MLP's first layer after its product: u += b, then g = gelu(u). Unfused, add_bias
 * reads and writes u, then gelu_forward reads u again and writes g: three passes over
 * an N x 4C tensor and one write. Fused, a row's chunk of 256 floats gets its bias and
 * its GELU while it is in L1: u is read once and written once, g written once. */
void bias_gelu_forward(float *u, const float *b, float *g, int N, int C, int nthreads)
{
    #pragma omp parallel for schedule(static) num_threads(TEAM(8LL * N * C))
    for (int n = 0; n < N; n++) {
        float *ur = u + (size_t)n * C, *gr = g + (size_t)n * C;
        for (int c0 = 0; c0 < C; c0 += CHUNK) {
            const int len = MIN(CHUNK, C - c0);
            float e[CHUNK];
            #pragma omp simd
            for (int i = 0; i < len; i++) {
                const float x = ur[c0 + i] + b[c0 + i];
                ur[c0 + i] = x;
                e[i] = gelu_arg(x);
            }
            exp_inplace(e, len);
            #pragma omp simd
            for (int i = 0; i < len; i++) gr[c0 + i] = gelu_of(ur[c0 + i], e[i]);
        }
    }
}
/* --8<-- [end:bias_gelu] */

/* The backward of the two: dx = dy * gelu'(x) and db = the column sums of dx, which
 * unfused is gelu_backward (a pass over x and dy, one over dx) and col_sum (another
 * pass over dx, by stripes of columns). Fused, each thread streams its rows once, as
 * gelu_backward does, and adds each row of dx into its own C partial sums (partial:
 * nthreads x C floats of the caller's); then the threads add the partial sums up, a
 * stripe of columns each, in thread order, so the sums do not depend on which thread
 * finished first. dx may be dy. */
void gelu_backward_bias(const float *x, const float *dy, float *dx, float *db, float *partial,
                        int N, int C, int nthreads)
{
    const int team = TEAM(8LL * N * C);
    #pragma omp parallel num_threads(team)
    {
        int t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        float *acc = partial + (size_t)t * C;
        memset(acc, 0, sizeof(float) * C);
        const int n0 = (int)((long long)N * t / nt), n1 = (int)((long long)N * (t + 1) / nt);
        for (int n = n0; n < n1; n++) {
            const float *xr = x + (size_t)n * C, *gr = dy + (size_t)n * C;
            float *dr = dx + (size_t)n * C;
            for (int c0 = 0; c0 < C; c0 += CHUNK) {
                const int len = MIN(CHUNK, C - c0);
                float e[CHUNK];
                #pragma omp simd
                for (int i = 0; i < len; i++) e[i] = gelu_arg(xr[c0 + i]);
                exp_inplace(e, len);
                #pragma omp simd
                for (int i = 0; i < len; i++) {
                    const float s = e[i] / (1.0f + e[i]), xi = xr[c0 + i];
                    const float dz = 2.0f * SM_GELU_K * (1.0f + 3.0f * SM_GELU_A * xi * xi);
                    const float d = gr[c0 + i] * (s + xi * s * (1.0f - s) * dz);
                    dr[c0 + i] = d;
                    acc[c0 + i] += d;
                }
            }
        }
        #pragma omp barrier
        const int c0 = (int)((long long)C * t / nt), c1 = (int)((long long)C * (t + 1) / nt);
        for (int c = c0; c < c1; c++) {
            float sum = 0.0f;
            for (int k = 0; k < nt; k++) sum += partial[(size_t)k * C + c];
            db[c] = sum;
        }
    }
}

/* --8<-- [start:residual_layernorm] */
/* After the attention's projection: mid = x + t + bias (the projection's bias and the
 * residual add), then out = LayerNorm(mid). Unfused: add_bias (a pass over t),
 * residual_add (x and t in, mid out) and layernorm_forward (mid in, out). Fused, each
 * row of mid is summed as it is made and stays in L1 (C floats: 2 KiB at C = 512) for
 * the variance and the normalisation: x and t are read once, mid and out written once. */
void residual_layernorm(const float *x, const float *t, const float *bias, float *mid,
                        const float *w, const float *b, float *out, float *mean, float *rstd,
                        int N, int C, int nthreads)
{
    #pragma omp parallel for schedule(static) num_threads(TEAM((long long)N * C))
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C, *tr = t + (size_t)n * C;
        float *mr = mid + (size_t)n * C, *yr = out + (size_t)n * C;
        float s = 0.0f;
        #pragma omp simd reduction(+:s)
        for (int c = 0; c < C; c++) {
            const float v = xr[c] + (tr[c] + bias[c]); /* add_bias, then the add */
            mr[c] = v;
            s += v;
        }
        const float m = s / C;
        mean[n] = m;
        rstd[n] = norm_row(mr, m, w, b, yr, C, SM_LN_EPS);
    }
}
/* --8<-- [end:residual_layernorm] */

/* After the MLP's second product: out = x + t + bias, the bias and the residual add
 * in one pass (unfused: add_bias over t, then residual_add). */
void bias_residual(const float *x, const float *t, const float *bias, float *out, int N, int C,
                   int nthreads)
{
    #pragma omp parallel for schedule(static) num_threads(TEAM((long long)N * C))
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C, *tr = t + (size_t)n * C;
        float *o = out + (size_t)n * C;
        #pragma omp simd
        for (int c = 0; c < C; c++) o[c] = xr[c] + (tr[c] + bias[c]);
    }
}
