/* The one forward's ids: every .c includes them and cffi reads them, so Python takes the
 * numbers from the compiled library (a test checks every Python name against them). */
enum { KIND_F32 = 0, KIND_INT8 = 1, KIND_BLOCKS = 2 };            /* sm_mat.kind */
enum { NORM_LAYER = 0, NORM_RMS = 1 };                             /* sm_model.norm */
enum { MLP_GELU = 0, MLP_SWIGLU = 1, MLP_GEGLU = 2 };              /* sm_model.mlp */
enum { ROPE_NONE = 0, ROPE_PAIRS = 1, ROPE_NEOX = 2 };             /* sm_model.rope */
enum { CACHE_TILES = 0, CACHE_F16 = 1, CACHE_STATE = 2 };          /* sm_model.cache */
/* sm_model.parts: a call's seconds by part (the parallel regions of the products, with the
 * threads' meetings, apart from the rounding of their inputs), and the count of regions that
 * met as a team */
enum { PART_EMBED = 0, PART_NORM = 1, PART_ROUND = 2, PART_PRODUCTS = 3, PART_POSITIONS = 4,
       PART_ATTEND = 5, PART_ACTIVATION = 6, PART_TEAMED = 7, PART_COUNT = 8 };
/* ggml's type numbers (sm_mat.type), and one of ours: Q8_0 in pairs of blocks laid out for
 * the nibbles */
enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q5_0 = 6, T_Q8_0 = 8, T_Q4_K = 12, T_Q6_K = 14,
       T_Q8_K = 15, T_BF16 = 30, T_Q8_0X2 = 1000 };
typedef struct {
    int K, N;
    int kind;
    const float *f;
    const int8_t *q;
    const uint16_t *s;
    const float *bias;
    int type;
    const uint8_t *w;
    long long row_bytes;
    const float *plain;
    int plain_trans;
} sm_mat;
typedef struct {
    const float *norm1_w, *norm1_b, *norm2_w, *norm2_b, *post1_w, *post2_w;
    const float *q_norm, *k_norm, *bq, *bk, *bv;
    sm_mat qkv, q, k, v, o, up, gate, down, decay;
    int window;
    const float *rope_cos, *rope_sin;
} sm_layer;
typedef struct {
    int n_layer, d, n_head, n_kv_head, head_dim, v_dim, hidden, vocab, context;
    int norm, mlp, rope, rope_dim, q_prescaled, cache;
    float eps, attn_scale, embed_scale, softcap;   /* embed_scale, softcap: 0 is none */
    sm_mat embd, head;
    const float *wpe, *out_norm_w, *out_norm_b, *rope_cos, *rope_sin;
    const sm_layer *layers;
    void *k_cache, *v_cache;
    int block_rows, gemm_rows, gemm_block_rows, gemm_bf16, gemm_order, gemm_mc, gemm_kc, gemm_nc;
    int amx_kc, amx_nc; /* the AMX path's blocks (gemm_bf16 == 2): smallem.gemm.amx_blocks */
    int max_threads;
    int gemm_int8;
    float *work;
    long long work_floats;
    long long par_min_bytes;
    long long ahead; /* bytes a decode step's weight rows are prefetched ahead (blocks.c) */
    int products_off; /* a probe: GGUF products write zeros and read no weight (appendix B) */
    double *parts;    /* a probe: where not NULL, PART_COUNT sums a call adds to (appendix B) */
} sm_model;
int sm_rows(void);
int sm_block_rows(void);
int sm_tile(void);
const char *sm_int8_instruction(void);
void sm_quantize_rows(const float *x, int rows, int K, int8_t *xq, float *xs);
void sm_matmul(const sm_mat *w, const float *x, const int8_t *xq, const float *xs, float *y, int rows, int accumulate, int nthreads);
const char *sm_g_instruction(void);
int sm_g_supported(int type);
int sm_g_act_type(int type);
int sm_g_block_weights(int type);
int sm_g_block_bytes(int type);
long long sm_g_act_bytes(int type, int K);
void sm_g_quantize(int type, const float *x, int K, void *act);
void sm_g_act_values(int type, const void *act, int K, double *out);
void sm_g_row(const sm_mat *w, int row, float *out);
int sm_g_tile_q8_0(const sm_mat *w, int8_t *q, uint16_t *s);
int sm_g_tile_q4_0(const sm_mat *w, uint8_t *q, uint16_t *s);
int sm_g_tile_q4_k(const sm_mat *w, uint8_t *q, uint16_t *s);
int sm_g_tile_q5_0(const sm_mat *w, uint8_t *q, uint16_t *s);
void sm_g_matmul(const sm_mat *w, const float *x, int rows, float *y, int nthreads, long long ahead);
double sm_time_product(const sm_mat *w, int reps);
const char *sm_q_instruction(void);
int sm_q_supported(int type);
int sm_q_matmul_path(const sm_mat *w, const float *x, int rows, float *y, int nthreads, int amx);
int sm_q_amx(void);
long long sm_work_floats(const sm_model *m);
int sm_forward(const sm_model *m, const int *tokens, int n, int pos, float *logits, int all_logits, int nthreads);
