/* Chapter 3: every layer of the GPT that is not a matrix product.
 *
 * The products (about 95% of a training step's FLOPs) go to chapter 2's GEMM.
 * What is left here is memory-bound: each kernel reads and writes its tensor
 * once or twice and does a handful of operations per float, so the goal is one
 * pass over memory, not peak FLOPs. The exception is exp(): softmax, the
 * cross-entropy and GELU all need it, and libm's expf is a scalar call that the
 * compiler cannot vectorise, so vec_exp below has an AVX-512, an AVX2 and a
 * plain-C branch.
 *
 * All tensors are row-major f32; N counts rows (tokens), C columns (features).
 * Threads split rows; kernels that reduce over rows (bias and LayerNorm weight
 * gradients, embedding scatter-add) split columns instead, so that no two
 * threads ever write the same float.
 */
#include <math.h>
#include "common.h"
#include "layers.h"

/* a kernel below SM_PAR_MIN floats of work runs on the calling thread (common.h) */
#define TEAM(work) ((long long)(work) >= SM_PAR_MIN ? nthreads : 1)

#include "vexp.h"
#include "rows.h"
#include "half.h"


void vec_exp(float *x, long long n) { exp_inplace(x, n); }

static inline float row_max(const float *x, int n)
{
    float m = -INFINITY;
    #pragma omp simd reduction(max:m)
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}


/* ------------------------------------------------------------------ bias, residual */
void add_bias(float *y, const float *b, int N, int C, int nthreads)
{
    #pragma omp parallel for schedule(static) num_threads(TEAM((long long)N * C))
    for (int n = 0; n < N; n++) {
        float *row = y + (size_t)n * C;
        #pragma omp simd
        for (int c = 0; c < C; c++) row[c] += b[c];
    }
}

/* db[c] = sum over rows of dy[n, c]; threads own column blocks of 64 floats
 * (one 256-byte stripe of every row), so their sums never collide. */
void col_sum(const float *dy, float *db, int N, int C, int nthreads)
{
    int blocks = (C + 63) / 64;
    #pragma omp parallel for schedule(static) num_threads(TEAM((long long)N * C))
    for (int blk = 0; blk < blocks; blk++) {
        int c0 = blk * 64, c1 = c0 + 64 < C ? c0 + 64 : C;
        float acc[64] = {0};
        for (int n = 0; n < N; n++) {
            const float *row = dy + (size_t)n * C;
            #pragma omp simd
            for (int c = c0; c < c1; c++) acc[c - c0] += row[c];
        }
        for (int c = c0; c < c1; c++) db[c] = acc[c - c0];
    }
}

void residual_add(const float *a, const float *b, float *out, long long n, int nthreads)
{
    #pragma omp parallel for simd schedule(static) num_threads(TEAM(n))
    for (long long i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* ------------------------------------------------------------------ embedding */
/* out[b, t] = wte[idx[b, t]] + wpe[t] (wpe may be NULL: no position table). Returns how
 * many ids are outside [0, V) (those rows are zeroed): a bad id must not read past the
 * table. */
int embedding_forward(const int *idx, const float *wte, const float *wpe, float *out,
                      int B, int T, int C, int V, int nthreads)
{
    int bad = 0;
    #pragma omp parallel for schedule(static) reduction(+:bad) \
        num_threads(TEAM((long long)B * T * C))
    for (int bt = 0; bt < B * T; bt++) {
        int id = idx[bt], t = bt % T;
        float *o = out + (size_t)bt * C;
        if (id < 0 || id >= V) {
            bad++;
            memset(o, 0, sizeof(float) * C);
            continue;
        }
        const float *e = wte + (size_t)id * C;
        if (!wpe) { /* no position table (the modern block's positions are in RoPE) */
            memcpy(o, e, sizeof(float) * C);
            continue;
        }
        const float *p = wpe + (size_t)t * C;
        #pragma omp simd
        for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
    return bad;
}

/* dwpe[t] = sum over b of dout[b, t] (overwritten; NULL: none); dwte[idx] += dout
 * (accumulated: the tied LM head has already written its share). Two tokens
 * may share an id, so threads split the columns, never the tokens. */
int embedding_backward(const int *idx, const float *dout, float *dwte, float *dwpe,
                       int B, int T, int C, int V, int nthreads)
{
    int blocks = (C + 63) / 64, bad = 0;
    for (int bt = 0; bt < B * T; bt++) bad += idx[bt] < 0 || idx[bt] >= V;
    #pragma omp parallel for schedule(static) num_threads(TEAM((long long)B * T * C))
    for (int blk = 0; blk < blocks; blk++) {
        int c0 = blk * 64, c1 = c0 + 64 < C ? c0 + 64 : C;
        if (dwpe)
            for (int t = 0; t < T; t++)
                for (int c = c0; c < c1; c++) dwpe[(size_t)t * C + c] = 0.0f;
        for (int bt = 0; bt < B * T; bt++) {
            int id = idx[bt], t = bt % T;
            const float *d = dout + (size_t)bt * C;
            if (dwpe) {
                float *p = dwpe + (size_t)t * C;
                for (int c = c0; c < c1; c++) p[c] += d[c];
            }
            if (id < 0 || id >= V) continue;
            float *e = dwte + (size_t)id * C;
            for (int c = c0; c < c1; c++) e[c] += d[c];
        }
    }
    return bad;
}

/* ------------------------------------------------------------------ LayerNorm */
/* --8<-- [start:layernorm] */
/* y = (x - mean) * rstd * w + b over each row of C floats: the row's mean, then
 * rows.h's norm_row (the variance of the centred values, and y). mean and rstd are
 * kept for the backward pass: 8 bytes per token instead of recomputing. */
void layernorm_forward(const float *x, const float *w, const float *b, float *out,
                       float *mean, float *rstd, int N, int C, int nthreads)
{
    #pragma omp parallel for schedule(static) num_threads(TEAM((long long)N * C))
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        const float m = row_sum(xr, C) / C;
        mean[n] = m;
        rstd[n] = norm_row(xr, m, w, b, out + (size_t)n * C, C, SM_LN_EPS);
    }
}
/* --8<-- [end:layernorm] */

/* --8<-- [start:layernorm_backward] */
/* With xh = (x - mean) * rstd and g = dy * w, the input gradient is
 *   dx = rstd * (g - mean(g) - xh * mean(g * xh))
 * and it is ADDED to dx: the block's residual stream already holds the
 * gradient that flows around the LayerNorm, so this one pass does the
 * residual's backward too. dw and db (sums over rows) come after, by column
 * blocks. */
void layernorm_backward(const float *dy, const float *x, const float *w, const float *mean,
                        const float *rstd, float *dx, float *dw, float *db, int N, int C,
                        int nthreads)
{
    #pragma omp parallel num_threads(TEAM((long long)N * C))
    {
        #pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *xr = x + (size_t)n * C, *gr = dy + (size_t)n * C;
            float *dr = dx + (size_t)n * C;
            float m = mean[n], rs = rstd[n], sg = 0.0f, sgx = 0.0f;
            #pragma omp simd reduction(+:sg, sgx)
            for (int c = 0; c < C; c++) {
                float g = gr[c] * w[c];
                sg += g;
                sgx += g * (xr[c] - m) * rs;
            }
            sg /= C;
            sgx /= C;
            #pragma omp simd
            for (int c = 0; c < C; c++) {
                float xh = (xr[c] - m) * rs;
                dr[c] += rs * (gr[c] * w[c] - sg - xh * sgx);
            }
        }
        int blocks = (C + 63) / 64;
        #pragma omp for schedule(static)
        for (int blk = 0; blk < blocks; blk++) {
            int c0 = blk * 64, c1 = c0 + 64 < C ? c0 + 64 : C;
            float aw[64] = {0}, ab[64] = {0};
            for (int n = 0; n < N; n++) {
                const float *xr = x + (size_t)n * C, *gr = dy + (size_t)n * C;
                float m = mean[n], rs = rstd[n];
                #pragma omp simd
                for (int c = c0; c < c1; c++) {
                    aw[c - c0] += gr[c] * (xr[c] - m) * rs;
                    ab[c - c0] += gr[c];
                }
            }
            for (int c = c0; c < c1; c++) {
                dw[c] = aw[c - c0];
                db[c] = ab[c - c0];
            }
        }
    }
}
/* --8<-- [end:layernorm_backward] */

/* ------------------------------------------------------------------ GELU */
/* --8<-- [start:gelu] */
/* GPT-2's tanh GELU (rows.h's gelu_chunk: one exp and one division per float) over
 * n floats, a chunk of 256 (1 KiB, in L1) at a time so that the exp pass is vectorised;
 * threads take chunks. */
void gelu_forward(const float *x, float *out, long long n, int nthreads)
{
    long long chunks = (n + CHUNK - 1) / CHUNK;
    #pragma omp parallel for schedule(static) num_threads(TEAM(8 * n))
    for (long long ch = 0; ch < chunks; ch++) {
        long long i0 = ch * CHUNK, len = n - i0 < CHUNK ? n - i0 : CHUNK;
        gelu_chunk(x + i0, out + i0, (int)len);
    }
}
/* --8<-- [end:gelu] */

/* d/dx [x s(z)] = s + x s (1 - s) dz/dx, s = sigmoid(z), z = 2u. */
void gelu_backward(const float *x, const float *dy, float *dx, long long n, int nthreads)
{
    long long chunks = (n + CHUNK - 1) / CHUNK;
    #pragma omp parallel for schedule(static) num_threads(TEAM(8 * n))
    for (long long ch = 0; ch < chunks; ch++) {
        long long i0 = ch * CHUNK, len = n - i0 < CHUNK ? n - i0 : CHUNK;
        float e[CHUNK];
        const float *xc = x + i0;
        #pragma omp simd
        for (int i = 0; i < len; i++) e[i] = gelu_arg(xc[i]);
        exp_inplace(e, len);
        #pragma omp simd
        for (int i = 0; i < len; i++) {
            float s = e[i] / (1.0f + e[i]), xi = xc[i];
            float dz = 2.0f * SM_GELU_K * (1.0f + 3.0f * SM_GELU_A * xi * xi);
            dx[i0 + i] = dy[i0 + i] * (s + xi * s * (1.0f - s) * dz);
        }
    }
}

/* ------------------------------------------------------------------ heads */
/* x is (B, T, parts, H, hd): the output of the fused QKV product (parts = 3)
 * or the attention output (parts = 1). Each part becomes (B, H, T, hd), so
 * that one head of one sequence is a contiguous T x hd matrix: the shape the
 * GEMM wants. Unused part pointers may be NULL. */
void heads_split(const float *x, float *q, float *k, float *v, int B, int T, int H, int hd,
                 int parts, int nthreads)
{
    float *dst[3] = {q, k, v};
    #pragma omp parallel for collapse(2) schedule(static) \
        num_threads(TEAM((long long)B * T * H * hd))
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int p = 0; p < parts; p++)
                for (int h = 0; h < H; h++) {
                    const float *src = x + ((((size_t)b * T + t) * parts + p) * H + h) * hd;
                    memcpy(dst[p] + (((size_t)b * H + h) * T + t) * hd, src, sizeof(float) * hd);
                }
}

void heads_merge(const float *q, const float *k, const float *v, float *x, int B, int T, int H,
                 int hd, int parts, int nthreads)
{
    const float *srcs[3] = {q, k, v};
    #pragma omp parallel for collapse(2) schedule(static) \
        num_threads(TEAM((long long)B * T * H * hd))
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int p = 0; p < parts; p++)
                for (int h = 0; h < H; h++) {
                    float *dst = x + ((((size_t)b * T + t) * parts + p) * H + h) * hd;
                    memcpy(dst, srcs[p] + (((size_t)b * H + h) * T + t) * hd, sizeof(float) * hd);
                }
}

/* ------------------------------------------------------------------ batched products */
/* --8<-- [start:batched_gemm] */
/* Attention needs B*H independent small products (T x hd x T for the xl model:
 * 512 x 64 x 512, 34 MFLOP each). Called one by one from Python, each pays a
 * wrapper's overhead and splits a small matrix over all cores; here each
 * thread takes whole products and runs chapter 2's GEMM (passed in as a
 * function pointer, its gemm_f32) single-threaded with its own packing buffer. */
typedef void (*gemm_f32_fn)(int, int, int, int, int, float, const float *, int, const float *,
                            int, float, float *, int, int, int, int, int, int, float *);

void batched_gemm(void *gemm, int count, int trans_a, int trans_b, int M, int N, int K,
                  float alpha, const float *A, long long stride_a, int lda, const float *B,
                  long long stride_b, int ldb, float beta, float *C, long long stride_c, int ldc,
                  int order, int mc, int kc, int nc, float *work, long long work_per_thread,
                  int nthreads)
{
    gemm_f32_fn fn = (gemm_f32_fn)gemm;
    #pragma omp parallel num_threads(TEAM((long long)count * M * N * K / 16))
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *w = work + (size_t)tid * work_per_thread;
        #pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < count; i++)
            fn(trans_a, trans_b, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb,
               beta, C + i * stride_c, ldc, 1, order, mc, kc, nc, w);
    }
}
/* --8<-- [end:batched_gemm] */

/* ------------------------------------------------------------------ attention softmax */
/* --8<-- [start:attn_softmax] */
/* s holds BH score matrices of T x T (S = Q K^T, unscaled). Row i of each
 * becomes softmax(scale * s[i, 0..i]) and zeros after i: the causal mask is
 * not a -inf added to the scores, it is the loop bound. Rows get longer down
 * the matrix, so threads take rows in small dynamic chunks. */
void attn_softmax_forward(float *s, int BH, int T, float scale, int nthreads)
{
    #pragma omp parallel for schedule(dynamic, 32) num_threads(TEAM((long long)BH * T * T))
    for (long long r = 0; r < (long long)BH * T; r++) {
        int i = (int)(r % T), n = i + 1;
        float *row = s + (size_t)r * T;
        float m = row_max(row, n) * scale;
        #pragma omp simd
        for (int j = 0; j < n; j++) row[j] = row[j] * scale - m;
        exp_inplace(row, n);
        float inv = 1.0f / row_sum(row, n);
        #pragma omp simd
        for (int j = 0; j < n; j++) row[j] *= inv;
        memset(row + n, 0, sizeof(float) * (T - n));
    }
}
/* --8<-- [end:attn_softmax] */

/* --8<-- [start:attn_softmax_backward] */
/* Given P and dP = dO V^T, the gradient of the unscaled scores, in place:
 *   dS[i, j] = scale * P[i, j] * (dP[i, j] - sum_k P[i, k] dP[i, k]).  */
void attn_softmax_backward(const float *p, float *dp, int BH, int T, float scale, int nthreads)
{
    #pragma omp parallel for schedule(dynamic, 32) num_threads(TEAM((long long)BH * T * T))
    for (long long r = 0; r < (long long)BH * T; r++) {
        int i = (int)(r % T), n = i + 1;
        const float *pr = p + (size_t)r * T;
        float *dr = dp + (size_t)r * T, dot = 0.0f;
        #pragma omp simd reduction(+:dot)
        for (int j = 0; j < n; j++) dot += pr[j] * dr[j];
        #pragma omp simd
        for (int j = 0; j < n; j++) dr[j] = scale * pr[j] * (dr[j] - dot);
        memset(dr + n, 0, sizeof(float) * (T - n));
    }
}
/* --8<-- [end:attn_softmax_backward] */

/* ------------------------------------------------------------------ bf16 */
/* --8<-- [start:to_bf16] */
/* f32 to bf16, rounded to nearest with ties to even (kernels_c/half.h: bf16 is the top half
 * of an f32, so add 0x7fff plus the lowest kept bit and keep the top 16 bits; a NaN is kept
 * a quiet NaN). The training step's rung 6 rounds both operands of every product this way
 * before chapter 2's bf16 GEMM reads them; the loop is integer work on the bits, which the
 * compiler vectorises. */
void to_bf16(const float *x, uint16_t *out, long long n, int nthreads)
{
    const uint32_t *u = (const uint32_t *)x;
    #pragma omp parallel for simd schedule(static) num_threads(TEAM(n))
    for (long long i = 0; i < n; i++) out[i] = sm_bits_to_bf16(u[i]);
}
/* --8<-- [end:to_bf16] */

/* ------------------------------------------------------------------ attention in tiles */
#include "layers/flash.c"

/* ------------------------------------------------------------------ fused element-wise work */
#include "layers/fused.c"

/* ------------------------------------------------------------------ the modern block */
#include "layers/modern.c"

/* ------------------------------------------------------------------ a gated linear recurrence */
#include "layers/scan.c"

/* ------------------------------------------------------------------ cross-entropy */
/* --8<-- [start:cross_entropy] */
/* Softmax, loss and gradient of the loss in one pass per row of V logits:
 *   losses[n] = logsumexp(z) - z[target],  dlogits = (softmax(z) - onehot) * dscale.
 * dscale is 1/N for a mean loss. Returns the count of targets outside [0, V)
 * (their loss is NaN and their gradient row zero). */
int cross_entropy(const float *logits, const int *targets, float *losses, float *dlogits,
                  int N, int V, float dscale, int nthreads)
{
    int bad = 0;
    #pragma omp parallel for schedule(static) reduction(+:bad) num_threads(TEAM((long long)N * V))
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * V;
        float *d = dlogits + (size_t)n * V;
        int t = targets[n];
        if (t < 0 || t >= V) {
            bad++;
            losses[n] = NAN;
            memset(d, 0, sizeof(float) * V);
            continue;
        }
        float m = row_max(z, V);
        #pragma omp simd
        for (int j = 0; j < V; j++) d[j] = z[j] - m;
        exp_inplace(d, V);
        float sum = row_sum(d, V), inv = dscale / sum;
        losses[n] = logf(sum) + m - z[t];
        #pragma omp simd
        for (int j = 0; j < V; j++) d[j] *= inv;
        d[t] -= dscale;
    }
    return bad;
}
/* --8<-- [end:cross_entropy] */

/* ------------------------------------------------------------------ optimiser */
/* --8<-- [start:adamw] */
/* AdamW (Loshchilov and Hutter), in PyTorch's order: decay the weight, update
 * both moments, step by lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps). gscale folds
 * gradient clipping into the same pass. Per float: 16 bytes read, 12 written
 * (p, m, v; g is read only), 3 state arrays the size of the model: for 25 M
 * parameters that is 700 MB of traffic per step: tens of milliseconds at the
 * DRAM bandwidths chapter 1 measures on the 2-core machines of this book. */
void adamw(float *p, const float *g, float *m, float *v, long long n, float lr, float beta1,
           float beta2, float eps, float wd, float gscale, float bc1, float bc2, int nthreads)
{
    float decay = 1.0f - lr * wd, step = lr / bc1, rbc2 = 1.0f / sqrtf(bc2);
    #pragma omp parallel for simd schedule(static) num_threads(TEAM(4 * n))
    for (long long i = 0; i < n; i++) {
        float gi = g[i] * gscale;
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - step * mi / (sqrtf(vi) * rbc2 + eps);
    }
}
/* --8<-- [end:adamw] */

/* Sum of squares in double: 25 M squares summed in f32 would lose the small ones.
 * 64 fixed chunks, each summed by one thread, then added in chunk order: an
 * OpenMP reduction would add the threads' partial sums in whatever order they
 * finish, and the gradient norm (hence the clipping, hence every later weight)
 * would differ in its last bits from run to run. Resuming a run must not. */
double sum_squares(const float *x, long long n, int nthreads)
{
    enum { CHUNKS = 64 };
    double part[CHUNKS];
    #pragma omp parallel for schedule(static) num_threads(TEAM(n))
    for (int c = 0; c < CHUNKS; c++) {
        long long i0 = n * c / CHUNKS, i1 = n * (c + 1) / CHUNKS;
        double s = 0.0;
        #pragma omp simd reduction(+:s)
        for (long long i = i0; i < i1; i++) s += (double)x[i] * x[i];
        part[c] = s;
    }
    double total = 0.0;
    for (int c = 0; c < CHUNKS; c++) total += part[c];
    return total;
}
