/*
 * attention — BDH's attention forward and backward by context length T,
 * at the 25M model's shape (H 4, latent N 8192, embd D 256, activations
 * bf16), against the floor of the same GEMMs in cuBLASLt in the same run.
 *
 * form "quadratic": the attention ops as the model runs them
 * (runtime/train/gpu_nodes.c, DG__N_ATTN and DG__N_ATTN_BWD): the forward
 * chain (dg_attention_fwd: on sm_90 with bf16, rope=pre and arch sm_90a,
 * RoPE(xs) into the workspace, then scores S = tril(qr·qrᵀ, −1) (B,H,T,T)
 * and out = S·v) and the backward chain (dg_attention_bwd: C = dS + dSᵀ
 * into the workspace, grad_v = Σ_h Sᵀ·grad, grad_xs = RoPEᵀ(C·qr) added
 * into dxs under the ReLU's mask, epi=mask), each prepared once through the
 * model's own prepared-op runner (dg__op_exec) and launched from it.
 * Tensors: xs (B,H,T,N) bf16, v (B,1,T,D) bf16, rope (T,N) f32, scores
 * (B,H,T,T) bf16, out (B,H,T,D) bf16, grad (B,H,T,D) f32, grad_v
 * (B,1,T,D) f32, dxs (B,H,T,N) bf16, inputs from dg_rng (uniform; the
 * values do not change the work). B·T = 4096 up to T = 4096, then B = 1;
 * T 512 to 65536 by default (--times).
 * form "chunked" (DESIGN.md "Long context"; dragon/ops.h "The chunked
 * form"): the same chains with args.chunk = C (--chunk, default the
 * model's rule: runtime/train/gpu_model.c attn_chunk_for, 256, 512 from T
 * 32768): per chunk the quadratic ops on the chunks as one-head
 * sequences, then the states (attention_chunk_state, _out, _dq); scores
 * (B,H,T,C). --form both runs each T both ways.
 *
 * The chunked form's floor: the same GEMMs' cuBLASLt time for its own
 * products — forward the chunks' qr·qrᵀ (B·H·T/C × C×C×N) and S·v
 * (B·H·T/C × C×D×C), a state's qrᵀ·v (B·H × N×D×T) and qr·S (B·H × T×D×N,
 * S in bf16: the kernels read hi + lo, twice the K); backward the chunks'
 * grad·vᵀ (C×C×D) and Sᵀ·grad (C×D×C) and C·qr (C×N×C), two states
 * (qrᵀ·v, qrᵀ·dout), qr·R and grad·Sᵀ + v·Rᵀ (B·H × T×N×2D).
 *
 * The quadratic form's floor: cuBLASLt bf16 batched GEMMs (bf16 in and out, f32 compute;
 * bench/kernels_cublas.c bk_gemm) of the chains' GEMMs as full squares,
 * over the same buffers: forward qr·qrᵀ (B·H × T×T×N) and S·v (B × H·T×D×T,
 * the heads stacked: v is shared), backward grad·vᵀ (B × H·T×T×D, grad in
 * bf16), Sᵀ·grad (B × T×D×H·T: the sum over heads is the reduction) and
 * C·qr (B·H × T×N×T). The floor runs before the chains at each T, so a
 * chain that breaks the context leaves the floor's row.
 *
 * A row: {form, B, T, C (the chunk; 0 for quadratic), fwd_ms, bwd_ms
 * (medians; p10, p90 beside them), tflops_fwd, tflops_bwd (the causal
 * FLOPs, below), floor_ms (floor_fwd_ms + floor_bwd_ms, each GEMM's in
 * "floor"), device_bytes}; a T that does not fit or that the plan
 * refuses gets "error": the library's message, and the bench goes on.
 * Useful (causal) FLOPs, P = T(T−1)/2 pairs a head: forward
 * B·H·P·2(N + D); backward B·H·P·(4D + 4N) (dS and grad_v 2D a pair, C·qr
 * 2N on each of C's 2P nonzeros). The floor's GEMMs compute full squares.
 *
 * Timing: dg_timer (bench/bench.h bk_time_op) — --warmup calls, then
 * --reps calls each between CUDA events on the device's stream (cuBLASLt
 * on it too), the L2 flushed before each, outside the events.
 *
 * --record FILE (with --form both): the choice of form by T as a record
 * of the tuning DB (runtime/tunedb/form.h: the chunked form from the
 * smallest T at which it wins there and at every larger T measured, its
 * chunk by T), which the model takes (runtime/train/gpu_model.c
 * attn_chunk_for) where FILE lies in its DB (in runtime/tunedb/records/
 * it is built into the library).
 *
 * Usage: attention [--form quadratic|chunked|both] [--chunk C] [--times 512,1024,...]
 *                  [--warmup N] [--reps N] [--out FILE] [--record FILE] [--require-gpu]
 * Exit: 0 (rows with "error" included, or skipped: no CUDA device), 1
 * the setup or the JSON failed, 2 usage.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "bench/bench.h"
#include "bench/bench_common.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/ops/ops_int.h"
#include "runtime/tunedb/form.h"

#define TOKENS 4096 /* B·T up to T = TOKENS */
#define MAX_TIMES 16

static const int default_times[] = { 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536 };

/* The buffers of one T, each its own allocation (0: none). */
enum { XS, V, ROPE, SCORES, OUT, GRAD, GRAD_V, DXS, FWS, BWS, N_BUF };

typedef struct att_case {
	bench *b;
	dg_spec spec; /* the chains' (attention_scores, as the model gives it) */
	int64_t B, T;
	int C; /* the chunk; 0: the quadratic form */
	size_t bytes[N_BUF];
	dg_dptr mem[N_BUF];
	dg_tensor xs, v, rope, scores, out, grad, grad_v, dxs;
	dg_attention_fwd_args fa;
	dg_attention_bwd_args ba;
	dg__op_exec fx, bx; /* the chains' ops, prepared once */
} att_case;

/* The model's spec of its attention chains (gpu_nodes.c attn_spec): bf16
 * on sm_90 takes the warpgroup GEMMs, which read RoPE(xs) made by the
 * chain. */
static dg_spec chain_spec(const dg_device_info *info)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_ATTENTION_SCORES);
	s.heads = BDH_H, s.embd = BDH_E, s.latent = BDH_L, s.vocab = 256;
	s.weight = s.act = s.out = s.src = DG_FMT_BF16;
	s.arch = info->sm;
	s.arch_specific = s.rope_pre = s.arch == 90;
	return s;
}

/* c's tensors at the addresses in c->mem (0 while sizing). */
static void set_tensors(att_case *c)
{
	const int64_t B = c->B, T = c->T, H = BDH_H, N = BDH_L, D = BDH_E;
	c->xs = dg_tensor_4d("xs", DG_FMT_BF16, c->mem[XS], B, H, T, N);
	c->v = dg_tensor_4d("v", DG_FMT_BF16, c->mem[V], B, 1, T, D);
	c->rope = dg_tensor_2d("rope", DG_FMT_F32, c->mem[ROPE], T, N);
	c->scores = dg_tensor_4d("scores", DG_FMT_BF16, c->mem[SCORES], B, H, T, c->C ? c->C : T);
	c->out = dg_tensor_4d("out", DG_FMT_BF16, c->mem[OUT], B, H, T, D);
	c->grad = dg_tensor_4d("grad", DG_FMT_F32, c->mem[GRAD], B, H, T, D);
	c->grad_v = dg_tensor_4d("grad_v", DG_FMT_F32, c->mem[GRAD_V], B, 1, T, D);
	c->dxs = dg_tensor_4d("dxs", DG_FMT_BF16, c->mem[DXS], B, H, T, N);
	dg_attention_fwd_args fa = { .xs = &c->xs, .v = &c->v, .rope = &c->rope, .scores = &c->scores,
				     .out = &c->out, .ws = { c->mem[FWS], c->bytes[FWS] }, .chunk = c->C };
	dg_attention_bwd_args ba = { .grad = &c->grad, .xs = &c->xs, .v = &c->v, .rope = &c->rope,
				     .scores = &c->scores, .grad_v = &c->grad_v, .dxs = &c->dxs,
				     .ws = { c->mem[BWS], c->bytes[BWS] }, .chunk = c->C };
	c->fa = fa;
	c->ba = ba;
}

/* Sizes every buffer (the workspaces as the chains ask), allocates them
 * and fills the inputs; false with b->err (the library's message). */
static bool case_alloc(att_case *c)
{
	bench *b = c->b;
	set_tensors(c);
	const dg_tensor *t[] = { [XS] = &c->xs, [V] = &c->v, [ROPE] = &c->rope, [SCORES] = &c->scores,
				 [OUT] = &c->out, [GRAD] = &c->grad, [GRAD_V] = &c->grad_v, [DXS] = &c->dxs };
	for (int i = 0; i < FWS; i++)
		c->bytes[i] = dg_tensor_bytes(t[i]);
	if (!bk_dg_ok(b, dg_attention_fwd_workspace(&c->spec, &c->fa, &c->bytes[FWS]),
		      "dg_attention_fwd_workspace") ||
	    !bk_dg_ok(b, dg_attention_bwd_workspace(&c->spec, &c->ba, &c->bytes[BWS]),
		      "dg_attention_bwd_workspace"))
		return false;
	for (int i = 0; i < N_BUF; i++)
		if (c->bytes[i] && !bk_dg_ok(b, dg_malloc(b->dev, c->bytes[i], &c->mem[i]), "dg_malloc"))
			return false;
	set_tensors(c);
	/* out is the floor's bf16 gradient until the forward writes it */
	static const int inputs[] = { XS, V, ROPE, OUT, GRAD, DXS };
	for (size_t i = 0; i < sizeof(inputs) / sizeof(inputs[0]); i++) {
		int k = inputs[i];
		if (!bk_fill_random(b, c->mem[k], c->bytes[k], k == ROPE || k == GRAD ? DG_FMT_F32 : DG_FMT_BF16))
			return false;
	}
	return true;
}

static void case_free(att_case *c)
{
	dg__exec_free(&c->fx);
	dg__exec_free(&c->bx);
	for (int i = 0; i < N_BUF; i++)
		if (c->mem[i])
			dg_free(c->b->dev, c->mem[i]);
}

static bool run_fwd(bench *b, void *arg)
{
	att_case *c = arg;
	dg__exec_begin(&c->fx, false);
	return bk_dg_ok(b, dg__attention_fwd_exec(&c->fx, &c->spec, &c->fa), "dg_attention_fwd");
}

static bool run_bwd(bench *b, void *arg)
{
	att_case *c = arg;
	dg__exec_begin(&c->bx, false);
	return bk_dg_ok(b, dg__attention_bwd_exec(&c->bx, &c->spec, &c->ba), "dg_attention_bwd");
}

/* The chains' ops prepared once (the kernels compiled or loaded here). */
static bool case_prepare(att_case *c)
{
	c->fx = dg__exec_eager(c->b->dev);
	c->bx = dg__exec_eager(c->b->dev);
	dg__exec_begin(&c->fx, true);
	if (!bk_dg_ok(c->b, dg__attention_fwd_exec(&c->fx, &c->spec, &c->fa), "preparing dg_attention_fwd"))
		return false;
	dg__exec_begin(&c->bx, true);
	return bk_dg_ok(c->b, dg__attention_bwd_exec(&c->bx, &c->spec, &c->ba), "preparing dg_attention_bwd");
}

/* ---- the floor ----------------------------------------------------------------- */

enum { F_QRQR, F_SV, F_GV, F_SG, F_CQR, N_FLOOR };
static const char *const floor_name[N_FLOOR] = { "qr_qrT_ms", "s_v_ms", "grad_vT_ms", "sT_grad_ms", "c_qr_ms" };

/* The chains' GEMMs as full squares, over c's buffers (bench.h bk_gemm:
 * row-major, A (M,K) or ta (K,M), B (K,N) or tb (N,K)). */
static void floor_gemms(const att_case *c, bk_gemm g[N_FLOOR])
{
	const int64_t B = c->B, T = c->T, H = BDH_H, N = BDH_L, D = BDH_E;
	const dg_dptr *m = c->mem;
	memset(g, 0, sizeof(bk_gemm) * N_FLOOR);
	/* S = qr·qrᵀ: (T,N)·(T,N)ᵀ a head */
	g[F_QRQR] = (bk_gemm){ .batch = B * H, .m = T, .n = T, .k = N, .tb = true,
			       .a = m[XS], .b = m[XS], .c = m[SCORES] };
	/* out = S·v: the heads stacked, (H·T,T)·(T,D) a row */
	g[F_SV] = (bk_gemm){ .batch = B, .m = H * T, .n = D, .k = T, .a = m[SCORES], .b = m[V], .c = m[OUT] };
	/* dS = grad·vᵀ: (H·T,D)·(T,D)ᵀ a row, into C's place */
	g[F_GV] = (bk_gemm){ .batch = B, .m = H * T, .n = T, .k = D, .tb = true,
			     .a = m[OUT], .b = m[V], .c = m[BWS] };
	/* grad_v = Σ_h S_hᵀ·grad_h: (H·T,T)ᵀ·(H·T,D) a row, bf16 into grad_v */
	g[F_SG] = (bk_gemm){ .batch = B, .m = T, .n = D, .k = H * T, .ta = true,
			     .a = m[SCORES], .b = m[OUT], .c = m[GRAD_V] };
	/* C·qr: (T,T)·(T,N) a head, into dxs */
	g[F_CQR] = (bk_gemm){ .batch = B * H, .m = T, .n = N, .k = T, .a = m[BWS], .b = m[XS], .c = m[DXS] };
}

/* The chunked form's GEMMs (the file's comment), over c's buffers: the
 * chunks' products over xs, scores, out and dxs; the states' over the
 * backward's workspace (B·H·2N·T/C·D bf16, more than a state a head). */
enum { FC_QRQR, FC_SV, FC_STATE, FC_QS, FC_GV, FC_SG, FC_CQR, FC_DQ, N_FLOOR_C };
static const char *const floor_c_name[N_FLOOR_C] = { "chunk_qr_qrT_ms", "chunk_s_v_ms", "state_ms", "qr_s_ms",
						     "chunk_grad_vT_ms", "chunk_sT_grad_ms", "chunk_c_qr_ms",
						     "grad_sT_ms" };

static void floor_gemms_chunked(const att_case *c, bk_gemm g[N_FLOOR_C])
{
	const int64_t B = c->B, T = c->T, H = BDH_H, N = BDH_L, D = BDH_E, C = c->C, nc = B * H * (T / C);
	const dg_dptr *m = c->mem;
	memset(g, 0, sizeof(bk_gemm) * N_FLOOR_C);
	g[FC_QRQR] = (bk_gemm){ .batch = nc, .m = C, .n = C, .k = N, .tb = true, .a = m[XS], .b = m[XS], .c = m[SCORES] };
	g[FC_SV] = (bk_gemm){ .batch = nc, .m = C, .n = D, .k = C, .a = m[SCORES], .b = m[OUT], .c = m[BWS] };
	/* a state: qrᵀ·v (N,T)·(T,D) a head */
	g[FC_STATE] = (bk_gemm){ .batch = B * H, .m = N, .n = D, .k = T, .ta = true, .a = m[XS], .b = m[OUT],
				 .c = m[BWS] };
	/* qr·S: (T,N)·(N,D) a head */
	g[FC_QS] = (bk_gemm){ .batch = B * H, .m = T, .n = D, .k = N, .a = m[XS], .b = m[BWS], .c = m[OUT] };
	g[FC_GV] = (bk_gemm){ .batch = nc, .m = C, .n = C, .k = D, .tb = true, .a = m[OUT], .b = m[OUT],
			      .c = m[SCORES] };
	g[FC_SG] = (bk_gemm){ .batch = nc, .m = C, .n = D, .k = C, .ta = true, .a = m[SCORES], .b = m[OUT],
			      .c = m[BWS] };
	g[FC_CQR] = (bk_gemm){ .batch = nc, .m = C, .n = N, .k = C, .a = m[SCORES], .b = m[XS], .c = m[DXS] };
	/* grad·Sᵀ (and v·Rᵀ, the same again): (T,D)·(N,D)ᵀ a head */
	g[FC_DQ] = (bk_gemm){ .batch = B * H, .m = T, .n = N, .k = D, .tb = true, .a = m[OUT], .b = m[BWS],
			      .c = m[DXS] };
}

/* Times the floor's GEMMs into ms; false with b->err at the first that
 * fails. */
static bool floor_run(att_case *c, double ms[N_FLOOR_C])
{
	bk_gemm g[N_FLOOR_C];
	const int n = c->C ? N_FLOOR_C : N_FLOOR;
	if (c->C)
		floor_gemms_chunked(c, g);
	else
		floor_gemms(c, g);
	for (int i = 0; i < n; i++) {
		dg_timing s;
		bool ok = bk_gemm_open(c->b, &g[i]) && bk_time_op(c->b, bk_gemm_run, &g[i], false, c->b->reps, &s);
		bk_gemm_close(&g[i]);
		if (!ok)
			return false;
		ms[i] = s.median_us * 1e-3;
	}
	return true;
}

/* ---- a row ------------------------------------------------------------------------ */

static void add_timing(cJSON *row, const char *what, const dg_timing *s)
{
	char key[32];
	snprintf(key, sizeof(key), "%s_ms", what);
	cJSON_AddNumberToObject(row, key, s->median_us * 1e-3);
	snprintf(key, sizeof(key), "%s_p10_ms", what);
	cJSON_AddNumberToObject(row, key, s->p10_us * 1e-3);
	snprintf(key, sizeof(key), "%s_p90_ms", what);
	cJSON_AddNumberToObject(row, key, s->p90_us * 1e-3);
}

/* The model's chunk at T (runtime/train/gpu_model.c attn_chunk_for's
 * rule): 256, 512 from T 32768, the largest that divides T. */
static int model_chunk(int T)
{
	for (int c = T >= 32768 ? 512 : 256; c >= 64; c /= 2)
		if (T % c == 0)
			return c;
	return 64;
}

/* One T of a form (C 0: quadratic): its row (the caller owns it). */
static cJSON *run_form(bench *b, const dg_spec *spec, int T, int C)
{
	att_case c;
	memset(&c, 0, sizeof(c));
	c.b = b;
	c.spec = *spec;
	c.T = T;
	c.C = C;
	c.B = T < TOKENS ? TOKENS / T : 1;
	const double H = BDH_H, N = BDH_L, D = BDH_E;
	/* causal pairs: the whole T's, or the chunks' own, then the states' terms */
	const double pairs = C ? (double)c.B * H * (double)(T / C) * (double)C * (C - 1) / 2
			       : (double)c.B * H * (double)T * (T - 1) / 2;
	const double bhtnd = (double)c.B * H * (double)T * N * D;
	const double flops_fwd = pairs * 2 * (N + D) + (C ? 4 * bhtnd : 0);
	const double flops_bwd = pairs * (4 * D + 4 * N) + (C ? 10 * bhtnd : 0);
	cJSON *row = cJSON_CreateObject();
	cJSON_AddStringToObject(row, "form", C ? "chunked" : "quadratic");
	cJSON_AddNumberToObject(row, "B", (double)c.B);
	cJSON_AddNumberToObject(row, "T", T);
	cJSON_AddNumberToObject(row, "C", C);
	fprintf(stderr, "attention: %s B %lld T %d C %d ...\n", C ? "chunked" : "quadratic", (long long)c.B, T, C);
	if (!case_alloc(&c)) {
		cJSON_AddStringToObject(row, "error", b->err);
		goto out;
	}
	size_t total = 0;
	for (int i = 0; i < N_BUF; i++)
		total += c.bytes[i];
	cJSON_AddNumberToObject(row, "device_bytes", (double)total);
	double fl[N_FLOOR_C];
	bool floor_ok = floor_run(&c, fl);
	if (floor_ok && C) {
		cJSON *fj = cJSON_AddObjectToObject(row, "floor");
		for (int i = 0; i < N_FLOOR_C; i++)
			cJSON_AddNumberToObject(fj, floor_c_name[i], fl[i]);
		const double ff = fl[FC_QRQR] + fl[FC_SV] + fl[FC_STATE] + fl[FC_QS];
		const double fb = fl[FC_GV] + fl[FC_SG] + 2 * fl[FC_STATE] + fl[FC_QS] + fl[FC_CQR] + 2 * fl[FC_DQ];
		cJSON_AddNumberToObject(row, "floor_fwd_ms", ff);
		cJSON_AddNumberToObject(row, "floor_bwd_ms", fb);
		cJSON_AddNumberToObject(row, "floor_ms", ff + fb);
	} else if (floor_ok) {
		cJSON *fj = cJSON_AddObjectToObject(row, "floor");
		for (int i = 0; i < N_FLOOR; i++)
			cJSON_AddNumberToObject(fj, floor_name[i], fl[i]);
		cJSON_AddNumberToObject(row, "floor_fwd_ms", fl[F_QRQR] + fl[F_SV]);
		cJSON_AddNumberToObject(row, "floor_bwd_ms", fl[F_GV] + fl[F_SG] + fl[F_CQR]);
		cJSON_AddNumberToObject(row, "floor_ms", fl[F_QRQR] + fl[F_SV] + fl[F_GV] + fl[F_SG] + fl[F_CQR]);
	} else {
		cJSON_AddStringToObject(row, "floor_error", b->err);
	}
	dg_timing f, bw;
	if (!case_prepare(&c) || !bk_time_op(b, run_fwd, &c, false, b->reps, &f) ||
	    !bk_time_op(b, run_bwd, &c, false, b->reps, &bw)) {
		cJSON_AddStringToObject(row, "error", b->err);
		goto out;
	}
	add_timing(row, "fwd", &f);
	add_timing(row, "bwd", &bw);
	cJSON_AddNumberToObject(row, "flops_fwd", flops_fwd);
	cJSON_AddNumberToObject(row, "flops_bwd", flops_bwd);
	cJSON_AddNumberToObject(row, "tflops_fwd", flops_fwd / (f.median_us * 1e-6) * 1e-12);
	cJSON_AddNumberToObject(row, "tflops_bwd", flops_bwd / (bw.median_us * 1e-6) * 1e-12);
out:
	case_free(&c);
	return row;
}

static double num(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* A row on stdout: times in ms, "-" where there is none. */
static void print_row(const cJSON *row)
{
	static const char *const keys[] = { "fwd_ms", "bwd_ms", "tflops_fwd", "tflops_bwd", "floor_fwd_ms",
					    "floor_bwd_ms" };
	const cJSON *form = cJSON_GetObjectItemCaseSensitive(row, "form");
	printf("%-10s %5.0f %6.0f %5.0f", cJSON_IsString(form) ? form->valuestring : "?", num(row, "B"), num(row, "T"),
	       num(row, "C"));
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		double v = num(row, keys[i]);
		if (v < 0)
			printf(" %10s", "-");
		else
			printf(" %10.3f", v);
	}
	const cJSON *e = cJSON_GetObjectItemCaseSensitive(row, "error"),
		    *fe = cJSON_GetObjectItemCaseSensitive(row, "floor_error");
	if (cJSON_IsString(e))
		printf("  error: %s", e->valuestring);
	if (cJSON_IsString(fe))
		printf("  floor: %s", fe->valuestring);
	putchar('\n');
	fflush(stdout);
}

static int usage(FILE *f, int code)
{
	fprintf(f, "usage: attention [--form quadratic|chunked|both] [--chunk C] [--times 512,1024,...]\n"
		   "                 [--warmup N] [--reps N] [--out FILE] [--record FILE] [--require-gpu]\n"
		   "BDH attention forward and backward by T at the 25M shape (H 4, N 8192, D 256, bf16),\n"
		   "against cuBLASLt bf16 GEMMs of the same products; JSON to --out. --record (with --form\n"
		   "both): the measured choice of form by T as a tuning record (runtime/tunedb/form.h), the\n"
		   "model's from then on where FILE is in its tuning DB (DRAGON_TUNE_DB, <cache>/tune).\n");
	return code;
}

static void add_notes(cJSON *doc)
{
	static const char *const notes[] = {
		"quadratic: the model's attention chains (dg_attention_fwd; dg_attention_bwd with dxs, grad_xs's "
		"epi=mask), prepared once and launched as the model launches them; on sm_90 rope=pre, arch sm_90a "
		"(the warpgroup GEMMs), RoPE(xs) written by the chain and included in its time",
		"chunked: the same chains with args.chunk = C (the model's rule unless --chunk: 256, 512 from T 32768): "
		"the quadratic ops on the chunks as one-head sequences, then the states (attention_chunk_state, "
		"_out, _dq); its FLOPs add the states' terms (forward 4*B*H*T*N*D, backward 10*B*H*T*N*D) to the "
		"chunks' causal pairs, and its floor is the cuBLASLt time of its own products (chunk_* a chunk, "
		"state_ms a state's q^T*v, qr_s_ms q*S with S in bf16, grad_sT_ms grad*S^T; the backward counts two "
		"states and two grad_sT)",
		"B*T = 4096 up to T = 4096, then B = 1; C (the chunk) is 0 for quadratic",
		"useful (causal) FLOPs, P = T(T-1)/2 pairs a head: forward B*H*P*2*(N + D); backward "
		"B*H*P*(4*D + 4*N) (dS and grad_v 2D a pair, C*qr 2N on each of the 2P nonzeros of C = dS + dS^T); "
		"tflops_* = these / the median time",
		"floor: cuBLASLt bf16 batched GEMMs (bf16 in and out, f32 compute, heuristic's first algo) of the "
		"same products as FULL SQUARES (not causal, so twice the useful work of all but C*qr), same buffers "
		"and run: forward qr*qr^T (B*H x T*T*N) + S*v (B x H*T*D*T), backward grad*v^T (B x H*T*T*D, grad "
		"in bf16) + S^T*grad (B x T*D*H*T) + C*qr (B*H x T*N*T); no RoPE, no mask; floor_ms = forward + "
		"backward",
		"inputs: dg_rng uniform values (the work does not depend on them)",
		"error: the library's message where a T does not fit in memory or the plan refuses it",
	};
	cJSON *n = cJSON_AddArrayToObject(doc, "notes");
	for (size_t i = 0; i < sizeof(notes) / sizeof(notes[0]); i++)
		cJSON_AddItemToArray(n, cJSON_CreateString(notes[i]));
}

/* attention's own options */
typedef struct attention_opts {
	const char *out_path, *form, *record;
	int chunk; /* 0: the model's rule */
	int times[MAX_TIMES], ntimes;
} attention_opts;

static int attention_option(void *user, const char *a, const char *v)
{
	attention_opts *o = user;
	if (!v)
		return 0;
	if (!strcmp(a, "--out"))
		o->out_path = v;
	else if (!strcmp(a, "--record"))
		o->record = v;
	else if (!strcmp(a, "--form"))
		o->form = v;
	else if (!strcmp(a, "--chunk"))
		return bc_parse_ints(v, &o->chunk, 1, 64, 4096) == 1 && o->chunk % 64 == 0 ? 2 : 0;
	else if (!strcmp(a, "--times"))
		return (o->ntimes = bc_parse_ints(v, o->times, MAX_TIMES, 2, 1L << 20)) > 0 ? 2 : 0;
	else
		return 0;
	return 2;
}

int main(int argc, char **argv)
{
	attention_opts o = { .form = "quadratic",
			     .ntimes = (int)(sizeof(default_times) / sizeof(default_times[0])) };
	memcpy(o.times, default_times, sizeof(default_times));
	bench b = { .reps = 10, .warmup = 2 };
	int rc = 0;
	if (!bk_args(&b, argc, argv, attention_option, &o, usage, &rc))
		return rc;
	const char *form = o.form, *out_path = o.out_path;
	const bool quad = !strcmp(form, "quadratic") || !strcmp(form, "both");
	const bool chunked = !strcmp(form, "chunked") || !strcmp(form, "both");
	if (!quad && !chunked) {
		fprintf(stderr, "attention: --form %s: expected quadratic, chunked or both\n", form);
		return 2;
	}
	if (o.record && !(quad && chunked)) {
		fprintf(stderr, "attention: --record needs --form both (the choice is between the two)\n");
		return 2;
	}
	if (!bk_open(&b, "attention", &rc))
		return rc;
	if (!bk_init(&b)) {
		fprintf(stderr, "attention: setup: %s\n", b.err);
		bk_fini(&b);
		return 1;
	}
	dg_spec spec = chain_spec(&b.info);
	char spec_text[512];
	if (dg_spec_to_string(&spec, spec_text, sizeof(spec_text)))
		snprintf(spec_text, sizeof(spec_text), "?");
	cJSON *doc = bc_doc("attention", &b.info);
	cJSON_AddStringToObject(doc, "nvrtc_version", dg_nvrtc_version());
	cJSON_AddNumberToObject(doc, "cublaslt_version", (double)cublasLtGetVersion());
	cJSON_AddNumberToObject(doc, "heads", BDH_H);
	cJSON_AddNumberToObject(doc, "latent", BDH_L);
	cJSON_AddNumberToObject(doc, "embd", BDH_E);
	cJSON_AddStringToObject(doc, "act", "bf16");
	cJSON_AddStringToObject(doc, "spec", spec_text);
	cJSON *tj = cJSON_AddObjectToObject(doc, "timing");
	cJSON_AddNumberToObject(tj, "reps", b.reps);
	cJSON_AddNumberToObject(tj, "warmup", b.warmup);
	cJSON_AddStringToObject(tj, "method", "dg_timer: CUDA events around each call on the device's stream "
					      "(cuBLASLt on it too); L2 flushed by a write before each rep, "
					      "outside the events; medians");
	add_notes(doc);
	cJSON *rows = cJSON_AddArrayToObject(doc, "rows");

	printf("attention on %s (sm_%d), %s, %d reps; times in ms, TFLOP/s on the causal FLOPs\n", b.info.name,
	       b.info.sm, spec_text, b.reps);
	printf("%-10s %5s %6s %5s %10s %10s %10s %10s %10s %10s\n", "form", "B", "T", "C", "fwd", "bwd", "TF/s fwd",
	       "TF/s bwd", "floor fwd", "floor bwd");
	int failed = 0, n_rows = 0;
	dg__attn_form_row rec[MAX_TIMES];
	memset(rec, 0, sizeof(rec));
	for (int i = 0; i < o.ntimes; i++)
		for (int f = 0; f < 2; f++) {
			if ((f == 0 && !quad) || (f == 1 && !chunked))
				continue;
			const int C = f == 0 ? 0 : o.chunk ? o.chunk : model_chunk(o.times[i]);
			cJSON *row = run_form(&b, &spec, o.times[i], C);
			failed += cJSON_GetObjectItemCaseSensitive(row, "error") != NULL;
			n_rows++;
			print_row(row);
			/* forward + backward of the form, for the record (0: not run) */
			const cJSON *fw = cJSON_GetObjectItemCaseSensitive(row, "fwd_ms"),
				    *bw = cJSON_GetObjectItemCaseSensitive(row, "bwd_ms"),
				    *bb = cJSON_GetObjectItemCaseSensitive(row, "B");
			const double ms = cJSON_IsNumber(fw) && cJSON_IsNumber(bw) ? fw->valuedouble + bw->valuedouble : 0;
			rec[i].t = o.times[i];
			rec[i].b = cJSON_IsNumber(bb) ? bb->valueint : 0;
			if (f == 0)
				rec[i].quadratic_ms = ms;
			else {
				rec[i].chunk = C;
				rec[i].chunked_ms = ms;
			}
			cJSON_AddItemToArray(rows, row);
		}
	if (failed)
		fprintf(stderr, "attention: %d of %d rows with an error (in their rows)\n", failed, n_rows);
	if (o.record) { /* published whole: the tuning DB may read it meanwhile */
		char *text = dg__attn_form_make(b.info.name, b.info.sm, BDH_H, BDH_L, BDH_E, DG_FMT_BF16,
						cJSON_GetObjectItemCaseSensitive(doc, "date")->valuestring, rec, o.ntimes);
		if (!text)
			fprintf(stderr, "attention: --record %s: out of memory\n", o.record);
		rc = text ? bc_write_text("attention", text, o.record) : 1;
		free(text);
	}
	int wrc = bc_write("attention", doc, out_path, out_path == NULL);
	rc = rc ? rc : wrc;
	cJSON_Delete(doc);
	bk_fini(&b);
	return rc;
}
