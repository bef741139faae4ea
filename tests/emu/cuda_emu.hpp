/*
 * cuda_emu.hpp — just enough of CUDA's device language, in C++20 on the
 * CPU, to run a generated element-wise kernel (tests/emu_helpers.c
 * compiles the rendered source after this header into a shared object):
 * a launch runs its blocks one after another, each block's threads as OS
 * threads, so __syncthreads is a barrier of the block and __shfl_xor_sync
 * an exchange among a warp's 32 threads. The arithmetic intrinsics are
 * the IEEE single/double operations they name, rounded to nearest even
 * (the build passes -ffp-contract=off, so nothing is fused that the
 * kernel did not fuse); fmaf is the fused one. Shared arrays are static
 * (one block runs at a time); a kernel's `extern __shared__` array is made
 * a pointer into dg_emu_dyn_smem by the helper's rewrite of the source.
 *
 * What it does not model: warp-synchronous code without the _sync
 * intrinsics, atomics, inline PTX (a kernel whose path uses it does not
 * compile here), tensor cores, asynchronous copies. It checks a kernel's
 * indexing, its barriers' placement (a thread that misses a barrier hangs
 * the launch, which the test's timeout reports), its arithmetic and its
 * bounds — the logic, not the speed.
 */
#pragma once

#include <barrier>
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
#define __align__(n) alignas(n)
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
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return { x, y, z, w }; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return { x, y }; }
static inline float2 make_float2(float x, float y) { return { x, y }; }
static inline float4 make_float4(float x, float y, float z, float w) { return { x, y, z, w }; }

/* The launch's geometry (a thread's own index), the block's barrier, a
 * warp's exchange slots and barriers, the dynamic shared memory: one
 * translation unit a kernel, so defined here. */
static thread_local dim3_emu threadIdx, blockIdx;
static dim3_emu blockDim, gridDim;
static unsigned char *dg_emu_dyn_smem;
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

/* Runs fn as a launch of grid x 1 x 1 blocks of nt x 1 x 1 threads with
 * smem bytes of dynamic shared memory: block after block, each one's
 * threads at once. */
static inline void dg_emu_launch(unsigned grid, unsigned nt, size_t smem, const std::function<void()> &fn)
{
	std::vector<unsigned char> dyn(smem + 16);
	dg_emu_dyn_smem = dyn.data();
	blockDim = { nt, 1, 1 };
	gridDim = { grid, 1, 1 };
	for (unsigned b = 0; b < grid; ++b) {
		/* a block's barriers: an exited thread drops out of them */
		std::barrier<> block((std::ptrdiff_t)nt);
		dg_emu_block_bar = &block;
		dg_emu_warp_bar.clear();
		for (unsigned w = 0; w < (nt + 31) / 32; ++w)
			dg_emu_warp_bar.emplace_back(new std::barrier<>((std::ptrdiff_t)(nt - 32 * w < 32 ? nt - 32 * w : 32)));
		std::vector<std::thread> th;
		th.reserve(nt);
		for (unsigned t = 0; t < nt; ++t)
			th.emplace_back([&, b, t] {
				blockIdx = { b, 0, 0 };
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

#define __syncthreads() dg_emu_syncthreads()
static inline float __shfl_xor_sync(unsigned, float v, int m) { return dg_emu_shfl_xor(v, m); }
static inline unsigned __shfl_xor_sync(unsigned, unsigned v, int m) { return dg_emu_shfl_xor_u(v, m); }
static inline int __shfl_xor_sync(unsigned, int v, int m) { return (int)dg_emu_shfl_xor_u((unsigned)v, m); }
static inline void __syncwarp(unsigned = 0xffffffffu) {}

template <class T> static inline T __ldg(const T *p) { return *p; }

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
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
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
