/* Chapter 4 on the GPU: one token's forward, kernel by kernel (smallem.generating.gpu_decode).
 *
 * A decode step multiplies one row by every weight matrix: each weight is read once and used
 * for one multiply-add, so the step is bound by how fast the weights stream from memory, and
 * the kernels are built for the stream: every matrix is stored with its output rows
 * contiguous (W^T, N x K: row j holds the K weights of output j), the lanes of a row (a whole
 * warp on a wide row, fewer on a narrow one) walk it with 16-byte loads, and a shuffle sum ends
 * it. Int8 weights (Q8_0) stream a quarter of f32's bytes, plus a scale a block of 32.
 *
 * The step's token and position live in device memory (state[0] = the position, tokens[p] =
 * the token at position p), so the same sequence of launches, recorded once as a CUDA graph,
 * serves every token: the last kernel (pick_token) chooses the next token, writes it into the
 * token buffer and advances the position, and the host only reads the tokens at the end.
 *
 * Caches: keys and values of one layer (heads, context, hd), float32. Sizes need not be
 * multiples of anything except where a kernel says so. No header is included: NVRTC has none.
 * tests/test_cuda_decode.py runs every kernel on the CPU (tests/cuda_emu).
 */

#define FULL_MASK 0xffffffffu
#define NEG_BIG (-3.0e38f)
#define QK 32 /* int8 values per scale (ggml's Q8_0 block) */

/* the attention's scores and query (attend): its block's dynamic shared memory */
extern __shared__ __align__(16) float dyn_smem[];

static __device__ __forceinline__ bool aligned16(const void *p)
{
    return (((unsigned long long)p) & 15ull) == 0;
}

static __device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

/* The sum (or max) over a block of whole warps, returned to every thread: each warp reduces
 * with shuffles, lane 0 posts its warp's value in red[] (shared, 32 floats), and every warp
 * then reduces the posted values itself, in the same order, so all threads hold the same bits.
 * The first barrier frees red[] from an earlier call. */
static __device__ float block_reduce(float v, float *red, bool is_max)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = is_max ? warp_max(v) : warp_sum(v);
    if (warps == 1) return v; /* one warp: its shuffles were the whole reduction */
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < warps ? red[lane] : (is_max ? NEG_BIG : 0.0f);
    return is_max ? warp_max(v) : warp_sum(v);
}

/* --8<-- [start:matvec] */
/* The rows of a warp: `lanes` (a power of two, 1 .. 32) lanes to an output row, 32 / lanes
 * rows a warp. The decoder gives a row as many lanes as make each lane load about four of its
 * 16-byte chunks (gpu_decode.lanes_for): four loads in flight a lane, and a narrow row (K = 32
 * is 8 float4) does not leave most of a warp idle. The lanes of a row are an aligned group:
 * their sum is log2(lanes) xor-shuffles within it. */
struct RowLanes {
    int row, sub; /* this lane's output row, and its place among the row's lanes */
};

static __device__ __forceinline__ RowLanes row_lanes(int lanes)
{
    const int lane = threadIdx.x & 31, warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    return {warp * (32 / lanes) + lane / lanes, lane & (lanes - 1)};
}

static __device__ __forceinline__ float group_sum(float v, int lanes)
{
    for (int o = lanes >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

/* y = x W (+ bias) for one row x (K) and W^T (N x K, row j = output j's weights), f32; with
 * accumulate, y += x W (+ bias): the residual add comes free. A row's lanes read consecutive
 * float4 of it (a warp reads 512 contiguous bytes when lanes = 32: one coalesced request),
 * multiply them by the same float4 of x (read by every warp: it stays in L1) and add their
 * partial sums with shuffles. Rows not a multiple of 4 long (or not 16-byte aligned) take
 * scalar loads. Launch with whole warps: ceil(N / (32 / lanes)) warps in all. */
extern "C" __global__ void __launch_bounds__(256)
matvec_f32(const float *__restrict__ W, const float *__restrict__ x,
           const float *__restrict__ bias, float *__restrict__ y, int K, int N, int lanes,
           int accumulate)
{
    const RowLanes rl = row_lanes(lanes);
    if (rl.row - (int)(threadIdx.x & 31) / lanes >= N) return; /* the whole warp leaves */
    const bool mine = rl.row < N; /* a row past N still joins its warp's shuffles */
    const float *w = W + (size_t)(mine ? rl.row : 0) * K;
    float s = 0.0f;
    int k = 0;
    if ((K & 3) == 0 && aligned16(W) && aligned16(x)) {
        const float4 *w4 = reinterpret_cast<const float4 *>(w);
        const float4 *x4 = reinterpret_cast<const float4 *>(x);
        const int K4 = mine ? K >> 2 : 0;
#pragma unroll 4
        for (int i = rl.sub; i < K4; i += lanes) {
            const float4 a = w4[i], b = x4[i];
            s += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
        }
        k = K;
    }
    if (mine)
        for (int i = k + rl.sub; i < K; i += lanes) s += w[i] * x[i];
    s = group_sum(s, lanes);
    if (mine && rl.sub == 0) {
        const float v = s + (bias ? bias[rl.row] : 0.0f);
        y[rl.row] = accumulate ? y[rl.row] + v : v;
    }
}
/* --8<-- [end:matvec] */

/* --8<-- [start:quantize] */
/* f32 -> the nearest float16 (ties to even) -> f32, in bits (no half type without headers):
 * the scale of an activation block is kept at f16 precision, as ggml's Q8_0 and the CPU
 * decoder keep it, so the GPU's integers are the CPU's. */
static __device__ float f16_round(float f)
{
    const unsigned u = __float_as_uint(f), sign = u & 0x80000000u, a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return f;                                  /* inf, NaN */
    if (a >= 0x477ff000u) return __uint_as_float(sign | 0x7f800000u); /* past 65504 */
    if (a < 0x38800000u) { /* below f16's smallest normal: a multiple of 2^-24 */
        const float m = (float)__float2int_rn(__uint_as_float(a) * 16777216.0f);
        return __uint_as_float(sign | __float_as_uint(m * 5.9604644775390625e-8f));
    }
    return __uint_as_float(sign | ((a + 0x0fffu + ((a >> 13) & 1u)) & ~0x1fffu));
}

/* One activation row x (K) to int8 per block of 32 (ggml's Q8_0, as the CPU decoder does):
 * xs[b] = f16(max|x| / 127), xq = round-half-even(x * 127 / max|x|), zero past K up to
 * K32 = K rounded up to 32. One warp a block: lane i holds x[32 b + i], a shuffle max finds
 * the block's max|x|. Launch with whole warps, ceil(K32 / 32) warps in all. */
extern "C" __global__ void __launch_bounds__(256)
quantize_q8(const float *__restrict__ x, int K, signed char *__restrict__ xq,
            float *__restrict__ xs)
{
    const int lane = threadIdx.x & 31;
    const int b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (b * QK >= K) return; /* past the last block: the whole warp */
    const int k = b * QK + lane;
    const float v = k < K ? x[k] : 0.0f;
    const float amax = warp_max(fabsf(v));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    xq[k] = (signed char)__float2int_rn(v * id);
    if (lane == 0) xs[b] = f16_round(amax / 127.0f);
}
/* --8<-- [end:quantize] */

/* float16 bits -> f32, exact (the weights' block scales are stored as ggml's Q8_0 stores them,
 * two bytes each: 34 bytes a block of 32 weights, not 36) */
static __device__ __forceinline__ float f16_bits_to_f32(unsigned short h)
{
    const unsigned sign = (unsigned)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) { /* zero or subnormal: m 2^-24 */
        const float f = (float)m * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    const unsigned ebits = e == 31 ? 0x7f800000u : (e + 112) << 23; /* inf/NaN, or rebias */
    return __uint_as_float(sign | ebits | (m << 13));
}

/* --8<-- [start:dp4a] */
/* y = x W (+ bias, or y += with accumulate) over Q8_0 weights: Wq (N x K32 int8, row j =
 * output j) with one scale per block of 32 (Ws, N x K32/32 float16 bits), against the activation
 * quantised by quantize_q8 (xq, xs). Each lane loads 16 weights and 16 activations (one int4
 * each: a warp reads 512 contiguous bytes of a row when lanes = 32) and sums their products
 * with four __dp4a (four int8 products and their sum, one instruction), exact in int32. A
 * block of 32 spans two lanes: one shuffle adds the pair's sums, and the even lane scales the
 * block's integer by both scales, as the CPU decoder's Q8_0 dot does. A quarter of f32's
 * bytes and a quarter of its instructions. lanes: 2 .. 32, a power of two (as matvec_f32;
 * a pair of lanes shares a block). */
extern "C" __global__ void __launch_bounds__(256)
matvec_q8_dp4a(const signed char *__restrict__ Wq, const unsigned short *__restrict__ Ws,
               const signed char *__restrict__ xq, const float *__restrict__ xs,
               const float *__restrict__ bias, float *__restrict__ y, int K32, int N, int lanes,
               int accumulate)
{
    const RowLanes rl = row_lanes(lanes);
    if (rl.row - (int)(threadIdx.x & 31) / lanes >= N) return; /* the whole warp */
    const bool mine = rl.row < N;
    const int4 *w = reinterpret_cast<const int4 *>(Wq + (size_t)(mine ? rl.row : 0) * K32);
    const int4 *a = reinterpret_cast<const int4 *>(xq);
    const unsigned short *ws = Ws + (size_t)(mine ? rl.row : 0) * (K32 / QK);
    const int n16 = K32 >> 4; /* 16-byte chunks in a row */
    float s = 0.0f;
    for (int base = 0; base < n16; base += lanes) { /* every lane takes part in the shuffle */
        const int c = base + rl.sub;
        int isum = 0;
        if (mine && c < n16) {
            const int4 wv = w[c], av = a[c];
            isum = __dp4a(wv.x, av.x, isum);
            isum = __dp4a(wv.y, av.y, isum);
            isum = __dp4a(wv.z, av.z, isum);
            isum = __dp4a(wv.w, av.w, isum);
        }
        isum += __shfl_xor_sync(FULL_MASK, isum, 1);
        if (mine && c < n16 && (c & 1) == 0)
            s += (float)isum * (f16_bits_to_f32(ws[c >> 1]) * xs[c >> 1]);
    }
    s = group_sum(s, lanes);
    if (mine && rl.sub == 0) {
        const float v = s + (bias ? bias[rl.row] : 0.0f);
        y[rl.row] = accumulate ? y[rl.row] + v : v;
    }
}
/* --8<-- [end:dp4a] */

/* --8<-- [start:q8_f32] */
/* The same product without dp4a: the int8 weights widened to float and multiplied by the f32
 * activation x (K floats; no quantisation of x), each lane's 16 products scaled by its
 * block's weight scale. Same bytes of weights as matvec_q8_dp4a, four times the instructions
 * (a conversion and an FMA per weight): on a wide layer the memory hides them, on a narrow one
 * it does not, which is what the decoder's dp4a switch measures. lanes: 1 .. 32, a power of
 * two (as matvec_f32). */
extern "C" __global__ void __launch_bounds__(256)
matvec_q8_f32(const signed char *__restrict__ Wq, const unsigned short *__restrict__ Ws,
              const float *__restrict__ x, const float *__restrict__ bias,
              float *__restrict__ y, int K, int K32, int N, int lanes, int accumulate)
{
    const RowLanes rl = row_lanes(lanes);
    if (rl.row - (int)(threadIdx.x & 31) / lanes >= N) return; /* the whole warp */
    const bool mine = rl.row < N;
    const int4 *w = reinterpret_cast<const int4 *>(Wq + (size_t)(mine ? rl.row : 0) * K32);
    const unsigned short *ws = Ws + (size_t)(mine ? rl.row : 0) * (K32 / QK);
    const bool vec = aligned16(x);
    const int n16 = mine ? K32 >> 4 : 0;
    float s = 0.0f;
    for (int c = rl.sub; c < n16; c += lanes) {
        const int4 wv = w[c];
        const int k = c << 4;
        float xv[16];
        if (vec && k + 16 <= K) {
            const float4 *x4 = reinterpret_cast<const float4 *>(x + k);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float4 t = x4[i];
                xv[4 * i] = t.x, xv[4 * i + 1] = t.y, xv[4 * i + 2] = t.z, xv[4 * i + 3] = t.w;
            }
        } else { /* the row's last, partial block */
#pragma unroll
            for (int i = 0; i < 16; i++) xv[i] = k + i < K ? x[k + i] : 0.0f;
        }
        const int words[4] = {wv.x, wv.y, wv.z, wv.w};
        float p = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++)
            p += (float)(signed char)(words[i >> 2] >> (8 * (i & 3))) * xv[i];
        s += p * f16_bits_to_f32(ws[c >> 1]);
    }
    s = group_sum(s, lanes);
    if (mine && rl.sub == 0) {
        const float v = s + (bias ? bias[rl.row] : 0.0f);
        y[rl.row] = accumulate ? y[rl.row] + v : v;
    }
}
/* --8<-- [end:q8_f32] */

/* --8<-- [start:norm] */
/* LayerNorm (rms = 0: (x - mean) / sqrt(var + eps) w + b) or RMSNorm (rms = 1: x /
 * sqrt(mean(x^2) + eps) w, b unused) of each row of x (rows x d) into y. One block a row,
 * whole warps; the mean and the variance are two block sums (the variance of x - mean, not
 * E[x^2] - mean^2, which cancels). */
extern "C" __global__ void __launch_bounds__(256)
norm_rows(const float *__restrict__ x, const float *__restrict__ w,
          const float *__restrict__ b, float *__restrict__ y, int d, float eps, int rms)
{
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * d;
    float *yr = y + (size_t)blockIdx.x * d;
    float mean = 0.0f;
    if (!rms) {
        float s = 0.0f;
        for (int i = threadIdx.x; i < d; i += blockDim.x) s += xr[i];
        mean = block_reduce(s, red, false) / (float)d;
    }
    float q = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float v = xr[i] - mean;
        q += v * v;
    }
    const float r = rsqrtf(block_reduce(q, red, false) / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        yr[i] = (xr[i] - mean) * r * w[i] + (rms || !b ? 0.0f : b[i]);
}
/* --8<-- [end:norm] */

/* --8<-- [start:embed] */
/* x[r] = wte[token] (+ wpe[position]) for rows r = 0 .. rows-1 at positions state[0] + r, the
 * token read from the token buffer at its position: the step's input never comes from the
 * host. A token outside [0, vocab) or a position past the context writes NaN, so a wrong
 * index shows in the logits instead of reading another row. One block a row. */
extern "C" __global__ void __launch_bounds__(256)
embed(const float *__restrict__ wte, const float *__restrict__ wpe, const int *__restrict__ tokens,
      const int *__restrict__ state, float *__restrict__ x, int d, int vocab, int context)
{
    const int p = state[0] + (int)blockIdx.x;
    const int t = p < context ? tokens[p] : -1;
    const bool ok = p < context && t >= 0 && t < vocab;
    float *xr = x + (size_t)blockIdx.x * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        xr[i] = ok ? wte[(size_t)t * d + i] + (wpe ? wpe[(size_t)p * d + i] : 0.0f)
                   : __uint_as_float(0x7fc00000u);
}
/* --8<-- [end:embed] */

/* --8<-- [start:rope_append] */
/* For rows r of qkv (rows x ld; q, k, v of H heads of hd each, side by side) at positions
 * p = state[0] + r: RoPE turns q (in place) and k by p theta_i, pairs (2i, 2i + 1) (cos, sin:
 * context x hd/2 tables; NULL for GPT-2's block: no turn), and k and v are written into the
 * layer's cache (kc, vc: H x context x hd) at p. Rows past the context are skipped. One
 * block a row, a thread a pair. */
extern "C" __global__ void __launch_bounds__(256)
rope_append(float *__restrict__ qkv, int ld, const float *__restrict__ cos_t,
            const float *__restrict__ sin_t, float *__restrict__ kc, float *__restrict__ vc,
            const int *__restrict__ state, int H, int hd, int context)
{
    const int p = state[0] + (int)blockIdx.x;
    if (p >= context) return;
    const int half = hd >> 1, d = H * hd, pairs = H * ((hd + 1) >> 1);
    float *q = qkv + (size_t)blockIdx.x * ld, *k = q + d, *v = q + 2 * d;
    for (int e = threadIdx.x; e < pairs; e += blockDim.x) {
        const int h = e / ((hd + 1) >> 1), i = e % ((hd + 1) >> 1);
        const int at = h * hd + 2 * i;
        const size_t to = ((size_t)h * context + p) * hd + 2 * i;
        float k0 = k[at], q0 = q[at];
        if (2 * i + 1 < hd) {
            float k1 = k[at + 1], q1 = q[at + 1];
            if (cos_t && i < half) {
                const float c = cos_t[(size_t)p * half + i], s = sin_t[(size_t)p * half + i];
                const float qa = q0 * c - q1 * s, qb = q0 * s + q1 * c;
                const float ka = k0 * c - k1 * s, kb = k0 * s + k1 * c;
                q[at] = qa, q[at + 1] = qb, k0 = ka, k1 = kb;
            }
            kc[to + 1] = k1;
            vc[to + 1] = v[at + 1];
        }
        kc[to] = k0;
        vc[to] = v[at];
    }
}
/* --8<-- [end:rope_append] */

/* --8<-- [start:attend] */
/* Attention of the query of each row r (in qkv, rows x ld, head h at h hd) over the layer's
 * cache at positions 0 .. p, p = state[0] + r (causal: a prompt's row sees itself and what
 * is before it), into out (rows x out_ld, head h at h hd). A block a (head, row): grid (H,
 * rows). Two passes over the scores, kept in shared memory: a thread a position for q.k
 * (q, pre-scaled, in shared memory is read by all threads at once, a broadcast; each
 * thread walks its own key row), the block's max, exp and their sum; then the values:
 * thread (g, i) adds position g, g + G, ... of column i (G = blockDim / hd groups: a group
 * reads one value row, coalesced), and the G partial sums are combined in shared memory.
 * Needs blockDim >= hd and dynamic shared memory of (hd4 + context + blockDim) floats, hd4 =
 * hd rounded up to 4. */
extern "C" __global__ void __launch_bounds__(256)
attend(const float *__restrict__ qkv, int ld, const float *__restrict__ kc,
       const float *__restrict__ vc, float *__restrict__ out, int out_ld,
       const int *__restrict__ state, int hd, int context, float scale)
{
    __shared__ float red[32];
    const int h = blockIdx.x, r = blockIdx.y, tid = threadIdx.x, nt = blockDim.x;
    const int p = state[0] + r;
    if (p >= context) return; /* the whole block */
    const int hd4 = (hd + 3) & ~3;
    float *sq = dyn_smem, *sc = dyn_smem + hd4, *part = sc + context;
    const float *qr = qkv + (size_t)r * ld + (size_t)h * hd;
    for (int i = tid; i < hd; i += nt) sq[i] = qr[i] * scale;
    __syncthreads();
    const float *K = kc + (size_t)h * context * hd, *V = vc + (size_t)h * context * hd;
    float m = NEG_BIG;
    for (int t = tid; t <= p; t += nt) {
        const float *kr = K + (size_t)t * hd;
        float s = 0.0f;
        if ((hd & 3) == 0 && aligned16(kr)) {
            const float4 *k4 = reinterpret_cast<const float4 *>(kr);
            for (int i = 0; i < (hd >> 2); i++) {
                const float4 kv = k4[i];
                s += sq[4 * i] * kv.x + sq[4 * i + 1] * kv.y + sq[4 * i + 2] * kv.z
                     + sq[4 * i + 3] * kv.w;
            }
        } else {
            for (int i = 0; i < hd; i++) s += sq[i] * kr[i];
        }
        sc[t] = s;
        m = fmaxf(m, s);
    }
    m = block_reduce(m, red, true);
    float l = 0.0f;
    for (int t = tid; t <= p; t += nt) {
        const float e = expf(sc[t] - m);
        sc[t] = e;
        l += e;
    }
    l = block_reduce(l, red, false); /* its barriers also publish sc[] */
    const int G = nt / hd, g = tid / hd, i = tid % hd;
    if (g < G) {
        float acc = 0.0f;
        for (int t = g; t <= p; t += G) acc += sc[t] * V[(size_t)t * hd + i];
        part[g * hd + i] = acc;
    }
    __syncthreads();
    if (tid < hd) {
        float acc = 0.0f;
        for (int j = 0; j < G; j++) acc += part[j * hd + tid];
        out[(size_t)r * out_ld + (size_t)h * hd + tid] = acc / l;
    }
}
/* --8<-- [end:attend] */

/* --8<-- [start:mlp_act] */
/* The MLP's nonlinearity for rows of u: GELU (swiglu = 0; tanh form, GPT-2's; u and g rows x
 * hidden) or SwiGLU (swiglu = 1; u rows x 2 hidden, gate then up: g = silu(gate) up). A
 * thread an element, grid-stride. */
extern "C" __global__ void __launch_bounds__(256)
mlp_act(const float *__restrict__ u, float *__restrict__ g, int hidden, int rows, int swiglu)
{
    const long long n = (long long)rows * hidden;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n;
         e += (long long)gridDim.x * blockDim.x) {
        const long long r = e / hidden, i = e % hidden;
        if (swiglu) {
            const float a = u[r * 2 * hidden + i], b = u[r * 2 * hidden + hidden + i];
            g[e] = a / (1.0f + expf(-a)) * b;
        } else {
            const float a = u[e];
            g[e] = 0.5f * a * (1.0f + tanhf(0.7978845608f * (a + 0.044715f * a * a * a)));
        }
    }
}
/* --8<-- [end:mlp_act] */

/* dst (rows x n) += src (if given) + bias (if given, one a column): the prompt's bias and
 * residual adds after its GEMMs. Grid-stride. */
extern "C" __global__ void __launch_bounds__(256)
add_rows(float *__restrict__ dst, const float *__restrict__ src, const float *__restrict__ bias,
         int rows, int n)
{
    const long long total = (long long)rows * n;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x)
        dst[e] += (src ? src[e] : 0.0f) + (bias ? bias[e % n] : 0.0f);
}

/* --8<-- [start:pick] */
/* A counter-based random number: a hash of (seed, position, token), so a draw depends on
 * nothing kept between launches and a replayed graph draws the same numbers. Three rounds of
 * a 32-bit finaliser (xor-shift, multiply by an odd constant). */
static __device__ __forceinline__ unsigned mix32(unsigned h)
{
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    return h;
}

static __device__ __forceinline__ unsigned draw_bits(unsigned seed, unsigned pos, unsigned i)
{
    return mix32(i * 0x9e3779b9u ^ mix32(pos * 0x85ebca77u ^ mix32(seed + 0x165667b1u)));
}

/* (score, index) pairs: the larger score wins, the smaller index on a tie, and a NaN beats
 * everything (numpy's argmax returns the first NaN). */
static __device__ __forceinline__ bool beats(float s, int i, float t, int j)
{
    const bool sn = s != s, tn = t != t;
    if (sn != tn) return sn;
    if (!sn && s != t) return s > t;
    return i < j;
}

/* The next token from logits (V): temperature 0 takes the argmax; temperature T > 0 draws
 * from softmax(logits / T) by the Gumbel-max trick, argmax of logits + T g with g =
 * -log(-log u) and u uniform in (0, 1) from the hash of (seed, position, token), position =
 * the one the new token will take. With advance, the position counter moves on first
 * (state[0] += 1: the step just run filled the cache there); the token is written at
 * tokens[state[0]] (if below capacity). One block of whole warps. */
extern "C" __global__ void __launch_bounds__(1024)
pick_token(const float *__restrict__ logits, int V, float temperature, unsigned seed,
           int *__restrict__ state, int *__restrict__ tokens, int capacity, int advance)
{
    __shared__ float best_s[32];
    __shared__ int best_i[32];
    const int p = state[0] + (advance ? 1 : 0);
    float bs = NEG_BIG;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float s = logits[i];
        if (temperature > 0.0f) {
            const unsigned bits = draw_bits(seed, (unsigned)p, (unsigned)i) >> 8; /* 24 bits */
            const float u = ((float)bits + 0.5f) * 5.9604644775390625e-8f;   /* in (0, 1) */
            s += temperature * -logf(-logf(u));
        }
        if (beats(s, i, bs, bi)) bs = s, bi = i;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float os = __shfl_xor_sync(FULL_MASK, bs, o);
        const int oi = __shfl_xor_sync(FULL_MASK, bi, o);
        if (beats(os, oi, bs, bi)) bs = os, bi = oi;
    }
    const int lane = threadIdx.x & 31, warps = (blockDim.x + 31) >> 5;
    if (lane == 0) best_s[threadIdx.x >> 5] = bs, best_i[threadIdx.x >> 5] = bi;
    __syncthreads(); /* also: every thread has read state[0] before it changes */
    if (threadIdx.x == 0) {
        for (int w = 1; w < warps; w++)
            if (beats(best_s[w], best_i[w], bs, bi)) bs = best_s[w], bi = best_i[w];
        if (bi >= V) bi = 0; /* V == 0 */
        if (advance) state[0] = p;
        if (p < capacity) tokens[p] = bi;
    }
}
/* --8<-- [end:pick] */

/* tokens[state[0]] = token: a host's token (decoder.step) enters the buffer as a kernel
 * argument, no copy. One thread. */
extern "C" __global__ void put_token(const int *__restrict__ state, int *__restrict__ tokens,
                                     int token, int capacity)
{
    if (threadIdx.x == 0 && blockIdx.x == 0 && state[0] < capacity) tokens[state[0]] = token;
}

/* state[0] += n: after a prompt of n rows, or a step that picks no token. One thread. */
extern "C" __global__ void advance_position(int *state, int n)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) state[0] += n;
}
