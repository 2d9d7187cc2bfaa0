void gemm_naive(int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C, int ldc, int nthreads);
