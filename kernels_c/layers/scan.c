/* A gated linear recurrence (issue 53's kernel ladder): for each (batch, head) pair, with
 * q_t, k_t, v_t of hd floats and a log-decay lam_t <= 0 per step,
 *   S_0 = 0 (hd x hd),  S_t = exp(lam_t) S_{t-1} + k_t v_t^T,  o_t = S_t^T q_t.
 * Three rungs, each a forward and a backward: the definition one step at a time (step);
 * chunks of L steps whose products go to chapter 2's GEMM (chunked); the chunks on a
 * team of threads (threaded). Included by ../layers.c after its exp helpers and
 * batched_gemm's gemm_f32_fn, not compiled alone.
 *
 * q, k, v, o, dq, dk, dv: BH x T x hd; lam, dlam: BH x T; states: BH x (nchunks + 1) x hd x hd,
 * the state at the start of every chunk of L steps and, last, the final state (the one a
 * decoder continues from), written by every forward and read by every backward; nchunks
 * = ceil(T / L). work: scan_work_floats(T, hd, L) floats per thread. The chunked rungs
 * take chapter 2's gemm_f32 as a pointer with its blocks (order, mc, kc, nc) and a packing
 * buffer, gwork, of gwork_per_thread floats a thread, as batched_gemm does.
 */
#ifndef MIN
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#endif

long long scan_work_floats(int T, int hd, int L) /* per thread, any rung */
{
    T = MAX(T, 1);
    hd = MAX(hd, 1);
    L = MIN(MAX(L, 1), T);
    const long long n = L, h = hd, chunks = (T + L - 1) / L;
    /* a chunk's scores and their gradient (L x L each), two L x hd blocks, five rows of L;
     * two hd x hd states; then either a chunk's L states (the step rung's backward) or one
     * head's chunk boundaries (the threaded backward's gradients of the carried state) */
    return 16 + 2 * n * n + 2 * n * h + 5 * n + h * h * (2 + MAX(n, chunks));
}

/* One thread's scratch, carved from its share of work (on a cache-line boundary). */
typedef struct {
    float *sc, *dp, *x1, *x2, *ec, *e, *drow, *colw, *dc, *pair, *big;
} scan_scratch;

static scan_scratch scan_carve(float *work, int t, int T, int hd, int L)
{
    const long long per = scan_work_floats(T, hd, L);
    float *w = (float *)(((uintptr_t)(work + (size_t)t * per) + 63) & ~(uintptr_t)63);
    scan_scratch s;
    s.sc = w;
    s.dp = s.sc + (size_t)L * L;
    s.x1 = s.dp + (size_t)L * L;
    s.x2 = s.x1 + (size_t)L * hd;
    s.ec = s.x2 + (size_t)L * hd;
    s.e = s.ec + L;
    s.drow = s.e + L;
    s.colw = s.drow + L;
    s.dc = s.colw + L;
    s.pair = s.dc + L;
    s.big = s.pair + 2 * (size_t)hd * hd;
    return s;
}

/* chapter 2's GEMM, single-threaded, with its blocks: C = op(A) op(B) + beta C */
typedef struct {
    gemm_f32_fn fn;
    int order, mc, kc, nc;
} scan_gemm;

static void mm(const scan_gemm *g, float *gw, int ta, int tb, int M, int N, int K,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    g->fn(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc, 1, g->order, g->mc, g->kc, g->nc,
          gw);
}

static inline float dot(const float *a, const float *b, int n)
{
    float s = 0.0f;
    #pragma omp simd reduction(+:s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* y[i] += a x[i] */
static inline void axpy(float *y, float a, const float *x, long long n)
{
    #pragma omp simd
    for (long long i = 0; i < n; i++) y[i] += a * x[i];
}

/* out (n x hd) = diag(w) x */
static void scale_rows(const float *x, const float *w, int n, int hd, float *out)
{
    for (int t = 0; t < n; t++) {
        const float a = w[t], *xr = x + (size_t)t * hd;
        float *r = out + (size_t)t * hd;
        #pragma omp simd
        for (int d = 0; d < hd; d++) r[d] = a * xr[d];
    }
}

/* ------------------------------------------------------------------ the definition */
/* --8<-- [start:scan_step] */
/* One step at a time, the state S (hd x hd, row i = S[i][:]) in one pass a step: each row
 * decays, takes k_t[i] v_t and adds q_t[i] times itself to o_t. The state is written to
 * states at every L steps and at the end. One thread; the hd-wide loops are vectors. */
void scan_step_forward(const float *q, const float *k, const float *v, const float *lam,
                       float *o, float *states, int BH, int T, int hd, int L, float *work)
{
    L = MIN(L, T);
    const int chunks = (T + L - 1) / L;
    const size_t hh = (size_t)hd * hd;
    float *S = scan_carve(work, 0, T, hd, L).pair;
    for (int bh = 0; bh < BH; bh++) {
        const size_t at = (size_t)bh * T * hd;
        float *st = states + (size_t)bh * (chunks + 1) * hh;
        memset(S, 0, sizeof(float) * hh);
        memset(st, 0, sizeof(float) * hh);
        for (int t = 0; t < T; t++) {
            const float a = expf(lam[(size_t)bh * T + t]);
            const float *qt = q + at + (size_t)t * hd, *kt = k + at + (size_t)t * hd,
                        *vt = v + at + (size_t)t * hd;
            float *ot = o + at + (size_t)t * hd;
            memset(ot, 0, sizeof(float) * hd);
            for (int i = 0; i < hd; i++) {
                float *Si = S + (size_t)i * hd;
                const float ki = kt[i], qi = qt[i];
                #pragma omp simd
                for (int j = 0; j < hd; j++) {
                    Si[j] = a * Si[j] + ki * vt[j];
                    ot[j] += qi * Si[j];
                }
            }
            if ((t + 1) % L == 0 || t + 1 == T)
                memcpy(st + (size_t)((t + L) / L) * hh, S, sizeof(float) * hh);
        }
    }
}

/* Backward through the steps, the gradient dS of the state carried from the end: a
 * chunk's states are recomputed forward from its checkpoint into scratch, then walked
 * back. At step t, with a = exp(lam_t):
 *   dS += q_t dO_t^T,  dq_t = S_t dO_t,  dk_t = dS v_t,  dv_t = dS^T k_t,
 *   dlam_t = a <dS, S_{t-1}>,  then dS = a dS (the gradient of S_{t-1}). */
void scan_step_backward(const float *q, const float *k, const float *v, const float *lam,
                        const float *states, const float *dout, float *dq, float *dk,
                        float *dv, float *dlam, int BH, int T, int hd, int L, float *work)
{
    L = MIN(L, T);
    const int chunks = (T + L - 1) / L;
    const size_t hh = (size_t)hd * hd;
    const scan_scratch s = scan_carve(work, 0, T, hd, L);
    float *dS = s.pair, *Sb = s.big; /* Sb: the chunk's states after each of its steps */
    for (int bh = 0; bh < BH; bh++) {
        const size_t at = (size_t)bh * T * hd;
        const float *st = states + (size_t)bh * (chunks + 1) * hh, *lm = lam + (size_t)bh * T;
        memset(dS, 0, sizeof(float) * hh);
        for (int c = chunks - 1; c >= 0; c--) {
            const int t0 = c * L, n = MIN(L, T - t0);
            for (int r = 0; r < n; r++) {
                const float *prev = r ? Sb + (size_t)(r - 1) * hh : st + (size_t)c * hh;
                const float a = expf(lm[t0 + r]);
                const float *kt = k + at + (size_t)(t0 + r) * hd, *vt = v + at + (size_t)(t0 + r) * hd;
                float *cur = Sb + (size_t)r * hh;
                for (int i = 0; i < hd; i++) {
                    const float *pi = prev + (size_t)i * hd;
                    float *ci = cur + (size_t)i * hd;
                    const float ki = kt[i];
                    #pragma omp simd
                    for (int j = 0; j < hd; j++) ci[j] = a * pi[j] + ki * vt[j];
                }
            }
            for (int r = n - 1; r >= 0; r--) {
                const int t = t0 + r;
                const float *prev = r ? Sb + (size_t)(r - 1) * hh : st + (size_t)c * hh;
                const float *cur = Sb + (size_t)r * hh, a = expf(lm[t]);
                const float *qt = q + at + (size_t)t * hd, *kt = k + at + (size_t)t * hd,
                            *vt = v + at + (size_t)t * hd, *gt = dout + at + (size_t)t * hd;
                float *dqt = dq + at + (size_t)t * hd, *dkt = dk + at + (size_t)t * hd,
                      *dvt = dv + at + (size_t)t * hd;
                double dl = 0.0;
                memset(dvt, 0, sizeof(float) * hd);
                for (int i = 0; i < hd; i++) {
                    float *dSi = dS + (size_t)i * hd;
                    const float qi = qt[i], ki = kt[i];
                    #pragma omp simd
                    for (int j = 0; j < hd; j++) dSi[j] += qi * gt[j];
                    dqt[i] = dot(cur + (size_t)i * hd, gt, hd);
                    dkt[i] = dot(dSi, vt, hd);
                    dl += dot(dSi, prev + (size_t)i * hd, hd);
                    #pragma omp simd
                    for (int j = 0; j < hd; j++) {
                        dvt[j] += ki * dSi[j];
                        dSi[j] *= a;
                    }
                }
                dlam[(size_t)bh * T + t] = (float)(a * dl);
            }
        }
    }
}
/* --8<-- [end:scan_step] */

/* ------------------------------------------------------------------ in chunks */
/* --8<-- [start:scan_chunk] */
/* Inside a chunk of n steps, c_t = lam_1 + ... + lam_t (c_0 = 0, summed in double so that
 * c_t - c_j keeps its digits however far the chunk has decayed), and
 *   D[t][j] = exp(c_t - c_j) for j <= t, else 0  (never above 1),
 *   O = ((Q K^T) o D) V + diag(exp(c)) Q S_prev,
 *   S_next = exp(c_n) S_prev + (diag(exp(c_n - c)) K)^T V.
 * ec[t] = exp(c_t), e[j] = exp(c_n - c_j). */
static void chunk_decays(const float *lam, int n, double *cum, float *ec, float *e)
{
    double s = 0.0;
    for (int t = 0; t < n; t++) {
        s += lam[t];
        cum[t] = s;
    }
    for (int t = 0; t < n; t++) {
        ec[t] = (float)cum[t];
        e[t] = (float)(s - cum[t]);
    }
    exp_inplace(ec, n);
    exp_inplace(e, n);
}

/* exp(c_n): the decay of the state carried across the chunk */
static float chunk_carry(const float *lam, int n)
{
    double s = 0.0;
    for (int t = 0; t < n; t++) s += lam[t];
    return expf((float)s);
}

/* Row t of D into drow[0..t]. */
static void decay_row(const double *cum, int t, float *drow)
{
    const double ct = cum[t];
    #pragma omp simd
    for (int j = 0; j <= t; j++) drow[j] = (float)(ct - cum[j]);
    exp_inplace(drow, t + 1);
}

/* What a chunk computes without the state before it: O = ((Q K^T) o D) V into o, and
 * the state it adds, (diag(e) K)^T V, into snext (both overwritten). */
static void chunk_intra(const scan_gemm *g, const float *q, const float *k, const float *v,
                        const float *lam, int n, int hd, float *o, float *snext,
                        const scan_scratch *s, float *gw)
{
    double cum[n];
    chunk_decays(lam, n, cum, s->ec, s->e);
    mm(g, gw, 0, 1, n, n, hd, q, hd, k, hd, 0.0f, s->sc, n); /* Q K^T */
    for (int t = 0; t < n; t++) {
        float *r = s->sc + (size_t)t * n;
        decay_row(cum, t, s->drow);
        #pragma omp simd
        for (int j = 0; j <= t; j++) r[j] *= s->drow[j];
        for (int j = t + 1; j < n; j++) r[j] = 0.0f;
    }
    mm(g, gw, 0, 0, n, hd, n, s->sc, n, v, hd, 0.0f, o, hd);
    scale_rows(k, s->e, n, hd, s->x1);
    mm(g, gw, 1, 0, hd, hd, n, s->x1, hd, v, hd, 0.0f, snext, hd);
}

/* What the state before the chunk adds to its output: o += diag(ec) Q S_prev. */
static void chunk_inter(const scan_gemm *g, const float *q, const float *lam, int n, int hd,
                        const float *sprev, float *o, const scan_scratch *s, float *gw)
{
    double cum[n];
    chunk_decays(lam, n, cum, s->ec, s->e);
    scale_rows(q, s->ec, n, hd, s->x1);
    mm(g, gw, 0, 0, n, hd, hd, s->x1, hd, sprev, hd, 1.0f, o, hd);
}

/* --8<-- [start:scan_chunk_backward] */
/* The chunk's gradients, given dO and dS_next (the gradient of the state after it; NULL:
 * zero) and S_prev (NULL: zero, the first chunk). With A = (Q K^T) o D, dP = dO V^T and
 * G = dP o D:
 *   dV = A^T dO + diag(e) K dS_next,   dK = G^T Q + diag(e) V dS_next^T,
 *   dQ = G K + diag(ec) dO S_prev^T;
 * and the gradient of each c_t, from D (W = (Q K^T) o D o dP: its row sums minus its
 * column sums, the diagonal left out as it cancels), from the state before (exp(c_t)
 * q_t^T S_prev dO_t) and from the state after (u_j = e_j k_j^T dS_next v_j: -u_j for
 * c_j, and sum u_j + exp(c_n) <dS_next, S_prev> for c_n):
 *   dc_t = sum_{j<t} W[t][j] - sum_{i>t} W[i][t] + ec_t q_t . (S_prev dO_t) - u_t
 *          + [t = n] (sum_j u_j + exp(c_n) <dS_next, S_prev>),
 * and dlam_s = sum over t >= s in the chunk of dc_t (c_t sums lam up to t). */
static void chunk_grad(const scan_gemm *g, const float *q, const float *k, const float *v,
                       const float *lam, const float *dout, int n, int hd, const float *sprev,
                       const float *dsnext, float *dq, float *dk, float *dv, float *dlam,
                       const scan_scratch *s, float *gw)
{
    double cum[n];
    float *sc = s->sc, *dp = s->dp, *dc = s->dc, *colw = s->colw, *x2 = s->x2;
    chunk_decays(lam, n, cum, s->ec, s->e);
    mm(g, gw, 0, 1, n, n, hd, q, hd, k, hd, 0.0f, sc, n);    /* Q K^T */
    mm(g, gw, 0, 1, n, n, hd, dout, hd, v, hd, 0.0f, dp, n); /* dO V^T */
    memset(colw, 0, sizeof(float) * n);
    for (int t = 0; t < n; t++) {
        float *a = sc + (size_t)t * n, *p = dp + (size_t)t * n, rw = 0.0f;
        const float *d = s->drow;
        decay_row(cum, t, s->drow);
        #pragma omp simd reduction(+:rw)
        for (int j = 0; j < t; j++) {
            const float w = a[j] * d[j] * p[j];
            rw += w;
            colw[j] += w;
        }
        dc[t] = rw;
        #pragma omp simd
        for (int j = 0; j <= t; j++) {
            a[j] *= d[j];
            p[j] *= d[j];
        }
        for (int j = t + 1; j < n; j++) a[j] = p[j] = 0.0f;
    }
    for (int t = 0; t < n; t++) dc[t] -= colw[t];
    mm(g, gw, 1, 0, n, hd, n, sc, n, dout, hd, 0.0f, dv, hd); /* A^T dO */
    mm(g, gw, 1, 0, n, hd, n, dp, n, q, hd, 0.0f, dk, hd);    /* G^T Q */
    mm(g, gw, 0, 0, n, hd, n, dp, n, k, hd, 0.0f, dq, hd);    /* G K */
    double last = 0.0; /* what c_n gets besides its own row */
    if (dsnext) {
        mm(g, gw, 0, 0, n, hd, hd, k, hd, dsnext, hd, 0.0f, x2, hd); /* K dS_next */
        for (int j = 0; j < n; j++) axpy(dv + (size_t)j * hd, s->e[j], x2 + (size_t)j * hd, hd);
        mm(g, gw, 0, 1, n, hd, hd, v, hd, dsnext, hd, 0.0f, x2, hd); /* V dS_next^T */
        for (int j = 0; j < n; j++) {
            const float *xj = x2 + (size_t)j * hd, u = s->e[j] * dot(k + (size_t)j * hd, xj, hd);
            axpy(dk + (size_t)j * hd, s->e[j], xj, hd);
            dc[j] -= u;
            last += u;
        }
    }
    if (sprev) {
        mm(g, gw, 0, 1, n, hd, hd, dout, hd, sprev, hd, 0.0f, x2, hd); /* dO S_prev^T */
        for (int t = 0; t < n; t++) {
            const float *xt = x2 + (size_t)t * hd;
            axpy(dq + (size_t)t * hd, s->ec[t], xt, hd);
            dc[t] += s->ec[t] * dot(q + (size_t)t * hd, xt, hd);
        }
        if (dsnext) last += (double)s->ec[n - 1] * dot(dsnext, sprev, hd * hd);
    }
    dc[n - 1] += (float)last;
    double acc = 0.0;
    for (int t = n - 1; t >= 0; t--) {
        acc += dc[t];
        dlam[t] = (float)acc;
    }
}

/* The chunk's share of the gradient of the state before it: Q^T diag(ec) dO (the rest,
 * exp(c_n) dS_next, is carried by the caller). */
static void chunk_state_grad(const scan_gemm *g, const float *q, const float *lam,
                             const float *dout, int n, int hd, float *dst,
                             const scan_scratch *s, float *gw)
{
    double cum[n];
    chunk_decays(lam, n, cum, s->ec, s->e);
    scale_rows(dout, s->ec, n, hd, s->x1);
    mm(g, gw, 1, 0, hd, hd, n, q, hd, s->x1, hd, 0.0f, dst, hd);
}
/* --8<-- [end:scan_chunk_backward] */

/* The chunked forward, one head after another and one chunk after another: the chunk's
 * own part, then the state carried in, then the state's share of the output. */
void scan_chunked_forward(void *gemm, const float *q, const float *k, const float *v,
                          const float *lam, float *o, float *states, int BH, int T, int hd,
                          int L, int order, int mc, int kc, int nc, float *gwork, float *work)
{
    const scan_gemm g = {(gemm_f32_fn)gemm, order, mc, kc, nc};
    L = MIN(L, T);
    const int chunks = (T + L - 1) / L;
    const size_t hh = (size_t)hd * hd;
    const scan_scratch s = scan_carve(work, 0, T, hd, L);
    for (int bh = 0; bh < BH; bh++) {
        float *st = states + (size_t)bh * (chunks + 1) * hh;
        memset(st, 0, sizeof(float) * hh);
        for (int c = 0; c < chunks; c++) {
            const size_t r0 = (size_t)bh * T + (size_t)c * L;
            const int n = MIN(L, T - c * L);
            chunk_intra(&g, q + r0 * hd, k + r0 * hd, v + r0 * hd, lam + r0, n, hd, o + r0 * hd,
                        st + (c + 1) * hh, &s, gwork);
            if (c == 0) continue;
            axpy(st + (c + 1) * hh, chunk_carry(lam + r0, n), st + c * hh, (long long)hh);
            chunk_inter(&g, q + r0 * hd, lam + r0, n, hd, st + c * hh, o + r0 * hd, &s, gwork);
        }
    }
}

/* The chunked backward: chunks in reverse, dS (the gradient of the state after the chunk)
 * carried back as dS_prev = Q^T diag(ec) dO + exp(c_n) dS_next. */
void scan_chunked_backward(void *gemm, const float *q, const float *k, const float *v,
                           const float *lam, const float *states, const float *dout, float *dq,
                           float *dk, float *dv, float *dlam, int BH, int T, int hd, int L,
                           int order, int mc, int kc, int nc, float *gwork, float *work)
{
    const scan_gemm g = {(gemm_f32_fn)gemm, order, mc, kc, nc};
    L = MIN(L, T);
    const int chunks = (T + L - 1) / L;
    const size_t hh = (size_t)hd * hd;
    const scan_scratch s = scan_carve(work, 0, T, hd, L);
    for (int bh = 0; bh < BH; bh++) {
        const float *st = states + (size_t)bh * (chunks + 1) * hh;
        float *dS = s.pair, *next = s.pair + hh;
        for (int c = chunks - 1; c >= 0; c--) {
            const size_t r0 = (size_t)bh * T + (size_t)c * L;
            const int n = MIN(L, T - c * L);
            chunk_grad(&g, q + r0 * hd, k + r0 * hd, v + r0 * hd, lam + r0, dout + r0 * hd, n, hd,
                       c ? st + c * hh : NULL, c < chunks - 1 ? dS : NULL, dq + r0 * hd,
                       dk + r0 * hd, dv + r0 * hd, dlam + r0, &s, gwork);
            if (c == 0) break;
            chunk_state_grad(&g, q + r0 * hd, lam + r0, dout + r0 * hd, n, hd, next, &s, gwork);
            if (c < chunks - 1) axpy(next, chunk_carry(lam + r0, n), dS, (long long)hh);
            float *swap = dS;
            dS = next;
            next = swap;
        }
    }
}
/* --8<-- [end:scan_chunk] */

/* ------------------------------------------------------------------ in chunks, threaded */
/* --8<-- [start:scan_threaded] */
/* A chunk's own part depends on nothing before it; only the carried state does, and
 * carrying it is hd^2 multiply-adds a chunk. So the forward runs in three sweeps over the
 * team: every (head, chunk) pair's own part (its output, and the state it adds, written
 * into its checkpoint), in any order; the carry, a head per task; every pair's share of
 * the state before it. Each pair is computed by one thread in a fixed order, so the bits
 * do not depend on the team (and are the chunked rung's). */
#define SCAN_TEAM(BH, T, hd, L) TEAM((long long)(BH) * (T) * (hd) * ((L) + 2 * (hd)) / 4)

void scan_threaded_forward(void *gemm, const float *q, const float *k, const float *v,
                           const float *lam, float *o, float *states, int BH, int T, int hd,
                           int L, int order, int mc, int kc, int nc, float *gwork,
                           long long gwork_per_thread, float *work, int nthreads)
{
    const scan_gemm g = {(gemm_f32_fn)gemm, order, mc, kc, nc};
    L = MIN(L, T);
    const int chunks = (T + L - 1) / L;
    const size_t hh = (size_t)hd * hd;
    const long long units = (long long)BH * chunks;
    #pragma omp parallel num_threads(SCAN_TEAM(BH, T, hd, L))
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        const scan_scratch s = scan_carve(work, tid, T, hd, L);
        float *gw = gwork + (size_t)tid * gwork_per_thread;
        #pragma omp for schedule(dynamic, 1)
        for (long long u = 0; u < units; u++) {
            const int bh = (int)(u / chunks), c = (int)(u % chunks), n = MIN(L, T - c * L);
            const size_t r0 = (size_t)bh * T + (size_t)c * L;
            float *st = states + (size_t)bh * (chunks + 1) * hh;
            chunk_intra(&g, q + r0 * hd, k + r0 * hd, v + r0 * hd, lam + r0, n, hd, o + r0 * hd,
                        st + (c + 1) * hh, &s, gw);
        }
        #pragma omp for schedule(dynamic, 1)
        for (int bh = 0; bh < BH; bh++) {
            float *st = states + (size_t)bh * (chunks + 1) * hh;
            memset(st, 0, sizeof(float) * hh);
            for (int c = 1; c < chunks; c++)
                axpy(st + (c + 1) * hh, chunk_carry(lam + (size_t)bh * T + (size_t)c * L,
                                                    MIN(L, T - c * L)), st + c * hh, (long long)hh);
        }
        #pragma omp for schedule(dynamic, 1)
        for (long long u = 0; u < units; u++) {
            const int bh = (int)(u / chunks), c = (int)(u % chunks), n = MIN(L, T - c * L);
            if (c == 0) continue;
            const size_t r0 = (size_t)bh * T + (size_t)c * L;
            const float *st = states + (size_t)bh * (chunks + 1) * hh;
            chunk_inter(&g, q + r0 * hd, lam + r0, n, hd, st + c * hh, o + r0 * hd, &s, gw);
        }
    }
}

/* The backward in the same three sweeps, over as many heads at a time as the team has
 * threads (head i of a group keeps its chunks' dS in thread i's scratch): every chunk's
 * share of the gradient of the state before it; the carry back, a head per task; every
 * chunk's gradients, from its checkpoint and its dS. */
void scan_threaded_backward(void *gemm, const float *q, const float *k, const float *v,
                            const float *lam, const float *states, const float *dout, float *dq,
                            float *dk, float *dv, float *dlam, int BH, int T, int hd, int L,
                            int order, int mc, int kc, int nc, float *gwork,
                            long long gwork_per_thread, float *work, int nthreads)
{
    const scan_gemm g = {(gemm_f32_fn)gemm, order, mc, kc, nc};
    L = MIN(L, T);
    const int chunks = (T + L - 1) / L;
    const size_t hh = (size_t)hd * hd;
    #pragma omp parallel num_threads(SCAN_TEAM(BH, T, hd, L))
    {
        int tid = 0, nt = 1;
#ifdef _OPENMP
        tid = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        const scan_scratch s = scan_carve(work, tid, T, hd, L);
        float *gw = gwork + (size_t)tid * gwork_per_thread;
        for (int h0 = 0; h0 < BH; h0 += nt) {
            const int heads = MIN(nt, BH - h0);
            const long long units = (long long)heads * chunks;
            /* dS after chunk c of head h0 + i: slot c of thread i's scratch */
            #pragma omp for schedule(dynamic, 1)
            for (long long u = 0; u < units; u++) {
                const int i = (int)(u / chunks), c = (int)(u % chunks), n = MIN(L, T - c * L);
                const size_t r0 = (size_t)(h0 + i) * T + (size_t)c * L;
                float *slots = scan_carve(work, i, T, hd, L).big;
                if (c == 0)
                    memset(slots + (size_t)(chunks - 1) * hh, 0, sizeof(float) * hh);
                else
                    chunk_state_grad(&g, q + r0 * hd, lam + r0, dout + r0 * hd, n, hd,
                                     slots + (size_t)(c - 1) * hh, &s, gw);
            }
            #pragma omp for schedule(dynamic, 1)
            for (int i = 0; i < heads; i++) {
                float *slots = scan_carve(work, i, T, hd, L).big;
                const float *lm = lam + (size_t)(h0 + i) * T;
                for (int c = chunks - 2; c >= 1; c--) /* slot c - 1 += exp(c_n of c) slot c */
                    axpy(slots + (size_t)(c - 1) * hh, chunk_carry(lm + (size_t)c * L,
                                                                   MIN(L, T - c * L)),
                         slots + (size_t)c * hh, (long long)hh);
            }
            #pragma omp for schedule(dynamic, 1)
            for (long long u = 0; u < units; u++) {
                const int i = (int)(u / chunks), c = (int)(u % chunks), n = MIN(L, T - c * L);
                const size_t r0 = (size_t)(h0 + i) * T + (size_t)c * L;
                const float *st = states + (size_t)(h0 + i) * (chunks + 1) * hh;
                float *slots = scan_carve(work, i, T, hd, L).big;
                chunk_grad(&g, q + r0 * hd, k + r0 * hd, v + r0 * hd, lam + r0, dout + r0 * hd, n,
                           hd, c ? st + c * hh : NULL,
                           c < chunks - 1 ? slots + (size_t)c * hh : NULL, dq + r0 * hd,
                           dk + r0 * hd, dv + r0 * hd, dlam + r0, &s, gw);
            }
        }
    }
}
/* --8<-- [end:scan_threaded] */
