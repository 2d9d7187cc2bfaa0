/* Shared by every kernel file: sizes, the ISA macros, OpenMP if present.
 *
 * Which vector code a file compiles is decided by the compiler's own macros
 * (__AVX512F__, __AVX2__, __FMA__, __AVXVNNI__, __AVX512BF16__, __AVX512VNNI__, __AMX_BF16__,
 * __AMX_INT8__),
 * which follow the -m flags of the ISA level, and is named here as SM_AVX512,
 * SM_AVX2, SM_AVX_VNNI, SM_AVX512_BF16, SM_AVX512_VNNI and SM_AMX_TILE/_BF16/_INT8. A file written for
 * AVX-512 therefore always has an AVX2 and a plain-C branch. The one macro the
 * build may add itself is SM_EMULATE_AVX512, for tests (emulate.h).
 */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

/* The layers' constants, defined once: the C kernels use them, and smallem.ops reads them
 * from this file (build.header_constant) for its numpy references. */
#define SM_LN_EPS 1e-5f           /* LayerNorm's and RMSNorm's epsilon */
#define SM_GELU_K 0.7978845608f   /* GPT-2's tanh GELU: sqrt(2 / pi) */
#define SM_GELU_A 0.044715f       /* ... and the cubic term's coefficient */

/* Where a kernel of the training step goes to the team. A parallel region costs a few
 * microseconds to open and close, and far more when another process holds a core and the
 * team waits at the barrier for a descheduled thread: below SM_PAR_MIN floats of work
 * (about 10 us on one core) a layer runs on the calling thread alone (layers.c's TEAM);
 * below SM_PRODUCT_PAR_MIN multiply-adds (about 1 MFLOP) so does a product of the step,
 * and below SM_ROUND_PAR_MIN floats the rounding to bf16 (smallem.ops reads both). */
#define SM_PAR_MIN 32768
#define SM_PRODUCT_PAR_MIN 524288
#define SM_ROUND_PAR_MIN 65536
#ifdef SM_POOL /* the step's kernels on smallem's own pool (kernels_c/pool.c), not libgomp */
#include "pool_shim.h"
#endif

#if defined(SM_EMULATE_AVX512)
#include "emulate.h"
#else
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define SM_AVX512 1
#endif
#if defined(__AVX512BF16__)
#define SM_AVX512_BF16 1
#endif
#if defined(__AVX512VNNI__)
#define SM_AVX512_VNNI 1
#endif
#if defined(__AMX_TILE__)
#define SM_AMX_TILE 1
/* AMX tile registers are named by number in each instruction: macros, not functions.
 * The configuration is loaded through an operand of all its 64 bytes: GCC 12's own
 * _tile_loadconfig tells the compiler that ldtilecfg reads 8 of them, so a configuration
 * filled just before (and dead after) may lose the stores of its tiles' shapes, and the first
 * tile instruction dies of SIGILL (llama.cpp's AMX build did: smallem/book/ch4/amx_tilecfg.h). */
#define SM_TILE_LOADCONFIG(cfg) \
    __asm__ volatile("ldtilecfg %0" ::"m"(*(const char(*)[64])(const void *)(cfg)))
#define SM_TILE_RELEASE() _tile_release()
#define SM_TILE_ZERO(t) _tile_zero(t)
#define SM_TILE_LOADD(t, base, stride) _tile_loadd(t, base, stride)
#define SM_TILE_STORED(t, base, stride) _tile_stored(t, base, stride)
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define SM_AMX_BF16 1
#define SM_TILE_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
#endif
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define SM_AMX_INT8 1
#define SM_TILE_DPBSSD(c, a, b) _tile_dpbssd(c, a, b)
#endif
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define SM_AVX2 1
#endif
#if defined(__AVXVNNI__) && !defined(SM_EMULATE_AVX512)
#define SM_AVX_VNNI 1 /* vpdpbusd on ymm (VEX): an extension of the AVX2 level */
#endif

/* Keep one copy of a function for every caller (GCC otherwise clones it per constant
 * argument, and a clone may allocate registers worse than the original). */
#if defined(__GNUC__) && !defined(__clang__)
#define SM_NOCLONE __attribute__((noclone))
#else
#define SM_NOCLONE
#endif

/* An empty asm that "might change" v: stops the compiler hoisting work on v
 * out of a loop, without emitting any instruction. */
#if defined(__GNUC__)
#define SM_OPAQUE(v) __asm__ volatile("" : "+r,m"(v))
/* the same, with v held in a register: a chain through memory would time the store and load */
#define SM_OPAQUE_REG(v) __asm__ volatile("" : "+r"(v))
#define SM_OPAQUE_VEC(v) __asm__ volatile("" : "+x"(v))
#else
#define SM_OPAQUE(v) ((void)0)
#define SM_OPAQUE_REG(v) ((void)0)
#define SM_OPAQUE_VEC(v) ((void)0)
#endif
