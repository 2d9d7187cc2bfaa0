/* Run kernels_cuda/gemm.cu on the CPU, for tests: one std::thread per CUDA thread, blocks one
 * after another, __syncthreads/__syncwarp as barriers, __shared__ as static storage (shared by
 * the threads of the running block). The wmma and cp.async helpers, inline PTX on a GPU, are
 * replaced here by plain C++ with the semantics the PTX manual gives them: every lane holds the
 * whole 16 x 16 tile, which is what the collective operation computes. This checks our index
 * arithmetic, bounds and tile logic; it cannot check timing, races between real warps or the
 * PTX spelling (ptxas checks that in test_cu_compiles). */
#pragma once
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstring>

#define SMALLEM_EMU 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct emu_dim3 { unsigned x, y, z; };
extern thread_local emu_dim3 threadIdx;
extern emu_dim3 blockIdx, blockDim, gridDim;
extern std::barrier<> *emu_block_barrier;
extern std::barrier<> *emu_warp_barrier[32];
alignas(128) extern unsigned char emu_dyn_smem[65536];

inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
inline void __syncwarp()
{
    unsigned t = threadIdx.x + threadIdx.y * blockDim.x;
    emu_warp_barrier[t / 32]->arrive_and_wait();
}

struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }

inline float emu_bf16(unsigned short h)
{
    unsigned u = (unsigned)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

struct FragA { float v[256]; };
struct FragB { float v[256]; };
struct FragC { float r[256]; };

template <bool ROW>
inline void wmma_load_a(FragA &f, const unsigned short *p, int ld)
{   /* A tile (i, k): row-major at p[i * ld + k], column-major at p[k * ld + i] */
    for (int i = 0; i < 16; i++)
        for (int k = 0; k < 16; k++) f.v[i * 16 + k] = emu_bf16(ROW ? p[i * ld + k] : p[k * ld + i]);
}

template <bool ROW>
inline void wmma_load_b(FragB &f, const unsigned short *p, int ld)
{   /* B tile (k, j): row-major at p[k * ld + j], column-major at p[j * ld + k] */
    for (int k = 0; k < 16; k++)
        for (int j = 0; j < 16; j++) f.v[k * 16 + j] = emu_bf16(ROW ? p[k * ld + j] : p[j * ld + k]);
}

template <bool AROW, bool BROW>
inline void wmma_acc(FragC &c, const FragA &a, const FragB &b)
{
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float s = c.r[i * 16 + j];
            for (int k = 0; k < 16; k++) s += a.v[i * 16 + k] * b.v[k * 16 + j];
            c.r[i * 16 + j] = s;
        }
}

inline void wmma_store(float *p, const FragC &c, int ld)
{
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) p[i * ld + j] = c.r[i * 16 + j];
}

inline void cp_async16(void *dst, const void *src) { std::memcpy(dst, src, 16); }
inline void cp_async_commit() {}
template <int N_PENDING> inline void cp_async_wait() {}
