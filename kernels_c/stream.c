/* Chapter 1: the STREAM kernels (McCalpin), on working sets of any size.
 *
 * Each kernel makes `reps` passes so that a working set small enough to sit
 * in L1 is still timed over milliseconds. Each thread owns one contiguous
 * slice, the same on every pass, with no barrier between passes: a core keeps
 * re-reading data already in its own caches, and it is that cache we measure.
 * Bytes counted, as STREAM counts them: copy and scale move 16 per element,
 * add and triad 24 (the extra read for write-allocate is not counted).
 * Beside them, read: a sum of one array, 8 bytes per element and no stores, the
 * traffic of a decoder streaming its weights (STREAM has no such kernel).
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
/* One thread's share: its slice, `reps` times. Passing the slice's pointers as
 * restrict arguments of a plain function (not as variables shared with the
 * OpenMP region) lets the compiler keep them, and s, in registers. */
static void triad_slice(double *restrict a, const double *restrict b,
                        const double *restrict c, double s, long long n, int reps)
{
    for (int r = 0; r < reps; r++)
        for (long long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}

void stream_triad(double *a, const double *b, const double *c, double s,
                  long long n, int reps, int nthreads)
{
    #pragma omp parallel num_threads(nthreads)
    {
        long long lo, hi;
        my_slice(n, &lo, &hi);
        triad_slice(a + lo, b + lo, c + lo, s, hi - lo, reps);
    }
}
/* --8<-- [end:triad] */

static void copy_slice(double *restrict a, const double *restrict b, long long n, int reps)
{
    for (int r = 0; r < reps; r++)
        for (long long i = 0; i < n; i++) a[i] = b[i];
}

static void scale_slice(double *restrict a, const double *restrict b, double s, long long n,
                        int reps)
{
    for (int r = 0; r < reps; r++)
        for (long long i = 0; i < n; i++) a[i] = s * b[i];
}

static void add_slice(double *restrict a, const double *restrict b, const double *restrict c,
                      long long n, int reps)
{
    for (int r = 0; r < reps; r++)
        for (long long i = 0; i < n; i++) a[i] = b[i] + c[i];
}

void stream_copy(double *a, const double *b, long long n, int reps, int nthreads)
{
    #pragma omp parallel num_threads(nthreads)
    {
        long long lo, hi;
        my_slice(n, &lo, &hi);
        copy_slice(a + lo, b + lo, hi - lo, reps);
    }
}

void stream_scale(double *a, const double *b, double s, long long n, int reps, int nthreads)
{
    #pragma omp parallel num_threads(nthreads)
    {
        long long lo, hi;
        my_slice(n, &lo, &hi);
        scale_slice(a + lo, b + lo, s, hi - lo, reps);
    }
}

void stream_add(double *a, const double *b, const double *c, long long n, int reps, int nthreads)
{
    #pragma omp parallel num_threads(nthreads)
    {
        long long lo, hi;
        my_slice(n, &lo, &hi);
        add_slice(a + lo, b + lo, c + lo, hi - lo, reps);
    }
}

/* --8<-- [start:read] */
/* One thread's read of its slice, `reps` times, into READ_LANES running sums.
 * The sums are independent, so the adds overlap: an add takes about 4 cycles and
 * two can start each cycle, so at least 8 vectors of sums are needed to keep the
 * adders busy and the two loads a cycle that an L1 serves: 16 zmm on AVX-512
 * (half its 32 registers, for slack), 8 ymm otherwise (half of AVX2's 16). The
 * sums carry over from pass to pass, so no pass can be optimised away. */
#if defined(__AVX512F__)
#define READ_LANES 128
#else
#define READ_LANES 32
#endif
static double read_slice(const double *restrict a, long long n, int reps)
{
    double s[READ_LANES] = {0}, tail = 0.0;
    long long body = n / READ_LANES * READ_LANES;
    for (int r = 0; r < reps; r++) {
        for (long long i = 0; i < body; i += READ_LANES)
            for (int j = 0; j < READ_LANES; j++) s[j] += a[i + j];
        for (long long i = body; i < n; i++) tail += a[i];  /* s stays in registers */
    }
    double total = tail;
    for (int j = 0; j < READ_LANES; j++) total += s[j];
    return total;
}

/* out[8 t] = thread t's sum over its slice and passes (a line of its own each). */
void stream_read(const double *a, double *out, long long n, int reps, int nthreads)
{
    #pragma omp parallel num_threads(nthreads)
    {
        long long lo, hi;
        my_slice(n, &lo, &hi);
#ifdef _OPENMP
        int t = omp_get_thread_num();
#else
        int t = 0;
#endif
        out[8 * t] = read_slice(a + lo, hi - lo, reps);
    }
}
/* --8<-- [end:read] */
