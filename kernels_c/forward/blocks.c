/* Others' weights, part 3: the table of types (one row a type) and the products on the
 * file's rows, read straight from the file's mapping (kind 2), threads splitting the rows,
 * each a page of prefetch ahead. Included by forward.c (one translation unit); compiles
 * alone too (internal.h). */
#ifndef SM_FORWARD_BLOCKS_C
#define SM_FORWARD_BLOCKS_C
#include "internal.h"
#include "dots.c" /* each type's dot, and (through it) quants.c's layouts and rows */

typedef float (*dot_fn)(const uint8_t *, const void *, int);

/* --8<-- [start:traits] */
/* One row a type, as ggml's type_traits: the weights and bytes of its block, the type its
 * activation row is rounded to (the pairing llama.cpp makes, in the layout this machine's
 * dot wants), its dot of a weight row by that activation (the count argument: blocks, or
 * weights for the float types) and its row in floats. A type is supported where it has a
 * row; Python reads the ids and the blocks from here (sm_g_supported, sm_g_block_*). */
typedef void (*row_fn)(const uint8_t *, int, float *);
typedef struct {
    int type, weights, bytes, act;
    dot_fn dot;
    row_fn row;
} sm_type_traits;

#if defined(SM_AVX512) && defined(SM_AVX512_VNNI)
#define ACT_Q8_0 T_Q8_0X2 /* Q8_0 blocks in pairs for vpdpbusd's 512 bits */
#else
#define ACT_Q8_0 T_Q8_0
#endif
#if defined(SM_AVX512)
#define ACT_Q4_0 T_Q8_0X2 /* Q4_0's and Q5_0's nibbles meet pairs without a shuffle */
#else
#define ACT_Q4_0 T_Q8_0
#endif

static const sm_type_traits TYPE_TRAITS[] = {
    {T_F32, 1, 4, T_F32, dot_f32, row_f32},
    {T_F16, 1, 2, T_F16, dot_f16, row_f16},
    {T_BF16, 1, 2, T_BF16, dot_bf16, row_bf16},
    {T_Q8_0, 32, sizeof(blk_q8_0), ACT_Q8_0, dot_q8_0, row_q8_0},
    {T_Q4_0, 32, sizeof(blk_q4_0), ACT_Q4_0, dot_q4_0, row_q4_0},
    {T_Q5_0, 32, sizeof(blk_q5_0), ACT_Q4_0, dot_q5_0, row_q5_0},
    {T_Q4_K, 256, sizeof(blk_q4_K), T_Q8_K, dot_q4_k, row_q4_k},
    {T_Q6_K, 256, sizeof(blk_q6_K), T_Q8_K, dot_q6_k, row_q6_k},
};
/* --8<-- [end:traits] */

static const sm_type_traits *traits_of(int type)
{
    for (size_t i = 0; i < sizeof TYPE_TRAITS / sizeof TYPE_TRAITS[0]; i++)
        if (TYPE_TRAITS[i].type == type) return &TYPE_TRAITS[i];
    return NULL;
}

int sm_g_supported(int type) { return traits_of(type) != NULL; }

/* a type's block as the products read it: its weights and its bytes (0 where they read none) */
int sm_g_block_weights(int type)
{
    const sm_type_traits *t = traits_of(type);
    return t ? t->weights : 0;
}

int sm_g_block_bytes(int type)
{
    const sm_type_traits *t = traits_of(type);
    return t ? t->bytes : 0;
}

int sm_g_act_type(int type)
{
    const sm_type_traits *t = traits_of(type);
    return t ? t->act : T_F32;
}

/* the row's dot and its count argument (f32's for a type the table lacks, as before) */
static dot_fn dot_of(int type, int K, int *count)
{
    const sm_type_traits *t = traits_of(type);
    if (!t) t = traits_of(T_F32);
    *count = K / t->weights;
    return t->dot;
}

void sm_g_row(const sm_mat *w, int row, float *out)
{
    const sm_type_traits *t = traits_of(w->type);
    if (t) t->row(w->w + (size_t)row * (size_t)w->row_bytes, w->K, out);
}

/* ------------------------------------------------------------------ products */
#define RB 4 /* weight rows kept in L1 while every activation row passes them */

/* --8<-- [start:ahead] */
/* A thread's rows are one stream of bytes, but the hardware prefetchers stop at each 4 KiB
 * page, and the loads the dots issue themselves do not run far enough ahead to cover a miss
 * to memory: at every page the stream starts again from such misses, and the time of the
 * memory adds to the time of the arithmetic instead of hiding under it. So each row of a
 * decode step (each group of RB rows of a short prompt) first asks for the bytes
 * PREFETCH_AHEAD further on, one page, never past the thread's last row: the next page's
 * lines are in flight while the dots work through this one. The hint is prefetcht2 (locality
 * 1): the lines need not come into L1, where the activation row every dot reads lives. Appendix B times the distances 0 to 16 KiB on each
 * machine. */
#define PREFETCH_AHEAD 4096

static inline void prefetch_span(const uint8_t *p, size_t n, const uint8_t *end)
{
    for (const uint8_t *q = p; q < p + n && q < end; q += 64) __builtin_prefetch(q, 0, 1);
}
/* --8<-- [end:ahead] */

/* y (rows, N) = act (rows, already rounded, ab bytes each) by w's rows j0..j1, each group
 * of rows after a prefetch of the bytes `ahead` further on (0: none) */
static void rows_span(const sm_mat *w, const uint8_t *act, long long ab, int rows, float *y,
                      int j0, int j1, long long ahead)
{
    int count;
    const dot_fn dot = dot_of(w->type, w->K, &count);
    const size_t rb = (size_t)w->row_bytes;
    const uint8_t *end = w->w + (size_t)j1 * rb;
    if (rows == 1) { /* a decode step: row by row, each after its own prefetch */
        for (int j = j0; j < j1; j++) {
            const uint8_t *row = w->w + (size_t)j * rb;
            if (ahead > 0) prefetch_span(row + (size_t)ahead, rb, end);
            y[j] = dot(row, act, count);
        }
        return;
    }
    for (int j = j0; j < j1; j += RB) {
        const int nj = j1 - j < RB ? j1 - j : RB;
        if (ahead > 0) prefetch_span(w->w + (size_t)j * rb + (size_t)ahead, (size_t)nj * rb, end);
        for (int r = 0; r < rows; r++)
            for (int jj = 0; jj < nj; jj++)
                y[(size_t)r * w->N + j + jj] =
                    dot(w->w + (size_t)(j + jj) * (size_t)w->row_bytes, act + (size_t)r * ab, count);
    }
}

/* --8<-- [start:tile_q8_0] */
/* A Q8_0 matrix's decode layout: its rows repacked once into chapter 4's int8 tiles (tiles.c,
 * forward.c's opening comment), the same int8 values and f16 scales in the order the tile
 * product streams them: 16 rows side by side, four values of each in a 4-byte group, so one
 * 64-byte line meets one broadcast of four activations and no row ends in a reduction. q
 * holds N16 K bytes and s N16 K / 32 halves, both zeroed by the caller (the padding rows stay
 * zero). Returns 0, or -1 for a matrix that is not Q8_0 of a K a multiple of 32. */
int sm_g_tile_q8_0(const sm_mat *w, int8_t *q, uint16_t *s)
{
    if (w->kind != KIND_BLOCKS || w->type != T_Q8_0 || w->K % QBLOCK) return -1;
    const int nb = w->K / QBLOCK, tiles = PAD(w->N, TILE) / TILE;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < tiles; t++) {
        size_t base, ls, sbase, ss;
        lines_of(t, tiles, (size_t)w->K / 4, &base, &ls);
        lines_of(t, tiles, (size_t)nb, &sbase, &ss);
        for (int l = 0; l < TILE && t * TILE + l < w->N; l++) {
            const blk_q8_0 *row = (const blk_q8_0 *)(w->w + (size_t)(t * TILE + l) * (size_t)w->row_bytes);
            for (int b = 0; b < nb; b++) {
                s[(sbase + (size_t)b * ss) * TILE + l] = row[b].d;
                for (int g = 0; g < QBLOCK / 4; g++)
                    memcpy(q + (base + ((size_t)b * (QBLOCK / 4) + g) * ls) * 64 + 4 * l,
                           row[b].qs + 4 * g, 4);
            }
        }
    }
    return 0;
}
/* --8<-- [end:tile_q8_0] */

/* --8<-- [start:tile_q4_0] */
/* A Q4_0 matrix's decode layout, as sm_g_tile_q8_0's but with the file's nibbles kept: a
 * block's 16 bytes of each row cut into 4 groups of 4 bytes, 16 rows' group side by side in a
 * 64-byte line (tiles.c's q4_block), the f16 scales as Q8_0's. q holds N16 K / 2 bytes, s
 * N16 K / 32 halves, zeroed by the caller. Returns 0, or -1 for a matrix that is not Q4_0 of
 * a K a multiple of 32. */
int sm_g_tile_q4_0(const sm_mat *w, uint8_t *q, uint16_t *s)
{
    if (w->kind != KIND_BLOCKS || w->type != T_Q4_0 || w->K % QBLOCK) return -1;
    const int nb = w->K / QBLOCK, tiles = PAD(w->N, TILE) / TILE;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < tiles; t++) {
        size_t base, ls, sbase, ss;
        lines_of(t, tiles, (size_t)w->K / 8, &base, &ls);
        lines_of(t, tiles, (size_t)nb, &sbase, &ss);
        for (int l = 0; l < TILE && t * TILE + l < w->N; l++) {
            const blk_q4_0 *row = (const blk_q4_0 *)(w->w + (size_t)(t * TILE + l) * (size_t)w->row_bytes);
            for (int b = 0; b < nb; b++) {
                s[(sbase + (size_t)b * ss) * TILE + l] = row[b].d;
                for (int g = 0; g < QBLOCK / 8; g++)
                    memcpy(q + (base + ((size_t)b * (QBLOCK / 8) + g) * ls) * 64 + 4 * l,
                           row[b].qs + 4 * g, 4);
            }
        }
    }
    return 0;
}
/* --8<-- [end:tile_q4_0] */

/* y (rows, N) = the int8 rows (xq, their block scales xs: sm_quantize_rows) by w's tiles,
 * for its rows j0..j1 (j0 a multiple of 16 TILE_RUN: whole runs of tiles inside a group),
 * tile-major: one decode row takes DNT tiles at a time, a prompt's rows four at a time
 * against two tiles (tiles.c's run_block). */
#define TILE_RUN DNT
static void tiles_span(const sm_mat *w, const int8_t *xq, const float *xs, int rows, float *y,
                       int j0, int j1, long long ahead)
{
    const int K32 = PAD(w->K, QBLOCK), nb = K32 / QBLOCK, G = rows == 1 ? DNT : 2;
    const int t1 = (j1 + TILE - 1) / TILE;
    for (int t = j0 / TILE; t < t1; t += G) {
        const int nt = t1 - t < G ? t1 - t : G;
        for (int r0 = 0; r0 < rows; r0 += MAXRB)
            run_block(w, t, nt, rows - r0 < MAXRB ? rows - r0 : MAXRB, NULL,
                      xq + (size_t)r0 * K32, xs + (size_t)r0 * nb, y + (size_t)r0 * w->N, 0, ahead);
    }
}

static void block_product(const sm_mat *w, const uint8_t *act, long long ab, int rows, float *y,
                          int nthreads, long long ahead)
{
    const int chunks = (w->N + 15) / 16;
    const int nt = nthreads < chunks ? nthreads : chunks;
    if (nt <= 1) {
        rows_span(w, act, ab, rows, y, 0, w->N, ahead);
        return;
    }
    #pragma omp parallel for schedule(static) num_threads(nt)
    for (int t = 0; t < nt; t++) {
        /* contiguous slices of 16-row chunks, one a thread */
        const int c0 = (int)((long long)chunks * t / nt), c1 = (int)((long long)chunks * (t + 1) / nt);
        const int j0 = 16 * c0, j1 = 16 * c1 < w->N ? 16 * c1 : w->N;
        rows_span(w, act, ab, rows, y, j0, j1, ahead);
    }
}

static void quantize_rows(int type, const float *x, int rows, int K, uint8_t *act)
{
    const long long ab = sm_g_act_bytes(type, K);
    for (int r = 0; r < rows; r++) sm_g_quantize(type, x + (size_t)r * K, K, act + (size_t)r * ab);
}

/* y (rows, N) = x (rows, K) by the matrix: the rows rounded as the type wants, then the
 * product (act is scratch of rows * sm_g_act_bytes bytes). */
static void matmul_with(const sm_mat *w, const float *x, int rows, float *y, uint8_t *act,
                        int nthreads, long long ahead)
{
    quantize_rows(w->type, x, rows, w->K, act);
    block_product(w, act, sm_g_act_bytes(w->type, w->K), rows, y, nthreads, ahead);
}

/* the product on its own, prefetching `ahead` bytes further on (-1: PREFETCH_AHEAD); a
 * matrix with tiles (sm_g_tile_q8_0) takes them, in runs of TILE_RUN tiles a thread */
void sm_g_matmul(const sm_mat *w, const float *x, int rows, float *y, int nthreads, long long ahead)
{
    const int K32 = PAD(w->K, QBLOCK);
    const size_t bytes = w->q ? (size_t)rows * ((size_t)K32 + sizeof(float) * (size_t)(K32 / QBLOCK)) + 64
                              : (size_t)rows * (size_t)sm_g_act_bytes(w->type, w->K) + 64;
    uint8_t *act = malloc(bytes);
    if (!act) return;
    if (w->q) {
        float *xs = (float *)(void *)(act + ((size_t)rows * K32 + 63) / 64 * 64);
        sm_quantize_rows(x, rows, w->K, (int8_t *)act, xs);
        const int runs = (w->N + TILE * TILE_RUN - 1) / (TILE * TILE_RUN);
        const int nt = nthreads < runs ? nthreads : runs;
        #pragma omp parallel for schedule(static) num_threads(nt > 0 ? nt : 1)
        for (int t = 0; t < nt; t++) {
            const int c0 = (int)((long long)runs * t / nt), c1 = (int)((long long)runs * (t + 1) / nt);
            const int j1 = TILE * TILE_RUN * c1 < w->N ? TILE * TILE_RUN * c1 : w->N;
            tiles_span(w, (int8_t *)act, xs, rows, y, TILE * TILE_RUN * c0, j1,
                       ahead < 0 ? PREFETCH_AHEAD : ahead);
        }
    } else {
        matmul_with(w, x, rows, y, act, nthreads, ahead < 0 ? PREFETCH_AHEAD : ahead);
    }
    free(act);
}
#endif /* SM_FORWARD_BLOCKS_C */
