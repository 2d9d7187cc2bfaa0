/* Instruments for chapter 2's measurements of the package's GEMM: the micro-kernel
 * alone (what the caches cost it) and the thread pool (what a parallel region costs).
 * The clock that times the driver's phases is in gemm/driver.c, beside its calls.
 *
 * Included by ../gemm.c after the ladder, not compiled alone.
 */
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <pthread.h>

/* ------------------------------------------------------------------ the micro-kernel alone */

/* The micro-kernel with nothing around it, to see what the caches cost it: each of
 * nthreads threads runs `reps` passes over `slivers` tiles, its own A sliver
 * (MR x kc, packed: MR floats per k) against packed B slivers (kc x NR each),
 * either one set that every thread reads (shared_b, as rung 5 shares its block
 * of B) or a set per thread. Thread t's tiles sum into its C, MR x (slivers * NR)
 * floats at c + t * MR * slivers * NR, so the caller can check the arithmetic:
 * after the call C = C0 + reps * A_t B. No packing, no edges, no barriers in the
 * passes: the B slivers' size decides where they come from (L2 or L3). */
void gemm_kernel_alone(int kc, int slivers, int reps, int nthreads, int shared_b,
                       const float *a, const float *b, float *c)
{
    const int ldc = slivers * NR;
    #pragma omp parallel num_threads(nthreads)
    {
        int t0, nt;
        team_position(&t0, &nt);
        for (int t = t0; t < nthreads; t += nt) { /* without OpenMP one thread does all */
            const float *at = a + (size_t)t * MR * kc;
            const float *bt = b + (shared_b ? 0 : (size_t)t * slivers * NR * kc);
            float *ct = c + (size_t)t * MR * ldc;
            for (int r = 0; r < reps; r++)
                for (int j = 0; j < slivers; j++)
                    store_tile(kc, at, bt + (size_t)j * NR * kc, ct + j * NR, ldc, MR, NR,
                               1.0f, 1.0f); /* the call rung 5 makes for a full tile */
        }
    }
}

/* ------------------------------------------------------------------ the thread pool */

/* The kernel-thread id of each OpenMP thread: equal ids on two calls show that
 * the pool's threads were reused, not created again. */
int gemm_pool_ids(int nthreads, long long *ids)
{
    int n = 1;
    #pragma omp parallel num_threads(nthreads)
    {
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
        #pragma omp single
        n = omp_get_num_threads();
#endif
#if defined(__linux__)
        ids[t] = (long long)syscall(SYS_gettid);
#else
        ids[t] = (long long)t;
#endif
    }
    return n;
}

/* What a parallel region costs once the pool exists: an empty one, `reps` times. */
void gemm_empty_regions(int reps, int nthreads)
{
    for (int r = 0; r < reps; r++) {
        #pragma omp parallel num_threads(nthreads)
        {
            int x = r;
            SM_OPAQUE(x);
        }
    }
}

static void *noop(void *arg) { return arg; }

/* What it would cost without a pool: create and join nthreads - 1 threads. */
void gemm_spawn_join(int reps, int nthreads)
{
    pthread_t th[256];
    if (nthreads > 256) nthreads = 256;
    for (int r = 0; r < reps; r++) {
        for (int t = 1; t < nthreads; t++) pthread_create(&th[t], NULL, noop, NULL);
        for (int t = 1; t < nthreads; t++) pthread_join(th[t], NULL);
    }
}
