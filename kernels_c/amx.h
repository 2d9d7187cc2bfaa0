/* AMX tiles, shared by the GEMM's bf16 path (gemm/bf16.c) and chapter 1's tile
 * probes (probes.c): the one tile shape both use, and the permission Linux asks
 * for. Included after common.h; empty where the build has no AMX. */
#pragma once
#if defined(SM_AMX_TILE)
#include <string.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* The 64-byte tile configuration of palette 1. */
struct sm_amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16]; /* bytes per row of each tile */
    uint8_t rows[16];
};

/* All eight tiles 16 rows of 64 bytes, the largest shape: per thread. */
static inline void sm_amx_configure(void)
{
    struct sm_amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    SM_TILE_LOADCONFIG(&c);
}

/* Linux gives the tiles' 8 KB of register state only to a process that asks. */
static inline int sm_amx_permitted(void)
{
#if defined(SM_EMULATE_AVX512)
    return 1;
#elif defined(__linux__)
    static int state = -1;
    if (state < 0)
        state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                        18 /* XFEATURE_XTILEDATA */) == 0;
    return state;
#else
    return 0;
#endif
}
#endif
