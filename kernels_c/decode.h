typedef struct {
    int K, N;
    int kind;
    const float *f;
    const int8_t *q;
    const uint16_t *s;
    const float *corr;
    const float *bias;
} sm_mat;
typedef struct {
    const float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
    sm_mat qkv, proj, fc, fc2;
} sm_layer;
typedef struct {
    int n_layer, d, n_head, hidden, vocab, context, modern;
    const float *wte, *wpe, *lnf_w, *lnf_b, *rope_cos, *rope_sin;
    sm_mat head;
    const sm_layer *layers;
    float *k_cache, *v_cache;
    float *work;
    long long work_floats;
    long long par_min_bytes;
} sm_model;
int sm_rows(void);
int sm_block_rows(void);
int sm_tile(void);
const char *sm_int8_instruction(void);
long long sm_work_floats(const sm_model *m);
int sm_forward(const sm_model *m, const int *tokens, int n, int pos, float *logits, int all_logits, int nthreads);
void sm_quantize_rows(const float *x, int rows, int K, int8_t *xq, float *xs);
void sm_matmul(const sm_mat *w, const float *x, const int8_t *xq, const float *xs, float *y, int rows, int accumulate, int nthreads);
double sm_time_matmul(const sm_mat *w, const float *x, const int8_t *xq, const float *xs, float *y, int reps);
