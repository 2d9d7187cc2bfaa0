double probe_add_chain(long long iters);
double probe_fma_f32(long long iters, int nthreads, float *sink);
double probe_dot_bf16(long long iters, int nthreads, float *sink);
double probe_dot_int8(long long iters, int nthreads, int32_t *sink);
int probe_has_native_bf16(void);
int probe_has_native_int8(void);
