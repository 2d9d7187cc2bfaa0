/* Causal attention in tiles (FlashAttention's scheme, on the CPU): forward and
 * backward without the T x T matrices of layers.c's attn_softmax_*. Included by
 * ../layers.c after its exp and row helpers, not compiled alone.
 */
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* --8<-- [start:flash_forward] */
/* Causal attention without the T x T matrix (FlashAttention's online softmax):
 * for each tile of `tile` query rows, the key tiles at or before them, one at a
 * time; each row keeps its running maximum m, the running sum l of exp(s - m)
 * and the running output acc = sum exp(s - m) v, rescaled by exp(m_old - m_new)
 * whenever the maximum grows. At the end o = acc / l, and lse = m + log(l) is
 * kept for the backward. Key tiles after a query row are never visited: the
 * mask is the loop bound. K's tile is packed transposed (hd x tile), so the
 * scores of one row are an FMA per dimension across the tile's keys.
 * q, k, v, o: BH x T x hd; lse: BH x T; work: nthreads x flash_work_floats(). */
long long flash_work_floats(int T, int hd, int tile) /* per thread, forward or backward */
{
    /* forward: K^T of a whole head (or of one tile, whichever is larger) and 4 rows of
     * scores; backward: D, K's and V's tiles, 4 rows of p and of ds */
    return MAX((long long)hd * MAX(T, tile) + 4LL * tile, 2LL * hd * tile + 8LL * tile + T);
}

/* K's rows j0 .. j0 + cols - 1 (each hd floats) transposed: kt[d * ld + c] */
static void pack_kt(const float *k, int j0, int cols, int hd, float *kt, int ld)
{
    for (int c = 0; c < cols; c++)
        for (int d = 0; d < hd; d++) kt[(size_t)d * ld + c] = k[(size_t)(j0 + c) * hd + d];
}

#if defined(VW)
/* FR query rows against a full tile of keys, all of them at or before every row (a
 * tile left of the diagonal), in registers: the scores s (FR x tile) two vectors of
 * keys at a time, FR x 2 accumulators, each vector of K's packed tile loaded once for
 * FR rows; then acc (FR x hd) += p V, two vectors of hd at a time. tile and hd are
 * multiples of 2 VW here. */
#define FR 4
static void flash_scores_full(const float *q, int hd, int tile, const float *kt, int ldk,
                              float *s)
{
    for (int c0 = 0; c0 < tile; c0 += 2 * VW) {
        VEC a[FR][2];
        for (int r = 0; r < FR; r++) a[r][0] = a[r][1] = VSET1(0.0f);
        for (int d = 0; d < hd; d++) {
            const float *kd = kt + (size_t)d * ldk + c0;
            const VEC k0 = VLOAD(kd), k1 = VLOAD(kd + VW);
            for (int r = 0; r < FR; r++) {
                const VEC x = VSET1(q[(size_t)r * hd + d]); /* a broadcast from memory */
                a[r][0] = VFMA(x, k0, a[r][0]);
                a[r][1] = VFMA(x, k1, a[r][1]);
            }
        }
        for (int r = 0; r < FR; r++) {
            VSTORE(s + (size_t)r * tile + c0, a[r][0]);
            VSTORE(s + (size_t)r * tile + c0 + VW, a[r][1]);
        }
    }
}

static void flash_pv_full(const float *v, float *o, int hd, int tile, const float *p)
{
    for (int h0 = 0; h0 < hd; h0 += 2 * VW) {
        VEC a[FR][2];
        for (int r = 0; r < FR; r++) {
            a[r][0] = VLOAD(o + (size_t)r * hd + h0);
            a[r][1] = VLOAD(o + (size_t)r * hd + h0 + VW);
        }
        for (int c = 0; c < tile; c++) {
            const VEC v0 = VLOAD(v + (size_t)c * hd + h0), v1 = VLOAD(v + (size_t)c * hd + h0 + VW);
            for (int r = 0; r < FR; r++) {
                const VEC x = VSET1(p[(size_t)r * tile + c]);
                a[r][0] = VFMA(x, v0, a[r][0]);
                a[r][1] = VFMA(x, v1, a[r][1]);
            }
        }
        for (int r = 0; r < FR; r++) {
            VSTORE(o + (size_t)r * hd + h0, a[r][0]);
            VSTORE(o + (size_t)r * hd + h0 + VW, a[r][1]);
        }
    }
}
/* acc (tile x hd) += x^T y for FR rows: acc[c] += sum over r of x[r][c] y[r] (the
 * backward's dV += P^T dO and dK += dS^T Q), two vectors of hd at a time. */
static void flash_tn_full(const float *x, const float *y, float *acc, int hd, int tile)
{
    for (int h0 = 0; h0 < hd; h0 += 2 * VW) {
        VEC y0[FR], y1[FR];
        for (int r = 0; r < FR; r++) {
            y0[r] = VLOAD(y + (size_t)r * hd + h0);
            y1[r] = VLOAD(y + (size_t)r * hd + h0 + VW);
        }
        for (int c = 0; c < tile; c++) {
            float *ac = acc + (size_t)c * hd + h0;
            VEC a0 = VLOAD(ac), a1 = VLOAD(ac + VW);
            for (int r = 0; r < FR; r++) {
                const VEC w = VSET1(x[(size_t)r * tile + c]);
                a0 = VFMA(w, y0[r], a0);
                a1 = VFMA(w, y1[r], a1);
            }
            VSTORE(ac, a0);
            VSTORE(ac + VW, a1);
        }
    }
}
#endif

/* One row of scores s (n of them, then tile - n masked ones) scaled, exponentiated
 * against the row's running maximum m, its running sum l updated and its accumulator
 * acc rescaled; the masked entries are set to zero, so P V may run over the whole tile. */
static void flash_online_row(float *s, int n, int tile, float scale, float *m, float *l,
                             float *acc, int hd)
{
    #pragma omp simd
    for (int c = 0; c < n; c++) s[c] *= scale;
    const float mnew = MAX(*m, row_max(s, n)), corr = expf(*m - mnew);
    #pragma omp simd
    for (int c = 0; c < n; c++) s[c] -= mnew;
    exp_inplace(s, n);
    for (int c = n; c < tile; c++) s[c] = 0.0f;
    *l = *l * corr + row_sum(s, n);
    #pragma omp simd
    for (int d = 0; d < hd; d++) acc[d] *= corr;
    *m = mnew;
}

/* The query rows i0 .. i0 + tile - 1 against every key tile at or before them. ktp: K^T
 * of the whole head (ld = T), packed once by the caller; or NULL, and each key tile is
 * packed here into kt (ld = tile). */
static void flash_forward_tile(const float *q, const float *k, const float *v, float *o,
                               float *lse, int T, int hd, float scale, int tile, int i0,
                               const float *ktp, float *kt, float *s)
{
    const int rows = MIN(tile, T - i0);
    for (int r = 0; r < rows; r++) {
        float *acc = o + (size_t)(i0 + r) * hd; /* the output row is the accumulator */
        memset(acc, 0, sizeof(float) * hd);
    }
    float m[rows], l[rows];
    for (int r = 0; r < rows; r++) { m[r] = -INFINITY; l[r] = 0.0f; }
    const int ldk = ktp ? T : tile;
    for (int j0 = 0; j0 < i0 + rows; j0 += tile) {
        const int cols = MIN(tile, T - j0);
        const float *kk = ktp ? ktp + j0 : kt;
        if (!ktp) pack_kt(k, j0, cols, hd, kt, tile);
        int r = 0;
#if defined(VW)
        /* FR rows at a time, in registers, over the whole tile; on the diagonal tile the
         * keys after a row are masked (their p is zero) */
        const int fast = cols == tile && tile % (2 * VW) == 0 && hd % (2 * VW) == 0;
        for (; fast && r + FR <= rows; r += FR) {
            flash_scores_full(q + (size_t)(i0 + r) * hd, hd, tile, kk, ldk, s);
            for (int x = 0; x < FR; x++)
                flash_online_row(s + (size_t)x * tile, MIN(tile, i0 + r + x - j0 + 1), tile,
                                 scale, &m[r + x], &l[r + x], o + (size_t)(i0 + r + x) * hd, hd);
            flash_pv_full(v + (size_t)j0 * hd, o + (size_t)(i0 + r) * hd, hd, tile, s);
        }
#endif
        for (; r < rows; r++) {
            const int i = i0 + r, n = MIN(cols, i - j0 + 1); /* keys j0 .. i */
            if (n <= 0) continue;
            const float *qi = q + (size_t)i * hd;
            float *acc = o + (size_t)i * hd;
            for (int c = 0; c < n; c++) s[c] = 0.0f;
            for (int d = 0; d < hd; d++) {
                const float x = qi[d], *kd = kk + (size_t)d * ldk;
                #pragma omp simd
                for (int c = 0; c < n; c++) s[c] += x * kd[c];
            }
            flash_online_row(s, n, n, scale, &m[r], &l[r], acc, hd);
            for (int c = 0; c < n; c++) {
                const float pc = s[c], *vc = v + (size_t)(j0 + c) * hd;
                #pragma omp simd
                for (int d = 0; d < hd; d++) acc[d] += pc * vc[d];
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        float *acc = o + (size_t)(i0 + r) * hd, inv = 1.0f / l[r];
        #pragma omp simd
        for (int d = 0; d < hd; d++) acc[d] *= inv;
        lse[i0 + r] = m[r] + logf(l[r]);
    }
}

void flash_forward(const float *q, const float *k, const float *v, float *o, float *lse,
                   int BH, int T, int hd, float scale, int tile, float *work, int nthreads)
{
    const int tiles = (T + tile - 1) / tile;
    const size_t per = (size_t)flash_work_floats(T, hd, tile);
    #pragma omp parallel num_threads(TEAM((long long)BH * T * T / 2 * hd / 64))
    {
        int t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        float *kt = work + (size_t)t * per, *s = kt + (size_t)hd * MAX(T, tile);
        if (BH >= nt) {
            /* a head per task: its K^T packed once, then its query tiles, last first */
            #pragma omp for schedule(dynamic, 1)
            for (int bh = 0; bh < BH; bh++) {
                const size_t at = (size_t)bh * T * hd;
                pack_kt(k + at, 0, T, hd, kt, T);
                for (int x = tiles - 1; x >= 0; x--)
                    flash_forward_tile(q + at, k + at, v + at, o + at, lse + (size_t)bh * T, T,
                                       hd, scale, tile, x * tile, kt, NULL, s);
            }
        } else {
            /* fewer heads than threads: a query tile per task, each key tile packed as
             * it is visited; the last query tiles see the most keys, so they go first */
            #pragma omp for schedule(dynamic, 1)
            for (long long u = 0; u < (long long)BH * tiles; u++) {
                const long long bh = u % BH;
                const int i0 = (int)(tiles - 1 - u / BH) * tile;
                const size_t at = (size_t)bh * T * hd;
                flash_forward_tile(q + at, k + at, v + at, o + at, lse + (size_t)bh * T, T, hd,
                                   scale, tile, i0, NULL, kt, s);
            }
        }
    }
}
/* --8<-- [end:flash_forward] */

/* --8<-- [start:flash_backward] */
/* The backward, without P: for each tile of keys (K and V packed transposed, as
 * in the forward), each query row at or after it recomputes its probabilities from
 * the scores and the forward's lse, p = exp(scale q.k - lse).
 * With D_i = dO_i . O_i (the row sum of P * dP):
 *   dV_j += p dO_i,  dp = dO_i . V_j,  ds = p (dp - D_i),
 *   dQ_i += scale ds K_j,  dK_j += scale ds Q_i.
 * One thread takes one (batch, head) whole, so its dQ, dK, dV are its own and the
 * sums come in one order: the results do not depend on the number of threads.
 * work: nthreads x flash_work_floats() floats. */
/* One query row i against the key tile at j0, one key at a time: the diagonal tile's
 * rows, and every row where the tile or hd is not a multiple of two vectors. */
static void flash_backward_row(const float *q, const float *k, const float *dout, float *dq,
                               float *dk, float *dv, const float *lse, const float *dd, int hd,
                               float scale, int tile, int j0, int cols, int i, const float *kt,
                               const float *vt, float *p, float *dp)
{
    const int n = MIN(cols, i - j0 + 1);
    const float *qi = q + (size_t)i * hd, *gi = dout + (size_t)i * hd;
    float *dqi = dq + (size_t)i * hd;
    for (int c = 0; c < n; c++) p[c] = dp[c] = 0.0f;
    for (int d = 0; d < hd; d++) { /* q.k and dO.v across the tile's keys */
        const float x = qi[d], g = gi[d], *kd = kt + (size_t)d * tile, *vd = vt + (size_t)d * tile;
        #pragma omp simd
        for (int c = 0; c < n; c++) {
            p[c] += x * kd[c];
            dp[c] += g * vd[c];
        }
    }
    #pragma omp simd
    for (int c = 0; c < n; c++) p[c] = scale * p[c] - lse[i];
    exp_inplace(p, n); /* p = exp(scale q.k - lse) */
    #pragma omp simd
    for (int c = 0; c < n; c++) dp[c] = scale * p[c] * (dp[c] - dd[i]); /* ds */
    for (int c = 0; c < n; c++) {
        const float pc = p[c], ds = dp[c], *kc = k + (size_t)(j0 + c) * hd;
        float *dkc = dk + (size_t)(j0 + c) * hd, *dvc = dv + (size_t)(j0 + c) * hd;
        #pragma omp simd
        for (int d = 0; d < hd; d++) {
            dvc[d] += pc * gi[d];
            dkc[d] += ds * qi[d];
            dqi[d] += ds * kc[d];
        }
    }
}

static void flash_backward_head(const float *q, const float *k, const float *v, const float *o,
                                const float *lse, const float *dout, float *dq, float *dk,
                                float *dv, int T, int hd, float scale, int tile, float *w)
{
    float *dd = w, *kt = dd + T, *vt = kt + (size_t)hd * tile, *p = vt + (size_t)hd * tile,
          *dp = p + (size_t)4 * tile;
    memset(dq, 0, sizeof(float) * T * hd);
    memset(dk, 0, sizeof(float) * T * hd);
    memset(dv, 0, sizeof(float) * T * hd);
    for (int i = 0; i < T; i++) {
        float x = 0.0f;
        const float *oi = o + (size_t)i * hd, *gi = dout + (size_t)i * hd;
        #pragma omp simd reduction(+:x)
        for (int d = 0; d < hd; d++) x += oi[d] * gi[d];
        dd[i] = x;
    }
    for (int j0 = 0; j0 < T; j0 += tile) {
        const int cols = MIN(tile, T - j0);
        pack_kt(k, j0, cols, hd, kt, tile);
        pack_kt(v, j0, cols, hd, vt, tile);
        int i = j0; /* the query rows that see this tile: j0 .. T - 1 */
#if defined(VW)
        /* FR rows at a time, in registers (as the forward); a row of the diagonal tile
         * has its keys after it masked: p = ds = 0 there */
        if (cols == tile && tile % (2 * VW) == 0 && hd % (2 * VW) == 0) {
            for (; i + FR <= T; i += FR) {
                float *ps = p, *ds = dp; /* FR rows each */
                flash_scores_full(q + (size_t)i * hd, hd, tile, kt, tile, ps);
                flash_scores_full(dout + (size_t)i * hd, hd, tile, vt, tile, ds);
                for (int r = 0; r < FR; r++) {
                    float *pr = ps + (size_t)r * tile, *dr = ds + (size_t)r * tile;
                    const float l = lse[i + r], d0 = dd[i + r];
                    const int n = MIN(tile, i + r - j0 + 1);
                    #pragma omp simd
                    for (int c = 0; c < tile; c++) pr[c] = scale * pr[c] - l;
                    exp_inplace(pr, tile);
                    #pragma omp simd
                    for (int c = 0; c < tile; c++) dr[c] = scale * pr[c] * (dr[c] - d0);
                    for (int c = n; c < tile; c++) pr[c] = dr[c] = 0.0f;
                }
                flash_tn_full(ps, dout + (size_t)i * hd, dv + (size_t)j0 * hd, hd, tile);
                flash_tn_full(ds, q + (size_t)i * hd, dk + (size_t)j0 * hd, hd, tile);
                flash_pv_full(k + (size_t)j0 * hd, dq + (size_t)i * hd, hd, tile, ds);
            }
        }
#endif
        for (; i < T; i++)
            flash_backward_row(q, k, dout, dq, dk, dv, lse, dd, hd, scale, tile, j0, cols, i,
                               kt, vt, p, dp);
    }
}

void flash_backward(const float *q, const float *k, const float *v, const float *o,
                    const float *lse, const float *dout, float *dq, float *dk, float *dv,
                    int BH, int T, int hd, float scale, int tile, float *work, int nthreads)
{
    const size_t per = (size_t)flash_work_floats(T, hd, tile);
    #pragma omp parallel num_threads(TEAM((long long)BH * T * T * hd / 32))
    {
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
#endif
        #pragma omp for schedule(dynamic, 1)
        for (int bh = 0; bh < BH; bh++) {
            const size_t at = (size_t)bh * T * hd;
            flash_backward_head(q + at, k + at, v + at, o + at, lse + (size_t)bh * T,
                                dout + at, dq + at, dk + at, dv + at, T, hd, scale, tile,
                                work + (size_t)t * per);
        }
    }
}
/* --8<-- [end:flash_backward] */
