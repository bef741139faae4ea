// Prototype: BDH attention's two large GEMMs on Hopper with TMA loads, an
// mbarrier ring and warp specialization (one producer warp, consumer
// warpgroups issuing wgmma), against cuBLAS at the same shapes.
//
//   scores:  S[bh, i, j] = sum_k QR[bh, i, k] QR[bh, j, k]   (j < i, else 0)
//   grad_xs: G[bh, i, n] = sum_t C[bh, i, t] QR[bh, t, n]    (store, or mask epilogue)
//
// nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a attn_ws.cu -lcuda -lcublas
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>
#include <algorithm>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CU(x) do { CUresult e_ = (x); if (e_ != CUDA_SUCCESS) { const char *s_; cuGetErrorString(e_, &s_); fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, s_); exit(1); } } while (0)

// ---------------------------------------------------------------- device helpers
__device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count)
{
	asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes)
{
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar)
{
	asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity)
{
	asm volatile("{\n.reg .pred p;\nWAIT_%=:\n"
		     "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
		     "@!p bra WAIT_%=;\n}\n" :: "r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void tma_load_3d(unsigned dst, const CUtensorMap *map, unsigned bar, int c0, int c1, int c2)
{
	asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
		     :: "r"(dst), "l"((unsigned long long)map), "r"(bar), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory"); }
template <int R> __device__ __forceinline__ void reg_alloc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(R)); }
template <int R> __device__ __forceinline__ void reg_dealloc() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(R)); }

// 128-byte-swizzled descriptor: K-major SBO 1024 (LBO unused), MN-major LBO 8192 SBO 1024
template <bool KMAJ>
__device__ __forceinline__ unsigned long long desc(unsigned saddr)
{
	constexpr unsigned long long lbo = KMAJ ? 1u : (8192u >> 4), sbo = 1024u >> 4;
	return (unsigned long long)((saddr & 0x3ffffu) >> 4) | (lbo << 16) | (sbo << 32) | (1ull << 62);
}

// d (+)= A·B, m64n128k16 bf16 -> f32; TB: B MN-major
template <int TB>
__device__ __forceinline__ void mma128(float (&d)[64], unsigned long long da, unsigned long long db)
{
	asm volatile("{\n"
		     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
		     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
		     "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
		     "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
		     "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
		     "%64, %65, 1, 1, 1, 0, %66;\n}\n"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
		       "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
		       "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
		       "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
		       "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
		       "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
		       "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
		       "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
		     : "l"(da), "l"(db), "n"(TB));
}
__device__ __forceinline__ void pin(float (&d)[64])
{
#pragma unroll
	for (int i = 0; i < 64; ++i)
		asm volatile("" : "+f"(d[i]) :: "memory");
}

__device__ __forceinline__ unsigned pack_bf16(float a, float b)
{
	__nv_bfloat162 v = __floats2bfloat162_rn(a, b);
	return *(unsigned *)&v;
}

// ---------------------------------------------------------------- the kernels
constexpr int BM = 128, BN = 128, BK = 64;
constexpr int NCW = 2;				// consumer warpgroups (64 rows each)
constexpr int NT = 128 * (NCW + 1);
constexpr int TILE_A = BM * BK * 2, TILE_B = BN * BK * 2, STAGE = TILE_A + TILE_B;

template <int S>
struct Ring {
	static constexpr int BYTES = S * STAGE + 1024 + 2 * S * 8;
};

// scores: grid (nt*nt, BH); block (i, j) = (x / nt, x % nt); j > i: zeros
template <int S>
__global__ void __launch_bounds__(NT, 1)
scores_ws(const __grid_constant__ CUtensorMap qr_map, __nv_bfloat16 *out, int T, int K)
{
	extern __shared__ __align__(1024) unsigned char smem_raw[];
	const int nt = (T + BM - 1) / BM;
	const int bi = blockIdx.x / nt, bj = blockIdx.x % nt, bh = blockIdx.y;
	const int tid = threadIdx.x;
	__nv_bfloat16 *o = out + (long long)bh * T * T;
	if (bj > bi) {		// wholly above the diagonal: zeros
		for (int e = tid; e < BM * BN / 2; e += NT) {
			const int r = e / (BN / 2), c = 2 * (e % (BN / 2));
			const int m = bi * BM + r, n = bj * BN + c;
			if (m < T && n < T) {
				if (n + 1 < T && (T % 2) == 0)
					*(unsigned *)(o + (long long)m * T + n) = 0u;
				else
					o[(long long)m * T + n] = __float2bfloat16(0.f);
			}
		}
		return;
	}
	const bool diag = bi == bj;
	const unsigned base = (smem_u32(smem_raw) + 1023u) & ~1023u;
	const unsigned bars = base + S * STAGE;		// full[S], empty[S]
	const int nk = (K + BK - 1) / BK;
	if (tid == 0) {
		for (int s = 0; s < S; ++s) {
			mbar_init(bars + 8 * s, 1);
			mbar_init(bars + 8 * (S + s), NCW * 128);
		}
		asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
	}
	__syncthreads();
	const int wg = tid / 128;
	if (wg == 0) {			// producer
		reg_dealloc<40>();
		if (tid == 0) {
			const unsigned bytes = diag ? TILE_A : STAGE;
			for (int k = 0; k < nk; ++k) {
				const int s = k % S;
				const unsigned ph = (k / S) & 1;
				mbar_wait(bars + 8 * (S + s), ph ^ 1);
				mbar_expect_tx(bars + 8 * s, bytes);
				tma_load_3d(base + s * STAGE, &qr_map, bars + 8 * s, k * BK, bi * BM, bh);
				if (!diag)
					tma_load_3d(base + s * STAGE + TILE_A, &qr_map, bars + 8 * s, k * BK, bj * BN, bh);
			}
		}
		return;
	}
	reg_alloc<232>();
	const int cw = wg - 1;
	float acc[64];
#pragma unroll
	for (int i = 0; i < 64; ++i)
		acc[i] = 0.f;
	for (int k = 0; k < nk; ++k) {
		const int s = k % S;
		mbar_wait(bars + 8 * s, (k / S) & 1);
		const unsigned as = base + s * STAGE + cw * 8192, bs = base + s * STAGE + (diag ? 0 : TILE_A);
		wg_fence();
#pragma unroll
		for (int kk = 0; kk < BK / 16; ++kk)
			mma128<0>(acc, desc<true>(as + 32 * kk), desc<true>(bs + 32 * kk));
		wg_commit();
		wg_wait<1>();
		pin(acc);
		if (k > 0)
			mbar_arrive(bars + 8 * (S + (k - 1) % S));
	}
	wg_wait<0>();
	pin(acc);
	// epilogue: rows g, g+8 of the warp's 16; columns 8j + 2q
	const int lane = tid & 31, warp = (tid >> 5) & 3, g = lane >> 2, q = lane & 3;
#pragma unroll
	for (int hr = 0; hr < 2; ++hr) {
		const int m = bi * BM + cw * 64 + warp * 16 + g + 8 * hr;
		if (m >= T)
			continue;
#pragma unroll
		for (int j = 0; j < BN / 8; ++j) {
			const int n = bj * BN + 8 * j + 2 * q;
			float v0 = n < m ? acc[4 * j + 2 * hr] : 0.f, v1 = n + 1 < m ? acc[4 * j + 2 * hr + 1] : 0.f;
			if (n + 1 < T)
				*(unsigned *)(o + (long long)m * T + n) = pack_bf16(v0, v1);
			else if (n < T)
				o[(long long)m * T + n] = __float2bfloat16(v0);
		}
	}
}

// grad_xs: out[bh, i, n] = sum_t C[bh, i, t] QR[bh, t, n]; grid (L/BN, ceil(T/BM), BH)
// MASK: dxs = mask > 0 ? dxs + RoPE^T(v) : 0 in place (out = dxs), else out = v (bf16)
template <int S, bool MASK>
__global__ void __launch_bounds__(NT, 1)
grad_xs_ws(const __grid_constant__ CUtensorMap c_map, const __grid_constant__ CUtensorMap qr_map,
	   __nv_bfloat16 *out, const __nv_bfloat16 *mask, const float *rope, int T, int L)
{
	extern __shared__ __align__(1024) unsigned char smem_raw[];
	const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM, bh = blockIdx.z;
	const int tid = threadIdx.x;
	const unsigned base = (smem_u32(smem_raw) + 1023u) & ~1023u;
	const unsigned bars = base + S * STAGE;
	const int nk = (T + BK - 1) / BK;
	if (tid == 0) {
		for (int s = 0; s < S; ++s) {
			mbar_init(bars + 8 * s, 1);
			mbar_init(bars + 8 * (S + s), NCW * 128);
		}
		asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
	}
	__syncthreads();
	const int wg = tid / 128;
	if (wg == 0) {
		reg_dealloc<40>();
		if (tid == 0) {
			for (int k = 0; k < nk; ++k) {
				const int s = k % S;
				const unsigned ph = (k / S) & 1;
				mbar_wait(bars + 8 * (S + s), ph ^ 1);
				mbar_expect_tx(bars + 8 * s, STAGE);
				tma_load_3d(base + s * STAGE, &c_map, bars + 8 * s, k * BK, m0, bh);
				// B: 64 rows of t, 64 columns of n a box; BN/64 boxes 8192 apart
#pragma unroll
				for (int b = 0; b < BN / 64; ++b)
					tma_load_3d(base + s * STAGE + TILE_A + 8192 * b, &qr_map, bars + 8 * s, n0 + 64 * b, k * BK, bh);
			}
		}
		return;
	}
	reg_alloc<232>();
	const int cw = wg - 1;
	float acc[64];
#pragma unroll
	for (int i = 0; i < 64; ++i)
		acc[i] = 0.f;
	for (int k = 0; k < nk; ++k) {
		const int s = k % S;
		mbar_wait(bars + 8 * s, (k / S) & 1);
		const unsigned as = base + s * STAGE + cw * 8192, bs = base + s * STAGE + TILE_A;
		wg_fence();
#pragma unroll
		for (int kk = 0; kk < BK / 16; ++kk)
			mma128<1>(acc, desc<true>(as + 32 * kk), desc<false>(bs + 2048 * kk));
		wg_commit();
		wg_wait<1>();
		pin(acc);
		if (k > 0)
			mbar_arrive(bars + 8 * (S + (k - 1) % S));
	}
	wg_wait<0>();
	pin(acc);
	const int lane = tid & 31, warp = (tid >> 5) & 3, g = lane >> 2, q = lane & 3;
	__nv_bfloat16 *o = out + (long long)bh * T * L;
	const __nv_bfloat16 *mk = mask + (long long)bh * T * L;
#pragma unroll
	for (int hr = 0; hr < 2; ++hr) {
		const int m = m0 + cw * 64 + warp * 16 + g + 8 * hr;
		if (m >= T)
			continue;
#pragma unroll
		for (int j = 0; j < BN / 8; ++j) {
			const int n = n0 + 8 * j + 2 * q;
			const long long e = (long long)m * L + n;
			float v0 = acc[4 * j + 2 * hr], v1 = acc[4 * j + 2 * hr + 1];
			if (MASK) {
				const float2 cs = *(const float2 *)(rope + (long long)m * L + n);
				const float r0 = __fadd_rn(__fmul_rn(v0, cs.x), __fmul_rn(v1, cs.y));
				const float r1 = __fsub_rn(__fmul_rn(v1, cs.x), __fmul_rn(v0, cs.y));
				const __nv_bfloat162 d = *(const __nv_bfloat162 *)(o + e), x = *(const __nv_bfloat162 *)(mk + e);
				v0 = __bfloat162float(x.x) > 0.f ? __fadd_rn(__bfloat162float(d.x), r0) : 0.f;
				v1 = __bfloat162float(x.y) > 0.f ? __fadd_rn(__bfloat162float(d.y), r1) : 0.f;
			}
			*(unsigned *)(o + e) = pack_bf16(v0, v1);
		}
	}
}

// ---------------------------------------------------------------- host
static void make_map(CUtensorMap *m, const void *p, unsigned long long d0, unsigned long long d1, unsigned long long d2,
		     unsigned b0, unsigned b1)
{
	cuuint64_t dims[3] = { d0, d1, d2 };
	cuuint64_t strides[2] = { d0 * 2, d0 * d1 * 2 };
	cuuint32_t box[3] = { b0, b1, 1 }, es[3] = { 1, 1, 1 };
	CU(cuTensorMapEncodeTiled(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)p, dims, strides, box, es,
				  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
				  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
}

__global__ void fill(__nv_bfloat16 *p, long long n, unsigned seed, float scale, bool relu)
{
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
		unsigned h = (unsigned)i * 2654435761u ^ seed;
		h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
		float v = ((h & 0xffffff) / 16777216.0f - 0.5f) * scale;
		p[i] = __float2bfloat16(relu && v < 0 ? 0.f : v);
	}
}

template <typename F>
static float time_ms(F f, int reps)
{
	cudaEvent_t a, b;
	CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
	for (int i = 0; i < 3; ++i) f();
	CK(cudaDeviceSynchronize());
	std::vector<float> ts;
	for (int i = 0; i < reps; ++i) {
		CK(cudaEventRecord(a)); f(); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
		float ms; CK(cudaEventElapsedTime(&ms, a, b)); ts.push_back(ms);
	}
	std::sort(ts.begin(), ts.end());
	return ts[ts.size() / 2];
}

static std::vector<float> to_host(const __nv_bfloat16 *d, size_t n)
{
	std::vector<__nv_bfloat16> h(n);
	CK(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
	std::vector<float> f(n);
	for (size_t i = 0; i < n; ++i) f[i] = __bfloat162float(h[i]);
	return f;
}

int main(int argc, char **argv)
{
	int B = argc > 1 ? atoi(argv[1]) : 8, T = argc > 2 ? atoi(argv[2]) : 512;
	const int H = 4, L = 8192, BH = B * H;
	constexpr int S1 = 6, S2 = 4;
	printf("B %d T %d H %d L %d\n", B, T, H, L);
	size_t nqr = (size_t)BH * T * L, ns = (size_t)BH * T * T;
	__nv_bfloat16 *qr, *s, *sref, *c, *gx, *gref, *mask, *dxs;
	float *rope, *sf;
	CK(cudaMalloc(&qr, nqr * 2)); CK(cudaMalloc(&s, ns * 2)); CK(cudaMalloc(&sref, ns * 2)); CK(cudaMalloc(&c, ns * 2));
	CK(cudaMalloc(&gx, nqr * 2)); CK(cudaMalloc(&gref, nqr * 2)); CK(cudaMalloc(&mask, nqr * 2)); CK(cudaMalloc(&dxs, nqr * 2));
	CK(cudaMalloc(&rope, (size_t)T * L * 4)); CK(cudaMalloc(&sf, ns * 4));
	fill<<<1024, 256>>>(qr, nqr, 1, 1.f, false);
	fill<<<1024, 256>>>(c, ns, 2, 1.f, false);
	fill<<<1024, 256>>>(mask, nqr, 3, 1.f, true);
	fill<<<1024, 256>>>(dxs, nqr, 4, 1.f, false);
	{
		std::vector<float> r((size_t)T * L);
		for (int t = 0; t < T; ++t)
			for (int p = 0; p < L / 2; ++p) {
				double f = 1.0 / pow(65536.0, 2.0 * p / L) / (2 * M_PI), ph = fmod(t * f, 1.0) * 2 * M_PI;
				r[(size_t)t * L + 2 * p] = (float)cos(ph);
				r[(size_t)t * L + 2 * p + 1] = (float)sin(ph);
			}
		CK(cudaMemcpy(rope, r.data(), r.size() * 4, cudaMemcpyHostToDevice));
	}
	CUtensorMap qr_k, qr_mn, c_k;
	make_map(&qr_k, qr, L, T, BH, 64, BM);		// K-major rows of t, 64 of K a box
	make_map(&qr_mn, qr, L, T, BH, 64, 64);		// MN-major: 64 of n x 64 rows of t
	make_map(&c_k, c, T, T, BH, 64, BM);
	cublasHandle_t hb;
	cublasCreate(&hb);
	float one = 1.f, zero = 0.f;
	// ---- scores
	const int nt = (T + BM - 1) / BM;
	CK(cudaFuncSetAttribute(scores_ws<S1>, cudaFuncAttributeMaxDynamicSharedMemorySize, Ring<S1>::BYTES));
	auto run_scores = [&] { scores_ws<S1><<<dim3(nt * nt, BH), NT, Ring<S1>::BYTES>>>(qr_k, s, T, L); };
	run_scores();
	CK(cudaGetLastError());
	CK(cudaDeviceSynchronize());
	// reference: cuBLAS S = QR QR^T in f32 (column-major trick: C^T = ...)
	auto cublas_scores = [&] {
		cublasGemmStridedBatchedEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, T, T, L, &one, qr, CUDA_R_16BF, L, (long long)T * L, qr,
					   CUDA_R_16BF, L, (long long)T * L, &zero, sref, CUDA_R_16BF, T, (long long)T * T, BH,
					   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	};
	cublasGemmStridedBatchedEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, T, T, L, &one, qr, CUDA_R_16BF, L, (long long)T * L, qr,
				   CUDA_R_16BF, L, (long long)T * L, &zero, sf, CUDA_R_32F, T, (long long)T * T, BH,
				   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	CK(cudaDeviceSynchronize());
	{
		std::vector<float> got = to_host(s, ns), ref(ns);
		CK(cudaMemcpy(ref.data(), sf, ns * 4, cudaMemcpyDeviceToHost));
		double num = 0, den = 0; long bad = 0;
		for (int b = 0; b < BH; ++b)
			for (int i = 0; i < T; ++i)
				for (int j = 0; j < T; ++j) {
					size_t e = ((size_t)b * T + i) * T + j;
					double r = j < i ? ref[e] : 0.0, d = got[e] - r;
					num += d * d; den += r * r;
					if (j >= i && got[e] != 0.f) bad++;
				}
		printf("scores: rel err %.3e, nonzero above diag %ld\n", sqrt(num / den), bad);
	}
	float ms_s = time_ms(run_scores, 20), ms_sb = time_ms(cublas_scores, 20);
	double fl = 2.0 * BH * T * T * (double)L;
	printf("scores: ws %.3f ms (%.0f TF/s causal-equiv full %.0f), cublas full %.3f ms (%.0f TF/s)\n", ms_s,
	       fl / 2 / ms_s / 1e9, fl / ms_s / 1e9, ms_sb, fl / ms_sb / 1e9);
	// ---- grad_xs (store)
	CK(cudaFuncSetAttribute(grad_xs_ws<S2, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, Ring<S2>::BYTES));
	CK(cudaFuncSetAttribute(grad_xs_ws<S2, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, Ring<S2>::BYTES));
	dim3 gg(L / BN, (T + BM - 1) / BM, BH);
	auto run_gx = [&] { grad_xs_ws<S2, false><<<gg, NT, Ring<S2>::BYTES>>>(c_k, qr_mn, gx, mask, rope, T, L); };
	run_gx();
	CK(cudaGetLastError());
	CK(cudaDeviceSynchronize());
	auto cublas_gx = [&] {	// G (T x L, row-major) = C (T x T) QR (T x L): col-major G^T = QR^T C^T
		cublasGemmStridedBatchedEx(hb, CUBLAS_OP_N, CUBLAS_OP_N, L, T, T, &one, qr, CUDA_R_16BF, L, (long long)T * L, c,
					   CUDA_R_16BF, T, (long long)T * T, &zero, gref, CUDA_R_16BF, L, (long long)T * L, BH,
					   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	};
	cublas_gx();
	CK(cudaDeviceSynchronize());
	{
		std::vector<float> got = to_host(gx, nqr), ref = to_host(gref, nqr);
		double num = 0, den = 0;
		for (size_t e = 0; e < nqr; ++e) { double d = got[e] - ref[e]; num += d * d; den += (double)ref[e] * ref[e]; }
		printf("grad_xs store: rel err vs cublas %.3e\n", sqrt(num / den));
	}
	float ms_g = time_ms(run_gx, 20), ms_gb = time_ms(cublas_gx, 20);
	double flg = 2.0 * BH * T * (double)T * L;
	printf("grad_xs store: ws %.3f ms (%.0f TF/s), cublas %.3f ms (%.0f TF/s)\n", ms_g, flg / ms_g / 1e9, ms_gb, flg / ms_gb / 1e9);
	// ---- grad_xs (mask epilogue, in place on a copy of dxs)
	CK(cudaMemcpy(gx, dxs, nqr * 2, cudaMemcpyDeviceToDevice));
	grad_xs_ws<S2, true><<<gg, NT, Ring<S2>::BYTES>>>(c_k, qr_mn, gx, mask, rope, T, L);
	CK(cudaGetLastError());
	CK(cudaDeviceSynchronize());
	{
		std::vector<float> got = to_host(gx, nqr), g = to_host(gref, nqr), d0 = to_host(dxs, nqr), mk = to_host(mask, nqr);
		std::vector<float> r((size_t)T * L);
		CK(cudaMemcpy(r.data(), rope, r.size() * 4, cudaMemcpyDeviceToHost));
		double num = 0, den = 0;
		for (size_t e = 0; e < nqr; e += 2) {
			size_t tl = e % ((size_t)T * L);
			float cs = r[tl], sn = r[tl + 1], v0 = g[e], v1 = g[e + 1];
			float r0 = v0 * cs + v1 * sn, r1 = v1 * cs - v0 * sn;
			float w0 = mk[e] > 0 ? d0[e] + r0 : 0, w1 = mk[e + 1] > 0 ? d0[e + 1] + r1 : 0;
			num += (got[e] - w0) * (double)(got[e] - w0) + (got[e + 1] - w1) * (double)(got[e + 1] - w1);
			den += (double)w0 * w0 + (double)w1 * w1;
		}
		printf("grad_xs mask: rel err %.3e\n", sqrt(num / den));
	}
	auto run_gxm = [&] { grad_xs_ws<S2, true><<<gg, NT, Ring<S2>::BYTES>>>(c_k, qr_mn, gx, mask, rope, T, L); };
	float ms_gm = time_ms(run_gxm, 20);
	printf("grad_xs mask: ws %.3f ms (%.0f TF/s); bytes/elem dxs r+w, mask, qr, rope(L2): HBM floor %.3f ms\n", ms_gm,
	       flg / ms_gm / 1e9, (double)nqr * 8 / 4.25e9);
	printf("SUMMARY scores_ws %.3f cublas_scores %.3f grad_xs_ws %.3f grad_xs_mask %.3f cublas_gx %.3f\n", ms_s, ms_sb,
	       ms_g, ms_gm, ms_gb);
	return 0;
}
