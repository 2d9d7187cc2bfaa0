/* The warp-collective instructions of kernels_cuda/mma.cu (ldmatrix, mma.sync m16n8k16), its
 * cp.async pipeline and its paired store, in plain C++ for the CPU emulator. Included at the end of emu.h,
 * whose lane and warp numbers and per-warp barriers it uses.
 *
 * Unlike emu.h's wmma stand-ins, which let every lane hold a whole tile, these keep the PTX
 * manual's fragment layouts exactly: a lane contributes its own registers (or, for ldmatrix, its
 * own row address), the warp exchanges them through a per-warp buffer, and each lane computes
 * just the registers the hardware would give it. A kernel that passes the wrong lane's address,
 * pairs the wrong registers or reads an accumulator element at the wrong place gets wrong
 * numbers here, as it would on a GPU.
 *
 * Layouts (PTX ISA, "Matrix fragments for mma.m16n8k16" and "ldmatrix"), with
 * g = lane / 4, t = lane % 4, two bf16 a register, the first in the low half:
 *   A (16 x 16): reg 0 = A[g][2t, 2t+1], reg 1 = A[g+8][2t, 2t+1], reg 2 = A[g][2t+8, 2t+9],
 *                reg 3 = A[g+8][2t+8, 2t+9]
 *   B (16 x 8):  reg 0 = B[2t, 2t+1][g], reg 1 = B[2t+8, 2t+9][g]
 *   C (16 x 8):  c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]
 *   ldmatrix .x4: lanes 8q .. 8q+7 give the 16-byte rows 0..7 of matrix q; lane l receives in
 *                 reg q the elements (l/4, 2(l%4)) and (l/4, 2(l%4)+1) of matrix q, or with
 *                 .trans (2(l%4), l/4) and (2(l%4)+1, l/4).
 */
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <vector>

/* Each collective writes into one of two buffers, alternating, then crosses the warp barrier
 * and reads: a lane can come back to the same buffer two collectives later only after every
 * lane has crossed the barrier of the one in between, hence after all of them have read. */
struct emu_warp_exchange {
    const void *row[2][32];
    unsigned a[2][32][4];
    unsigned b[2][32][2];
};
inline emu_warp_exchange emu_xchg[EMU_MAX_WARPS];
inline unsigned emu_xchg_turns[32 * EMU_MAX_WARPS];  /* each thread's, as a register would be */
#define emu_xchg_turn emu_xchg_turns[emu_tid()]

inline void emu_fail(const char *what)
{
    std::fprintf(stderr, "CUDA emulator: %s\n", what);
    std::abort();
}

template <bool TRANS>
inline void ldmatrix_x4(unsigned (&r)[4], const void *row)
{
    unsigned w = emu_warp(), lane = emu_lane();
    if (emu_warp_lanes() != 32) emu_fail("ldmatrix: a warp collective needs all 32 lanes");
    if ((std::uintptr_t)row & 15) emu_fail("ldmatrix: a row address is not 16-byte aligned");
    unsigned k = emu_xchg_turn++ & 1;
    emu_xchg[w].row[k][lane] = row;
    emu_warp_barrier[w].wait();
    const void *const *rows = emu_xchg[w].row[k];
    for (unsigned q = 0; q < 4; q++) {
        unsigned short lo, hi;
        if (TRANS) {  /* column lane/4 of rows 2(lane%4) and 2(lane%4)+1 */
            lo = ((const unsigned short *)rows[8 * q + 2 * (lane % 4)])[lane / 4];
            hi = ((const unsigned short *)rows[8 * q + 2 * (lane % 4) + 1])[lane / 4];
        } else {      /* row lane/4, columns 2(lane%4) and 2(lane%4)+1 */
            const unsigned short *p = (const unsigned short *)rows[8 * q + lane / 4];
            lo = p[2 * (lane % 4)];
            hi = p[2 * (lane % 4) + 1];
        }
        r[q] = lo | (unsigned)hi << 16;
    }
}

inline float emu_bf16_half(unsigned reg, unsigned half)
{
    return emu_bf16((unsigned short)(half ? reg >> 16 : reg & 0xffff));
}

/* c += a b (mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32), sums in k order in float */
inline void mma_bf16_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1)
{
    unsigned w = emu_warp(), lane = emu_lane();
    if (emu_warp_lanes() != 32) emu_fail("mma.sync: a warp collective needs all 32 lanes");
    unsigned k = emu_xchg_turn++ & 1;
    emu_warp_exchange &x = emu_xchg[w];
    for (int q = 0; q < 4; q++) x.a[k][lane][q] = a[q];
    x.b[k][lane][0] = b0;
    x.b[k][lane][1] = b1;
    emu_warp_barrier[w].wait();
    for (unsigned e = 0; e < 4; e++) {
        unsigned i = lane / 4 + (e >= 2 ? 8 : 0), j = 2 * (lane % 4) + (e & 1);
        float s = c[e];
        for (unsigned kk = 0; kk < 16; kk++) {
            /* A[i][kk]: lane (i % 8) * 4 + (kk % 8) / 2, register (i >= 8) + 2 (kk >= 8) */
            unsigned areg = x.a[k][(i % 8) * 4 + (kk % 8) / 2][(i >= 8) + 2 * (kk >= 8)];
            /* B[kk][j]: lane j * 4 + (kk % 8) / 2, register kk >= 8 */
            unsigned breg = x.b[k][j * 4 + (kk % 8) / 2][kk >= 8];
            s += emu_bf16_half(areg, kk & 1) * emu_bf16_half(breg, kk & 1);
        }
        c[e] = s;
    }
}

/* cp.async as the hardware may run it: a copy is only queued when issued, and happens when a
 * cp.async.wait_group lets fewer groups than it stays in flight. A kernel that reads a stage
 * before waiting for it reads what was there before, here as on a GPU (where it is a race).
 * Per thread: the copies not yet committed, then the committed groups, oldest first. A kernel
 * ends with wait_group 0 (mma.cu does), or its last copies are never made. */
struct emu_cp_async { void *dst; const void *src; unsigned bytes; };
inline std::vector<emu_cp_async> emu_cp_opens[32 * EMU_MAX_WARPS];
inline std::deque<std::vector<emu_cp_async>> emu_cp_groupss[32 * EMU_MAX_WARPS];
#define emu_cp_open emu_cp_opens[emu_tid()]
#define emu_cp_groups emu_cp_groupss[emu_tid()]

inline void emu_new_launch()
{
    for (unsigned t = 0; t < 32 * EMU_MAX_WARPS; t++) {
        emu_xchg_turns[t] = 0;
        emu_cp_opens[t].clear();
        emu_cp_groupss[t].clear();
    }
}

/* cp.async.cg.shared.global [dst], [src], 16, src_bytes: the first src_bytes copied, the rest
 * of the 16 zeroed */
inline void cp_async16_zfill(void *dst, const void *src, unsigned src_bytes)
{
    if (((std::uintptr_t)dst & 15) || (src_bytes && ((std::uintptr_t)src & 15)))
        emu_fail("cp.async: an address is not 16-byte aligned");
    if (src_bytes > 16) emu_fail("cp.async: src-size above 16");
    emu_cp_open.push_back({dst, src, src_bytes});
}

inline void cp_async_commit_group()
{
    emu_cp_groups.push_back(std::move(emu_cp_open));
    emu_cp_open.clear();
}

template <int N>
inline void cp_async_wait_group()
{
    while (emu_cp_groups.size() > (std::size_t)N) {
        for (const emu_cp_async &c : emu_cp_groups.front()) {
            if (c.bytes) std::memcpy(c.dst, c.src, c.bytes);
            std::memset((char *)c.dst + c.bytes, 0, 16 - c.bytes);
        }
        emu_cp_groups.pop_front();
    }
}

inline void st_global_f32x2(float *p, float x, float y)
{
    if ((std::uintptr_t)p & 7) emu_fail("st.global.v2.f32: address not 8-byte aligned");
    p[0] = x;
    p[1] = y;
}
