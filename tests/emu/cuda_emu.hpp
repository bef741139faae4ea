/*
 * cuda_emu.hpp — enough of CUDA's device language and of sm_90a's inline
 * PTX, in C++20 on the CPU, to run a generated kernel
 * (tests/emu_helpers.c builds the rendered source after this header into
 * a shared object, each asm statement rewritten as a call of the
 * emulation below): a launch runs its blocks one after another, each
 * block's threads as OS threads, so __syncthreads is a barrier of the
 * block, bar.sync a named one (bar.arrive counts towards it), __shfl_xor_sync an exchange among a warp's
 * 32 threads. The arithmetic intrinsics are the IEEE single/double
 * operations they name, rounded to nearest even (the build passes
 * -ffp-contract=off, so nothing is fused that the kernel did not fuse);
 * fmaf is the fused one.
 *
 * Shared memory is one window (dg_emu_window), the dynamic shared memory
 * at its start; a shared address is the offset into it. Emulated at
 * issue, in program order: cp.async (the copy done when issued; commit
 * and wait no-ops), TMA's bulk tensor copies (a box of rank 3 or 5
 * through the test's own map, eh_tmap; zeros outside the tensor; the
 * map's 128- or 64-byte swizzle on the shared addresses; its bytes
 * complete on the mbarrier) and rank-3 bulk tensor stores (nothing past
 * the tensor's edges written; bulk groups' commit and wait no-ops), mbarriers
 * (arrival counts, transaction bytes, phases; try_wait blocks until its
 * phase completed), wgmma (the descriptors' layouts, 128-byte swizzle or
 * none, K- or MN-major; the accumulators of the calling thread only, f32
 * or s32 sums; fence, commit and wait no-ops), setmaxnreg and the fences
 * (no-ops).
 *
 * What it does not model: timing and the asynchrony itself (an MMA or a
 * copy is complete when issued, so a stage released too early is not
 * caught), warp-synchronous code without the _sync intrinsics, atomics
 * other than atomicAdd (under one lock),
 * clusters, the sm_80 copies and loads beyond cp.async and ldmatrix x4 (an
 * asm the rewrite does not know stops the launch that reaches it, naming
 * it). mma.sync (m16n8k16 bf16, m16n8k32 s8/u8) and ldmatrix exchange the
 * warp's fragments at the warp's barrier, so every lane of the warp must
 * reach them, as on the hardware. It checks a kernel's indexing, its barriers'
 * placement (a thread that misses one hangs the launch, which the test's
 * timeout reports), its layouts and its arithmetic — the logic, not the
 * speed. The tensor-core sums are in the order of k (the hardware's order
 * differs in the last bits: compare by a tolerance).
 */
#pragma once

#include <barrier>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <math.h>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__

struct dim3_emu {
	unsigned x, y, z;
};
struct uint4 {
	unsigned x, y, z, w;
};
struct uint2 {
	unsigned x, y;
};
struct float2 {
	float x, y;
};
struct float4 {
	float x, y, z, w;
};
struct int4 {
	int x, y, z, w;
};
struct int2 {
	int x, y;
};
static inline int4 make_int4(int x, int y, int z, int w) { return { x, y, z, w }; }
static inline int2 make_int2(int x, int y) { return { x, y }; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return { x, y, z, w }; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return { x, y }; }
static inline float2 make_float2(float x, float y) { return { x, y }; }
static inline float4 make_float4(float x, float y, float z, float w) { return { x, y, z, w }; }

/* The launch's geometry (a thread's own index), the block's barrier, a
 * warp's exchange slots and barriers, the dynamic shared memory: one
 * translation unit a kernel, so defined here. */
static thread_local dim3_emu threadIdx, blockIdx;
static dim3_emu blockDim, gridDim;
/* Shared memory: one window, the dynamic shared memory at its start, so
 * that a shared address (__cvta_generic_to_shared: the offset into it)
 * fits the 18 bits a wgmma descriptor takes and keeps its alignment (the
 * window is 1024-byte aligned, as the swizzle's atoms need). */
#define DG_EMU_SMEM (256 * 1024)
alignas(1024) static unsigned char dg_emu_window[DG_EMU_SMEM];
static unsigned char *dg_emu_dyn_smem = dg_emu_window;
static size_t dg_emu_dyn_size;
static std::barrier<> *dg_emu_block_bar;
static std::vector<std::unique_ptr<std::barrier<>>> dg_emu_warp_bar;
static unsigned dg_emu_slot[1024];

static inline void dg_emu_syncthreads() { dg_emu_block_bar->arrive_and_wait(); }

static inline unsigned dg_emu_shfl_xor_u(unsigned v, int m)
{
	const unsigned t = threadIdx.x, w = t / 32;
	dg_emu_slot[t] = v;
	dg_emu_warp_bar[w]->arrive_and_wait();
	const unsigned r = dg_emu_slot[(t & ~31u) | ((t & 31u) ^ (unsigned)(m & 31))];
	dg_emu_warp_bar[w]->arrive_and_wait();
	return r;
}

static inline float dg_emu_shfl_xor(float v, int m)
{
	unsigned u, r;
	std::memcpy(&u, &v, 4);
	r = dg_emu_shfl_xor_u(u, m);
	float f;
	std::memcpy(&f, &r, 4);
	return f;
}

template <class T> static inline T __ldg(const T *p) { return *p; }
template <class T> static inline void __stwb(T *p, T v) { *p = v; }

/* CUDA's min and max of integers and floats (the device overloads) */
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }

static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline int __float_as_int(float f) { int u; std::memcpy(&u, &f, 4); return u; }
static inline float __int2float_rn(int i) { return (float)i; }	/* nearest even, as the FPU rounds */
static inline float __uint2float_rn(unsigned i) { return (float)i; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
static inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
static inline float __double2float_rn(double d) { return (float)d; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fsqrt_rn(float a) { return std::sqrt(a); }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b)
{
	return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
/* round half to even; NaN 0; out of range saturates (PTX cvt.rni.s32.f32) */
static inline int __float2int_rn(float f)
{
	if (std::isnan(f))
		return 0;
	if (f >= 2147483648.0f)
		return INT_MAX;
	if (f <= -2147483648.0f)
		return INT_MIN;
	return (int)std::nearbyint(f);
}
/* PTX prmt: the bytes of {b, a} picked by the selector's four nibbles */
static inline unsigned __byte_perm(unsigned a, unsigned b, unsigned s)
{
	const unsigned long long v = ((unsigned long long)b << 32) | a;
	unsigned r = 0;
	for (int i = 0; i < 4; ++i)
		r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
	return r;
}

#define __syncthreads() dg_emu_syncthreads()
static inline float __shfl_xor_sync(unsigned, float v, int m) { return dg_emu_shfl_xor(v, m); }
static inline unsigned __shfl_xor_sync(unsigned, unsigned v, int m) { return dg_emu_shfl_xor_u(v, m); }
static inline int __shfl_xor_sync(unsigned, int v, int m) { return (int)dg_emu_shfl_xor_u((unsigned)v, m); }
static inline void __syncwarp(unsigned = 0xffffffffu) {}

/* ---- shared addresses ---------------------------------------------------- */

static inline size_t __cvta_generic_to_shared(const void *p)
{
	const unsigned char *c = (const unsigned char *)p;
	if (c < dg_emu_window || c >= dg_emu_window + DG_EMU_SMEM) {
		fprintf(stderr, "emu: a shared address of memory outside the dynamic shared memory\n");
		abort();
	}
	return (size_t)(c - dg_emu_window);
}

static inline unsigned char *dg_emu_sh(unsigned addr)
{
	if (addr >= DG_EMU_SMEM) {
		fprintf(stderr, "emu: shared address 0x%x past the window\n", addr);
		abort();
	}
	return dg_emu_window + addr;
}

/* the 128-byte swizzle: the 16-byte chunk (address bits 4-6) xor the row
 * within its 1024-byte atom (bits 7-9) */
static inline unsigned dg_emu_swz128(unsigned a) { return a ^ (((a >> 7) & 7u) << 4); }

/* the 64-byte swizzle: the 16-byte chunk (bits 4-5) xor bits 7-8 */
static inline unsigned dg_emu_swz64(unsigned a) { return a ^ (((a >> 7) & 3u) << 4); }

/* a map's swizzle on a shared address (128, 64 or none) */
static inline unsigned dg_emu_swz(unsigned swizzle, unsigned a)
{
	return swizzle == 128 ? dg_emu_swz128(a) : swizzle == 64 ? dg_emu_swz64(a) : a;
}

/* ---- named barriers (bar.sync id, count) ---------------------------------- */

static std::mutex dg_emu_mu;
static std::map<unsigned, std::unique_ptr<std::barrier<>>> dg_emu_named;

static inline void dg_emu_named_reset() { dg_emu_named.clear(); }

static inline std::barrier<> *dg_emu_named_at(unsigned id, unsigned count)
{
	std::lock_guard<std::mutex> g(dg_emu_mu);
	auto &e = dg_emu_named[id];
	if (!e)
		e.reset(new std::barrier<>((std::ptrdiff_t)count));
	return e.get();
}

static inline void dg_emu_bar_sync(unsigned id, unsigned count)
{
	dg_emu_named_at(id, count)->arrive_and_wait();
}

/* bar.arrive: counts towards the barrier's phase without waiting for it */
static inline void dg_emu_bar_arrive(unsigned id, unsigned count)
{
	(void)dg_emu_named_at(id, count)->arrive();
}

/* ---- mbarriers: arrivals a phase, pending transaction bytes ------------- */

struct dg_emu_mbar {
	unsigned count, pending;
	long long tx;
	unsigned phase;
};
static std::map<unsigned, dg_emu_mbar> dg_emu_mbars;
static std::condition_variable dg_emu_cv;

static inline void dg_emu_mbar_reset() { dg_emu_mbars.clear(); }

static inline dg_emu_mbar &dg_emu_mbar_at(unsigned bar)
{
	auto it = dg_emu_mbars.find(bar);
	if (it == dg_emu_mbars.end()) {
		fprintf(stderr, "emu: mbarrier at 0x%x used before its init\n", bar);
		abort();
	}
	return it->second;
}

/* the phase completes when every arrival came and no bytes are pending */
static inline void dg_emu_mbar_check(dg_emu_mbar &m)
{
	if (m.pending == 0 && m.tx == 0) {
		m.phase++;
		m.pending = m.count;
		dg_emu_cv.notify_all();
	}
}

static inline void dg_emu_mbar_init(unsigned bar, unsigned count)
{
	std::lock_guard<std::mutex> g(dg_emu_mu);
	dg_emu_mbars[bar] = { count, count, 0, 0 };
}

static inline void dg_emu_mbar_arrive(unsigned bar)
{
	std::lock_guard<std::mutex> g(dg_emu_mu);
	dg_emu_mbar &m = dg_emu_mbar_at(bar);
	if (m.pending == 0) {
		fprintf(stderr, "emu: mbarrier at 0x%x: more arrivals than its count\n", bar);
		abort();
	}
	m.pending--;
	dg_emu_mbar_check(m);
}

static inline void dg_emu_mbar_expect_tx(unsigned bar, unsigned bytes)
{
	std::lock_guard<std::mutex> g(dg_emu_mu);
	dg_emu_mbar &m = dg_emu_mbar_at(bar);
	m.tx += bytes;
	m.pending--;
	dg_emu_mbar_check(m);
}

static inline void dg_emu_mbar_complete_tx(unsigned bar, unsigned bytes)
{
	std::lock_guard<std::mutex> g(dg_emu_mu);
	dg_emu_mbar &m = dg_emu_mbar_at(bar);
	m.tx -= bytes;
	dg_emu_mbar_check(m);
}

/* waits until the phase of this parity completed: the current phase's
 * parity is the other one */
static inline void dg_emu_mbar_wait(unsigned bar, unsigned parity)
{
	std::unique_lock<std::mutex> g(dg_emu_mu);
	dg_emu_mbar_at(bar);
	dg_emu_cv.wait(g, [&] { return (dg_emu_mbar_at(bar).phase & 1u) != (parity & 1u); });
}

/* ---- copies into shared memory -------------------------------------------- */

/* cp.async (cg 16 / ca 8): src_bytes of src, zeros to n (at once) */
static inline void dg_emu_cp_async(size_t dst, unsigned long long src, unsigned n, unsigned src_bytes)
{
	unsigned char *d = dg_emu_sh((unsigned)dst);
	std::memset(d, 0, n);
	if (src_bytes)
		std::memcpy(d, (const void *)src, src_bytes < n ? src_bytes : n);
}

static inline void dg_emu_st_shared_v4(size_t dst, unsigned a, unsigned b, unsigned c, unsigned d)
{
	unsigned v[4] = { a, b, c, d };
	std::memcpy(dg_emu_sh((unsigned)dst), v, 16);
}

/* A tensor map as the tests make it (tests/emu/tmap.h) */
#include "tmap.h"
typedef eh_tmap dg_emu_tmap;

/* a box of up to rank 5 at coordinates c into shared dst, dim 0 fastest
 * (the map's swizzle on its addresses), zeros outside the tensor; the
 * whole box's bytes complete on bar. The strides of dims 1 to 4 are the
 * map's own, in any order (a permuted gather of rows). With store, the
 * other way: shared src into the tensor, nothing outside it written (a
 * bulk tensor store, complete at issue). */
static inline void dg_emu_tma_copy(size_t dst, unsigned long long map, size_t bar, const int c[5], bool store)
{
	const dg_emu_tmap *m = (const dg_emu_tmap *)map;
	unsigned off = 0;
	for (unsigned i4 = 0; i4 < m->box[4]; ++i4)
		for (unsigned i3 = 0; i3 < m->box[3]; ++i3)
			for (unsigned i2 = 0; i2 < m->box[2]; ++i2)
				for (unsigned i1 = 0; i1 < m->box[1]; ++i1)
					for (unsigned i0 = 0; i0 < m->box[0]; ++i0, off += m->es) {
						const unsigned ii[5] = { i0, i1, i2, i3, i4 };
						bool in = true;
						unsigned long long at = 0;
						for (int d = 0; d < 5; ++d) {
							const long long x = (long long)c[d] + ii[d];
							in = in && x >= 0 && x < (long long)m->dims[d];
							at += (unsigned long long)x * (d ? m->strides[d - 1] : m->es);
						}
						unsigned char *p = dg_emu_sh(dg_emu_swz(m->swizzle, (unsigned)dst + off));
						if (store) {
							if (in)
								std::memcpy((unsigned char *)m->base + at, p, m->es);
						} else if (!in)
							std::memset(p, 0, m->es);
						else
							std::memcpy(p, (const unsigned char *)m->base + at, m->es);
					}
	if (!store)
		dg_emu_mbar_complete_tx((unsigned)bar, off);
}

static inline void dg_emu_tma_load(size_t dst, unsigned long long map, size_t bar, const int c[5])
{
	dg_emu_tma_copy(dst, map, bar, c, false);
}

static inline void dg_emu_tma_store3(unsigned long long map, size_t src, int c0, int c1, int c2)
{
	const int c[5] = { c0, c1, c2, 0, 0 };
	dg_emu_tma_copy(src, map, 0, c, true);
}

static inline void dg_emu_tma_load3(size_t dst, unsigned long long map, size_t bar, int c0, int c1, int c2)
{
	const int c[5] = { c0, c1, c2, 0, 0 };
	dg_emu_tma_load(dst, map, bar, c);
}

static inline void dg_emu_tma_load5(size_t dst, unsigned long long map, size_t bar, int c0, int c1, int c2, int c3,
				    int c4)
{
	const int c[5] = { c0, c1, c2, c3, c4 };
	dg_emu_tma_load(dst, map, bar, c);
}

/* ---- warpgroup MMA (wgmma.mma_async, at issue) ------------------------------ */

/* An operand's element (r: its M or N index, k) through its descriptor:
 * start (bits 0-13), LBO (16-29), SBO (32-45), 16-byte units; layout 1
 * (bits 62-63) the 128-byte swizzle. K-major: rows of r, 8-row groups SBO
 * apart, k along the row; MN-major (transposed): rows of k, 8-row groups
 * SBO apart, 64-wide groups of r LBO apart. es: element bytes. */
static inline const unsigned char *dg_emu_desc_elem(unsigned long long desc, bool mn, int r, int k, int es)
{
	const unsigned start = (unsigned)(desc & 0x3fffu) << 4, lbo = (unsigned)((desc >> 16) & 0x3fffu) << 4,
		       sbo = (unsigned)((desc >> 32) & 0x3fffu) << 4, layout = (unsigned)(desc >> 62);
	unsigned a;
	if (layout == 1) {
		const int per = 128 / es; /* elements a 128-byte row */
		if (!mn)
			a = start + (unsigned)(r / 8) * sbo + (unsigned)(r % 8) * 128u + (unsigned)(k * es);
		else
			a = start + (unsigned)(r / per) * lbo + (unsigned)(k / 8) * sbo + (unsigned)(k % 8) * 128u +
			    (unsigned)((r % per) * es);
		a = dg_emu_swz128(a);
	} else if (layout == 0) {
		/* no swizzle: core matrices of 8 rows x 16 bytes, K-major; along
		 * K LBO apart, along M / N SBO apart */
		if (mn) {
			fprintf(stderr, "emu: an MN-major operand without the swizzle\n");
			abort();
		}
		const int per = 16 / es;
		a = start + (unsigned)(k / per) * lbo + (unsigned)(r / 8) * sbo + (unsigned)(r % 8) * 16u +
		    (unsigned)((k % per) * es);
	} else {
		fprintf(stderr, "emu: descriptor layout %u\n", layout);
		abort();
	}
	return dg_emu_sh(a);
}

static inline float dg_emu_bf16(const unsigned char *p)
{
	unsigned short h;
	std::memcpy(&h, p, 2);
	return __uint_as_float((unsigned)h << 16);
}

/* d (+)= A (64 x K) · B (N x K)ᵀ for the calling thread's accumulators:
 * thread t of its warpgroup, warp w = t / 32 % 4, lane 4g + q, register
 * 4j + i at row 16w + g (+8 for i >= 2), column 8j + 2q (+1 for odd i).
 * kind 0: bf16 operands, f32 sums (K 16); 1: s8 · s8, 2: u8 · s8, s32
 * sums (K 32). */
static inline void dg_emu_wgmma(void *const *d, int n, int kind, unsigned long long da, unsigned long long db,
				int scale_d, int ta, int tb)
{
	const int t = (int)(threadIdx.x % 128), w = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
	const int K = kind == 0 ? 16 : 32, es = kind == 0 ? 2 : 1;
	for (int reg = 0; reg < n / 2; ++reg) {
		const int j = reg / 4, i = reg % 4, row = 16 * w + g + (i >= 2 ? 8 : 0), col = 8 * j + 2 * q + (i & 1);
		if (kind == 0) {
			float acc = scale_d ? *(float *)d[reg] : 0.0f;
			for (int k = 0; k < K; ++k)
				acc += dg_emu_bf16(dg_emu_desc_elem(da, ta, row, k, 2)) *
				       dg_emu_bf16(dg_emu_desc_elem(db, tb, col, k, 2));
			*(float *)d[reg] = acc;
		} else {
			int acc = scale_d ? *(int *)d[reg] : 0;
			for (int k = 0; k < K; ++k) {
				const unsigned char a = *dg_emu_desc_elem(da, false, row, k, es),
						    b = *dg_emu_desc_elem(db, false, col, k, es);
				acc += (kind == 2 ? (int)a : (int)(signed char)a) * (int)(signed char)b;
			}
			*(int *)d[reg] = acc;
		}
	}
}

/* atomics: one lock for all (the emulation's threads are OS threads) */
static inline float atomicAdd(float *p, float v)
{
	std::lock_guard<std::mutex> g(dg_emu_mu);
	const float o = *p;
	*p = o + v;
	return o;
}
static inline int atomicAdd(int *p, int v)
{
	std::lock_guard<std::mutex> g(dg_emu_mu);
	const int o = *p;
	*p = o + v;
	return o;
}
static inline unsigned atomicAdd(unsigned *p, unsigned v)
{
	std::lock_guard<std::mutex> g(dg_emu_mu);
	const unsigned o = *p;
	*p = o + v;
	return o;
}

/* An inline PTX statement the emulation has no form of (the rewrite's
 * call in its place): reached, it stops the launch naming it. */
static inline void dg_emu_unknown(const char *tmpl)
{
	fprintf(stderr, "emu: no emulation of this inline PTX:\n%s\n", tmpl);
	abort();
}

/* ---- warp-level MMA (mma.sync) and ldmatrix --------------------------------- */

/* Each lane's operand registers, exchanged among its warp: a warp's lanes
 * write theirs, meet at the warp's barrier, read the others', meet again
 * (so no slot is rewritten before every lane read it). */
static unsigned dg_emu_frag[1024][6];
static size_t dg_emu_fragaddr[1024];

static inline float dg_emu_bf16_half(unsigned w, int hi)
{
	return __uint_as_float(hi ? (w & 0xffff0000u) : (w << 16));
}

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (kind 0) or
 * m16n8k32 .s32.{s8,u8}.s8.s32 (kind 1: s8, 2: u8), d (+)= A·B in place:
 * lane 4g + q holds A rows g, g+8 (regs 0, 1: k 0..7 / 0..15; regs 2, 3:
 * the upper half of k), B column g (reg 0: k low half, reg 1: high), D
 * (g, 2q), (g, 2q+1), (g+8, 2q), (g+8, 2q+1) (PTX ISA, the m16n8 fragments). */
static inline void dg_emu_mma_sync(void *const *d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
				   unsigned b1, int kind)
{
	const unsigned t = threadIdx.x, w = t / 32, base = t & ~31u;
	unsigned *f = dg_emu_frag[t];
	f[0] = a0, f[1] = a1, f[2] = a2, f[3] = a3, f[4] = b0, f[5] = b1;
	dg_emu_warp_bar[w]->arrive_and_wait();
	const int lane = (int)(t & 31u), g = lane / 4, q = lane % 4;
	const int K = kind == 0 ? 16 : 32, per = kind == 0 ? 2 : 4; /* elements a register */
	for (int i = 0; i < 4; ++i) {
		const int r = g + (i >= 2 ? 8 : 0), c = 2 * q + (i & 1);
		float fs = kind == 0 ? *(float *)d[i] : 0.0f;
		int is = kind == 0 ? 0 : *(int *)d[i];
		for (int k = 0; k < K; ++k) {
			const int hk = k >= K / 2, kk = k % (K / 2); /* the half of K, the place in it */
			const unsigned *fa = dg_emu_frag[base + (unsigned)((r % 8) * 4 + kk / per)];
			const unsigned *fb = dg_emu_frag[base + (unsigned)(c * 4 + kk / per)];
			const unsigned wa = fa[(r >= 8 ? 1 : 0) + 2 * hk], wb = fb[4 + hk];
			const int ea = kk % per;
			if (kind == 0)
				fs += dg_emu_bf16_half(wa, ea) * dg_emu_bf16_half(wb, ea);
			else {
				const unsigned ba = (wa >> (8 * ea)) & 0xffu, bb = (wb >> (8 * ea)) & 0xffu;
				is += (kind == 2 ? (int)ba : (int)(signed char)ba) * (int)(signed char)bb;
			}
		}
		if (kind == 0)
			*(float *)d[i] = fs;
		else
			*(int *)d[i] = is;
	}
	dg_emu_warp_bar[w]->arrive_and_wait();
}

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8i..8i+7 give
 * the row addresses of matrix i; register i of lane 4g + q gets matrix
 * i's (g, 2q) and (g, 2q+1) (.trans: (2q, g) and (2q+1, g)). */
static inline void dg_emu_ldmatrix(unsigned *r0, unsigned *r1, unsigned *r2, unsigned *r3, size_t addr, int trans)
{
	const unsigned t = threadIdx.x, w = t / 32, base = t & ~31u;
	dg_emu_fragaddr[t] = addr;
	dg_emu_warp_bar[w]->arrive_and_wait();
	const int lane = (int)(t & 31u), g = lane / 4, q = lane % 4;
	unsigned *out[4] = { r0, r1, r2, r3 };
	for (int i = 0; i < 4; ++i) {
		unsigned short e[2];
		for (int h = 0; h < 2; ++h) {
			const int row = trans ? 2 * q + h : g, col = trans ? g : 2 * q + h;
			std::memcpy(&e[h], dg_emu_sh((unsigned)dg_emu_fragaddr[base + 8 * i + row] + 2u * (unsigned)col), 2);
		}
		*out[i] = (unsigned)e[0] | ((unsigned)e[1] << 16);
	}
	dg_emu_warp_bar[w]->arrive_and_wait();
}

/* ---- small instructions ---------------------------------------------------- */

static inline unsigned dg_emu_cvt_bf16x2(float hi, float lo)
{
	auto rn = [](float f) {
		unsigned u = __float_as_uint(f);
		if ((u & 0x7fffffffu) > 0x7f800000u)
			return (u >> 16) | 0x40u;
		u += 0x7fffu + ((u >> 16) & 1u);
		return u >> 16;
	};
	return (rn(lo) & 0xffffu) | (rn(hi) << 16);
}

/* max.bf16x2: each 16-bit lane the larger bf16, a NaN lane giving the
 * other's value (both NaN: the canonical NaN) */
static inline unsigned dg_emu_max_bf16x2(unsigned x, unsigned y)
{
	unsigned d = 0;
	for (int sh = 0; sh < 32; sh += 16) {
		const unsigned a = (x >> sh) & 0xffffu, b = (y >> sh) & 0xffffu;
		const float fa = __uint_as_float(a << 16), fb = __uint_as_float(b << 16);
		const unsigned m = fa != fa ? (fb != fb ? 0x7fffu : b) : fb != fb ? a : fa >= fb ? a : b;
		d |= m << sh;
	}
	return d;
}

static inline float dg_emu_fma_sat(float a, float b, float c)
{
	const float u = fmaf(a, b, c);
	return std::isnan(u) ? 0.0f : u < 0.0f ? 0.0f : u > 1.0f ? 1.0f : u;
}

static inline int dg_emu_dp4a(unsigned a, unsigned b, int c, bool a_unsigned)
{
	int s = c;
	for (int i = 0; i < 4; ++i) {
		const int x = a_unsigned ? (int)((a >> (8 * i)) & 0xffu) : (int)(signed char)((a >> (8 * i)) & 0xffu);
		s += x * (int)(signed char)((b >> (8 * i)) & 0xffu);
	}
	return s;
}

/* Runs fn as a launch of grid blocks (x fastest) of nt x 1 x 1 threads
 * with smem bytes of dynamic shared memory: block after block, each
 * one's threads at once. */
static inline void dg_emu_launch3(dim3_emu grid, unsigned nt, size_t smem, const std::function<void()> &fn)
{
	if (smem > DG_EMU_SMEM) {
		fprintf(stderr, "emu: %zu bytes of dynamic shared memory, more than the window's %d\n", smem, DG_EMU_SMEM);
		abort();
	}
	dg_emu_dyn_size = smem;
	blockDim = { nt, 1, 1 };
	gridDim = grid;
	for (unsigned bz = 0; bz < grid.z; ++bz)
		for (unsigned by = 0; by < grid.y; ++by)
			for (unsigned bx = 0; bx < grid.x; ++bx) {
				/* a block's barriers: an exited thread drops out of them */
				std::barrier<> block((std::ptrdiff_t)nt);
				dg_emu_block_bar = &block;
				std::memset(dg_emu_window, 0xcd, sizeof(dg_emu_window)); /* stale bytes are not zeros */
				dg_emu_named_reset();
				dg_emu_mbar_reset();
				dg_emu_warp_bar.clear();
				for (unsigned w = 0; w < (nt + 31) / 32; ++w)
					dg_emu_warp_bar.emplace_back(
						new std::barrier<>((std::ptrdiff_t)(nt - 32 * w < 32 ? nt - 32 * w : 32)));
				std::vector<std::thread> th;
				th.reserve(nt);
				for (unsigned t = 0; t < nt; ++t)
					th.emplace_back([&, bx, by, bz, t] {
						blockIdx = { bx, by, bz };
						threadIdx = { t, 0, 0 };
						fn();
						/* an exited thread no longer counts at a barrier */
						dg_emu_block_bar->arrive_and_drop();
						dg_emu_warp_bar[t / 32]->arrive_and_drop();
					});
				for (auto &x : th)
					x.join();
			}
}

static inline void dg_emu_launch(unsigned grid, unsigned nt, size_t smem, const std::function<void()> &fn)
{
	dg_emu_launch3({ grid, 1, 1 }, nt, smem, fn);
}
