/* Others' weights, part 1: ggml's block layouts as the file holds them, the activation
 * row rounded to the type each weight type pairs with, and a weight row in floats (the
 * embedding, the prompt's panels, the tests' dequantisation). forward.c's opening comment
 * describes the types, their activations and the instructions. Included by forward.c (one
 * translation unit); compiles alone too (internal.h). */
#ifndef SM_FORWARD_QUANTS_C
#define SM_FORWARD_QUANTS_C
#include "internal.h"
#include "tiles.c" /* q8_0_of: Q8_0's rounding of a row, the tiles' and the blocks' */

/* the types' ids (T_*) are forward.h's enum, which Python reads from the library */

typedef struct { uint16_t d; int8_t qs[32]; } blk_q8_0;
typedef struct { uint16_t d; uint8_t qs[16]; } blk_q4_0;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_0;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } blk_q4_K;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } blk_q6_K;
typedef struct { float d; int8_t qs[256]; int16_t bsums[16]; } blk_q8_K;
/* Two Q8_0 activation blocks a and b (the same values, rounded as Q8_0), laid out so that one
 * zmm of 4-bit weights meets them without a shuffle: qs holds a[0..15] b[0..15] a[16..31]
 * b[16..31] (the order in which the two weight blocks' low nibbles, then high nibbles, come
 * out of one load); init puts minus each block's sum in the first of its int32 lanes (lanes
 * 0-3 and 8-11 are a's, 4-7 and 12-15 b's), so that the integer product that starts from
 * init shifted by 3 (Q4_0) or 4 (Q5_0) is sum (q - 8) x or sum (q - 16) x exactly; d is each
 * lane's block scale as a float. */
typedef struct { int8_t qs[64]; int32_t init[16]; float d[16]; } blk_q8_0x2;
_Static_assert(sizeof(blk_q8_0) == 34 && sizeof(blk_q4_0) == 18 && sizeof(blk_q5_0) == 22 &&
               sizeof(blk_q4_K) == 144 && sizeof(blk_q6_K) == 210 && sizeof(blk_q8_K) == 292 &&
               sizeof(blk_q8_0x2) == 192,
               "GGUF block sizes");

const char *sm_g_instruction(void)
{
#if defined(SM_AVX512) && defined(SM_AVX512_VNNI)
    return "vpdpbusd (AVX512-VNNI)";
#elif defined(SM_AVX512)
    return "vpmaddubsw (AVX-512)";
#elif defined(SM_AVX2) && defined(SM_AVX_VNNI)
    return "vpdpbusd (AVX-VNNI)";
#elif defined(SM_AVX2)
    return "vpmaddubsw (AVX2)";
#else
    return "plain C";
#endif
}

/* what each type is (its block, its activation's type, its dot, its row in floats): the
 * table TYPE_TRAITS below, after the dots it names */

/* ------------------------------------------------------------------ activations */
static inline int nearest_even(float v) { return (int)nearbyintf(v); }

long long sm_g_act_bytes(int type, int K)
{
    switch (sm_g_act_type(type)) {
    case T_F16: case T_BF16: return 2LL * K;
    case T_Q8_0: return (long long)(K / 32) * sizeof(blk_q8_0);
    case T_Q8_0X2: return (long long)((K / 32 + 1) / 2) * sizeof(blk_q8_0x2);
    case T_Q8_K: return (long long)(K / 256) * sizeof(blk_q8_K);
    }
    return 4LL * K;
}

/* Q8_0 blocks (nb of them) in pairs, as blk_q8_0x2 says; an odd last block pairs with zeros. */
static void pair_q8_0(const blk_q8_0 *q, int nb, blk_q8_0x2 *o)
{
    for (int i = 0; i < nb; i += 2, o++) {
        memset(o, 0, sizeof *o);
        for (int h = 0; h < 2 && i + h < nb; h++) {
            const blk_q8_0 *b = &q[i + h];
            int sum = 0;
            for (int j = 0; j < 16; j++) {
                o->qs[16 * h + j] = b->qs[j];
                o->qs[32 + 16 * h + j] = b->qs[16 + j];
            }
            for (int j = 0; j < 32; j++) sum += b->qs[j];
            o->init[4 * h] = -sum;
            for (int l = 0; l < 4; l++) o->d[4 * h + l] = o->d[8 + 4 * h + l] = h2f(b->d);
        }
    }
}

/* One row of K floats as ggml's Q8_0 blocks (K a multiple of 32): tiles.c's q8_0_of. */
static void quantize_q8_0(const float *x, int K, blk_q8_0 *b)
{
    for (int i = 0; i < K / 32; i++, x += 32) q8_0_of(x, b[i].qs, &b[i].d);
}

/* One activation row of K floats in the form the weights' type pairs with. */
void sm_g_quantize(int type, const float *x, int K, void *act)
{
    switch (sm_g_act_type(type)) {
    case T_F32:
        memcpy(act, x, sizeof(float) * (size_t)K);
        break;
    case T_F16: {
        uint16_t *o = act;
        for (int k = 0; k < K; k++) o[k] = f2h(x[k]);
        break;
    }
    case T_BF16: {
        uint16_t *o = act;
        for (int k = 0; k < K; k++) o[k] = f2bf(x[k]);
        break;
    }
    case T_Q8_0:
        quantize_q8_0(x, K, act);
        break;
    case T_Q8_0X2: {
        blk_q8_0 tmp[2];
        blk_q8_0x2 *o = act;
        for (int i = 0; i < K / 32; i += 2, x += 64, o++) {
            const int n = K / 32 - i < 2 ? K / 32 - i : 2;
            quantize_q8_0(x, 32 * n, tmp);
            pair_q8_0(tmp, n, o);
        }
        break;
    }
    case T_Q8_K: {
        blk_q8_K *b = act;
        for (int i = 0; i < K / 256; i++, x += 256) {
            float amax = 0.0f, vmax = 0.0f;
            for (int j = 0; j < 256; j++)
                if (fabsf(x[j]) > amax) amax = fabsf(x[j]), vmax = x[j];
            if (amax == 0.0f) {
                memset(&b[i], 0, sizeof b[i]);
                continue;
            }
            const float is = -127.0f / vmax;
            for (int j = 0; j < 256; j++) {
                const int v = nearest_even(is * x[j]);
                b[i].qs[j] = (int8_t)(v < 127 ? v : 127);
            }
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int j = 0; j < 16; j++) s += b[i].qs[16 * g + j];
                b[i].bsums[g] = (int16_t)s;
            }
            b[i].d = 1.0f / is;
        }
        break;
    }
    }
}

/* The values the rounded activation stands for (for the tests' float64 references). */
void sm_g_act_values(int type, const void *act, int K, double *out)
{
    switch (sm_g_act_type(type)) {
    case T_F32:
        for (int k = 0; k < K; k++) out[k] = ((const float *)act)[k];
        break;
    case T_F16:
        for (int k = 0; k < K; k++) out[k] = h2f(((const uint16_t *)act)[k]);
        break;
    case T_BF16:
        for (int k = 0; k < K; k++) out[k] = bf2f(((const uint16_t *)act)[k]);
        break;
    case T_Q8_0:
        for (int k = 0; k < K; k++) {
            const blk_q8_0 *b = (const blk_q8_0 *)act + k / 32;
            out[k] = (double)h2f(b->d) * b->qs[k % 32];
        }
        break;
    case T_Q8_K:
        for (int k = 0; k < K; k++) {
            const blk_q8_K *b = (const blk_q8_K *)act + k / 256;
            out[k] = (double)b->d * b->qs[k % 256];
        }
        break;
    case T_Q8_0X2:
        for (int k = 0; k < K; k++) {
            const blk_q8_0x2 *b = (const blk_q8_0x2 *)act + k / 64;
            const int h = (k / 32) % 2, j = k % 32;
            out[k] = (double)b->d[4 * h] * b->qs[(j < 16 ? 0 : 32) + 16 * h + j % 16];
        }
        break;
    }
}

/* ------------------------------------------------------------------ block helpers */
/* Q4_K's 6-bit scale and min of sub-block j (of 8), packed in 12 bytes */
static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q6_K's 256 values, 0..63 (the -32 is applied by the caller), in the file's order */
static inline void q6_values(const blk_q6_K *b, uint8_t *u)
{
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = b->ql + 64 * n, *qh = b->qh + 32 * n;
        uint8_t *y = u + 128 * n;
        for (int l = 0; l < 32; l++) {
            y[l] = (uint8_t)((ql[l] & 0xF) | ((qh[l] & 3) << 4));
            y[l + 32] = (uint8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
            y[l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            y[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
    }
}

/* One row of weights as floats, a function a type (an embedding lookup; the tests'
 * dequantisation). Compiled without fused multiply-adds, so that d sc q - dmin m rounds
 * twice, as the gguf package's reference dequantiser does. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
static void row_f32(const uint8_t *p, int K, float *out)
{
    memcpy(out, p, sizeof(float) * (size_t)K);
}

static void row_f16(const uint8_t *p, int K, float *out)
{
    for (int k = 0; k < K; k++) out[k] = h2f(((const uint16_t *)p)[k]);
}

static void row_bf16(const uint8_t *p, int K, float *out)
{
    for (int k = 0; k < K; k++) out[k] = bf2f(((const uint16_t *)p)[k]);
}

static void row_q8_0(const uint8_t *p, int K, float *out)
{
    for (int i = 0; i < K / 32; i++) {
        const blk_q8_0 *b = (const blk_q8_0 *)p + i;
        for (int j = 0; j < 32; j++) out[32 * i + j] = h2f(b->d) * b->qs[j];
    }
}

static void row_q4_0(const uint8_t *p, int K, float *out)
{
    for (int i = 0; i < K / 32; i++) {
        const blk_q4_0 *b = (const blk_q4_0 *)p + i;
        const float d = h2f(b->d);
        for (int j = 0; j < 16; j++) {
            out[32 * i + j] = d * ((b->qs[j] & 0xF) - 8);
            out[32 * i + j + 16] = d * ((b->qs[j] >> 4) - 8);
        }
    }
}

static void row_q5_0(const uint8_t *p, int K, float *out)
{
    for (int i = 0; i < K / 32; i++) {
        const blk_q5_0 *b = (const blk_q5_0 *)p + i;
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        const float d = h2f(b->d);
        for (int j = 0; j < 16; j++) {
            const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            out[32 * i + j] = d * (((b->qs[j] & 0xF) | h0) - 16);
            out[32 * i + j + 16] = d * (((b->qs[j] >> 4) | h1) - 16);
        }
    }
}

static void row_q4_k(const uint8_t *p, int K, float *out)
{
    for (int i = 0; i < K / 256; i++) {
        const blk_q4_K *b = (const blk_q4_K *)p + i;
        const float d = h2f(b->d), dmin = h2f(b->dmin);
        for (int c = 0; c < 4; c++) {
            int s0, m0, s1, m1;
            scale_min_k4(2 * c, b->scales, &s0, &m0);
            scale_min_k4(2 * c + 1, b->scales, &s1, &m1);
            float *y = out + 256 * i + 64 * c;
            for (int l = 0; l < 32; l++) {
                y[l] = d * s0 * (b->qs[32 * c + l] & 0xF) - dmin * m0;
                y[l + 32] = d * s1 * (b->qs[32 * c + l] >> 4) - dmin * m1;
            }
        }
    }
}

static void row_q6_k(const uint8_t *p, int K, float *out)
{
    for (int i = 0; i < K / 256; i++) {
        const blk_q6_K *b = (const blk_q6_K *)p + i;
        uint8_t u[256];
        q6_values(b, u);
        const float d = h2f(b->d);
        for (int j = 0; j < 256; j++) out[256 * i + j] = d * b->scales[j / 16] * (u[j] - 32);
    }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

/* Rows r0..r1 of the matrix as floats into out ((r1 - r0) x K), threads splitting the rows:
 * the panels a prompt's GEMM multiplies (smallem/generating/forward.py). */
static void sm_g_rows(const sm_mat *w, int r0, int r1, float *out, int nthreads)
{
    const int n = r1 - r0, nt = nthreads < n ? nthreads : (n > 0 ? n : 1);
    #pragma omp parallel for schedule(static) num_threads(nt)
    for (int r = r0; r < r1; r++) sm_g_row(w, r, out + (size_t)(r - r0) * w->K);
}

/* The same rows rounded to bf16 (nearest even) for the bf16 GEMM; scratch holds K floats
 * for each thread. */
static void sm_g_rows_bf16(const sm_mat *w, int r0, int r1, uint16_t *out, float *scratch, int nthreads)
{
    const int n = r1 - r0, nt = nthreads < n ? nthreads : (n > 0 ? n : 1);
    #pragma omp parallel for schedule(static) num_threads(nt)
    for (int r = r0; r < r1; r++) {
        float *row = scratch + (size_t)omp_get_thread_num() * w->K;
        uint16_t *o = out + (size_t)(r - r0) * w->K;
        sm_g_row(w, r, row);
        for (int k = 0; k < w->K; k++) o[k] = f2bf(row[k]);
    }
}
#endif /* SM_FORWARD_QUANTS_C */
