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

/* each row's Q8_K scale of block sb (dx) and its sum over sub-block sub times it (sx) */
static inline void q8k_factors(const uint8_t *act, long long ab, int rows, int sb, int sub,
                               float *dx, float *sx)
{
    for (int r = 0; r < rows; r++) {
        const blk_q8_K *a = (const blk_q8_K *)(act + (size_t)r * (size_t)ab) + sb;
        dx[r] = a->d;
        sx[r] = dx[r] * (float)(a->bsums[2 * sub] + a->bsums[2 * sub + 1]);
    }
}

/* A Q4_K matrix in tiles (sm_g_tile_q4_k): per 256-weight block, each pair of 32-weight
 * sub-blocks is 8 lines of 16 rows' 4 bytes, the low nibbles sub-block 2j, the high ones
 * 2j + 1; beside them, for each block and tile, the rows' f16 d and dmin and their 6-bit
 * sub-block scales and mins as bytes (Q4K_ENTRY halves). The activation is the rows' own,
 * llama.cpp's Q8_K (one scale a_b per 256, the sums of each 16): a weight is d sc q - dmin m,
 * so a sub-block's part is d sc a_b sum q x - dmin m a_b sum x, its integer sum exact. */
#define Q4K_ENTRY 160 /* halves a tile and block: d[16], dmin[16], sc[8][16] and m[8][16] bytes */
INLINE void q4k_block(const sm_mat *w, int t0, const int NT, const int NROW, const uint8_t *act,
                      long long ab, float *y, int ldy, long long ahead)
{
    const int nsb = w->K / 256;
    size_t base, ls, sbase, ss;
    lines_of(t0, PAD(w->N, TILE) / TILE, (size_t)w->K / 8, &base, &ls);
    lines_of(t0, PAD(w->N, TILE) / TILE, (size_t)nsb, &sbase, &ss);
    const uint8_t *wt = (const uint8_t *)w->q + base * 64; /* tile t0+i, line kk: (kk ls + i) 64 */
    const uint16_t *st = w->s + sbase * Q4K_ENTRY;         /* its block sb: (sb ss + i) Q4K_ENTRY */
#if defined(SM_AVX512_VNNI)
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512 facc[MAXRB][MAXNT];
    for (int r = 0; r < NROW; r++)
        for (int i = 0; i < NT; i++) facc[r][i] = _mm512_setzero_ps();
    for (int sb = 0; sb < nsb; sb++)
        for (int j = 0; j < 4; j++) {
            __m512i iacc[MAXRB][MAXNT][2];
            for (int r = 0; r < NROW; r++)
                for (int i = 0; i < NT; i++) iacc[r][i][0] = iacc[r][i][1] = _mm512_setzero_si512();
            for (int g = 0; g < 8; g++) {
                const size_t kk = (size_t)sb * 32 + (size_t)j * 8 + g;
                __m512i lo[MAXNT], hi[MAXNT];
                for (int i = 0; i < NT; i++) {
                    const __m512i v = _mm512_loadu_si512((const void *)(wt + (kk * ls + i) * 64));
                    if (ahead > 0) __builtin_prefetch(wt + (kk * ls + i) * 64 + ahead, 0, 1);
                    lo[i] = _mm512_and_si512(v, m4);
                    hi[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                }
                for (int r = 0; r < NROW; r++) {
                    const int8_t *xb = ((const blk_q8_K *)(act + (size_t)r * (size_t)ab))[sb].qs + (size_t)j * 64 + 4 * g;
                    int32_t x0, x1;
                    memcpy(&x0, xb, 4);
                    memcpy(&x1, xb + 32, 4);
                    const __m512i a0 = _mm512_set1_epi32(x0), a1 = _mm512_set1_epi32(x1);
                    for (int i = 0; i < NT; i++) {
                        iacc[r][i][0] = _mm512_dpbusd_epi32(iacc[r][i][0], lo[i], a0);
                        iacc[r][i][1] = _mm512_dpbusd_epi32(iacc[r][i][1], hi[i], a1);
                    }
                }
            }
            for (int h = 0; h < 2; h++) {
                const int sub = 2 * j + h;
                float dx[MAXRB], sx[MAXRB];
                q8k_factors(act, ab, NROW, sb, sub, dx, sx);
                for (int i = 0; i < NT; i++) {
                    const uint16_t *e = st + ((size_t)sb * ss + i) * Q4K_ENTRY;
                    const uint8_t *sm = (const uint8_t *)(e + 32);
                    const __m512 sc = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)e)),
                        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sm + 16 * sub)))));
                    const __m512 mn = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(e + 16))),
                        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sm + 128 + 16 * sub)))));
                    for (int r = 0; r < NROW; r++)
                        facc[r][i] = _mm512_fnmadd_ps(mn, _mm512_set1_ps(sx[r]),
                                                      _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[r][i][h]),
                                                                      _mm512_mul_ps(sc, _mm512_set1_ps(dx[r])),
                                                                      facc[r][i]));
                }
            }
        }
    for (int i = 0; i < NT; i++)
        for (int r = 0; r < NROW; r++)
            finish_zmm(facc[r][i], y + (size_t)r * ldy, NULL, (t0 + i) * TILE, w->N, 0);
#elif defined(SM_AVX2)
#if defined(SM_AVX_VNNI)
#define Q4_DOT(acc, u, x) _mm256_dpbusd_avx_epi32(acc, u, x)
#else
#define Q4_DOT(acc, u, x) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), \
                                                                   _mm256_set1_epi16(1)))
#endif
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 facc[MAXRB][MAXNT][2];
    for (int r = 0; r < NROW; r++)
        for (int i = 0; i < NT; i++) facc[r][i][0] = facc[r][i][1] = _mm256_setzero_ps();
    for (int sb = 0; sb < nsb; sb++)
        for (int j = 0; j < 4; j++) {
            __m256i iacc[MAXRB][MAXNT][2][2]; /* row, tile, sub-block of the pair, half */
            for (int r = 0; r < NROW; r++)
                for (int i = 0; i < NT; i++)
                    iacc[r][i][0][0] = iacc[r][i][0][1] = iacc[r][i][1][0] = iacc[r][i][1][1] = _mm256_setzero_si256();
            for (int g = 0; g < 8; g++) {
                const size_t kk = (size_t)sb * 32 + (size_t)j * 8 + g;
                for (int r = 0; r < NROW; r++) {
                    const int8_t *xb = ((const blk_q8_K *)(act + (size_t)r * (size_t)ab))[sb].qs + (size_t)j * 64 + 4 * g;
                    int32_t x0, x1;
                    memcpy(&x0, xb, 4);
                    memcpy(&x1, xb + 32, 4);
                    const __m256i a0 = _mm256_set1_epi32(x0), a1 = _mm256_set1_epi32(x1);
                    for (int i = 0; i < NT; i++) {
                        if (r == 0 && ahead > 0) __builtin_prefetch(wt + (kk * ls + i) * 64 + ahead, 0, 1);
                        for (int hh = 0; hh < 2; hh++) {
                            const __m256i v = _mm256_loadu_si256((const __m256i *)(wt + (kk * ls + i) * 64 + 32 * hh));
                            iacc[r][i][0][hh] = Q4_DOT(iacc[r][i][0][hh], _mm256_and_si256(v, m4), a0);
                            iacc[r][i][1][hh] = Q4_DOT(iacc[r][i][1][hh],
                                                       _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), a1);
                        }
                    }
                }
            }
            for (int h = 0; h < 2; h++) {
                const int sub = 2 * j + h;
                float dx[MAXRB], sx[MAXRB];
                q8k_factors(act, ab, NROW, sb, sub, dx, sx);
                for (int i = 0; i < NT; i++) {
                    const uint16_t *e = st + ((size_t)sb * ss + i) * Q4K_ENTRY;
                    const uint8_t *sm = (const uint8_t *)(e + 32);
                    for (int hh = 0; hh < 2; hh++) {
                        const __m256 sc = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(e + 8 * hh))),
                            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sm + 16 * sub + 8 * hh)))));
                        const __m256 mn = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(e + 16 + 8 * hh))),
                            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sm + 128 + 16 * sub + 8 * hh)))));
                        for (int r = 0; r < NROW; r++)
                            facc[r][i][hh] = _mm256_fnmadd_ps(mn, _mm256_set1_ps(sx[r]),
                                _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[r][i][h][hh]),
                                                _mm256_mul_ps(sc, _mm256_set1_ps(dx[r])), facc[r][i][hh]));
                    }
                }
            }
        }
#undef Q4_DOT
    for (int i = 0; i < NT; i++)
        for (int r = 0; r < NROW; r++)
            finish_ymm2(facc[r][i][0], facc[r][i][1], y + (size_t)r * ldy, NULL, (t0 + i) * TILE, w->N, 0);
#else
    (void)ahead;
    for (int r = 0; r < NROW; r++)
        for (int i = 0; i < NT; i++) {
            float v[TILE] = {0};
            for (int sb = 0; sb < nsb; sb++)
                for (int sub = 0; sub < 8; sub++) {
                    const int j = sub / 2, h = sub % 2;
                    const blk_q8_K *a = (const blk_q8_K *)(act + (size_t)r * (size_t)ab) + sb;
                    const int8_t *xb = a->qs + (size_t)sub * 32;
                    const float dx = a->d;
                    const float sx = dx * (float)(a->bsums[2 * sub] + a->bsums[2 * sub + 1]);
                    const uint16_t *e = st + ((size_t)sb * ss + i) * Q4K_ENTRY;
                    const uint8_t *sm = (const uint8_t *)(e + 32);
                    for (int l = 0; l < TILE; l++) {
                        int32_t acc = 0;
                        for (int k = 0; k < 32; k++) { /* byte k of the pair's 32: line g = k / 4 */
                            const uint8_t q = wt[(((size_t)sb * 32 + (size_t)j * 8 + (size_t)(k / 4)) * ls + i) * 64 + l * 4 + k % 4];
                            acc += (int32_t)(h ? q >> 4 : q & 15) * xb[k];
                        }
                        const float sc = sm_f16_to_f32(e[l]) * (float)sm[16 * sub + l];
                        const float mn = sm_f16_to_f32(e[16 + l]) * (float)sm[128 + 16 * sub + l];
                        v[l] = fmaf((float)acc, sc * dx, v[l]) - mn * sx;
                    }
                }
            finish(v, y + (size_t)r * ldy, NULL, (t0 + i) * TILE, w->N, 0);
        }
#endif
}

/* y (rows, N) = the rows' Q8_K activations (act, ab bytes each) by a Q4_K matrix's tiles, its
 * rows j0..j1 (multiples of 16): tile by tile within each group of GROUP, DNT at a time for
 * one row, one at a time for several */
static void q4k_span(const sm_mat *w, const uint8_t *act, long long ab, int rows, float *y,
                     int j0, int j1, long long ahead)
{
    const int t1 = (j1 + TILE - 1) / TILE;
    for (int t = j0 / TILE; t < t1;) {
        const int end = (t / GROUP + 1) * GROUP < t1 ? (t / GROUP + 1) * GROUP : t1;
        const int nt = rows == 1 && end - t >= DNT ? DNT : 1;
        for (int r0 = 0; r0 < rows; r0 += MAXRB) {
            const int rb = rows - r0 < MAXRB ? rows - r0 : MAXRB;
            const uint8_t *a = act + (size_t)r0 * (size_t)ab;
            float *yr = y + (size_t)r0 * w->N;
            if (nt == DNT) q4k_block(w, t, DNT, 1, a, ab, yr, w->N, ahead);
            else if (rb == MAXRB) q4k_block(w, t, 1, MAXRB, a, ab, yr, w->N, ahead);
            else for (int r = 0; r < rb; r++)
                q4k_block(w, t, 1, 1, a + (size_t)r * (size_t)ab, ab, yr + (size_t)r * w->N, w->N, ahead);
        }
        t += nt;
    }
}

/* y (rows, N) = act (rows, already rounded, ab bytes each) by w's rows j0..j1, each group
 * of rows after a prefetch of the bytes `ahead` further on (0: none) */
static void rows_span(const sm_mat *w, const uint8_t *act, long long ab, int rows, float *y,
                      int j0, int j1, long long ahead)
{
    if (w->q && w->type == T_Q4_K) { /* its tiles, on the same activation as its rows */
        q4k_span(w, act, ab, rows, y, j0, j1, ahead);
        return;
    }
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
 * 64-byte line meets one broadcast of four activations and no row ends in a reduction.
 * tile_blocks does it for every type whose block is an f16 scale and then bytes (at qs, nqs
 * of them): block b's groups of 4 bytes, group g of the 16 rows side by side in the block's
 * line g; Q5_0 (qh) adds a line of its fifth bits. q holds N16 K nqs / 32 bytes (Q5_0: + N16 K
 * / 8), s N16 K / 32 halves, both zeroed by the caller (the padding rows stay zero). Returns
 * 0, or -1 for a matrix not of `type`, or of a K not a multiple of 32. */
static int tile_blocks(const sm_mat *w, uint8_t *q, uint16_t *s, int type, int qs, int nqs, int qh)
{
    if (w->kind != KIND_BLOCKS || w->type != type || w->K % QBLOCK) return -1;
    const int nb = w->K / QBLOCK, tiles = PAD(w->N, TILE) / TILE, lines = nqs / 4 + (qh > 0);
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < tiles; t++) {
        size_t base, ls, sbase, ss;
        lines_of(t, tiles, (size_t)nb * (size_t)lines, &base, &ls);
        lines_of(t, tiles, (size_t)nb, &sbase, &ss);
        for (int l = 0; l < TILE && t * TILE + l < w->N; l++) {
            const uint8_t *row = w->w + (size_t)(t * TILE + l) * (size_t)w->row_bytes;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = row + (size_t)b * (size_t)(w->row_bytes / nb);
                memcpy(&s[(sbase + (size_t)b * ss) * TILE + l], blk, 2); /* the f16 scale */
                for (int g = 0; g < nqs / 4; g++)
                    memcpy(q + (base + ((size_t)b * lines + g) * ls) * 64 + 4 * l, blk + qs + 4 * g, 4);
                if (qh) { /* bits 4l..4l+3 of line g's masks: values 4g.. (low), 16 + 4g.. (high) */
                    uint32_t h;
                    memcpy(&h, blk + qh, 4);
                    uint8_t *fm = q + (base + ((size_t)b * lines + 4) * ls) * 64;
                    for (int g = 0; g < 4; g++) {
                        fm[16 * g + l / 2] |= (uint8_t)(((h >> (4 * g)) & 15) << (4 * (l % 2)));
                        fm[16 * g + 8 + l / 2] |= (uint8_t)(((h >> (16 + 4 * g)) & 15) << (4 * (l % 2)));
                    }
                }
            }
        }
    }
    return 0;
}
int sm_g_tile_q8_0(const sm_mat *w, int8_t *q, uint16_t *s)
{
    return tile_blocks(w, (uint8_t *)q, s, T_Q8_0, offsetof(blk_q8_0, qs), 32, 0);
}
/* --8<-- [end:tile_q8_0] */

/* --8<-- [start:tile_q4_0] */
/* Q4_0's tiles keep the file's nibbles: a block's 16 bytes in 4 lines, the low nibbles of a
 * group values 4g..4g+3, the high ones 16+4g..16+4g+3 (tiles.c's q4_block). Q5_0's add a fifth
 * line, its fifth bits as eight 64-bit masks over the four lines' bytes (for each line the low
 * nibbles' bits, then the high ones'); both as many bytes as the file's rows. */
int sm_g_tile_q4_0(const sm_mat *w, uint8_t *q, uint16_t *s)
{
    return tile_blocks(w, q, s, T_Q4_0, offsetof(blk_q4_0, qs), 16, 0);
}
int sm_g_tile_q5_0(const sm_mat *w, uint8_t *q, uint16_t *s)
{
    return tile_blocks(w, q, s, T_Q5_0, offsetof(blk_q5_0, qs), 16, offsetof(blk_q5_0, qh));
}
/* --8<-- [end:tile_q4_0] */

/* A Q4_K matrix's decode layout: each 256-weight block's nibbles as Q4_0's tiles keep theirs
 * (a sub-block pair's 32 bytes of each row cut into 8 groups of 4), and per block and tile an
 * entry of Q4K_ENTRY halves: the 16 rows' d, their dmin, then their 8 sub-blocks' 6-bit scales
 * and mins as bytes (q4k_block above). q holds N16 K / 2 bytes, s N16 K / 256 Q4K_ENTRY
 * halves, zeroed by the caller. Returns 0, or -1 for a matrix that is not Q4_K. */
int sm_g_tile_q4_k(const sm_mat *w, uint8_t *q, uint16_t *s)
{
    if (w->kind != KIND_BLOCKS || w->type != T_Q4_K || w->K % 256) return -1;
    const int nsb = w->K / 256, tiles = PAD(w->N, TILE) / TILE;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < tiles; t++) {
        size_t base, ls, sbase, ss;
        lines_of(t, tiles, (size_t)w->K / 8, &base, &ls);
        lines_of(t, tiles, (size_t)nsb, &sbase, &ss);
        for (int l = 0; l < TILE && t * TILE + l < w->N; l++) {
            const blk_q4_K *row = (const blk_q4_K *)(w->w + (size_t)(t * TILE + l) * (size_t)w->row_bytes);
            for (int b = 0; b < nsb; b++) {
                uint16_t *e = s + (sbase + (size_t)b * ss) * Q4K_ENTRY;
                uint8_t *sm = (uint8_t *)(e + 32);
                e[l] = row[b].d;
                e[16 + l] = row[b].dmin;
                for (int sub = 0; sub < 8; sub++) {
                    int sc, mn;
                    scale_min_k4(sub, row[b].scales, &sc, &mn);
                    sm[16 * sub + l] = (uint8_t)sc;
                    sm[128 + 16 * sub + l] = (uint8_t)mn;
                }
                for (int g = 0; g < 32; g++) /* 4 pairs of 8 groups */
                    memcpy(q + (base + ((size_t)b * 32 + g) * ls) * 64 + 4 * l, row[b].qs + 4 * g, 4);
            }
        }
    }
    return 0;
}

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
    const int tiled = w->q && w->type != T_Q4_K; /* Q4_K's tiles take its rows' activation */
    const size_t bytes = tiled ? (size_t)rows * ((size_t)K32 + sizeof(float) * (size_t)(K32 / QBLOCK)) + 64
                               : (size_t)rows * (size_t)sm_g_act_bytes(w->type, w->K) + 64;
    uint8_t *act = malloc(bytes);
    if (!act) return;
    if (tiled) {
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
