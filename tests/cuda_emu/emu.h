/* Run CUDA kernels (kernels_cuda/*.cu) on the CPU, for tests: one fiber (a ucontext with its
 * own stack) per CUDA thread of a block, all on the calling thread, switched only where a
 * CUDA thread waits (__syncthreads, __syncwarp, a warp collective); the blocks of a grid one
 * after another, __shared__ as static storage (shared by the threads of the running block),
 * warp shuffles and votes through a per-warp exchange, atomics through std::atomic_ref.
 * The PTX helpers of the kernels (wmma, cp.async; mma.sync and ldmatrix in mma.h) are
 * replaced by plain C++ with the semantics the PTX manual gives them. This checks index
 * arithmetic, bounds, tile logic and the order of barriers; it cannot check timing, races
 * between real warps or the PTX spelling (ptxas checks that in test_cu_compiles).
 *
 * A thread that returns early leaves the block's barriers (as an exited warp does on a GPU),
 * so a kernel whose threads return before a __syncthreads the others still reach runs here;
 * a warp collective needs every lane of its warp, as on the GPU. Threads that all wait on
 * barriers none of the others will reach stop the run with a message, not a hang.
 * (It ran one std::thread per CUDA thread until 2026-12: the futex traffic of a block's
 * barriers made chapter 3's quick GPU step take 92 s of mostly system time; fibers switch
 * in user space.) */
#pragma once
#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <utility>

#define SMALLEM_EMU 1
#define __global__
#define __device__
#define __host__
#define __noinline__ __attribute__((noinline))
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __constant__ static
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__

struct emu_dim3 { unsigned x, y, z; };
inline emu_dim3 threadIdx, blockIdx;  /* the running fiber's; set at each switch */
inline emu_dim3 blockDim, gridDim;
constexpr int warpSize = 32;
#define EMU_SMEM_BYTES (256 * 1024)
alignas(128) inline unsigned char emu_dyn_smem[EMU_SMEM_BYTES];

/* A barrier that can be left (drop) and re-armed between blocks. A fiber that is not the
 * last to arrive gives way (emu_wait_for) until the barrier's generation moves on. */
inline void emu_wait_for(const unsigned long *generation, unsigned long seen);
struct EmuBarrier {
    unsigned expected = 0, arrived = 0;
    unsigned long generation = 0;
    void arm(unsigned n) { expected = n; arrived = 0; }
    void wait()
    {
        unsigned long g = generation;
        if (++arrived >= expected) { arrived = 0; generation++; return; }
        emu_wait_for(&generation, g);
    }
    void drop()
    {
        expected--;
        if (arrived && arrived >= expected) { arrived = 0; generation++; }
    }
};
#define EMU_MAX_WARPS 32
inline EmuBarrier emu_block_barrier, emu_warp_barrier[EMU_MAX_WARPS];
inline unsigned long long emu_warp_slot[EMU_MAX_WARPS][32];

inline unsigned emu_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
inline unsigned emu_lane() { return emu_tid() % 32; }
inline unsigned emu_warp() { return emu_tid() / 32; }
inline void __syncthreads() { emu_block_barrier.wait(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)mask; emu_warp_barrier[emu_warp()].wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

/* ---- warp shuffles and votes: each lane posts its value, all read, all wait again */
template <typename T>
inline T emu_exchange(T v, int src)
{
    static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
    unsigned w = emu_warp();
    std::memcpy(&emu_warp_slot[w][emu_lane()], &v, sizeof(T));
    emu_warp_barrier[w].wait();
    T out;
    std::memcpy(&out, &emu_warp_slot[w][src & 31], sizeof(T));
    emu_warp_barrier[w].wait();
    return out;
}
template <typename T> inline T __shfl_sync(unsigned, T v, int src, int width = 32)
{ int lane = (int)emu_lane(); return emu_exchange(v, (lane & ~(width - 1)) + (src & (width - 1))); }
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32)
{ int lane = (int)emu_lane(); int s = lane ^ mask; return emu_exchange(v, (s & ~(width - 1)) == (lane & ~(width - 1)) ? s : lane); }
template <typename T> inline T __shfl_down_sync(unsigned, T v, unsigned d, int width = 32)
{ int lane = (int)emu_lane(); int s = lane + (int)d; return emu_exchange(v, (s & ~(width - 1)) == (lane & ~(width - 1)) ? s : lane); }
template <typename T> inline T __shfl_up_sync(unsigned, T v, unsigned d, int width = 32)
{ int lane = (int)emu_lane(); int s = lane - (int)d; return emu_exchange(v, s >= (lane & ~(width - 1)) ? s : lane); }
inline unsigned __ballot_sync(unsigned, int pred)
{
    unsigned w = emu_warp(), out = 0;
    emu_warp_slot[w][emu_lane()] = pred != 0;
    emu_warp_barrier[w].wait();
    for (int l = 0; l < 32; l++) out |= (unsigned)emu_warp_slot[w][l] << l;
    emu_warp_barrier[w].wait();
    return out;
}
inline int __any_sync(unsigned m, int p) { return __ballot_sync(m, p) != 0; }
inline unsigned emu_warp_lanes()
{
    unsigned n = blockDim.x * blockDim.y * blockDim.z, w = emu_warp();
    return n - 32 * w >= 32 ? 32 : n - 32 * w;
}
inline int __all_sync(unsigned m, int p)
{
    unsigned lanes = emu_warp_lanes();
    return __ballot_sync(m, p) == (lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u);
}

/* ---- atomics */
template <typename T> inline T atomicAdd(T *p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }
template <typename T> inline T atomicMax(T *p, T v)
{
    std::atomic_ref<T> a(*p);
    T old = a.load();
    while (old < v && !a.compare_exchange_weak(old, v)) {}
    return old;
}
template <typename T> inline T atomicMin(T *p, T v)
{
    std::atomic_ref<T> a(*p);
    T old = a.load();
    while (old > v && !a.compare_exchange_weak(old, v)) {}
    return old;
}
template <typename T> inline T atomicCAS(T *p, T cmp, T v)
{ std::atomic_ref<T>(*p).compare_exchange_strong(cmp, v); return cmp; }
template <typename T> inline T atomicExch(T *p, T v) { return std::atomic_ref<T>(*p).exchange(v); }

/* ---- vector types */
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(4) char4 { signed char x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
inline int4 make_int4(int a, int b, int c, int d) { return {a, b, c, d}; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }

/* ---- intrinsics */
template <typename T> inline T __ldg(const T *p) { return *p; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline int __float_as_int(float f) { int u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline int __float2int_rn(float x) { return (int)std::nearbyint(x); }
inline float __int2float_rn(int x) { return (float)x; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __ffs(int x) { return __builtin_ffs(x); }
using std::max;
using std::min;
/* __dp4a: four signed 8-bit products of a and b added to c */
inline int __dp4a(int a, int b, int c)
{
    for (int i = 0; i < 4; i++) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c)
{
    for (int i = 0; i < 4; i++) c += ((a >> (8 * i)) & 255u) * ((b >> (8 * i)) & 255u);
    return c;
}
inline long long clock64() { return 0; }

inline float emu_bf16(unsigned short h)
{
    unsigned u = (unsigned)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

/* ---- gemm.cu's wmma helpers: every lane holds the whole 16 x 16 tile, which is what the
 * collective operation computes */
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

/* ---- the launcher: the threads of a block as fibers on the calling thread, each with its
 * own stack (kept for the process, guard page below), run round-robin by emu_schedule until
 * every one has returned; then the next block: blocks run one after another, so __shared__
 * statics are one block's. */
#include <cstdio>
#include <functional>
#include <sys/mman.h>
#include <ucontext.h>

#define EMU_STACK (512 * 1024)
struct EmuFiber {
    ucontext_t ctx;
    char *stack = nullptr;
    bool done = false;
    const unsigned long *waits_on = nullptr;  /* a barrier's generation, or nothing */
    unsigned long seen = 0;
};
inline EmuFiber emu_fibers[32 * EMU_MAX_WARPS];
inline ucontext_t emu_scheduler;
inline unsigned emu_running;
inline const std::function<void()> *emu_body;
inline void emu_fail_run(const char *what)
{
    std::fprintf(stderr, "CUDA emulator: %s\n", what);
    std::abort();
}

inline void emu_wait_for(const unsigned long *generation, unsigned long seen)
{
    EmuFiber &f = emu_fibers[emu_running];
    f.waits_on = generation;
    f.seen = seen;
    swapcontext(&f.ctx, &emu_scheduler);
}

inline void emu_fiber_main()
{
    unsigned t = emu_running;
    (*emu_body)();
    emu_block_barrier.drop();
    emu_warp_barrier[t / 32].drop();
    emu_fibers[t].done = true;  /* returning resumes the scheduler (uc_link) */
}

inline void emu_start_fiber(unsigned t)
{
    EmuFiber &f = emu_fibers[t];
    if (!f.stack) {
        size_t page = 4096;
        char *m = (char *)mmap(nullptr, EMU_STACK + page, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) emu_fail_run("no memory for a thread's stack");
        mprotect(m, page, PROT_NONE);  /* a stack overflow stops at the guard page */
        f.stack = m + page;
    }
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = EMU_STACK;
    f.ctx.uc_link = &emu_scheduler;
    makecontext(&f.ctx, emu_fiber_main, 0);
    f.done = false;
    f.waits_on = nullptr;
}

/* Run every fiber that can run, in turn, until all have returned; fibers that all wait on
 * barriers whose generation never moves are a deadlock (a __syncthreads some threads skip
 * while others wait, a warp collective with lanes missing), reported, not hung on. */
inline void emu_schedule(unsigned n, emu_dim3 block)
{
    for (;;) {
        bool ran = false, left = false;
        for (unsigned t = 0; t < n; t++) {
            EmuFiber &f = emu_fibers[t];
            if (f.done) continue;
            left = true;
            if (f.waits_on && *f.waits_on == f.seen) continue;
            f.waits_on = nullptr;
            emu_running = t;
            threadIdx = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
            swapcontext(&emu_scheduler, &f.ctx);
            ran = true;
        }
        if (!left) return;
        if (!ran) emu_fail_run("deadlock: every thread left waits on a barrier the others never reach");
    }
}

inline void emu_new_launch();  /* mma.h's per-thread state, reset for each launch */

inline int emu_run(emu_dim3 grid, emu_dim3 block, const std::function<void()> &body)
{
    unsigned n = block.x * block.y * block.z;
    if (n == 0 || n > 32 * EMU_MAX_WARPS || grid.x * grid.y * grid.z == 0) return -1;
    gridDim = grid;
    blockDim = block;
    emu_body = &body;
    emu_new_launch();
    unsigned warps = (n + 31) / 32;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = {x, y, z};
                emu_block_barrier.arm(n);
                for (unsigned w = 0; w < warps; w++)
                    emu_warp_barrier[w].arm(n - 32 * w >= 32 ? 32 : n - 32 * w);
                for (unsigned t = 0; t < n; t++) emu_start_fiber(t);
                emu_schedule(n, block);
            }
    return 0;
}

/* Call a kernel whose parameters are read from args[i] (a pointer to each argument's value,
 * as cuLaunchKernel takes them); dims = grid x, y, z, block x, y, z. */
template <typename... A, std::size_t... I>
inline void emu_call(void (*f)(A...), void **args, std::index_sequence<I...>)
{
    f(*static_cast<std::remove_cv_t<std::remove_reference_t<A>> *>(args[I])...);
}
template <typename... A>
inline int emu_launch(void (*f)(A...), const unsigned *d, void **args)
{
    return emu_run({d[0], d[1], d[2]}, {d[3], d[4], d[5]},
                   [&] { emu_call(f, args, std::index_sequence_for<A...>{}); });
}
/* The size of each parameter and whether it is a pointer (size | 1 << 16), for the caller's
 * check of the arguments it packs. Returns the number of parameters. */
template <typename... A>
inline int emu_signature(void (*)(A...), int *out)
{
    int i = 0;
    ((out[i++] = (int)sizeof(A) | (std::is_pointer_v<A> ? 1 << 16 : 0)), ...);
    return (int)sizeof...(A);
}
#include "mma.h"
