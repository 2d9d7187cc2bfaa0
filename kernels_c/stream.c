/* Chapter 1: the STREAM kernels (McCalpin), on working sets of any size.
 *
 * Each kernel makes `reps` passes so that a working set small enough to sit
 * in L1 is still timed over milliseconds. Threads take the same static slice
 * on every pass (no barrier between passes), so each core keeps re-reading
 * data that is already in its own caches, and it is that cache we measure.
 * Bytes counted, as STREAM counts them: copy and scale move 16 per element,
 * add and triad 24 (the extra read for write-allocate is not counted).
 */
#include "common.h"
#include "stream.h"

/* First touch decides which core's memory node a page lands on: touch each
 * slice from the thread that will use it. */
void stream_init(double *a, double *b, double *c, long long n, int nthreads)
{
    #pragma omp parallel for schedule(static) num_threads(nthreads)
    for (long long i = 0; i < n; i++) {
        a[i] = 1.0;
        b[i] = 2.0;
        c[i] = 0.5;
    }
}

/* --8<-- [start:triad] */
void stream_triad(double *a, const double *b, const double *c, double s,
                  long long n, int reps, int nthreads)
{
    #pragma omp parallel num_threads(nthreads)
    for (int r = 0; r < reps; r++) {
        #pragma omp for schedule(static) nowait
        for (long long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
    }
}
/* --8<-- [end:triad] */

void stream_copy(double *a, const double *b, long long n, int reps, int nthreads)
{
    #pragma omp parallel num_threads(nthreads)
    for (int r = 0; r < reps; r++) {
        #pragma omp for schedule(static) nowait
        for (long long i = 0; i < n; i++) a[i] = b[i];
    }
}

void stream_scale(double *a, const double *b, double s, long long n, int reps, int nthreads)
{
    #pragma omp parallel num_threads(nthreads)
    for (int r = 0; r < reps; r++) {
        #pragma omp for schedule(static) nowait
        for (long long i = 0; i < n; i++) a[i] = s * b[i];
    }
}

void stream_add(double *a, const double *b, const double *c, long long n, int reps, int nthreads)
{
    #pragma omp parallel num_threads(nthreads)
    for (int r = 0; r < reps; r++) {
        #pragma omp for schedule(static) nowait
        for (long long i = 0; i < n; i++) a[i] = b[i] + c[i];
    }
}
