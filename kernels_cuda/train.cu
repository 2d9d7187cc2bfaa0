/* Chapter 3 on the GPU: every layer of the training step that is not a matrix product, the
 * attention in tiles, the loss, the gradient norm and AdamW. The products themselves are
 * cuBLAS's or gemm.cu's (smallem.training.gpu_ops.CudaOps chooses); this file is the rest.
 *
 * Each kernel has the semantics of the method of the same layer in
 * smallem/training/ops.py (the Numpy* classes are the definition), on the same row-major
 * layouts: activations (N, C) with N = B*T tokens, per-head tensors (B, H, T, hd). Sizes need
 * not be multiples of anything: every thread checks its index, and the element-wise kernels
 * walk their tensor in a grid-stride loop, so any grid covers any size. tests/test_cuda_train.py
 * runs every kernel on the CPU (tests/cuda_emu) on awkward shapes.
 *
 * Launch shapes (the Python side uses these; the kernels check nothing about them):
 *   element-wise kernels      any 1-D grid, any 1-D block (256 threads on a GPU: 8 warps a
 *                             block, enough loads in flight per SM for a memory-bound loop)
 *   warp-per-row kernels      any 1-D grid, blocks of a multiple of 32 threads (128)
 *   colsum_partial            grid (ceil(C / 32), parts), block (32, up to COL_ROWS)
 *   embedding_bwd_wte         grid (ceil(C / block), V), block a multiple of 32, <= 1024
 *   attn_*                    grid (ceil(T / ATT), B*H), block ATT
 *   sum_partial, *_finish     block a power of two up to SUM_THREADS (256); the finishing
 *                             kernels one block
 * (The tests launch smaller blocks than a GPU wants: the CPU emulator makes a thread of each.)
 *
 * No header is included (NVRTC ships none); the constants below are kernels_c/common.h's,
 * and a test checks that the two files agree. */

#define TR_LN_EPS 1e-5f           /* LayerNorm's and RMSNorm's epsilon (SM_LN_EPS) */
#define TR_GELU_K 0.7978845608f   /* sqrt(2 / pi), GPT-2's tanh GELU (SM_GELU_K) */
#define TR_GELU_A 0.044715f       /* its cubic term (SM_GELU_A) */

#define COL_ROWS 8      /* colsum_partial's largest blockDim.y */
#define SUM_THREADS 256 /* the reductions' largest block */
#define EMB_IDS 256     /* token ids staged in shared memory at a time */
#define ATT 32          /* attention: queries a block = keys a tile = threads a block */

#define NEG_INF __uint_as_float(0xff800000u)
#define QNAN __uint_as_float(0x7fc00000u)

/* i runs over [0, n) in steps of the whole grid: each thread takes every (grid size)-th
 * element, so a warp's 32 loads are 32 neighbouring floats (one 128-byte transaction) and the
 * grid can be sized to the GPU (a few blocks per SM), not to the tensor. */
#define GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (long long)(n); \
         i += (long long)gridDim.x * blockDim.x)

/* Sum (max) over the 32 lanes of a warp by butterfly shuffles: register to register, no
 * shared memory, no barrier, and every lane ends with the same value. */
__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* ------------------------------------------------------------------ embedding */
/* out[n] = wte[idx[n]] + wpe[n % T] (wpe may be NULL: the modern block has no position
 * table). One thread an element: a warp reads 32 neighbouring floats of one table row. A token
 * id outside [0, V) gives a NaN row (the host never reads the ids back to check them). */
extern "C" __global__ void embedding_fwd(const int *idx, const float *wte, const float *wpe,
                                         float *out, int N, int T, int V, int C)
{
    GRID_STRIDE(i, (long long)N * C) {
        int n = (int)(i / C), c = (int)(i - (long long)n * C);
        int id = idx[n];
        float e = (id >= 0 && id < V) ? wte[(size_t)id * C + c] : QNAN;
        out[i] = wpe ? e + wpe[(size_t)(n % T) * C + c] : e;
    }
}

/* dwte[v] += the sum of dout[n] over the tokens n whose id is v. Deterministic, without
 * atomics: block (x, v) owns columns of row v and scans every id in token order, the ids
 * staged EMB_IDS at a time in shared memory (read once from global memory per block, then
 * broadcast to the threads). A float atomicAdd would add a repeated byte's rows in whatever
 * order the warps arrive, and the weights would differ in their last bits from run to run;
 * here the order is numpy's np.add.at's. Launch: grid (ceil(C / blockDim.x), V). */
extern "C" __global__ void embedding_bwd_wte(const int *idx, const float *dout, float *dwte,
                                             int N, int C)
{
    __shared__ int ids[EMB_IDS];
    int v = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    float acc = c < C ? dwte[(size_t)v * C + c] : 0.0f;
    for (int n0 = 0; n0 < N; n0 += EMB_IDS) {
        int count = min(EMB_IDS, N - n0);
        __syncthreads();  /* the previous chunk of ids is no longer read */
        for (int j = threadIdx.x; j < count; j += blockDim.x) ids[j] = idx[n0 + j];
        __syncthreads();
        if (c < C)
            for (int j = 0; j < count; j++)
                if (ids[j] == v) acc += dout[(size_t)(n0 + j) * C + c];
    }
    if (c < C) dwte[(size_t)v * C + c] = acc;
}

/* dwpe[t] = the sum over the batch of dout[b*T + t] for t < T, 0 for the rows t >= T
 * (overwrites all P rows). One thread an element of dwpe, summing B rows in batch order. */
extern "C" __global__ void embedding_bwd_wpe(const float *dout, float *dwpe, int B, int T, int P,
                                             int C)
{
    GRID_STRIDE(i, (long long)P * C) {
        int t = (int)(i / C), c = (int)(i - (long long)t * C);
        float s = 0.0f;
        if (t < T)
            for (int b = 0; b < B; b++) s += dout[((size_t)b * T + t) * C + c];
        dwpe[i] = s;
    }
}

/* ------------------------------------------------------------------ LayerNorm, RMSNorm */
/* One warp a row: the row's sums are warp shuffles, with no shared memory and no barrier,
 * and a warp's loads are 32 neighbouring floats. Rows of up to a few thousand floats are
 * re-read from L1/L2 on each pass rather than held in registers, so one kernel serves any C.
 *
 * With t == NULL: y = norm(x). With t: the residual add first, mid = x + (t + bias) (bias may
 * be NULL), written out, then y = norm(mid): the block's "residual + LayerNorm" in one pass.
 * mean == NULL selects RMSNorm (no centring, b unused: pass NULL); else LayerNorm, b may be
 * NULL. y = (v - mean) * rstd * w + b with rstd = 1 / sqrt(mean((v - mean)^2) + eps). */
extern "C" __global__ void norm_fwd(const float *x, const float *t, const float *bias,
                                    float *mid, const float *w, const float *b, float *out,
                                    float *mean, float *rstd, int N, int C)
{
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += gridDim.x * warps) {
        const float *src = x + (size_t)row * C;
        if (t) {
            const float *tr = t + (size_t)row * C;
            float *mr = mid + (size_t)row * C;
            for (int c = lane; c < C; c += 32)
                mr[c] = src[c] + (bias ? tr[c] + bias[c] : tr[c]);
            src = mr;  /* each lane reads back only what it wrote */
        }
        float mu = 0.0f;
        if (mean) {
            float s = 0.0f;
            for (int c = lane; c < C; c += 32) s += src[c];
            mu = warp_sum(s) / C;
        }
        float ss = 0.0f;
        for (int c = lane; c < C; c += 32) {
            float d = src[c] - mu;
            ss += d * d;
        }
        float rs = 1.0f / sqrtf(warp_sum(ss) / C + TR_LN_EPS);
        float *y = out + (size_t)row * C;
        for (int c = lane; c < C; c += 32) {
            float v = (src[c] - mu) * rs * w[c];
            y[c] = b ? v + b[c] : v;
        }
        if (lane == 0) {
            if (mean) mean[row] = mu;
            rstd[row] = rs;
        }
    }
}

/* The input gradient, ADDED into dx (the residual stream's gradient already there), one warp
 * a row: with xh = (x - mean) * rstd and g = dy * w,
 *   LayerNorm  dx += rstd * (g - mean(g) - xh * mean(g * xh))
 *   RMSNorm    dx += rstd * (g - xh * mean(g * xh))          (mean == NULL, xh = x * rstd)
 * The weight and bias gradients are column sums over the rows: colsum_partial. */
extern "C" __global__ void norm_bwd(const float *dy, const float *x, const float *w,
                                    const float *mean, const float *rstd, float *dx, int N, int C)
{
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += gridDim.x * warps) {
        const float *xr = x + (size_t)row * C, *gr = dy + (size_t)row * C;
        float *dr = dx + (size_t)row * C;
        float mu = mean ? mean[row] : 0.0f, rs = rstd[row], sg = 0.0f, sgx = 0.0f;
        for (int c = lane; c < C; c += 32) {
            float g = gr[c] * w[c];
            sg += g;
            sgx += g * ((xr[c] - mu) * rs);
        }
        sg = mean ? warp_sum(sg) / C : 0.0f;
        sgx = warp_sum(sgx) / C;
        for (int c = lane; c < C; c += 32) {
            float g = gr[c] * w[c];
            dr[c] += rs * (g - sg - (xr[c] - mu) * rs * sgx);
        }
    }
}

/* Column sums over N rows, in two deterministic passes: block (x, part) sums 32 columns over
 * one slice of rows into partial sums, colsum_finish adds the parts in order. Each warp reads
 * 32 neighbouring columns of a row (128 bytes, one transaction), the COL_ROWS warps of a block
 * take rows in turn and meet in shared memory; the slices give the GPU enough blocks even
 * when C / 32 alone would leave most SMs idle.
 *   pb: sums of dy (a bias gradient), if pb != NULL
 *   pw: sums of dy * xh, xh = (x - mean) * rstd (LayerNorm's weight gradient; mean == NULL:
 *       RMSNorm's), if pw != NULL
 * Launch: grid (ceil(C / 32), parts), block (32, COL_ROWS or fewer); part p covers rows
 * [p * rows, (p + 1) * rows). Partial sums are written at [p * C + c]. */
extern "C" __global__ void colsum_partial(const float *dy, const float *x, const float *mean,
                                          const float *rstd, float *pw, float *pb, int N, int C,
                                          int rows)
{
    __shared__ float sw[COL_ROWS][32], sb[COL_ROWS][32];
    int tx = threadIdx.x, ty = threadIdx.y, c = blockIdx.x * 32 + tx;
    int r0 = blockIdx.y * rows, r1 = min(N, r0 + rows);
    float aw = 0.0f, ab = 0.0f;
    if (c < C)
        for (int r = r0 + ty; r < r1; r += blockDim.y) {
            float d = dy[(size_t)r * C + c];
            ab += d;
            if (pw) aw += d * ((x[(size_t)r * C + c] - (mean ? mean[r] : 0.0f)) * rstd[r]);
        }
    sw[ty][tx] = aw;
    sb[ty][tx] = ab;
    __syncthreads();
    if (ty == 0 && c < C) {
        float tw = 0.0f, tb = 0.0f;
        for (int k = 0; k < (int)blockDim.y; k++) {
            tw += sw[k][tx];
            tb += sb[k][tx];
        }
        if (pw) pw[(size_t)blockIdx.y * C + c] = tw;
        if (pb) pb[(size_t)blockIdx.y * C + c] = tb;
    }
}

/* out[c] = the sum over the parts of p[part * C + c], in part order (for pw into dw and pb into
 * db; either pair may be NULL). Overwrites. */
extern "C" __global__ void colsum_finish(const float *pw, const float *pb, float *dw, float *db,
                                         int parts, int C)
{
    GRID_STRIDE(c, C) {
        float tw = 0.0f, tb = 0.0f;
        for (int p = 0; p < parts; p++) {
            if (pw) tw += pw[(size_t)p * C + c];
            if (pb) tb += pb[(size_t)p * C + c];
        }
        if (dw) dw[c] = tw;
        if (db) db[c] = tb;
    }
}

/* ------------------------------------------------------------------ element-wise layers */
/* out = x + (t + bias), rows of C: the residual adds (bias == NULL), a bias alone (t == NULL:
 * out = x + bias, in place when out == x) and the fused "bias + residual". The sum is taken
 * in the order the unfused CPU layers take it. */
extern "C" __global__ void add_rows(const float *x, const float *t, const float *bias,
                                    float *out, long long n, int C)
{
    GRID_STRIDE(i, n) {
        float u = t ? t[i] : 0.0f;
        if (bias) u = t ? u + bias[i % C] : bias[i % C];
        out[i] = x[i] + u;
    }
}

/* u += b (if b != NULL; u keeps the biased value: the backward needs it), then
 * g = 0.5 u (1 + tanh(K (u + A u^3))), GPT-2's tanh GELU. */
extern "C" __global__ void bias_gelu_fwd(float *u, const float *b, float *g, long long n, int C)
{
    GRID_STRIDE(i, n) {
        float x = u[i];
        if (b) {
            x += b[i % C];
            u[i] = x;
        }
        float th = tanhf(TR_GELU_K * (x + TR_GELU_A * x * x * x));
        g[i] = 0.5f * x * (1.0f + th);
    }
}

/* dx = dy * gelu'(u); dx may be dy (each thread reads its element before writing it). The
 * bias gradient, if any, is colsum_partial over dx afterwards. */
extern "C" __global__ void gelu_bwd(const float *u, const float *dy, float *dx, long long n)
{
    GRID_STRIDE(i, n) {
        float x = u[i];
        float th = tanhf(TR_GELU_K * (x + TR_GELU_A * x * x * x));
        float dth = (1.0f - th * th) * TR_GELU_K * (1.0f + 3.0f * TR_GELU_A * x * x);
        dx[i] = dy[i] * (0.5f * (1.0f + th) + 0.5f * x * dth);
    }
}

/* SwiGLU: u (N, 2h) holds a = x W1 and b = x W3 side by side; g (N, h) = silu(a) * b.
 * One thread an output element: both of its loads and its store are coalesced. */
extern "C" __global__ void swiglu_fwd(const float *u, float *g, int N, int h)
{
    GRID_STRIDE(i, (long long)N * h) {
        long long n = i / h, j = i - n * h;
        float a = u[n * 2 * h + j], b = u[n * 2 * h + h + j];
        g[i] = a / (1.0f + expf(-a)) * b;
    }
}

/* du[:, :h] = dg * b * s * (1 + a (1 - s)), du[:, h:] = dg * a * s, with s = sigmoid(a). */
extern "C" __global__ void swiglu_bwd(const float *u, const float *dg, float *du, int N, int h)
{
    GRID_STRIDE(i, (long long)N * h) {
        long long n = i / h, j = i - n * h;
        float a = u[n * 2 * h + j], b = u[n * 2 * h + h + j], d = dg[i];
        float s = 1.0f / (1.0f + expf(-a));
        du[n * 2 * h + j] = d * b * s * (1.0f + a * (1.0f - s));
        du[n * 2 * h + h + j] = d * a * s;
    }
}

/* ------------------------------------------------------------------ RoPE and the heads */
/* RoPE in place on q and k (BH, T, hd): the pair (2i, 2i+1) of each row at position t turned
 * by the angle whose cosine and sine are cos[t, i], sin[t, i] (T, hd/2), or turned back
 * (inverse: the backward). One thread a pair: it reads both floats and writes both, so no
 * other thread touches them. */
extern "C" __global__ void rope(float *q, float *k, const float *cos, const float *sin, int BH,
                                int T, int hd, int inverse)
{
    int half = hd / 2;
    long long pairs = (long long)BH * T * half;
    GRID_STRIDE(i, 2 * pairs) {
        float *x = i < pairs ? q : k;
        long long p = i < pairs ? i : i - pairs, row = p / half;
        int j = (int)(p - row * half), t = (int)(row % T);
        float c = cos[t * half + j], s = inverse ? -sin[t * half + j] : sin[t * half + j];
        float a = x[row * hd + 2 * j], b = x[row * hd + 2 * j + 1];
        x[row * hd + 2 * j] = a * c - b * s;
        x[row * hd + 2 * j + 1] = a * s + b * c;
    }
}

/* qkv (B*T, 3, H, hd) -> q, k, v (B, H, T, hd), RoPE applied to q and k on the way when cos
 * is not NULL (the modern block): one pass over memory for what the CPU does in two. One
 * thread an element of qkv: reads are coalesced, writes are runs of hd floats. An element of
 * a pair reads its partner too (the second read hits the same cache line). */
extern "C" __global__ void qkv_split(const float *qkv, float *q, float *k, float *v,
                                     const float *cos, const float *sin, int B, int T, int H,
                                     int hd)
{
    int half = hd / 2;
    GRID_STRIDE(i, (long long)B * T * 3 * H * hd) {
        long long r = i / hd;
        int d = (int)(i - r * hd), h = (int)(r % H);
        r /= H;
        int part = (int)(r % 3);
        long long tok = r / 3;
        int t = (int)(tok % T), b = (int)(tok / T);
        float val = qkv[i];
        if (cos && part < 2) {
            float c = cos[t * half + d / 2], s = sin[t * half + d / 2];
            val = (d & 1) ? qkv[i - 1] * s + val * c : val * c - qkv[i + 1] * s;
        }
        float *dst = part == 0 ? q : (part == 1 ? k : v);
        dst[(((size_t)b * H + h) * T + t) * hd + d] = val;
    }
}

/* The backward's way back: dq, dk, dv (B, H, T, hd) -> dqkv (B*T, 3, H, hd), RoPE undone on
 * dq and dk when cos is not NULL. One thread an element of dqkv: writes are coalesced. */
extern "C" __global__ void qkv_merge(const float *dq, const float *dk, const float *dv,
                                     float *dqkv, const float *cos, const float *sin, int B,
                                     int T, int H, int hd)
{
    int half = hd / 2;
    GRID_STRIDE(i, (long long)B * T * 3 * H * hd) {
        long long r = i / hd;
        int d = (int)(i - r * hd), h = (int)(r % H);
        r /= H;
        int part = (int)(r % 3);
        long long tok = r / 3;
        int t = (int)(tok % T), b = (int)(tok / T);
        const float *src = part == 0 ? dq : (part == 1 ? dk : dv);
        const float *row = src + (((size_t)b * H + h) * T + t) * hd;
        float val = row[d];
        if (cos && part < 2) {  /* the rotation by -angle */
            float c = cos[t * half + d / 2], s = sin[t * half + d / 2];
            val = (d & 1) ? row[d - 1] * -s + val * c : val * c + row[d + 1] * s;
        }
        dqkv[i] = val;
    }
}

/* ------------------------------------------------------------------ attention in tiles */
/* Causal attention without the T x T matrix (FlashAttention's scheme), in f32 on the SIMT
 * cores. A block is one warp: ATT = 32 queries of one (batch, head), one thread a query, its
 * q row and output row in registers (HD floats each: the head size rounded up to 16, 32 or
 * 64, a compile-time size so the rows stay in registers rather than local memory). The keys
 * and values come through shared memory ATT rows at a time; every thread of the warp reads
 * the same key element at once (a broadcast: no bank conflict). The scores of a tile sit in
 * ATT registers, so the running maximum and sum are rescaled once per tile, not per key.
 * Only the tiles at or before the block's own are visited: the causal mask halves the work.
 *
 * Forward: o = softmax(scale q k^T, causal) v into o (BH, T, hd) and, in token layout, into
 * out (B*T, H*hd); lse = the log-sum-exp of each row's scaled scores, for the backward. */
template <int HD>
__device__ __forceinline__ void attn_fwd_body(const float *q, const float *k, const float *v,
                                              float *o, float *out, float *lse, int H, int T,
                                              int hd, float scale)
{
    __shared__ __align__(16) float Ks[ATT][HD], Vs[ATT][HD];
    int bh = blockIdx.y, tile = blockIdx.x, tid = threadIdx.x, qi = tile * ATT + tid;
    bool valid = qi < T;
    size_t base = (size_t)bh * T * hd;
    float qr[HD], acc[HD];
#pragma unroll
    for (int d = 0; d < HD; d++) {
        qr[d] = (valid && d < hd) ? q[base + (size_t)qi * hd + d] * scale : 0.0f;
        acc[d] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (int kt = 0; kt <= tile; kt++) {
        __syncthreads();  /* the previous tile is no longer read */
        for (int e = tid; e < ATT * HD; e += ATT) {
            int r = e / HD, d = e % HD, key = kt * ATT + r;
            bool in = key < T && d < hd;
            Ks[r][d] = in ? k[base + (size_t)key * hd + d] : 0.0f;
            Vs[r][d] = in ? v[base + (size_t)key * hd + d] : 0.0f;
        }
        __syncthreads();
        float s[ATT], tmax = NEG_INF;
#pragma unroll
        for (int j = 0; j < ATT; j++) {
            float dot = 0.0f;
#pragma unroll
            for (int d = 0; d < HD; d++) dot += qr[d] * Ks[j][d];
            s[j] = kt * ATT + j <= qi ? dot : NEG_INF;  /* every tile has key kt*ATT <= qi */
            tmax = fmaxf(tmax, s[j]);
        }
        float mnew = fmaxf(m, tmax), corr = expf(m - mnew);  /* exp(-inf) = 0 at the start */
        l *= corr;
#pragma unroll
        for (int d = 0; d < HD; d++) acc[d] *= corr;
#pragma unroll
        for (int j = 0; j < ATT; j++) {
            float p = expf(s[j] - mnew);
            l += p;
#pragma unroll
            for (int d = 0; d < HD; d++) acc[d] += p * Vs[j][d];
        }
        m = mnew;
    }
    if (valid) {
        int b = bh / H, h = bh - b * H;
        float inv = 1.0f / l;
        float *orow = o + base + (size_t)qi * hd, *trow = out + (((size_t)b * T + qi) * H + h) * hd;
#pragma unroll
        for (int d = 0; d < HD; d++)
            if (d < hd) {
                orow[d] = acc[d] * inv;
                trow[d] = acc[d] * inv;
            }
        lse[(size_t)bh * T + qi] = m + logf(l);
    }
}

/* Before the backward: dO from the token layout (B*T, H*hd) into (BH, T, hd), and each row's
 * D = sum_d dO * O, the term every score's gradient subtracts (rowsum(P * dP) = rowsum(dO * O)).
 * One warp a row. */
extern "C" __global__ void attn_bwd_prep(const float *dout, const float *o, float *dO, float *D,
                                         int B, int H, int T, int hd)
{
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    long long rows = (long long)B * H * T;
    for (long long row = (long long)blockIdx.x * warps + (threadIdx.x >> 5); row < rows;
         row += (long long)gridDim.x * warps) {
        long long bh = row / T;
        int t = (int)(row - bh * T), b = (int)(bh / H), h = (int)(bh % H);
        const float *src = dout + (((size_t)b * T + t) * H + h) * hd;
        float s = 0.0f;
        for (int d = lane; d < hd; d += 32) {
            float g = src[d];
            dO[row * hd + d] = g;
            s += g * o[row * hd + d];
        }
        s = warp_sum(s);
        if (lane == 0) D[row] = s;
    }
}

/* Backward, keys' side: block (tile, bh) owns ATT keys, one thread a key, and visits every
 * query tile at or after its own, recomputing P = exp(scale q k - lse) from the forward's lse:
 *   dv += P^T dO,  dS = P * (dO v^T - D),  dk += scale dS^T q.
 * The block's own k and v rows sit in shared memory with rows padded to HD + 1 floats: thread
 * t reads row t, and the padding puts the 32 threads' elements in 32 different banks. dk and
 * dv accumulate in registers. No atomics: the queries' side is the next kernel. */
template <int HD>
__device__ __forceinline__ void attn_bwd_dkdv_body(const float *q, const float *k,
                                                   const float *v, const float *dO,
                                                   const float *lse, const float *D, float *dk,
                                                   float *dv, int T, int hd, float scale)
{
    __shared__ __align__(16) float Qs[ATT][HD], Gs[ATT][HD];
    __shared__ float Kown[ATT][HD + 1], Vown[ATT][HD + 1], Ls[ATT], Ds[ATT];
    int bh = blockIdx.y, tile = blockIdx.x, tid = threadIdx.x, kj = tile * ATT + tid;
    size_t base = (size_t)bh * T * hd;
    for (int e = tid; e < ATT * HD; e += ATT) {
        int r = e / HD, d = e % HD, key = tile * ATT + r;
        bool in = key < T && d < hd;
        Kown[r][d] = in ? k[base + (size_t)key * hd + d] : 0.0f;
        Vown[r][d] = in ? v[base + (size_t)key * hd + d] : 0.0f;
    }
    float gk[HD], gv[HD];
#pragma unroll
    for (int d = 0; d < HD; d++) gk[d] = gv[d] = 0.0f;
    int tiles = (T + ATT - 1) / ATT;
    for (int qt = tile; qt < tiles; qt++) {
        __syncthreads();
        for (int e = tid; e < ATT * HD; e += ATT) {
            int r = e / HD, d = e % HD, row = qt * ATT + r;
            bool in = row < T && d < hd;
            Qs[r][d] = in ? q[base + (size_t)row * hd + d] : 0.0f;
            Gs[r][d] = in ? dO[base + (size_t)row * hd + d] : 0.0f;
        }
        int row = qt * ATT + tid;
        Ls[tid] = row < T ? lse[(size_t)bh * T + row] : 0.0f;
        Ds[tid] = row < T ? D[(size_t)bh * T + row] : 0.0f;
        __syncthreads();
        for (int i = 0; i < ATT; i++) {
            int qi = qt * ATT + i;
            if (qi >= T || kj > qi) continue;  /* masked: only in the diagonal tile */
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int d = 0; d < HD; d++) {
                s += Kown[tid][d] * Qs[i][d];
                dp += Gs[i][d] * Vown[tid][d];
            }
            float p = expf(s * scale - Ls[i]), ds = p * (dp - Ds[i]);
#pragma unroll
            for (int d = 0; d < HD; d++) {
                gv[d] += p * Gs[i][d];
                gk[d] += ds * Qs[i][d];
            }
        }
    }
    if (kj < T) {
#pragma unroll
        for (int d = 0; d < HD; d++)
            if (d < hd) {
                dk[base + (size_t)kj * hd + d] = gk[d] * scale;
                dv[base + (size_t)kj * hd + d] = gv[d];
            }
    }
}

/* Backward, queries' side: block (tile, bh) owns ATT queries and visits the key tiles at or
 * before its own: dq = scale dS k, with dS recomputed as above. q and dq in registers, the
 * thread's own dO row in padded shared memory, keys and values through shared memory. */
template <int HD>
__device__ __forceinline__ void attn_bwd_dq_body(const float *q, const float *k, const float *v,
                                                 const float *dO, const float *lse,
                                                 const float *D, float *dq, int T, int hd,
                                                 float scale)
{
    __shared__ __align__(16) float Ks[ATT][HD], Vs[ATT][HD];
    __shared__ float Gown[ATT][HD + 1];
    int bh = blockIdx.y, tile = blockIdx.x, tid = threadIdx.x, qi = tile * ATT + tid;
    bool valid = qi < T;
    size_t base = (size_t)bh * T * hd;
    for (int e = tid; e < ATT * HD; e += ATT) {
        int r = e / HD, d = e % HD, row = tile * ATT + r;
        Gown[r][d] = (row < T && d < hd) ? dO[base + (size_t)row * hd + d] : 0.0f;
    }
    float qr[HD], gq[HD];
#pragma unroll
    for (int d = 0; d < HD; d++) {
        qr[d] = (valid && d < hd) ? q[base + (size_t)qi * hd + d] : 0.0f;
        gq[d] = 0.0f;
    }
    float L = valid ? lse[(size_t)bh * T + qi] : 0.0f, Dq = valid ? D[(size_t)bh * T + qi] : 0.0f;
    for (int kt = 0; kt <= tile; kt++) {
        __syncthreads();
        for (int e = tid; e < ATT * HD; e += ATT) {
            int r = e / HD, d = e % HD, key = kt * ATT + r;
            bool in = key < T && d < hd;
            Ks[r][d] = in ? k[base + (size_t)key * hd + d] : 0.0f;
            Vs[r][d] = in ? v[base + (size_t)key * hd + d] : 0.0f;
        }
        __syncthreads();
        for (int j = 0; j < ATT; j++) {
            if (!valid || kt * ATT + j > qi) continue;  /* masked: only in the diagonal tile */
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int d = 0; d < HD; d++) {
                s += qr[d] * Ks[j][d];
                dp += Gown[tid][d] * Vs[j][d];
            }
            float ds = expf(s * scale - L) * (dp - Dq);
#pragma unroll
            for (int d = 0; d < HD; d++) gq[d] += ds * Ks[j][d];
        }
    }
    if (valid) {
#pragma unroll
        for (int d = 0; d < HD; d++)
            if (d < hd) dq[base + (size_t)qi * hd + d] = gq[d] * scale;
    }
}

/* One kernel of each per head-size bound, written out (the emulator finds kernels by their
 * declarations): launch the smallest HD >= hd. */
extern "C" __global__ void __launch_bounds__(ATT) attn_fwd_h16(
    const float *q, const float *k, const float *v, float *o, float *out, float *lse, int H,
    int T, int hd, float scale)
{
    attn_fwd_body<16>(q, k, v, o, out, lse, H, T, hd, scale);
}

extern "C" __global__ void __launch_bounds__(ATT) attn_bwd_dkdv_h16(
    const float *q, const float *k, const float *v, const float *dO, const float *lse,
    const float *D, float *dk, float *dv, int T, int hd, float scale)
{
    attn_bwd_dkdv_body<16>(q, k, v, dO, lse, D, dk, dv, T, hd, scale);
}

extern "C" __global__ void __launch_bounds__(ATT) attn_bwd_dq_h16(
    const float *q, const float *k, const float *v, const float *dO, const float *lse,
    const float *D, float *dq, int T, int hd, float scale)
{
    attn_bwd_dq_body<16>(q, k, v, dO, lse, D, dq, T, hd, scale);
}

extern "C" __global__ void __launch_bounds__(ATT) attn_fwd_h32(
    const float *q, const float *k, const float *v, float *o, float *out, float *lse, int H,
    int T, int hd, float scale)
{
    attn_fwd_body<32>(q, k, v, o, out, lse, H, T, hd, scale);
}

extern "C" __global__ void __launch_bounds__(ATT) attn_bwd_dkdv_h32(
    const float *q, const float *k, const float *v, const float *dO, const float *lse,
    const float *D, float *dk, float *dv, int T, int hd, float scale)
{
    attn_bwd_dkdv_body<32>(q, k, v, dO, lse, D, dk, dv, T, hd, scale);
}

extern "C" __global__ void __launch_bounds__(ATT) attn_bwd_dq_h32(
    const float *q, const float *k, const float *v, const float *dO, const float *lse,
    const float *D, float *dq, int T, int hd, float scale)
{
    attn_bwd_dq_body<32>(q, k, v, dO, lse, D, dq, T, hd, scale);
}

extern "C" __global__ void __launch_bounds__(ATT) attn_fwd_h64(
    const float *q, const float *k, const float *v, float *o, float *out, float *lse, int H,
    int T, int hd, float scale)
{
    attn_fwd_body<64>(q, k, v, o, out, lse, H, T, hd, scale);
}

extern "C" __global__ void __launch_bounds__(ATT) attn_bwd_dkdv_h64(
    const float *q, const float *k, const float *v, const float *dO, const float *lse,
    const float *D, float *dk, float *dv, int T, int hd, float scale)
{
    attn_bwd_dkdv_body<64>(q, k, v, dO, lse, D, dk, dv, T, hd, scale);
}

extern "C" __global__ void __launch_bounds__(ATT) attn_bwd_dq_h64(
    const float *q, const float *k, const float *v, const float *dO, const float *lse,
    const float *D, float *dq, int T, int hd, float scale)
{
    attn_bwd_dq_body<64>(q, k, v, dO, lse, D, dq, T, hd, scale);
}

/* ------------------------------------------------------------------ cross-entropy */
/* One warp a row of V logits: losses[n] = logsumexp(z) - z[target] and
 * dlogits = (softmax(z) - onehot(target)) * dscale (dscale = 1/N: the mean loss's gradient).
 * The exponentials are written into dlogits on the way and scaled in place. A target outside
 * [0, V) gives a NaN loss and a zero gradient row (the host never reads targets back). */
extern "C" __global__ void cross_entropy(const float *logits, const int *targets, float *losses,
                                         float *dlogits, int N, int V, float dscale)
{
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += gridDim.x * warps) {
        const float *z = logits + (size_t)row * V;
        float *d = dlogits + (size_t)row * V;
        int t = targets[row];  /* the same for the whole warp: the branch does not diverge */
        if (t < 0 || t >= V) {
            for (int c = lane; c < V; c += 32) d[c] = 0.0f;
            if (lane == 0) losses[row] = QNAN;
            continue;
        }
        float m = NEG_INF;
        for (int c = lane; c < V; c += 32) m = fmaxf(m, z[c]);
        m = warp_max(m);
        float s = 0.0f;
        for (int c = lane; c < V; c += 32) {
            float e = expf(z[c] - m);
            d[c] = e;
            s += e;
        }
        s = warp_sum(s);
        float inv = dscale / s;
        for (int c = lane; c < V; c += 32) d[c] = c == t ? d[c] * inv - dscale : d[c] * inv;
        if (lane == 0) losses[row] = logf(s) + m - z[t];
    }
}

/* ------------------------------------------------------------------ sums, the norm, AdamW */
/* The block's doubles (one a thread, blockDim.x a power of two up to SUM_THREADS) summed by a
 * tree in shared memory, in a fixed order. */
__device__ __forceinline__ double block_sum(double s)
{
    __shared__ double sh[SUM_THREADS];
    sh[threadIdx.x] = s;
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        __syncthreads();
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    }
    __syncthreads();
    return sh[0];
}

/* part[block] = the sum of x (square != 0: of x^2) over the block's grid-stride elements, in
 * double: millions of small squares summed in f32 would lose the smallest. The partial sums
 * are added in a fixed order (sum_finish, norm_finish), so for a given grid the result is the
 * same bits every run: a resumed run clips exactly as the uninterrupted one. */
extern "C" __global__ void sum_partial(const float *x, long long n, int square, double *part)
{
    double s = 0.0;
    GRID_STRIDE(i, n) {
        double v = x[i];
        s += square ? v * v : v;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

/* out[0] = scale * (the sum of the parts). One block. */
extern "C" __global__ void sum_finish(const double *part, int parts, double scale, double *out)
{
    double s = 0.0;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) s += part[i];
    s = block_sum(s);
    if (threadIdx.x == 0) out[0] = s * scale;
}

/* From the parts of the gradient's sum of squares: out[0] = its norm, out[1] = the factor
 * that clips it to ``clip``, min(1, clip / (norm + 1e-6)), or 1 where clip <= 0. Both stay on
 * the device: AdamW and Muon read out[1] from there. One block. */
extern "C" __global__ void norm_finish(const double *part, int parts, double clip, double *out)
{
    double s = 0.0;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) s += part[i];
    s = block_sum(s);
    if (threadIdx.x == 0) {
        double norm = sqrt(s);
        out[0] = norm;
        out[1] = clip > 0.0 ? fmin(1.0, clip / (norm + 1e-6)) : 1.0;
    }
}

/* x = g / (sqrt(ss[0]) + eps), the sum of squares ss read on the device (Newton-Schulz's
 * start, X = G / |G|). */
extern "C" __global__ void scale_inv_norm(const float *g, float *x, long long n,
                                          const double *ss, double eps)
{
    float f = (float)(1.0 / (sqrt(ss[0]) + eps));
    GRID_STRIDE(i, n) x[i] = g[i] * f;
}

/* y = alpha x + beta y (beta == 0: y is not read): the products' alpha and beta. */
extern "C" __global__ void axpby(const float *x, float *y, long long n, float alpha, float beta)
{
    GRID_STRIDE(i, n) y[i] = beta != 0.0f ? alpha * x[i] + beta * y[i] : alpha * x[i];
}

/* AdamW in PyTorch's order, as kernels_c/layers.c's adamw: decay the weight, update both
 * moments, step by lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps). The gradient is scaled by
 * gmul * gscale[0], gscale the clipping factor norm_finish left on the device (NULL: 1), so
 * clipping costs no trip to the host. 16 bytes read and 12 written per parameter: memory-
 * bound, hence one pass. */
extern "C" __global__ void adamw(float *p, const float *g, float *m, float *v, long long n,
                                 float lr, float beta1, float beta2, float eps, float wd,
                                 const double *gscale, float gmul, float bc1, float bc2)
{
    float scale = gscale ? (float)gscale[0] * gmul : gmul;
    float decay = 1.0f - lr * wd, step = lr / bc1, rbc2 = 1.0f / sqrtf(bc2);
    GRID_STRIDE(i, n) {
        float gi = g[i] * scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - step * mi / (sqrtf(vi) * rbc2 + eps);
    }
}
