/* Chapter 3, rung 2: a thread pool of our own, and what a fork-join costs.
 *
 * GCC compiles `#pragma omp parallel` into a function holding the region's body and
 * one call, GOMP_parallel(body, data, threads, flags), into libgomp, OpenMP's runtime;
 * barriers, `single` and dynamically scheduled loops are calls too. This file is a
 * second runtime behind those few calls: the kernels of the training step are compiled
 * again against it (layers_pool, gemm_pool: the same sources with SM_POOL, whose
 * pool_shim.h forwards the calls here), so the climb can put them on our pool without
 * changing a line of them.
 *
 * The pool keeps its threads. A fork publishes the job and bumps a generation counter;
 * a join counts the workers down. Whoever waits (a worker for the next job, the caller
 * for the workers, everyone at a barrier) spins for a bounded time, then sleeps in the
 * kernel on a futex and is woken by whoever changes the word it waits on. Spinning
 * answers in tens of nanoseconds but holds a core; sleeping frees the core but costs a
 * system call and a wake-up of microseconds. On a machine with more runnable threads
 * than cores a spinner may hold the very core the thread it waits for needs: there a
 * bounded spin is the difference between microseconds and a scheduler time slice.
 *
 * Also here: the same fork-join timed on OpenMP's runtime (this file is compiled with
 * -fopenmp and its own pragmas go to libgomp) and with threads created for each call,
 * for chapter 3's table.
 */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include "common.h"
#include "pool.h"
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define POOL_MAX 256  /* threads in a team, the caller included */
#define SLOTS 16      /* work-sharing constructs (loops, singles) a region may have in flight */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* ------------------------------------------------------------------ waiting */
/* How long a waiter spins before it sleeps, in nanoseconds; < 0: forever, 0: at once. */
static long long spin_ns = 50000;

static void futex_wait(int *addr, int val)
{
#if defined(__linux__)
    syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
#else
    (void)addr;
    (void)val;
    sched_yield();
#endif
}

static void futex_wake(int *addr)
{
#if defined(__linux__)
    syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, 1 << 30, NULL, NULL, 0);
#else
    (void)addr;
#endif
}

/* Wait until *addr != val: spin for spin_ns, then sleep; *sleepers counts the sleepers,
 * so that whoever changes *addr makes the system call only when someone sleeps. */
static void wait_while(int *addr, int val, int *sleepers)
{
    if (__atomic_load_n(addr, __ATOMIC_ACQUIRE) != val) return;
    const long long limit = spin_ns;
    if (limit != 0) {
        const double until = limit < 0 ? 0.0 : now_s() + 1e-9 * (double)limit;
        for (unsigned i = 1;; i++) {
            if (__atomic_load_n(addr, __ATOMIC_ACQUIRE) != val) return;
            cpu_relax();
            if (limit > 0 && (i & 63) == 0 && now_s() > until) break;
        }
    }
    __atomic_add_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(addr, __ATOMIC_SEQ_CST) == val) futex_wait(addr, val);
    __atomic_sub_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
}

/* Change *addr (already stored) visible to its waiters: wake the sleepers, if any. */
static void wake(int *addr, int *sleepers)
{
    if (__atomic_load_n(sleepers, __ATOMIC_SEQ_CST) > 0) futex_wake(addr);
}

/* ------------------------------------------------------------------ the team */
struct slot {            /* one work-sharing construct of the current region */
    long long seq;       /* which construct of the region holds the slot; -1: none */
    long long next, end, step;
    int taken;           /* a `single`'s winner */
};

static struct {
    pthread_mutex_t lock;          /* one region at a time; a second caller runs alone */
    pthread_t threads[POOL_MAX];
    int workers;                   /* started so far (they never exit) */
    int born[POOL_MAX];            /* the job number when each worker was started */
    long long regions;             /* regions run on more than one thread, for the tests */
    void (*fn)(void *);
    void *data;
    int size;                      /* threads in the current team, the caller included */
    int job, job_sleepers;         /* generation of the job; workers asleep on it */
    int pending, pending_sleepers; /* workers still in the region; the caller asleep on it */
    int bar_count, bar_gen, bar_sleepers;
    struct slot slots[SLOTS];
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Each thread's place: in a region or not, its number, the team's size, and how many
 * work-sharing constructs it has met in this region. */
static __thread struct { int in, num, size; long long seq; struct slot *loop; } me = {0, 0, 1};

static void run_member(int num, int size, void (*fn)(void *), void *data)
{
    const __typeof__(me) saved = me;
    me.in = 1;
    me.num = num;
    me.size = size;
    me.seq = 0;
    me.loop = NULL;
    fn(data);
    me = saved;
}

static void *worker(void *arg)
{
    const int index = (int)(intptr_t)arg; /* worker i is thread i + 1 of a team */
    int seen = pool.born[index];          /* the job before the one it was started for */
    for (;;) {
        wait_while(&pool.job, seen, &pool.job_sleepers);
        /* read the job, then check that it is still the one whose number was read: a
         * worker outside a team may look while the caller already posts the next job */
        const int job = __atomic_load_n(&pool.job, __ATOMIC_ACQUIRE);
        const int size = __atomic_load_n(&pool.size, __ATOMIC_RELAXED);
        void (*fn)(void *) = __atomic_load_n(&pool.fn, __ATOMIC_RELAXED);
        void *data = __atomic_load_n(&pool.data, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&pool.job, __ATOMIC_RELAXED) != job) continue;
        seen = job;
        if (index + 1 >= size) continue; /* not in this team */
        run_member(index + 1, size, fn, data);
        if (__atomic_sub_fetch(&pool.pending, 1, __ATOMIC_ACQ_REL) == 0)
            wake(&pool.pending, &pool.pending_sleepers);
    }
    return NULL;
}

/* --8<-- [start:pool_fork_join] */
/* Run fn(data) on n threads, the caller as thread 0; return when all are done. */
void pool_parallel(void (*fn)(void *), void *data, int n)
{
    if (n > POOL_MAX) n = POOL_MAX;
    if (n <= 1 || me.in || pthread_mutex_trylock(&pool.lock) != 0) {
        run_member(0, 1, fn, data); /* alone: nested, or another caller holds the pool */
        return;
    }
    while (pool.workers < n - 1) {  /* start workers once; they stay */
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 8 << 20);
        pool.born[pool.workers] = __atomic_load_n(&pool.job, __ATOMIC_RELAXED);
        if (pthread_create(&pool.threads[pool.workers], &attr, worker,
                           (void *)(intptr_t)pool.workers) != 0) {
            pthread_attr_destroy(&attr);
            break;                  /* the system refuses: a smaller team */
        }
        pthread_attr_destroy(&attr);
        pool.workers++;
    }
    if (n > pool.workers + 1) n = pool.workers + 1;
    pool.regions++;
    __atomic_store_n(&pool.fn, fn, __ATOMIC_RELAXED);
    __atomic_store_n(&pool.data, data, __ATOMIC_RELAXED);
    __atomic_store_n(&pool.size, n, __ATOMIC_RELAXED);
    pool.bar_count = 0;
    for (int i = 0; i < SLOTS; i++) pool.slots[i].seq = -1;
    __atomic_store_n(&pool.pending, n - 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&pool.job, 1, __ATOMIC_SEQ_CST);  /* publish the job ... */
    wake(&pool.job, &pool.job_sleepers);                 /* ... and wake who sleeps */
    run_member(0, n, fn, data);
    int left;
    while ((left = __atomic_load_n(&pool.pending, __ATOMIC_ACQUIRE)) != 0)
        wait_while(&pool.pending, left, &pool.pending_sleepers);
    pthread_mutex_unlock(&pool.lock);
}

/* Every thread of the team waits here until all have arrived (sense by generation). */
void pool_barrier(void)
{
    if (!me.in || me.size <= 1) return;
    const int gen = __atomic_load_n(&pool.bar_gen, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&pool.bar_count, 1, __ATOMIC_ACQ_REL) == me.size) {
        __atomic_store_n(&pool.bar_count, 0, __ATOMIC_RELAXED);
        __atomic_add_fetch(&pool.bar_gen, 1, __ATOMIC_SEQ_CST);
        wake(&pool.bar_gen, &pool.bar_sleepers);
        return;
    }
    wait_while(&pool.bar_gen, gen, &pool.bar_sleepers);
}
/* --8<-- [end:pool_fork_join] */

/* A task from Python (smallem.pool.run): fn(ctx, thread, threads) on every thread. */
struct task { void (*fn)(void *, int, int); void *ctx; };

static void run_task(void *p)
{
    const struct task *t = p;
    t->fn(t->ctx, pool_thread_num(), pool_num_threads());
}

void pool_run_task(void (*fn)(void *, int, int), void *ctx, int n)
{
    struct task t = {fn, ctx};
    pool_parallel(run_task, &t, n);
}

int pool_thread_num(void) { return me.in ? me.num : 0; }
int pool_num_threads(void) { return me.in ? me.size : 1; }

/* The slot of this thread's next work-sharing construct, set up by whichever thread of
 * the team meets it first (the others wait the few nanoseconds that takes). */
static struct slot *construct(long long start, long long end, long long step)
{
    const long long seq = me.seq++;
    struct slot *s = &pool.slots[seq % SLOTS];
    if (me.size <= 1) { /* alone: a private slot */
        static __thread struct slot own;
        own.seq = seq;
        own.next = start;
        own.end = end;
        own.step = step;
        own.taken = 0;
        return &own;
    }
    long long cur = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
    while (cur != seq) {
        if (cur != -2 && cur < seq &&
            __atomic_compare_exchange_n(&s->seq, &cur, -2, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            s->next = start;
            s->end = end;
            s->step = step;
            s->taken = 0;
            __atomic_store_n(&s->seq, seq, __ATOMIC_RELEASE);
            break;
        }
        cpu_relax();
        cur = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
    }
    return s;
}

int pool_single_start(void)
{
    struct slot *s = construct(0, 0, 0);
    return __atomic_exchange_n(&s->taken, 1, __ATOMIC_ACQ_REL) == 0;
}

/* A dynamically scheduled loop: chunks of iterations from a shared counter, [start,
 * end) by incr (either sign), as libgomp's GOMP_loop_*_dynamic_start and _next give them. */
int pool_loop_next(long *istart, long *iend)
{
    struct slot *s = me.loop;
    const long long i = __atomic_fetch_add(&s->next, s->step, __ATOMIC_RELAXED);
    if (s->step > 0 ? i >= s->end : i <= s->end) return 0;
    const long long j = i + s->step;
    *istart = (long)i;
    *iend = (long)(s->step > 0 ? (j < s->end ? j : s->end) : (j > s->end ? j : s->end));
    return 1;
}

int pool_loop_start(long start, long end, long incr, long chunk, long *istart, long *iend)
{
    me.loop = construct(start, end, (chunk < 1 ? 1 : chunk) * incr);
    return pool_loop_next(istart, iend);
}

void pool_loop_end(void) { me.loop = NULL; }

/* ------------------------------------------------------------------ settings */
void pool_set_spin_ns(long long ns) { spin_ns = ns; }
long long pool_spin_ns(void) { return spin_ns; }
int pool_workers(void) { return pool.workers; }
long long pool_regions(void) { return pool.regions; }

/* The table pool_shim.h's forwarders call through (in the order of struct sm_pool_api). */
static const void *api[] = {(const void *)pool_parallel, (const void *)pool_barrier,
                            (const void *)pool_thread_num, (const void *)pool_num_threads,
                            (const void *)pool_single_start, (const void *)pool_loop_start,
                            (const void *)pool_loop_next, (const void *)pool_loop_end};

void *pool_api(void) { return (void *)api; }

/* ------------------------------------------------------------------ fork-join costs */
/* A region whose body is a store per thread: what a fork and a join cost by themselves. */
static void touch(void *p)
{
    volatile long long *hits = p;
    hits[8 * pool_thread_num()] += 1; /* each on its own cache line */
}

double pool_fork_join_seconds(int n, long long reps)
{
    long long hits[8 * POOL_MAX] = {0};
    pool_parallel(touch, hits, n); /* the workers exist before the clock starts */
    const double t0 = now_s();
    for (long long r = 0; r < reps; r++) pool_parallel(touch, hits, n);
    return (now_s() - t0) / (double)reps;
}

static void barrier_loop(void *p)
{
    const long long reps = *(const long long *)p;
    for (long long r = 0; r < reps; r++) pool_barrier();
}

/* One region with reps barriers in it: a barrier's cost, the region's own amortised. */
double pool_barrier_seconds(int n, long long reps)
{
    long long one = 1;
    pool_parallel(barrier_loop, &one, n);
    const double t0 = now_s();
    pool_parallel(barrier_loop, &reps, n);
    return (now_s() - t0) / (double)reps;
}

double omp_fork_join_seconds(int n, long long reps)
{
    volatile long long hits[8 * POOL_MAX] = {0};
#ifdef _OPENMP
    #pragma omp parallel num_threads(n)
    hits[8 * omp_get_thread_num()] += 1;
    const double t0 = now_s();
    for (long long r = 0; r < reps; r++) {
        #pragma omp parallel num_threads(n)
        hits[8 * omp_get_thread_num()] += 1;
    }
    return (now_s() - t0) / (double)reps;
#else
    (void)n;
    (void)reps;
    (void)hits;
    return -1.0;
#endif
}

double omp_barrier_seconds(int n, long long reps)
{
#ifdef _OPENMP
    const double t0 = now_s();
    #pragma omp parallel num_threads(n)
    for (long long r = 0; r < reps; r++) {
        #pragma omp barrier
    }
    return (now_s() - t0) / (double)reps;
#else
    (void)n;
    (void)reps;
    return -1.0;
#endif
}

static void *touch_thread(void *p)
{
    *(volatile long long *)p += 1;
    return NULL;
}

double create_fork_join_seconds(int n, long long reps)
{
    long long hits[8 * POOL_MAX] = {0};
    pthread_t t[POOL_MAX];
    if (n > POOL_MAX) n = POOL_MAX;
    const double t0 = now_s();
    for (long long r = 0; r < reps; r++) {
        int made = 0;
        for (int i = 1; i < n; i++)
            made += pthread_create(&t[made], NULL, touch_thread, &hits[8 * i]) == 0;
        hits[0] += 1;
        for (int i = 0; i < made; i++) pthread_join(t[i], NULL);
    }
    return (now_s() - t0) / (double)reps;
}
