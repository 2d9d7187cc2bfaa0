typedef struct {
    int type, K, N;
    const uint8_t *w;
    long long row_bytes;
} sm_gmat;
typedef struct {
    const float *attn_norm, *ffn_norm, *q_norm, *k_norm, *bq, *bk, *bv;
    sm_gmat q, k, v, o, gate, up, down;
} sm_glayer;
typedef struct {
    int n_layer, d, n_head, n_kv_head, head_dim, v_dim, hidden, vocab, context, rope_dim, neox,
        q_prescaled;
    float eps;
    sm_gmat embd, out;
    const float *out_norm, *rope_cos, *rope_sin;
    const sm_glayer *layers;
    uint16_t *k_cache, *v_cache;
    float *work;
    long long work_floats;
    long long par_min_bytes;
} sm_gmodel;
const char *sm_g_instruction(void);
int sm_g_supported(int type);
int sm_g_act_type(int type);
long long sm_g_act_bytes(int type, int K);
void sm_g_quantize(int type, const float *x, int K, void *act);
void sm_g_act_values(int type, const void *act, int K, double *out);
void sm_g_row(const sm_gmat *w, int row, float *out);
void sm_g_rows(const sm_gmat *w, int r0, int r1, float *out, int nthreads);
void sm_g_rows_bf16(const sm_gmat *w, int r0, int r1, uint16_t *out, float *scratch, int nthreads);
void sm_g_matmul(const sm_gmat *w, const float *x, int rows, float *y, int nthreads);
long long sm_g_work_floats(const sm_gmodel *m, int n);
int sm_g_forward(const sm_gmodel *m, const int *tokens, int n, int pos, float *logits, int all_logits, int nthreads);
