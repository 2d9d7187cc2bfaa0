/* Included first in every C++ file of a llama.cpp build with AMX (smallem/book/ch4/llama.py).
 *
 * GCC 12's _tile_loadconfig (amxtileintrin.h) is an asm whose memory operand is
 * *(const void **)config: the compiler is told that ldtilecfg reads 8 bytes, not the
 * configuration's 64. ggml's ggml_tile_config_init fills a tile_config_t on the stack and
 * loads it; at -O3 GCC keeps the zeroing and the palette byte and drops the stores of the
 * tiles' rows and widths as dead, so every tile is left unshaped and the first tilezero
 * dies of SIGILL. This loads the configuration through an operand of all 64 bytes. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__AMX_TILE__)
#include <immintrin.h>
static inline __attribute__((always_inline)) void smallem_tile_loadconfig(const void *config)
{
    __asm__ volatile("ldtilecfg %0" ::"m"(*(const char(*)[64])config));
}
#define _tile_loadconfig(config) smallem_tile_loadconfig(config)
#endif
