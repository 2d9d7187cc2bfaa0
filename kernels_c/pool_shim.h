/* The OpenMP runtime's entry points that GCC's code for the kernels' pragmas calls,
 * defined here, hidden inside the module, so that they bind to this module's own
 * definitions and not to libgomp's: each forwards to kernels_c/pool.c's pool through the
 * table sm_pool_attach receives (smallem.pool attaches every module built with SM_POOL
 * when it loads it). Before that, a region runs on the calling thread alone.
 *
 * Included by common.h when SM_POOL is defined (the modules layers_pool and gemm_pool,
 * built from layers.c and gemm.c), never otherwise.
 */
#pragma once
#include <stdbool.h>

static struct {
    void (*parallel)(void (*)(void *), void *, int);
    void (*barrier)(void);
    int (*thread_num)(void);
    int (*num_threads)(void);
    int (*single_start)(void);
    int (*loop_start)(long, long, long, long, long *, long *);
    int (*loop_next)(long *, long *);
    void (*loop_end)(void);
} sm_pool;

void sm_pool_attach(void *api) /* the table pool_api() returns, in the order above */
{
    memcpy(&sm_pool, api, sizeof sm_pool);
}

#define SM_HIDDEN __attribute__((visibility("hidden")))

SM_HIDDEN void GOMP_parallel(void (*fn)(void *), void *data, unsigned n, unsigned flags)
{
    (void)flags;
    if (!sm_pool.parallel) {
        fn(data);
        return;
    }
    sm_pool.parallel(fn, data, n ? (int)n : 1);
}

SM_HIDDEN void GOMP_barrier(void)
{
    if (sm_pool.barrier) sm_pool.barrier();
}

SM_HIDDEN int omp_get_thread_num(void) { return sm_pool.thread_num ? sm_pool.thread_num() : 0; }
SM_HIDDEN int omp_get_num_threads(void)
{
    return sm_pool.num_threads ? sm_pool.num_threads() : 1;
}

SM_HIDDEN bool GOMP_single_start(void)
{
    return sm_pool.single_start ? sm_pool.single_start() : true;
}

SM_HIDDEN bool GOMP_loop_nonmonotonic_dynamic_start(long start, long end, long incr, long chunk,
                                                    long *istart, long *iend)
{
    if (!sm_pool.loop_start) { /* alone: the whole range at once */
        if (incr > 0 ? start >= end : start <= end) return false;
        *istart = start;
        *iend = end;
        return true;
    }
    return sm_pool.loop_start(start, end, incr, chunk, istart, iend);
}

SM_HIDDEN bool GOMP_loop_nonmonotonic_dynamic_next(long *istart, long *iend)
{
    return sm_pool.loop_next ? sm_pool.loop_next(istart, iend) : false;
}

SM_HIDDEN void GOMP_loop_end_nowait(void)
{
    if (sm_pool.loop_end) sm_pool.loop_end();
}

SM_HIDDEN void GOMP_loop_end(void)
{
    GOMP_loop_end_nowait();
    GOMP_barrier();
}
