/* Chapter 1 on the GPU: how fast the arithmetic units and the memories are.
 *
 * No header is included (NVRTC has none of its own); bf16 values are raw 16-bit patterns and
 * the tensor cores are reached with the PTX wmma instructions.
 */

/* --8<-- [start:fma] */
/* f32 FMA peak on the CUDA cores. Each thread runs FMA_CHAINS independent chains, so a warp
 * always has an FMA whose inputs are ready: with a 4-cycle FMA latency a scheduler needs 4
 * independent warp-FMAs in flight to issue one every cycle, and 8 chains x several warps per
 * scheduler give far more. a and b come from the caller, so nothing can be folded away.
 * FLOP = 2 * FMA_CHAINS * FMA_UNROLL * iters * threads. */
#define FMA_CHAINS 8
#define FMA_UNROLL 16
extern "C" __global__ void fma_f32(float *out, int iters, float a, float b)
{
    float x[FMA_CHAINS];
#pragma unroll
    for (int c = 0; c < FMA_CHAINS; c++) x[c] = threadIdx.x + c;
    for (int i = 0; i < iters; i++) {
#pragma unroll
        for (int u = 0; u < FMA_UNROLL; u++)
#pragma unroll
            for (int c = 0; c < FMA_CHAINS; c++) x[c] = fmaf(x[c], a, b);
    }
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < FMA_CHAINS; c++) s += x[c];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;  /* keeps every chain alive */
}
/* --8<-- [end:fma] */

/* --8<-- [start:mma] */
/* bf16 tensor-core peak: each warp repeats MMA_CHAINS independent 16 x 16 x 16 products
 * (8192 FLOP each) on fragments that never leave its registers, so neither memory nor shared
 * memory is involved. FLOP = 8192 * MMA_CHAINS * iters * warps. */
#define MMA_CHAINS 4
extern "C" __global__ void mma_bf16(float *out, int iters, unsigned seed)
{
    unsigned a[4], b[4];
    float c[MMA_CHAINS][8];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        /* small bf16 pairs that depend on the seed: 0x3c00 is 2^-7 */
        a[q] = 0x3c003c00u ^ (seed & 0x00ff00ffu);
        b[q] = 0x3c003c00u ^ ((seed >> 8) & 0x00ff00ffu) ^ threadIdx.x;
    }
#pragma unroll
    for (int k = 0; k < MMA_CHAINS; k++)
#pragma unroll
        for (int q = 0; q < 8; q++) c[k][q] = 0.0f;
    for (int i = 0; i < iters; i++) {
#pragma unroll
        for (int k = 0; k < MMA_CHAINS; k++)
            asm volatile("wmma.mma.sync.aligned.row.col.m16n16k16.f32.bf16.bf16.f32 "
                         "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, {%12,%13,%14,%15}, "
                         "{%0,%1,%2,%3,%4,%5,%6,%7};"
                         : "+f"(c[k][0]), "+f"(c[k][1]), "+f"(c[k][2]), "+f"(c[k][3]),
                           "+f"(c[k][4]), "+f"(c[k][5]), "+f"(c[k][6]), "+f"(c[k][7])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]),
                           "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]));
    }
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < MMA_CHAINS; k++)
#pragma unroll
        for (int q = 0; q < 8; q++) s += c[k][q];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
/* --8<-- [end:mma] */

/* --8<-- [start:read] */
/* The memory staircase: read a working set of n4 float4 (n4 a power of two) `total` float4
 * loads in all, so small sets are read many times over and stay in L2, large ones stream from
 * HBM. ld.global.cg caches in L2 only: the per-SM L1 (256 KB) would otherwise answer repeated
 * reads of small sets and we would measure L1. Four independent loads per trip keep enough
 * bytes in flight (bandwidth x latency: about 4.8 TB/s x 600 ns = 2.9 MB for the whole chip). */
__device__ __forceinline__ float4 load_cg(const float4 *p)
{
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}

extern "C" __global__ void read_f32x4(const float4 *x, long long n4, long long total,
                                      float *out)
{
    long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long mask = n4 - 1;
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (; i + 3 * stride < total; i += 4 * stride) {
        float4 v0 = load_cg(x + (i & mask));
        float4 v1 = load_cg(x + ((i + stride) & mask));
        float4 v2 = load_cg(x + ((i + 2 * stride) & mask));
        float4 v3 = load_cg(x + ((i + 3 * stride) & mask));
        s.x += v0.x + v1.x + v2.x + v3.x;
        s.y += v0.y + v1.y + v2.y + v3.y;
        s.z += v0.z + v1.z + v2.z + v3.z;
        s.w += v0.w + v1.w + v2.w + v3.w;
    }
    for (; i < total; i += stride) {
        float4 v = load_cg(x + (i & mask));
        s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
    }
    /* a store that (almost) never happens still forces every load to be done */
    if (s.x + s.y + s.z + s.w == -1.0f) out[0] = s.x;
}
/* --8<-- [end:read] */

/* --8<-- [start:copy] */
/* Copy n4 float4: the HBM figure that counts read and written bytes, like STREAM's copy. */
extern "C" __global__ void copy_f32x4(const float4 *x, float4 *y, long long n4)
{
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride)
        y[i] = x[i];
}
/* --8<-- [end:copy] */
