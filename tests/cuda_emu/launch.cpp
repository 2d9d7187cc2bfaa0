/* Appended after emu.h and gemm.cu: the launcher Python calls through ctypes. */
/* emu_run, the globals and the barriers are in emu.h */

static void emu_run(unsigned gx, unsigned gy, unsigned bx, unsigned by,
                    const std::function<void()> &body)
{
    emu_run(emu_dim3{gx, gy, 1}, emu_dim3{bx, by, 1}, body);
}

extern "C" int emu_gemm(const char *name, unsigned gx, unsigned gy, unsigned bx, unsigned by,
                        int M, int N, int K, const void *A, const void *B, float *C)
{
    typedef const float *F;
    typedef const unsigned short *H;
#define SM_F32(k) if (!std::strcmp(name, #k)) { emu_run(gx, gy, bx, by, [&] { k(M, N, K, (F)A, (F)B, C); }); return 0; }
#define SM_H16(k) if (!std::strcmp(name, #k)) { emu_run(gx, gy, bx, by, [&] { k(M, N, K, (H)A, (H)B, C); }); return 0; }
    SM_F32(sgemm_naive) SM_F32(sgemm_coalesced) SM_F32(sgemm_smem) SM_F32(sgemm_block1d)
    SM_F32(sgemm_block2d) SM_F32(sgemm_vec) SM_F32(sgemm_vec_nt) SM_F32(sgemm_vec_tn)
    SM_F32(sgemm_prefetch) SM_F32(sgemm_prefetch_nt) SM_F32(sgemm_prefetch_tn)
    SM_H16(hgemm_wmma) SM_H16(hgemm_wmma_nt) SM_H16(hgemm_wmma_tn)
    SM_H16(hgemm_async) SM_H16(hgemm_async_nt) SM_H16(hgemm_async_tn)
    SM_H16(hgemm_mma) SM_H16(hgemm_mma_nt) SM_H16(hgemm_mma_tn)
    return -1;
}

extern "C" void emu_f32_to_bf16(const float *x, unsigned short *y, long long n)
{
    emu_run(2, 1, 64, 1, [&] { f32_to_bf16(x, y, n); });
}

/* A copy of nbytes of src whose last byte sits just before an inaccessible page (and whose
 * first byte just after one): a kernel reading or writing past either end of a matrix stops
 * with SIGSEGV instead of reading the neighbour's bytes. Never freed: tests run it in a child
 * process. */
#include <sys/mman.h>
#include <unistd.h>
extern "C" void *emu_guarded_copy(const void *src, size_t nbytes)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t pages = (nbytes + page - 1) / page;
    char *base = (char *)mmap(nullptr, (pages + 2) * page, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return nullptr;
    mprotect(base, page, PROT_NONE);
    mprotect(base + (pages + 1) * page, page, PROT_NONE);
    char *dst = base + (pages + 1) * page - nbytes;
    std::memcpy(dst, src, nbytes);
    return dst;
}
