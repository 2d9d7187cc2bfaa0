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

/* --8<-- [start:wgmma] */
/* bf16 tensor-core peak on Hopper (sm_90a): wgmma, the instruction of Hopper's own matrix
 * kernels. mma_bf16 above issues the Ampere-era warp instruction, which a Hopper SM runs at a
 * fraction of its tensor rate. Here a warpgroup - 4 consecutive warps, one on each of the SM's
 * four tensor cores - issues wgmma.mma_async m64n128k16: a 64 x 16 tile of A times a 16 x 128
 * tile of B (2 x 64 x 128 x 16 = 262144 FLOP), both read by the tensor cores straight from
 * shared memory through matrix descriptors, the 64 x 128 f32 sums spread over the registers of
 * the 128 threads (64 each). The instruction is asynchronous: the warps queue WG_UNROLL x
 * WG_CHAINS of them, commit them as one group and wait only for the group before
 * (wgmma.wait_group 1), so the tensor cores always have the next group waiting. Products into
 * the same accumulators are chained in order by the hardware; WG_CHAINS accumulators add
 * independent ones. Blocks of 256 threads: two warpgroups reading the same tiles.
 * FLOP = 2 * WG_M * WG_N * WG_K * WG_CHAINS * WG_UNROLL * iters * threads / 128.
 * Built for anything but sm_90a (which alone has wgmma), the kernel only writes NaN. */
#define WG_M 64
#define WG_N 128
#define WG_K 16
#define WG_CHAINS 2
#define WG_UNROLL 4
#define WG_ACC (WG_M * WG_N / 128)  /* f32 sums a thread holds per chain */
#define WG_STR_(x) #x
#define WG_STR(x) WG_STR_(x)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
static_assert(WG_ACC == 64, "wg_mma below names 64 accumulator registers");

/* A shared-memory matrix descriptor: start address, the byte offset between core matrices
 * (8 rows of 16 bytes, stored as 128 contiguous bytes) neighbouring along K (LBO: 128) and
 * along M or N (SBO: 256), no swizzle (bits 62-63 zero); addresses and offsets in 16 bytes. */
__device__ __forceinline__ unsigned long long wg_desc(const void *p)
{
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return (unsigned long long)((a & 0x3ffff) >> 4) | (unsigned long long)(128 >> 4) << 16 |
           (unsigned long long)(256 >> 4) << 32;
}

#define WG_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define WG_F16(i) WG_F4(i), WG_F4(i + 4), WG_F4(i + 8), WG_F4(i + 12)
/* d += A B for the tiles the descriptors describe (scale-d 1: accumulate; no negation, both
 * operands K-major) */
__device__ __forceinline__ void wg_mma(float (&d)[WG_ACC], unsigned long long da,
                                       unsigned long long db)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m" WG_STR(WG_M) "n" WG_STR(WG_N) "k" WG_STR(WG_K)
                 ".f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WG_F16(0), WG_F16(16), WG_F16(32), WG_F16(48)
                 : "l"(da), "l"(db), "r"(1));
}
#undef WG_F16
#undef WG_F4

/* keeps the compiler from moving accesses to v across this point (the wgmma fence and waits
 * order the tensor cores' register accesses, not the compiler's) */
__device__ __forceinline__ void wg_pin(float &v) { asm volatile("" : "+f"(v) :: "memory"); }
#endif

extern "C" __global__ void __launch_bounds__(256) wgmma_bf16(float *out, int iters, unsigned seed)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __shared__ __align__(128) unsigned short sa[WG_M * WG_K], sb[WG_N * WG_K];
    for (int e = threadIdx.x; e < WG_N * WG_K; e += blockDim.x) {
        /* bf16 in [2^-7, 2^-6) that depend on the seed: the sums stay far from overflow */
        unsigned short v = (unsigned short)(0x3c00 | ((seed ^ (e * 0x9e3779b9u)) >> 25));
        if (e < WG_M * WG_K) sa[e] = v;
        sb[e] = v ^ 0x15;
    }
    /* the tensor cores read shared memory through the async proxy: order our stores first */
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    unsigned long long da = wg_desc(sa), db = wg_desc(sb);
    float d[WG_CHAINS][WG_ACC];
#pragma unroll
    for (int c = 0; c < WG_CHAINS; c++)
#pragma unroll
        for (int q = 0; q < WG_ACC; q++) { d[c][q] = 0.0f; wg_pin(d[c][q]); }
    for (int i = 0; i < iters; i++) {
        /* before a group: the accumulators' last writes by ordinary instructions (the zeros)
         * are ordered before the tensor cores read them; as cheap as the rest of the issue */
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int u = 0; u < WG_UNROLL; u++)
#pragma unroll
            for (int c = 0; c < WG_CHAINS; c++) wg_mma(d[c], da, db);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < WG_CHAINS; c++)
#pragma unroll
        for (int q = 0; q < WG_ACC; q++) { wg_pin(d[c][q]); s += d[c][q]; }
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
#else
    (void)iters;
    (void)seed;
    out[blockIdx.x * blockDim.x + threadIdx.x] = __int_as_float(0x7fc00000);  /* NaN */
#endif
}
/* --8<-- [end:wgmma] */

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
