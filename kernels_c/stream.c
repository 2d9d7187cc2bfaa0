/* Chapter 1: the STREAM kernels (McCalpin), on working sets of any size.
 *
 * Each kernel makes `reps` passes so that a working set small enough to sit
 * in L1 is still timed over milliseconds. Each thread owns one contiguous
 * slice, the same on every pass, with no barrier between passes: a core keeps
 * re-reading data already in its own caches, and it is that cache we measure.
 * Bytes counted, as STREAM counts them: copy and scale move 16 per element,
 * add and triad 24 (the extra read for write-allocate is not counted).
 */
#include "common.h"
#include "stream.h"

/* This thread's slice [lo, hi) of n elements, cut at multiples of 8 doubles
 * (one 64-byte line) so no two threads write into the same cache line. */
static void my_slice(long long n, long long *lo, long long *hi)
{
#ifdef _OPENMP
    long long t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
    long long t = 0, nt = 1;
#endif
    long long chunk = ((n + nt - 1) / nt + 7) / 8 * 8;
    *lo = t * chunk < n ? t * chunk : n;
    *hi = *lo + chunk < n ? *lo + chunk : n;
}

/* First touch decides which core's memory node a page lands on: touch each
 * slice from the thread that will use it. */
void stream_init(double *a, double *b, double *c, long long n, int nthreads)
{
    #pragma omp parallel num_threads(nthreads)
    {
        long long lo, hi;
        my_slice(n, &lo, &hi);
        for (long long i = lo; i < hi; i++) {
            a[i] = 1.0;
            b[i] = 2.0;
            c[i] = 0.5;
        }
    }
}

/* --8<-- [start:triad] */
void stream_triad(double *a, const double *b, const double *c, double s,
                  long long n, int reps, int nthreads)
{
    #pragma omp parallel num_threads(nthreads)
    {
        long long lo, hi;
        my_slice(n, &lo, &hi);
        for (int r = 0; r < reps; r++) {
            #pragma GCC unroll 4
            for (long long i = lo; i < hi; i++) a[i] = b[i] + s * c[i];
        }
    }
}
/* --8<-- [end:triad] */

void stream_copy(double *a, const double *b, long long n, int reps, int nthreads)
{
    #pragma omp parallel num_threads(nthreads)
    {
        long long lo, hi;
        my_slice(n, &lo, &hi);
        for (int r = 0; r < reps; r++) {
            #pragma GCC unroll 4
            for (long long i = lo; i < hi; i++) a[i] = b[i];
        }
    }
}

void stream_scale(double *a, const double *b, double s, long long n, int reps, int nthreads)
{
    #pragma omp parallel num_threads(nthreads)
    {
        long long lo, hi;
        my_slice(n, &lo, &hi);
        for (int r = 0; r < reps; r++) {
            #pragma GCC unroll 4
            for (long long i = lo; i < hi; i++) a[i] = s * b[i];
        }
    }
}

void stream_add(double *a, const double *b, const double *c, long long n, int reps, int nthreads)
{
    #pragma omp parallel num_threads(nthreads)
    {
        long long lo, hi;
        my_slice(n, &lo, &hi);
        for (int r = 0; r < reps; r++) {
            #pragma GCC unroll 4
            for (long long i = lo; i < hi; i++) a[i] = b[i] + c[i];
        }
    }
}
