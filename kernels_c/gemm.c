/* Chapter 2: the matrix product C = A B, one rung of the ladder per function.
 *
 * Every rung has the same prototype: row-major A (M x K, leading dimension
 * lda), B (K x N, ldb), C (M x N, ldc), and a thread count that the
 * single-threaded rungs ignore. C is overwritten.
 */
#include "common.h"
#include "gemm.h"

/* --8<-- [start:naive] */
/* Rung 0: the textbook triple loop. The inner loop walks down a column of B,
 * one float per 64-byte cache line, and each sum waits for the previous add. */
void gemm_naive(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                float *C, int ldc, int nthreads)
{
    (void)nthreads;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float sum = 0.0f;
            for (int k = 0; k < K; k++) sum += A[(size_t)i * lda + k] * B[(size_t)k * ldb + j];
            C[(size_t)i * ldc + j] = sum;
        }
}
/* --8<-- [end:naive] */
