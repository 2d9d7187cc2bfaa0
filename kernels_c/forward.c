/* Generating text: one forward pass for every architecture the book runs, chapter 4's GPT
 * (GPT-2's block or the modern one) and others' GGUF models (llama, qwen2, qwen3, phi3, gemma3),
 * for n new tokens (n = 1 when decoding, a prompt's rows when prefilling) in one C call,
 * against a key/value cache the caller owns.
 *
 * An architecture is a row of switches in sm_model and sm_layer, not a forward of its own:
 * the norm (LayerNorm with biases, or RMSNorm) and whether a second one follows attention and
 * the MLP before each residual add (post norms: gemma3); positions learned (wpe) or turned by
 * RoPE on the first rope_dim features of each head, in pairs (2i, 2i+1) or (i, i + half: neox),
 * with a table per layer (gemma3's sliding-window layers keep their own base); biases on q, k
 * and v; an RMSNorm over each head's q and k; the query scaled before it meets the keys, or
 * the scores after (attn_scale either way); a sliding window per layer; the MLP's GELU, SwiGLU
 * or GeGLU; the embeddings scaled (gemma3: sqrt(d)); the logits soft-capped. Grouped-query
 * attention: head h reads kv head h / (n_head / n_kv_head).
 *
 * Each weight matrix is an sm_mat in one of three kinds, and a product is chosen by kind:
 * kind 0 and 1, chapter 4's tiles (f32, or int8 with an f16 scale per 32: forward/tiles.c),
 * kind 2, ggml's blocks read straight from a GGUF file's mapping (forward/quants.c, dots.c,
 * blocks.c). The cache has three kinds (forward/attend.c): chapter 4's f32 keys in tiles of
 * 16 positions with its vectorised attention (cache 0), llama.cpp's f16 rows with the
 * attention summed as ggml's flash attention sums it (cache 1), which is what makes a GGUF
 * model's tokens llama.cpp's, or the recurrent block's state (cache 2).
 *
 * A prompt of at least gemm_rows rows takes its products through chapter 2's GEMM (gemm.c,
 * compiled into this file): chapter 4's f32 weights as they are (the plain copy), a GGUF
 * matrix a panel of rows at a time, dequantised to bf16 or f32. Everything else of the
 * forward is the same code for a prompt and for a token.
 *
 * Chapter 4's tiles. Decoding one token is a matrix-vector product per weight matrix: every
 * weight is read once and used for two operations (a multiply and an add), so the time per
 * token is the weight bytes divided by the bandwidth of whatever level of the memory holds
 * them. Two things follow, and the tiles are built on them:
 *
 * - The weights are repacked once into the order the product reads them: tiles of
 *   TILE = 16 output columns, each tile's K rows one after another. One tile row is one
 *   64-byte line (16 f32, or for int8 16 outputs x 4 inputs), so the product streams
 *   every matrix front to back with one vector load per line, and no output ends in a
 *   horizontal reduction: a vector holds 16 outputs, not 16 terms of one.
 * - Fewer bytes per weight is the only lever left once the stream runs at the level's
 *   bandwidth: int8 weights (kind 1) read a quarter of f32's bytes. A weight column is
 *   cut into blocks of QBLOCK = 32 along K, each with its own scale s (an f16, as in
 *   llama.cpp's Q8_0, so the same bytes can be exported): w = s q, q in [-127, 127].
 *   The activation row is quantised per block of 32 as ggml's Q8_0 (sm_quantize_rows):
 *   x = a_b p in block b. Then y_j = sum_b s_jb a_b sum_{k in b} p_k q_kj, the inner sums
 *   exact in int32, each scaled and added in float as llama.cpp's Q8_0 dot does.
 *
 * The inner sum is vpdpbusd on AVX512-VNNI: four u8 x s8 products added into each of 16
 * int32 lanes, one instruction per 64 weights. It wants the activations unsigned, so
 * they go in as p + 128 (p xor 0x80), which adds 128 sum_{k in b} q_kj to each block's
 * sum; one more vpdpbusd per line, of ones against the weights, counts that sum (once for
 * every row of a prompt), and it is taken out of the block's int32 sum before the scaling.
 * On AVX2 there is no VNNI; vpmaddubsw multiplies u8 by s8 into pairs of int16 that would
 * overflow with p + 128, so it takes |q| and moves q's sign onto p (vpsignb), and needs no
 * correction. Where the CPU has AVX-VNNI (vpdpbusd on ymm, VEX: Alder Lake and later, Zen
 * 5) the AVX2 level takes vpdpbusd with the same +128 and count, on two ymm halves of each
 * line. Plain C does the same sums with ints.
 *
 * Layouts (N16 = N rounded up to 16, K32 = K rounded up to 32, zero-padded). A line is
 * one tile's 64 bytes for one k (f32) or one group of four k (int8). The tiles go in groups
 * of GROUP = 8 (the last group may hold fewer, n_g), and a group's lines are interleaved:
 * first line 0 of its n_g tiles, then line 1 of each, ... so that a block of a group's tiles
 * reads one stream, front to back, that the hardware prefetcher follows:
 *   f32:  f[group][K][n_g][16]
 *   int8: q[group][K32/4][n_g][16][4]  (four consecutive k per output, as vpdpbusd wants)
 *         s[group][K32/32][n_g][16]    (f16 scale per output and block)
 * Threads split a product's tiles (static schedule: a thread reads the same slice of each
 * matrix at every token). A GGUF Q8_0 matrix has the same int8 values and f16 scales as
 * this int8 form, so it is repacked once into these tiles too (blocks.c, sm_g_tile_q8_0),
 * and its products below the GEMM branch stream the tiles instead of the file's rows. A GGUF
 * Q4_0 matrix is repacked into tiles of its own nibbles (sm_g_tile_q4_0):
 *   q4:   q[group][K32/8][n_g][16][4]  (bytes 4g..4g+3 of a block's 16: k = 4g.. low, 16+4g.. high)
 *         s as int8's
 *
 * Others' blocks.
 *
 * A GGUF matrix of ne = [K, N] is N rows of K weights, each row a run of blocks. A decode
 * step multiplies one activation row by every matrix, so it reads every weight once and
 * does two operations with it: its time is the bytes of the blocks over the bandwidth of
 * the level that holds them, and the arithmetic only has to keep up. It does so as llama.cpp
 * does, which is also what makes the tokens comparable with llama.cpp's: the activation row is
 * first rounded to the "vec_dot" type that llama.cpp pairs with the weights' type, and each
 * row's dot product is then exact integer sums per block, scaled in float:
 *
 *   weights        activation rounded to              one block's contribution
 *   F32            F32 (none)                         w x
 *   F16, BF16      F16, BF16 (round to nearest even)  w x, in f32
 *   Q8_0 Q4_0 Q5_0 Q8_0: 32 int8 with an f16 scale    d_w d_x sum q_w q_x
 *   Q4_K           Q8_K: 256 int8 with an f32 scale   d_x (d sum_j sc_j sum q q_x
 *                  and the sums of each 16                 - dmin sum_j m_j sum q_x)
 *   Q6_K           Q8_K                               d_x d sum_16 sc_16 sum (q - 32) q_x
 *
 * (Q8_0's activation: d = max|x| / 127 stored as f16, q = round-half-even(x 127 / max|x|),
 * as llama.cpp's x86 code does; Q8_K's: scale -127 / x_m with x_m the value of largest
 * magnitude, q = min(127, round-half-even), as its reference does, which every x86 build
 * uses.) The integer sums go through one instruction, u8 x s8 -> four products added into
 * an int32 lane: vpdpbusd where the CPU has VNNI (AVX512-VNNI on ymm or zmm, AVX-VNNI on
 * ymm), else vpmaddubsw then vpmaddwd. Nibbles and 6-bit values are unsigned, so they go in
 * as the u8 side directly; the subtracted offsets (-8 of Q4_0, -16 of Q5_0, -32 of Q6_K,
 * Q4_K's mins) are handled as llama.cpp's formats intend: Q4_0/Q5_0 subtract before the
 * product (a signed weight, whose sign moves onto the activation), Q6_K and Q4_K take the
 * activation's block sums (Q8_K's bsums). The AVX-512 level multiplies two 32-weight blocks
 * per zmm for Q8_0, Q4_0 and Q5_0, against an activation stored once in pairs of blocks
 * (blk_q8_0x2, with each lane's scale as a float and each block's sum); with VNNI, Q8_0's
 * weights go in flipped to w + 128 and the sum starts from -128 times the block's sum of the
 * activation. The K-quants' 256-weight blocks stay on ymm at every level (their scales change
 * every 16 or 32 weights). Plain C does the same sums with ints. Every product on the rows
 * prefetches them a page ahead (blocks.c, PREFETCH_AHEAD); a Q8_0 or Q4_0 matrix's decode
 * reads its tiles instead (above; Q4_0's keep the nibbles, tiles.c's q4_block), one stream a
 * group, read the same distance ahead (chapter 4's own int8 tiles are not).
 *
 * Threads split a product's rows (static: a thread reads the same slice of each matrix at
 * every token); a matrix smaller than par_min_bytes stays on one core. A prompt of n rows
 * runs each block of 4 weight rows against all n rounded activation rows while those 4
 * rows are in L1: every weight is read from memory once per call, not once per token.
 *
 */
#include "gemm.c" /* chapter 2's GEMM: the prompt's products (its names stay its own) */
/* the ids of kinds, norms, MLPs, RoPEs, caches and ggml's types are forward.h's enums, which
 * cffi reads too: Python takes them from the compiled library (tests/test_forward_ids.py) */
#include "forward/internal.h"
#include "forward/tiles.c"  /* chapter 4's tiles */
#include "forward/quants.c" /* others' weights: ggml's block layouts, the activations */
#include "forward/dots.c"   /* ... one row's dot, a function a type */
#include "forward/blocks.c" /* ... the table of types, the products on the file's rows */
#include "forward/qgemm.c"  /* the prompt's integer GEMM on those blocks */
#include "forward/attend.c" /* the attention, one function a cache */

/* Seconds of one row's product by w on one thread, the best of reps, the row rounded as the
 * product rounds it (the threshold below which a product stays on one core is derived from
 * it). Returns -1 where the scratch cannot be had. */
double sm_time_product(const sm_mat *w, int reps)
{
    const int K = w->K, K32 = PAD(K, QBLOCK),
              tiled = w->kind == KIND_INT8 || (w->q && w->type != T_Q4_K); /* Q4_K's tiles: its
                                                                          * rows' activation */
    const long long act = tiled ? K32 : sm_g_act_bytes(w->type, K);
    float *x = malloc(sizeof(float) * ((size_t)K + (size_t)w->N + (size_t)(K32 / QBLOCK) + 16));
    uint8_t *a = malloc((size_t)act + 64);
    if (!x || !a) {
        free(x), free(a);
        return -1.0;
    }
    float *y = x + K, *xs = y + w->N;
    for (int k = 0; k < K; k++) x[k] = 1.0f;
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (tiled) {
            sm_quantize_rows(x, 1, K, (int8_t *)a, xs);
            if (w->kind == KIND_BLOCKS) tiles_span(w, (int8_t *)a, xs, 1, y, 0, w->N, PREFETCH_AHEAD);
            else sm_matmul(w, x, (int8_t *)a, xs, y, 1, 0, 1);
        } else if (w->kind == KIND_BLOCKS) {
            sm_g_quantize(w->type, x, K, a);
            block_product(w, a, act, 1, y, 1, PREFETCH_AHEAD);
        } else {
            sm_matmul(w, x, NULL, NULL, y, 1, 0, 1);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        const double t = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        best = t < best ? t : best;
    }
    free(x), free(a);
    return best;
}

/* ------------------------------------------------------------------ the layers */
static void norm_rows(const sm_model *m, const float *x, const float *w, const float *b,
                      float *out, int rows, int C)
{
    const int rms = m->norm == NORM_RMS;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * C;
        norm_row(xr, rms ? 0.0f : row_sum(xr, C) / C, w, rms ? NULL : b, out + (size_t)r * C, C,
                 m->eps);
    }
}

/* ggml's GELU where GGML_GELU_FP16 is defined (its CPU default): the input rounded to f16,
 * the tanh GELU of that f16 value in f32 rounded to f16 again (the entry of its table of
 * 65 536), and the ends passed through. */
static inline float gelu_ggml(float x)
{
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    const float v = sm_f16_to_f32(sm_f32_to_f16(x));
    const float g = 0.5f * v * (1.0f + tanhf(SM_GELU_K * v * (1.0f + SM_GELU_A * v * v)));
    return sm_f16_to_f32(sm_f32_to_f16(g));
}

/* The MLP's activation for rows of h features into g (stride h): GELU of a (GPT-2's, in
 * chunks); SwiGLU silu(a) b; GeGLU gelu(a) b as ggml computes it. a and b are each row's gate
 * and up, sa apart from one row to the next (a fused [gate | up] row, or their own buffers). */
static void activation(const sm_model *m, const float *a, const float *b, size_t sa, float *g,
                       int rows, int h)
{
    for (int r = 0; r < rows; r++) {
        const float *ar = a + (size_t)r * sa, *br = b ? b + (size_t)r * sa : NULL;
        float *o = g + (size_t)r * h;
        if (m->mlp == MLP_GEGLU) {
            for (int i = 0; i < h; i++) o[i] = gelu_ggml(ar[i]) * br[i];
            continue;
        }
        for (int i0 = 0; i0 < h; i0 += CHUNK) {
            const int n = h - i0 < CHUNK ? h - i0 : CHUNK;
            if (m->mlp == MLP_SWIGLU)
                swiglu_chunk(ar + i0, br + i0, o + i0, n);
            else
                gelu_chunk(ar + i0, o + i0, n);
        }
    }
}

/* one head's first rope_dim features turned by the angles of position p (the layer's table) */
static void rope(const sm_model *m, const sm_layer *L, float *hd, int p)
{
    const int half = m->rope_dim / 2;
    const float *cs = L->rope_cos ? L->rope_cos : m->rope_cos;
    const float *sn = L->rope_sin ? L->rope_sin : m->rope_sin;
    const float *c = cs + (size_t)p * half, *s = sn + (size_t)p * half;
    if (m->rope == ROPE_PAIRS) {
        rope_head(hd, c, s, half, 1.0f);
        return;
    }
    for (int i = 0; i < half; i++) {
        const float a = hd[i], b = hd[i + half];
        hd[i] = a * c[i] - b * s[i];
        hd[i + half] = a * s[i] + b * c[i];
    }
}


/* ------------------------------------------------------------------ the work space */
typedef struct {
    float *x, *t, *qkv, *att, *o, *u, *g, *scores, *xs, *panel, *scratch, *gemm;
    uint8_t *act, *qpanel;
    uint16_t *xb;
} work_t;

static int max2(int a, int b) { return a > b ? a : b; }

/* The most rows of one block: the direct products' block, or the GEMM's where there is one
 * (gemm_block_rows > 0: the prompt may take the GEMM, from gemm_rows rows on). */
static int most_rows(const sm_model *m)
{
    return m->gemm_block_rows > 0 ? max2(m->block_rows, m->gemm_block_rows) : m->block_rows;
}

static long long carve(const sm_model *m, work_t *w)
{
    const int R = most_rows(m), d = m->d, hid = m->hidden;
    const int qd = m->n_head * m->head_dim, kd = m->n_kv_head * m->head_dim,
              vd = m->n_kv_head * m->v_dim, ad = m->n_head * m->v_dim;
    const int kmax = max2(max2(d, hid), ad), nt = m->max_threads > 0 ? m->max_threads : 1;
    const int gemm = m->gemm_block_rows > 0, nc = m->gemm_nc > 0 ? m->gemm_nc : 1;
    const int panel_rows = gemm ? nc : 0;
    long long off = 0;
#define TAKE(field, type, count)                                   \
    do {                                                           \
        if (w) w->field = (type *)(void *)(m->work + off);         \
        off += ((long long)(count) + 15) / 16 * 16;                \
    } while (0)
    TAKE(x, float, (long long)R * d);
    TAKE(t, float, (long long)R * d);
    TAKE(qkv, float, (long long)R * (qd + kd + vd));
    TAKE(att, float, (long long)R * ad);
    TAKE(o, float, (long long)R * d);
    TAKE(u, float, (long long)R * 2 * hid);
    TAKE(g, float, (long long)R * hid);
    TAKE(scores, float, m->cache == CACHE_TILES ? (long long)R * m->n_head * PAD(m->context, 16)
                        : m->cache == CACHE_STATE ? (long long)R * m->n_head : 0); /* or gates */
    TAKE(xs, float, (long long)R * (PAD(kmax, QBLOCK) / QBLOCK)); /* int8 rows' block scales */
    /* the rounded inputs: up to three at once (q, k, v), at most 8 bytes a weight (the
     * paired Q8_0 takes 6), or int8 tiles' byte a weight */
    TAKE(act, uint8_t, (gemm && qg_act_bytes(R, kmax) > (long long)R * 24 * PAD(kmax, 256) + 768
                        ? qg_act_bytes(R, kmax) : (long long)R * 24 * PAD(kmax, 256) + 768) / 4);
    TAKE(xb, uint16_t, gemm ? ((long long)R * kmax + 1) / 2 : 0);
    TAKE(panel, float, (long long)panel_rows * kmax);
    TAKE(scratch, float, gemm ? (long long)nt * kmax : 0);
    TAKE(qpanel, uint8_t, gemm ? (nt * qg_panel_bytes(kmax) + 3) / 4 : 0);
    TAKE(gemm, float, gemm ? gemm_work_floats(max2(nc, max2(m->vocab, max2(2 * hid, qd + kd + vd))),
                                              kmax, m->gemm_mc, max2(m->gemm_kc, m->amx_kc),
                                              max2(nc, m->amx_nc), nt) : 0);
#undef TAKE
    return off;
}

long long sm_work_floats(const sm_model *m)
{
    return carve(m, NULL);
}


/* ------------------------------------------------------------------ the products */
/* --8<-- [start:gemm_branch] */
/* A prompt's product through chapter 2's GEMM: y (rows x N) = x (rows x K) W, + y where acc.
 * Chapter 4's weights have their plain f32 matrix (K x N, or N x K where plain_trans); a GGUF
 * matrix is dequantised nc rows at a time (the GEMM's own column block, so the panels add no
 * packing the GEMM would not do) into bf16 where the machine's bf16 path beats its f32 GEMM
 * (gemm_bf16 >= 0: chapter 2's path number; on AMX tiles, with the tiles' own blocks amx_kc
 * and amx_nc), else into f32. The activations are rounded to bf16 once per product. Where
 * gemm_int8 is set, a matrix with an integer form (a GGUF Q8_0, Q4_0, Q5_0, Q4_K or Q6_K
 * matrix, or chapter 4's int8 weights, given as Q8_0 blocks in w) goes through the integer
 * GEMM instead
 * (forward/qgemm.c). */
static int gemm_product(const sm_model *m, const sm_mat *W, const float *x, int rows, float *y,
                        int acc, work_t *w, int nthreads)
{
    const int K = W->K, N = W->N;
    const float beta = acc ? 1.0f : 0.0f;
    if (m->gemm_int8 && W->w && qg_supported(W->type) && K % qg_k_multiple(W->type) == 0) { /* the integer GEMM */
        qg_product(W, x, rows, y, acc, w->act, w->qpanel, nthreads, m->gemm_int8 == 2);
        if (W->bias)
            for (int r = 0; r < rows; r++)
                for (int j = 0; j < N; j++) y[(size_t)r * N + j] += W->bias[j];
        return 1;
    }
    if (W->kind != KIND_BLOCKS) {
        if (!W->plain) return 0;
        gemm_f32(0, W->plain_trans, rows, N, K, 1.0f, x, K, W->plain, W->plain_trans ? K : N,
                 beta, y, N, nthreads, m->gemm_order, m->gemm_mc, m->gemm_kc, m->gemm_nc, w->gemm);
        if (W->bias)
            for (int r = 0; r < rows; r++)
                for (int j = 0; j < N; j++) y[(size_t)r * N + j] += W->bias[j];
        return 1;
    }
    const int bf16 = m->gemm_bf16 >= 0, nc = m->gemm_nc;
    if (bf16)
        for (size_t i = 0; i < (size_t)rows * K; i++) w->xb[i] = sm_f32_to_bf16(x[i]);
    for (int r0 = 0; r0 < N; r0 += nc) {
        const int r1 = N - r0 < nc ? N : r0 + nc;
        if (bf16) {
            uint16_t *panel = (uint16_t *)w->panel;
            sm_g_rows_bf16(W, r0, r1, panel, w->scratch, nthreads);
            const int amx = m->gemm_bf16 == 2 && m->amx_kc > 0; /* the tiles' own blocks */
            gemm_bf16(m->gemm_bf16, 0, 1, rows, r1 - r0, K, 1.0f, w->xb, K, panel, K, beta,
                      y + r0, N, nthreads, m->gemm_order, m->gemm_mc,
                      amx ? m->amx_kc : m->gemm_kc, amx ? m->amx_nc : m->gemm_nc, w->gemm);
        } else {
            sm_g_rows(W, r0, r1, w->panel, nthreads);
            gemm_f32(0, 1, rows, r1 - r0, K, 1.0f, x, K, w->panel, K, beta, y + r0, N, nthreads,
                     m->gemm_order, m->gemm_mc, m->gemm_kc, m->gemm_nc, w->gemm);
        }
    }
    return 1;
}
/* --8<-- [end:gemm_branch] */

/* Up to three GGUF matrices that read the same input (q, k and v; gate and up) in one parallel
 * region: each thread takes an equal share of their bytes, in runs of 16 rows, so a small
 * matrix (k and v under grouped-query attention) does not leave a core idle while another
 * works, and the team meets once, not once a matrix. Row j of matrix i starts at byte
 * start_i + j row_bytes_i of the concatenation; a thread's share [P_t, P_t+1) of the bytes
 * becomes the rows at_rows(P_t) .. at_rows(P_t+1) of each matrix, the same function at both
 * ends, so the shares tile every matrix. The input is rounded once for each matrix's type.
 * Together they stay on one core below par_min_bytes. */
static int at_rows(const sm_mat *w, long long start, long long P)
{
    const long long u = w->q ? TILE * TILE_RUN : 16; /* a tiled matrix in whole runs of tiles */
    if (P >= start + (long long)w->N * w->row_bytes) return w->N; /* past its end: all of it,
                                                                    * however few rows it has */
    const long long r = P <= start ? 0 : ((P - start) / w->row_bytes + u / 2) / u * u;
    return r < w->N ? (int)r : w->N;
}

static void block_products(const sm_model *m, const sm_mat *const *ws, float *const *ys,
                           int count, const float *x, int rows, work_t *wk, int nthreads)
{
    const uint8_t *act[3];
    const float *xs[3] = {NULL, NULL, NULL};
    long long ab[3], start[4] = {0};
    uint8_t *a = wk->act;
    double t0 = part_now(m);
    for (int i = 0; i < count; i++) {
        /* int8 per 32 for tiles; a Q4_K matrix's tiles take its rows' Q8_K */
        const int tiled = ws[i]->q != NULL && ws[i]->type != T_Q4_K, K32 = PAD(ws[i]->K, QBLOCK);
        ab[i] = tiled ? K32 : sm_g_act_bytes(ws[i]->type, ws[i]->K);
        start[i + 1] = start[i] + (long long)ws[i]->N * ws[i]->row_bytes;
        if (i > 0 && tiled == (ws[i - 1]->q != NULL && ws[i - 1]->type != T_Q4_K) && ws[i]->K == ws[i - 1]->K &&
            (tiled || sm_g_act_type(ws[i]->type) == sm_g_act_type(ws[i - 1]->type))) {
            act[i] = act[i - 1], xs[i] = xs[i - 1]; /* the same rounding of the same input: made once */
            continue;
        }
        act[i] = a;
        if (tiled) { /* int8 per block of 32, the scales after the values */
            xs[i] = (const float *)(const void *)(a + ((long long)rows * K32 + 63) / 64 * 64);
            sm_quantize_rows(x, rows, ws[i]->K, (int8_t *)a, (float *)xs[i]);
            a += ((long long)rows * K32 + 63) / 64 * 64 + ((long long)rows * (K32 / QBLOCK) * 4 + 63) / 64 * 64;
        } else {
            quantize_rows(ws[i]->type, x, rows, ws[i]->K, a);
            a += (rows * ab[i] + 63) / 64 * 64;
        }
    }
    const long long total = start[count];
    const int nt = team(m, total, nthreads);
    part_add(m, PART_ROUND, t0);
    t0 = part_now(m);
    #pragma omp parallel for schedule(static) num_threads(nt)
    for (int t = 0; t < nt; t++) {
        const long long p0 = total * t / nt, p1 = total * (t + 1) / nt;
        for (int i = 0; i < count; i++) {
            const int j0 = at_rows(ws[i], start[i], p0), j1 = at_rows(ws[i], start[i], p1);
            if (j1 <= j0) continue;
            if (m->products_off) /* the probe of the rest of a step: the same regions, no weight read */
                for (int r = 0; r < rows; r++)
                    memset(ys[i] + (size_t)r * ws[i]->N + j0, 0, sizeof(float) * (size_t)(j1 - j0));
            else if (ws[i]->q && ws[i]->type != T_Q4_K)
                tiles_span(ws[i], (const int8_t *)act[i], xs[i], rows, ys[i], j0, j1,
                           ws[i]->kind == KIND_BLOCKS ? m->ahead : 0); /* a GGUF file's tiles
                                                                        * are read ahead as its rows */
            else
                rows_span(ws[i], act[i], ab[i], rows, ys[i], j0, j1, m->ahead);
        }
    }
    part_add(m, PART_PRODUCTS, t0);
}

/* --8<-- [start:products] */
/* y_i (rows x N_i) = x (rows x K) W_i for the count <= 3 matrices of one input, each + y_i
 * where acc: through the GEMM for a prompt of gemm_rows or more, else each matrix's own
 * product: chapter 4's tiles one matrix at a time (the input quantised first for int8),
 * ggml's blocks together in one region. */
static void products(const sm_model *m, const sm_mat *const *ws, float *const *ys, int count,
                     const float *x, int rows, int acc, work_t *w, int nthreads)
{
    if (m->gemm_block_rows > 0 && rows >= m->gemm_rows) {
        int done = 1;
        const double t0 = part_now(m);
        for (int i = 0; i < count; i++) done &= gemm_product(m, ws[i], x, rows, ys[i], acc, w, nthreads);
        part_add(m, PART_PRODUCTS, t0);
        if (done) return;
    }
    if (ws[0]->kind != KIND_BLOCKS) {
        for (int i = 0; i < count; i++) {
            const sm_mat *W = ws[i];
            const long long bytes = (long long)PAD(W->K, QBLOCK) * PAD(W->N, TILE) * (W->kind ? 1 : 4);
            double t0 = part_now(m);
            if (W->kind == KIND_INT8) sm_quantize_rows(x, rows, W->K, (int8_t *)w->act, w->xs);
            part_add(m, PART_ROUND, t0);
            t0 = part_now(m);
            sm_matmul(W, x, W->kind ? (int8_t *)w->act : NULL, W->kind ? w->xs : NULL, ys[i], rows,
                      acc, team(m, bytes * rows, nthreads));
            part_add(m, PART_PRODUCTS, t0);
        }
        return;
    }
    if (!acc) {
        block_products(m, ws, ys, count, x, rows, w, nthreads);
        return;
    }
    for (int i = 0; i < count; i++) { /* ggml's rows are written, not added to: add after */
        const int N = ws[i]->N;
        float *tmp = w->o;
        block_products(m, &ws[i], &tmp, 1, x, rows, w, nthreads);
        const double t0 = part_now(m);
        for (size_t k = 0; k < (size_t)rows * N; k++) ys[i][k] += tmp[k];
        part_add(m, PART_NORM, t0);
    }
}
/* --8<-- [end:products] */

static void product(const sm_model *m, const sm_mat *W, const float *x, int rows, float *y,
                    int acc, work_t *w, int nthreads)
{
    const sm_mat *ws[1] = {W};
    float *ys[1] = {y};
    products(m, ws, ys, 1, x, rows, acc, w, nthreads);
}

/* x += the block's output o (rows x d), after the post norm where the layer has one. */
static void residual(const sm_model *m, const float *post, float *x, float *o, int rows)
{
    const int d = m->d;
    const double t0 = part_now(m);
    if (post) norm_rows(m, o, post, NULL, o, rows, d);
    for (size_t i = 0; i < (size_t)rows * d; i++) x[i] += o[i];
    part_add(m, PART_NORM, t0);
}

static void add_bias(float *y, size_t stride, const float *b, int rows, int N)
{
    if (!b) return;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < N; j++) y[(size_t)r * stride + j] += b[j];
}

/* ------------------------------------------------------------------ one layer */

/* --8<-- [start:attention] */
/* q, k, v for the block's rows (rows at positions p0 ..): their norms and RoPE, then the
 * model's cache takes k and v and each row's attention over it goes into w->att
 * (forward/attend.c: one function a cache, behind one signature). */
static void attention(const sm_model *m, int l, work_t *w, int rows, int p0, int nthreads)
{
    const sm_layer *L = m->layers + l;
    const int H = m->n_head, nkv = m->n_kv_head, hd = m->head_dim, vd = m->v_dim;
    const int qd = H * hd, kd = nkv * hd, vdt = nkv * vd, fused = L->qkv.N > 0;
    /* q, k and v rows: one fused row of qd + kd + vd, or three buffers of their own */
    float *qb = w->qkv, *kb = fused ? qb + qd : qb + (size_t)rows * qd,
          *vb = fused ? qb + qd + kd : kb + (size_t)rows * kd;
    const size_t qs = fused ? (size_t)(qd + kd + vdt) : (size_t)qd,
                 ks = fused ? qs : (size_t)kd, vs = fused ? qs : (size_t)vdt;
    if (fused) {
        product(m, &L->qkv, w->t, rows, qb, 0, w, nthreads);
    } else {
        const sm_mat *ws[3] = {&L->q, &L->k, &L->v};
        float *ys[3] = {qb, kb, vb};
        products(m, ws, ys, 3, w->t, rows, 0, w, nthreads);
    }
    double t0 = part_now(m);
    add_bias(qb, qs, L->bq, rows, qd);
    add_bias(kb, ks, L->bk, rows, kd);
    add_bias(vb, vs, L->bv, rows, vdt);
    sm_qkv x = {qb, kb, vb, qs, ks, vs, NULL};
    if (m->cache == CACHE_STATE) {  /* the recurrent block: its gates' logits */
        part_add(m, PART_POSITIONS, t0);
        product(m, &L->decay, w->t, rows, w->scores, 0, w, nthreads);
        t0 = part_now(m);
        x.gate = w->scores;
    } else {
        for (int r = 0; r < rows; r++) {
            const int p = p0 + r;
            float *qr = qb + (size_t)r * qs, *kr = kb + (size_t)r * ks;
            for (int h = 0; h < H; h++) {
                if (L->q_norm) norm_row(qr + h * hd, 0.0f, L->q_norm, NULL, qr + h * hd, hd, m->eps);
                if (m->rope) rope(m, L, qr + h * hd, p);
            }
            for (int h = 0; h < nkv; h++) {
                if (L->k_norm) norm_row(kr + h * hd, 0.0f, L->k_norm, NULL, kr + h * hd, hd, m->eps);
                if (m->rope) rope(m, L, kr + h * hd, p);
            }
        }
        part_add(m, PART_POSITIONS, t0);
        t0 = part_now(m);
    }
    ATTEND[m->cache](m, l, &x, w->att, w->scores, rows, p0, nthreads);
    part_add(m, PART_ATTEND, t0);
}
/* --8<-- [end:attention] */

/* --8<-- [start:mlp] */
static void mlp(const sm_model *m, const sm_layer *L, work_t *w, int rows, int nthreads)
{
    const int hid = m->hidden;
    float *out = L->post2_w ? w->o : w->x;   /* added straight into x, or normed first */
    if (m->mlp == MLP_GELU) {
        product(m, &L->up, w->t, rows, w->u, 0, w, nthreads);
        const double t0 = part_now(m);
        activation(m, w->u, NULL, hid, w->g, rows, hid);
        part_add(m, PART_ACTIVATION, t0);
    } else if (L->gate.N > 0) {              /* gate and up: two matrices of one input */
        const sm_mat *ws[2] = {&L->gate, &L->up};
        float *ys[2] = {w->u, w->u + (size_t)rows * hid};
        products(m, ws, ys, 2, w->t, rows, 0, w, nthreads);
        const double t0 = part_now(m);
        activation(m, w->u, w->u + (size_t)rows * hid, hid, w->g, rows, hid);
        part_add(m, PART_ACTIVATION, t0);
    } else {                                 /* one fused matrix: each row [gate | up] */
        product(m, &L->up, w->t, rows, w->u, 0, w, nthreads);
        const double t0 = part_now(m);
        activation(m, w->u, w->u + hid, 2 * hid, w->g, rows, hid);
        part_add(m, PART_ACTIVATION, t0);
    }
    const int direct = !L->post2_w && L->down.kind != KIND_BLOCKS;
    product(m, &L->down, w->g, rows, direct ? out : w->o, direct, w, nthreads);
    if (!direct) residual(m, L->post2_w, w->x, w->o, rows);
}
/* --8<-- [end:mlp] */

/* --8<-- [start:forward] */
/* Tokens tokens[0..n) at positions pos..pos+n-1: their keys and values go into the cache,
 * and the logits of the last one (or of all n, all_logits) into logits. The rows go in
 * blocks of block_rows (gemm_block_rows where the prompt takes the GEMM). Returns 0, or a
 * negative code for bad arguments (checked before anything is written). */
int sm_forward(const sm_model *m, const int *tokens, int n, int pos, float *logits,
               int all_logits, int nthreads)
{
    if (n < 1) return -1;
    if (pos < 0 || pos + n > m->context) return -2;
    if (!m->work || m->work_floats < sm_work_floats(m) || m->block_rows < 1) return -3;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->vocab) return -4;
    if (m->cache == CACHE_TILES && m->v_dim != m->head_dim) return -5;
    if (m->cache == CACHE_STATE && (m->v_dim != m->head_dim || m->n_kv_head != m->n_head ||
                                    m->layers[0].decay.N != m->n_head)) return -5;
    for (int l = 0; l < m->n_layer; l++)
        if (m->cache == CACHE_TILES && m->layers[l].window > 0) return -5;
    if (nthreads < 1 || nthreads > (m->max_threads > 0 ? m->max_threads : 1)) return -6;
    const int d = m->d, V = m->vocab;
    const int block = m->gemm_block_rows > 0 && n >= m->gemm_rows ? m->gemm_block_rows : m->block_rows;
    work_t w;
    carve(m, &w);
    for (int r0 = 0; r0 < n; r0 += block) {
        const int rows = n - r0 < block ? n - r0 : block, p0 = pos + r0;
        double t0 = part_now(m);
        for (int r = 0; r < rows; r++) {           /* the embeddings */
            float *xr = w.x + (size_t)r * d;
            sm_g_row(&m->embd, tokens[r0 + r], xr);
            if (m->embed_scale != 0.0f)  /* gemma3's sqrt(d); 0: none */
                for (int c = 0; c < d; c++) xr[c] *= m->embed_scale;
            if (m->wpe)
                for (int c = 0; c < d; c++) xr[c] += m->wpe[(size_t)(p0 + r) * d + c];
        }
        part_add(m, PART_EMBED, t0);
        for (int l = 0; l < m->n_layer; l++) {
            const sm_layer *L = m->layers + l;
            t0 = part_now(m);
            norm_rows(m, w.x, L->norm1_w, L->norm1_b, w.t, rows, d);
            part_add(m, PART_NORM, t0);
            attention(m, l, &w, rows, p0, nthreads);
            const int direct = !L->post1_w && L->o.kind != KIND_BLOCKS;  /* x += att Wo */
            product(m, &L->o, w.att, rows, direct ? w.x : w.o, direct, &w, nthreads);
            if (!direct) residual(m, L->post1_w, w.x, w.o, rows);
            t0 = part_now(m);
            norm_rows(m, w.x, L->norm2_w, L->norm2_b, w.t, rows, d);
            part_add(m, PART_NORM, t0);
            mlp(m, L, &w, rows, nthreads);
        }
        if (!all_logits && r0 + rows < n) continue;
        const int first = all_logits ? 0 : rows - 1;  /* the head */
        float *out = logits + (all_logits ? (size_t)r0 * V : 0);
        t0 = part_now(m);
        norm_rows(m, w.x + (size_t)first * d, m->out_norm_w, m->out_norm_b, w.t, rows - first, d);
        part_add(m, PART_NORM, t0);
        product(m, &m->head, w.t, rows - first, out, 0, &w, nthreads);
        if (m->softcap > 0.0f)
            for (size_t i = 0; i < (size_t)(rows - first) * V; i++)
                out[i] = m->softcap * tanhf(out[i] / m->softcap);
    }
    return 0;
}
/* --8<-- [end:forward] */
