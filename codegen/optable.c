/*
 * The op table: a row an op (dragon/spec.h dg_op_info). Validation
 * (codegen/spec.c), the parser's key list (codegen/spec_text.c), the
 * template module that renders an op (codegen/codegen.c), `dragon-gen list`
 * and its help texts, the default build set and the tuner read these rows
 * and nothing else, so adding an op is a name in DG_OP_LIST, a row here,
 * its template, its op wrapper, its CPU reference and its tests.
 *
 * Shapes: B batch, T time, R rows (run-time), H heads, Hin input heads,
 * D embd, N latent, V vocab (the spec's; docs/formats.md, "Dimensions").
 *
 * Gradients of the backward (dragon/spec.h "gradient formats"): src is
 * the format of a gradient an op only reads, out the format of every
 * gradient it writes (one it writes in place over an input is read in that
 * format too); f32 | bf16, f32 by default. Ops whose gradients are f32
 * only list neither. Those fields came after the ops' specs were
 * published, so the canonical text leaves them out at their f32 default
 * (.quiet): the texts, cache keys and tuning records stay what they were.
 */
#include <string.h>

#include "dragon/spec.h"

#define B(f) DG_FMT_BIT(DG_FMT_##f)
/* Every weight format, every activation format, every projection output. */
#define W_ALL (B(F32) | B(BF16) | B(INT8) | B(TERNARY) | B(SIGN1))
#define A_ALL (B(F32) | B(BF16) | B(INT8) | B(INT4) | B(UINT8POS))
#define O_ALL (B(F32) | B(BF16) | B(INT8) | B(UINT8POS))
#define FLOATS (B(F32) | B(BF16))

#define F(x) DG_FIELD_##x
#define DIM(x) DG_DIM_##x
/* An argument of the calls of one epilogue only (dg_op_arg.epi). */
#define EPI(x) (1u << DG_EPI_##x)
/* The fields of the projection and of its gradients. */
#define LOWRANK_SHAPE (F(ARCH) | F(EMBD) | F(HEADS) | F(IN_HEADS) | F(LATENT) | F(TILE))
#define DECODER_SHAPE (F(ARCH) | F(EMBD) | F(HEADS) | F(LATENT) | F(TILE))
/* The low-bit recipes a training step is built for: each weight format
 * with int8 activations. */
#define LOWBIT "weight=int8,ternary,sign1"
/* The gradient formats of a backward op: f32 unless the spec says bf16,
 * and the text names them only when they are not f32. */
#define GRAD_F32 DG_FMT_F32

static const dg_op_info rows[DG_OP__COUNT] = {
	[DG_OP_LOWRANK_FWD] = {
		.family = "lowrank", .module = "lowrank",
		.about = "projection: out (B,H,T,N) = relu(s * x (B,Hin,T,D) . w (H,N,D)^T - thr) (epi=rope: and qr = RoPE(out) by the rope table (T,N))",
		.fields = LOWRANK_SHAPE | F(ACT) | F(EPI) | F(OUT) | F(RELU) | F(WEIGHT) | F(ASCALE) | F(WSCALE),
		.tile = DG_TILE_GEMM,
		.weight_fmts = W_ALL, .act_fmts = A_ALL, .out_fmts = O_ALL,
		.weight_axis = F(EMBD), .pack_fmt = DG_FMT__COUNT,
		.n_args = 5, .args = {
			{ "x", false, DG_ARG_ACT, true, 4, { DIM(B), DIM(HIN), DIM(T), DIM(D) } },
			{ "w", false, DG_ARG_WEIGHT, true, 3, { DIM(H), DIM(N), DIM(D) } },
			{ "out", true, DG_ARG_OUT, true, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			/* epi=rope: the table, and RoPE(out) (rope_fwd's from out) */
			{ "rope", false, DG_ARG_F32, false, 2, { DIM(T), DIM(N) }, .epi = EPI(ROPE) },
			{ "qr", true, DG_ARG_BF16, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) }, .epi = EPI(ROPE) } },
		.check = DG_CHECK_EXACT,
		.build = "in_heads=1,4;" LOWBIT ";act=int8;out=bf16,uint8pos;relu=0",
	},
	[DG_OP_RELU_MASK] = {
		.family = "lowrank", .module = "lowrank",
		.about = "ReLU mask: grad_out (B,H,T,N) = grad * [y > thr], y recomputed from the projection's codes",
		.fields = LOWRANK_SHAPE | F(ACT) | F(RELU) | F(WEIGHT) | F(ASCALE) | F(WSCALE),
		.tile = DG_TILE_GEMM,
		.weight_fmts = W_ALL, .act_fmts = A_ALL,
		.weight_axis = F(EMBD), .pack_fmt = DG_FMT__COUNT, .needs_relu = true,
		.defaults = { .fields = F(RELU), .relu = true, .relu_thr = 0.0f },
		.n_args = 4, .args = {
			{ "x", false, DG_ARG_ACT, true, 4, { DIM(B), DIM(HIN), DIM(T), DIM(D) } },
			{ "w", false, DG_ARG_WEIGHT, true, 3, { DIM(H), DIM(N), DIM(D) } },
			{ "grad", false, DG_ARG_F32, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "grad_out", true, DG_ARG_F32, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } } },
		.check = DG_CHECK_MASK,
		.build = "in_heads=1,4;" LOWBIT ";act=int8;relu=0",
	},
	[DG_OP_LOWRANK_GRAD_INPUT] = {
		.family = "lowrank", .module = "grad",
		.about = "projection input gradient: grad_x (B,Hin,T,D) f32 = sw * grad (B,H,T,N) src . w (H,N,D)",
		.fields = LOWRANK_SHAPE | F(SRC) | F(WEIGHT) | F(WSCALE),
		.tile = DG_TILE_GEMM,
		.weight_fmts = W_ALL, .src_fmts = FLOATS,
		.weight_axis = F(EMBD), .pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(SRC), .src = GRAD_F32 },
		.quiet = F(SRC),
		.n_args = 3, .args = {
			{ "grad", false, DG_ARG_SRC, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "w", false, DG_ARG_WEIGHT, true, 3, { DIM(H), DIM(N), DIM(D) } },
			{ "grad_x", true, DG_ARG_F32, false, 4, { DIM(B), DIM(HIN), DIM(T), DIM(D) } } },
		.check = DG_CHECK_NORM,
		.build = "in_heads=1,4;" LOWBIT ";src=bf16",
	},
	[DG_OP_LOWRANK_GRAD_WEIGHT] = {
		.family = "lowrank", .module = "grad",
		.about = "projection weight gradient: grad_w (H,N,D) f32 (+)= sa * sum_bt grad (B,H,T,N) src x (B,Hin,T,D)",
		.fields = LOWRANK_SHAPE | F(ACT) | F(SRC) | F(ASCALE),
		.tile = DG_TILE_GEMM,
		.act_fmts = A_ALL, .src_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(SRC), .src = GRAD_F32 },
		.quiet = F(SRC),
		.n_args = 3, .args = {
			{ "grad", false, DG_ARG_SRC, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "x", false, DG_ARG_ACT, true, 4, { DIM(B), DIM(HIN), DIM(T), DIM(D) } },
			{ "grad_w", true, DG_ARG_F32, false, 3, { DIM(H), DIM(N), DIM(D) } } },
		.check = DG_CHECK_NORM,
		.build = "in_heads=1,4;act=int8;src=bf16",
	},
	[DG_OP_DECODER_FWD] = {
		.family = "decoder", .module = "decoder",
		.about = "decoder tail: out (B,1,T,D) = s * sum_h y (B,H,T,N) . w (D,H*N)^T, f32|bf16",
		.fields = DECODER_SHAPE | F(ACT) | F(OUT) | F(WEIGHT) | F(ASCALE) | F(WSCALE),
		.tile = DG_TILE_GEMM,
		.weight_fmts = W_ALL, .act_fmts = A_ALL, .out_fmts = FLOATS,
		.weight_axis = F(LATENT), .pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(OUT), .out = DG_FMT_BF16 },
		.n_args = 3, .args = {
			{ "y", false, DG_ARG_ACT, true, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "w", false, DG_ARG_WEIGHT, true, 2, { DIM(D), DIM(HN) } },
			{ "out", true, DG_ARG_OUT, false, 4, { DIM(B), DIM(ONE), DIM(T), DIM(D) } } },
		.check = DG_CHECK_EXACT,
		.build = LOWBIT ";act=uint8pos;out=bf16",
	},
	[DG_OP_DECODER_GRAD_INPUT] = {
		.family = "decoder", .module = "grad",
		.about = "decoder input gradient: grad_y (B,H,T,N) out = sw * grad (B,1,T,D) f32 . w (D,H*N)",
		.fields = DECODER_SHAPE | F(OUT) | F(WEIGHT) | F(WSCALE),
		.tile = DG_TILE_GEMM,
		.weight_fmts = W_ALL, .out_fmts = FLOATS,
		.weight_axis = F(LATENT), .pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(OUT), .out = GRAD_F32 },
		.quiet = F(OUT),
		.n_args = 3, .args = {
			{ "grad", false, DG_ARG_F32, false, 4, { DIM(B), DIM(ONE), DIM(T), DIM(D) } },
			{ "w", false, DG_ARG_WEIGHT, true, 2, { DIM(D), DIM(HN) } },
			{ "grad_y", true, DG_ARG_OUT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } } },
		.check = DG_CHECK_NORM,
		.build = LOWBIT ";out=bf16",
	},
	[DG_OP_DECODER_GRAD_WEIGHT] = {
		.family = "decoder", .module = "grad",
		.about = "decoder weight gradient: grad_w (D,H*N) (+)= sa * sum_bt grad (B,1,T,D) y (B,H,T,N)",
		.fields = DECODER_SHAPE | F(ACT) | F(ASCALE),
		.tile = DG_TILE_GEMM,
		.act_fmts = A_ALL,
		.pack_fmt = DG_FMT__COUNT,
		.n_args = 3, .args = {
			{ "grad", false, DG_ARG_F32, false, 4, { DIM(B), DIM(ONE), DIM(T), DIM(D) } },
			{ "y", false, DG_ARG_ACT, true, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "grad_w", true, DG_ARG_F32, false, 2, { DIM(D), DIM(HN) } } },
		.check = DG_CHECK_NORM,
		.build = "act=uint8pos",
	},
	[DG_OP_QUANTIZE_ACT] = {
		.family = "quantize", .module = "quantize",
		.about = "activation quantize: x (any shape; (B,G,T,C) with ascale=token, a scale a token over its G heads) f32|bf16 -> codes and scale",
		.fields = F(ACT) | F(ARCH) | F(SRC) | F(TILE) | F(ASCALE),
		.tile = DG_TILE_THREADS,
		.act_fmts = B(INT8) | B(INT4) | B(UINT8POS), .src_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.n_args = 2, .args = {
			{ "x", false, DG_ARG_SRC, false, 0, { 0 } },
			{ "codes", true, DG_ARG_ACT, true, 0, { 0 } } },
		.tune = { .r_mul = 1, .r_div = 1, .cols = 32768 }, /* the BDH latent, H·N wide */
		.check = DG_CHECK_SCALED_CODES,
		.build = "src=f32,bf16;act=int8,uint8pos",
	},
	[DG_OP_QUANTIZE_WEIGHT] = {
		.family = "quantize", .module = "qweight",
		.about = "weight quantize: w (any shape) f32|bf16 -> int8 codes (a byte each) and the format's scale",
		.fields = F(ARCH) | F(SRC) | F(TILE) | F(WEIGHT) | F(WSCALE),
		.tile = DG_TILE_THREADS,
		.weight_fmts = B(INT8) | B(TERNARY) | B(SIGN1), .src_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.n_args = 2, .args = {
			{ "w", false, DG_ARG_SRC, false, 0, { 0 } },
			{ "codes", true, DG_ARG_INT8, true, 0, { 0 } } },
		.tune = { .r_mul = 8, .r_div = 1, .cols = 256 }, /* at 4096 rows the BDH weight */
		.check = DG_CHECK_SCALED_CODES,
		.build = "src=f32;" LOWBIT,
	},
	[DG_OP_PACK_TERNARY] = {
		.family = "pack", .module = "qweight",
		.about = "ternary pack: codes (R,D) int8 <-> words (R,D/16), 2 bits a code; and the unpack to i8x4",
		.fields = F(ARCH) | F(EMBD) | F(TILE),
		.tile = DG_TILE_THREADS,
		.pack_fmt = DG_FMT_TERNARY,
		.n_args = 2, .args = {
			{ "codes", false, DG_ARG_INT8, false, 2, { DIM(R), DIM(D) } },
			{ "packed", true, DG_ARG_PACK, false, 2, { DIM(R), DIM(D) } } },
		.tune = { .r_mul = 8, .r_div = 1 },
		.check = DG_CHECK_EXACT,
		.build = "",
	},
	[DG_OP_PACK_SIGN1] = {
		.family = "pack", .module = "qweight",
		.about = "sign1 pack: codes (R,D) int8 <-> words (R,D/32), 1 bit a code; and the unpack to i8x4",
		.fields = F(ARCH) | F(EMBD) | F(TILE),
		.tile = DG_TILE_THREADS,
		.pack_fmt = DG_FMT_SIGN1,
		.n_args = 2, .args = {
			{ "codes", false, DG_ARG_INT8, false, 2, { DIM(R), DIM(D) } },
			{ "packed", true, DG_ARG_PACK, false, 2, { DIM(R), DIM(D) } } },
		.tune = { .r_mul = 8, .r_div = 1 },
		.check = DG_CHECK_EXACT,
		.build = "",
	},
	[DG_OP_PACK_I8X4] = {
		.family = "pack", .module = "pack",
		.about = "i8x4 pack: codes (R,D,N) int8 -> packed (R,N,D/4), four codes of D a word",
		.fields = F(ARCH) | F(EMBD) | F(LATENT) | F(TILE),
		.tile = DG_TILE_THREADS,
		.pack_fmt = DG_FMT__COUNT, .latent_any = true,
		.n_args = 2, .args = {
			{ "codes", false, DG_ARG_INT8, false, 3, { DIM(R), DIM(D), DIM(N) } },
			{ "packed", true, DG_ARG_INT8, false, 3, { DIM(R), DIM(N), DIM(D) } } },
		.tune = { .r_mul = 1, .r_div = 1024, .r_max = 4 }, /* the BDH heads from 4096 rows */
		.check = DG_CHECK_EXACT,
		.build = "",
	},
	[DG_OP_UNPACK_I8X4] = {
		.family = "pack", .module = "pack",
		.about = "i8x4 unpack: packed (R,N,D/4) -> codes (R,D,N) int8",
		.fields = F(ARCH) | F(EMBD) | F(LATENT) | F(TILE),
		.tile = DG_TILE_THREADS,
		.pack_fmt = DG_FMT__COUNT, .latent_any = true,
		.n_args = 2, .args = {
			{ "packed", false, DG_ARG_INT8, false, 3, { DIM(R), DIM(N), DIM(D) } },
			{ "codes", true, DG_ARG_INT8, false, 3, { DIM(R), DIM(D), DIM(N) } } },
		.tune = { .r_mul = 1, .r_div = 1024, .r_max = 4 },
		.check = DG_CHECK_EXACT,
		.build = "",
	},
	/* ---- attention (BDH, quadratic form): N = latent, D = embd; rope (T,N)
	 * f32 holds (cos, sin) of pair p at columns 2p, 2p+1 of row t
	 * (dg_ref_rope_pairs), the same index as the element pair it turns. */
	[DG_OP_ROPE_FWD] = {
		.family = "attention", .module = "rope",
		.about = "RoPE: out (B,H,T,N) = x*cos + rot(x)*sin, pairs (2p,2p+1), from the rope table (T,N)",
		.fields = F(ACT) | F(ARCH) | F(HEADS) | F(LATENT) | F(TILE),
		.tile = DG_TILE_THREADS,
		.act_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(ACT), .act = DG_FMT_BF16 },
		.n_args = 3, .args = {
			{ "x", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "rope", false, DG_ARG_F32, false, 2, { DIM(T), DIM(N) } },
			{ "out", true, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } } },
		.check = DG_CHECK_EXACT,
		.build = "act=f32,bf16",
	},
	[DG_OP_ROPE_BWD] = {
		.family = "attention", .module = "rope",
		.about = "RoPE transpose: grad_x (B,H,T,N) = grad*cos + rot^T(grad*sin), f32",
		.fields = F(ARCH) | F(HEADS) | F(LATENT) | F(TILE),
		.tile = DG_TILE_THREADS,
		.pack_fmt = DG_FMT__COUNT,
		.n_args = 3, .args = {
			{ "grad", false, DG_ARG_F32, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "rope", false, DG_ARG_F32, false, 2, { DIM(T), DIM(N) } },
			{ "grad_x", true, DG_ARG_F32, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } } },
		.check = DG_CHECK_EXACT,
		.build = "",
	},
	[DG_OP_ATTENTION_SCORES] = {
		.family = "attention", .module = "attention",
		.about = "attention scores: S (B,H,T,T) = tril(qr . qr^T, -1), qr = RoPE(xs (B,H,T,N)) on the load (rope=pre: qr = xs)",
		.fields = F(ACT) | F(ARCH) | F(HEADS) | F(LATENT) | F(ROPE) | F(TILE),
		.tile = DG_TILE_GEMM,
		.act_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(ACT), .act = DG_FMT_BF16 },
		.n_args = 3, .args = {
			{ "xs", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "rope", false, DG_ARG_F32, false, 2, { DIM(T), DIM(N) } },
			{ "scores", true, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(T) } } },
		.check = DG_CHECK_NORM,
		.build = "act=f32,bf16",
	},
	[DG_OP_ATTENTION_OUT] = {
		.family = "attention", .module = "attention",
		.about = "attention output: out (B,H,T,D) = tril(S (B,H,T,T), -1) . v (B,1,T,D), v shared by every head",
		.fields = F(ACT) | F(ARCH) | F(EMBD) | F(HEADS) | F(TILE),
		.tile = DG_TILE_GEMM,
		.act_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(ACT), .act = DG_FMT_BF16 },
		.n_args = 3, .args = {
			{ "scores", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(T) } },
			{ "v", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(ONE), DIM(T), DIM(D) } },
			{ "out", true, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(D) } } },
		.check = DG_CHECK_NORM,
		.build = "act=f32,bf16",
	},
	[DG_OP_ATTENTION_GRAD_SCORES] = {
		.family = "attention", .module = "attention",
		.about = "attention score gradient: C (B,H,T,T) = dS + dS^T, dS = tril(grad (B,H,T,D) . v^T, -1)",
		.fields = F(ACT) | F(ARCH) | F(EMBD) | F(HEADS) | F(TILE),
		.tile = DG_TILE_GEMM,
		.act_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(ACT), .act = DG_FMT_BF16 },
		.n_args = 3, .args = {
			{ "grad", false, DG_ARG_F32, false, 4, { DIM(B), DIM(H), DIM(T), DIM(D) } },
			{ "v", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(ONE), DIM(T), DIM(D) } },
			{ "grad_scores", true, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(T) } } },
		.check = DG_CHECK_NORM,
		.build = "act=f32,bf16",
	},
	[DG_OP_ATTENTION_GRAD_V] = {
		.family = "attention", .module = "attention",
		.about = "attention value gradient: grad_v (B,1,T,D) = sum_h tril(S, -1)^T . grad (B,H,T,D), heads in order",
		.fields = F(ACT) | F(ARCH) | F(EMBD) | F(HEADS) | F(TILE),
		.tile = DG_TILE_GEMM,
		.act_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(ACT), .act = DG_FMT_BF16 },
		.n_args = 3, .args = {
			{ "scores", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(T) } },
			{ "grad", false, DG_ARG_F32, false, 4, { DIM(B), DIM(H), DIM(T), DIM(D) } },
			{ "grad_v", true, DG_ARG_F32, false, 4, { DIM(B), DIM(ONE), DIM(T), DIM(D) } } },
		.check = DG_CHECK_NORM,
		.build = "act=f32,bf16",
	},
	[DG_OP_ATTENTION_GRAD_XS] = {
		.family = "attention", .module = "attention",
		.about = "attention input gradient: grad_xs (B,H,T,N) out = RoPE^T(C (B,H,T,T) . RoPE(xs)) (rope=pre: xs is RoPE(xs)); epi=mask: dxs (B,H,T,N) out = (dxs + grad_xs) * [mask_xs > 0] in place, no grad_xs",
		.fields = F(ACT) | F(ARCH) | F(EPI) | F(HEADS) | F(LATENT) | F(OUT) | F(ROPE) | F(TILE),
		.tile = DG_TILE_GEMM,
		.act_fmts = FLOATS, .out_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(ACT) | F(OUT), .act = DG_FMT_BF16, .out = DG_FMT_F32 },
		.quiet = F(OUT),
		/* epi=store writes grad_xs; epi=mask reads and writes dxs (the
		 * gradient of the ReLU's output, in the gradient format) and
		 * reads mask_xs (the ReLU's output itself: with rope=pre, xs is
		 * RoPE(xs), whose sign is not the mask) */
		.n_args = 6, .args = {
			{ "grad_scores", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(T) } },
			{ "xs", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "rope", false, DG_ARG_F32, false, 2, { DIM(T), DIM(N) } },
			{ "grad_xs", true, DG_ARG_OUT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) }, false, EPI(STORE) },
			{ "dxs", true, DG_ARG_OUT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) }, false, EPI(MASK) },
			{ "mask_xs", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) }, false, EPI(MASK) } },
		.check = DG_CHECK_NORM,
		.build = "act=f32,bf16",
		.inout = 1u << 4, /* dxs: read, then overwritten (epi=mask) */
	},
	/* ---- embed, norm, loss: rows R = B·T of width D (run-time R; D, V the
	 * spec's). Float activations f32|bf16; statistics, losses and
	 * gradients f32; every sum in a fixed order (bitwise reproducible). */
	/* ---- decoding from a state: the attention's linear form a token at a
	 * time (dragon/model.h dg_model_state) */
	[DG_OP_ATTENTION_STEP] = {
		.family = "attention", .module = "attention_step",
		.about = "attention step: T tokens a row in order, each out (B,H,T,D) = qr . S, then S (B,H,N,D) f32 += qr^T v (S stored in groups of 8 columns, each group's N rows contiguous); qr = RoPE(xs (B,H,T,N)) at pos (B) f32 + t with freq (N), v (B,1,T,D)",
		.fields = F(ACT) | F(ARCH) | F(EMBD) | F(HEADS) | F(LATENT) | F(TILE),
		.tile = DG_TILE_THREADS,
		.act_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(ACT), .act = DG_FMT_BF16 },
		.n_args = 6, .args = {
			{ "xs", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "pos", false, DG_ARG_F32, false, 1, { DIM(B) } },
			{ "freq", false, DG_ARG_F32, false, 1, { DIM(N) } },
			{ "v", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(ONE), DIM(T), DIM(D) } },
			{ "state", true, DG_ARG_F32, false, 4, { DIM(B), DIM(H), DIM(N), DIM(D) } },
			{ "out", true, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(D) } } },
		.check = DG_CHECK_NORM,
		.build = "act=f32,bf16",
		.inout = 1u << 4, /* state: read, then written */
	},
	/* ---- the chunked form (templates/attention_chunk.lua; the chains of
	 * runtime/ops/attention.c): per (b, h), chunks of C rows of T; the
	 * intra-chunk terms are the quadratic ops above on the chunks as
	 * sequences of one head, these the states and what joins them. sm_90a
	 * (TMA, warpgroup MMAs) for the three GEMMs; T % C == 0. */
	[DG_OP_ATTENTION_CHUNK_STATE] = {
		.family = "attention", .module = "attention_chunk",
		.about = "chunk states: states (B,H,S,D) = each chunk c's S_c = sum_{t < cC} qr_t^T src_t (backward: R_c = sum_{t >= cC+C}) as bf16 hi and lo rows; qr (B,H,T,N), src (B,Hin,T,D) the values (in_heads 1) or the output gradient",
		.fields = F(ACT) | F(ARCH) | F(CHUNK) | F(EMBD) | F(HEADS) | F(IN_HEADS) | F(LATENT) | F(TILE),
		.tile = DG_TILE_GEMM,
		.act_fmts = B(BF16),
		.pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(ACT) | F(ARCH), .act = DG_FMT_BF16, .arch_specific = true },
		.n_args = 3, .args = {
			{ "qr", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "src", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(HIN), DIM(T), DIM(D) } },
			{ "states", true, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(S), DIM(D) } } },
		.check = DG_CHECK_NORM,
		.build = "in_heads=1,4",
	},
	[DG_OP_ATTENTION_CHUNK_OUT] = {
		.family = "attention", .module = "attention_chunk",
		.about = "chunk output: out (B,H,T,D) out += qr_c (B,H,T,N) . S_c, each chunk's state from states (B,H,S,D) (hi + lo); the walk's first chunk (backward: the last) adds nothing",
		.fields = F(ACT) | F(ARCH) | F(CHUNK) | F(EMBD) | F(HEADS) | F(LATENT) | F(OUT) | F(TILE),
		.tile = DG_TILE_GEMM,
		.act_fmts = B(BF16), .out_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(ACT) | F(ARCH) | F(OUT), .act = DG_FMT_BF16, .out = DG_FMT_BF16,
			      .arch_specific = true },
		.n_args = 3, .args = {
			{ "qr", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "states", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(S), DIM(D) } },
			{ "out", true, DG_ARG_OUT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(D) } } },
		.check = DG_CHECK_NORM,
		.build = "out=f32,bf16",
		.inout = 1u << 2, /* out: read, then written */
	},
	[DG_OP_ATTENTION_CHUNK_DQ] = {
		.family = "attention", .module = "attention_chunk",
		.about = "chunk input gradient: dxs (B,H,T,N) out = (dxs + RoPE^T(C_c . qr_c + grad_c . S_c^T + v_c . R_c^T)) * [mask_xs > 0]; C (B,H,T,C) the chunks' dS + dS^T, S and R the forward's and the backward's states (B,H,S,D)",
		.fields = F(ACT) | F(ARCH) | F(CHUNK) | F(EMBD) | F(HEADS) | F(LATENT) | F(OUT) | F(TILE),
		.tile = DG_TILE_GEMM,
		.act_fmts = B(BF16), .out_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(ACT) | F(ARCH) | F(OUT), .act = DG_FMT_BF16, .out = DG_FMT_F32,
			      .arch_specific = true },
		.n_args = 9, .args = {
			{ "grad_scores", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(C) } },
			{ "qr", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "grad", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(D) } },
			{ "v", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(ONE), DIM(T), DIM(D) } },
			{ "states", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(S), DIM(D) } },
			{ "rstates", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(S), DIM(D) } },
			{ "rope", false, DG_ARG_F32, false, 2, { DIM(T), DIM(N) } },
			{ "dxs", true, DG_ARG_OUT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "mask_xs", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } } },
		.check = DG_CHECK_NORM,
		.build = "out=f32,bf16",
		.inout = 1u << 7, /* dxs: read, then written */
	},
	[DG_OP_ATTENTION_CHUNK_VREP] = {
		.family = "attention", .module = "attention_chunk",
		.about = "values a head each: vr (B,H,T,D) = v (B,1,T,D) for every head",
		.fields = F(ACT) | F(ARCH) | F(EMBD) | F(HEADS) | F(TILE),
		.tile = DG_TILE_THREADS,
		.act_fmts = B(BF16),
		.pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(ACT), .act = DG_FMT_BF16 },
		.n_args = 2, .args = {
			{ "v", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(ONE), DIM(T), DIM(D) } },
			{ "vr", true, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(D) } } },
		.check = DG_CHECK_EXACT,
		.build = "",
	},
	[DG_OP_ATTENTION_CHUNK_CAST] = {
		.family = "attention", .module = "attention_chunk",
		.about = "gradient cast: out (B,H,T,D) act = grad (B,H,T,D) f32, rounded to nearest even",
		.fields = F(ACT) | F(ARCH) | F(EMBD) | F(HEADS) | F(TILE),
		.tile = DG_TILE_THREADS,
		.act_fmts = B(BF16),
		.pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(ACT), .act = DG_FMT_BF16 },
		.n_args = 2, .args = {
			{ "grad", false, DG_ARG_F32, false, 4, { DIM(B), DIM(H), DIM(T), DIM(D) } },
			{ "out", true, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(D) } } },
		.check = DG_CHECK_EXACT,
		.build = "",
	},
	[DG_OP_ATTENTION_CHUNK_HSUM] = {
		.family = "attention", .module = "attention_chunk",
		.about = "head sum: grad_v (B,1,T,D) f32 = sum_h grad (B,H,T,D) f32, the heads in order",
		.fields = F(ARCH) | F(EMBD) | F(HEADS) | F(TILE),
		.tile = DG_TILE_THREADS,
		.pack_fmt = DG_FMT__COUNT,
		.n_args = 2, .args = {
			{ "grad", false, DG_ARG_F32, false, 4, { DIM(B), DIM(H), DIM(T), DIM(D) } },
			{ "grad_v", true, DG_ARG_F32, false, 4, { DIM(B), DIM(ONE), DIM(T), DIM(D) } } },
		.check = DG_CHECK_EXACT,
		.build = "",
	},
	[DG_OP_EMBED_FWD] = {
		.family = "embed", .module = "embed",
		.about = "embedding: out (R,D) f32|bf16 = table (V,D)[idx (R) i32]; a token outside 0..V-1 gives a zero row and sets *bad",
		.fields = F(ARCH) | F(EMBD) | F(OUT) | F(TILE) | F(VOCAB),
		.tile = DG_TILE_THREADS,
		.out_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(OUT), .out = DG_FMT_F32 },
		.n_args = 3, .args = {
			{ "idx", false, DG_ARG_I32, false, 1, { DIM(R) } },
			{ "table", false, DG_ARG_F32, false, 2, { DIM(V), DIM(D) } },
			{ "out", true, DG_ARG_OUT, false, 2, { DIM(R), DIM(D) } } },
		.tune = { .r_mul = 1, .r_div = 1 },
		.check = DG_CHECK_EXACT,
		.build = "out=f32,bf16",
	},
	[DG_OP_EMBED_BWD] = {
		.family = "embed", .module = "embed",
		.about = "embedding gradient: dtable (V,D) f32 (+)= sum of dout (R,D) rows by token, in token order (no atomics)",
		.fields = F(ARCH) | F(EMBD) | F(SRC) | F(TILE) | F(VOCAB),
		.tile = DG_TILE_THREADS,
		.src_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.n_args = 3, .args = {
			{ "idx", false, DG_ARG_I32, false, 1, { DIM(R) } },
			{ "dout", false, DG_ARG_SRC, false, 2, { DIM(R), DIM(D) } },
			{ "dtable", true, DG_ARG_F32, false, 2, { DIM(V), DIM(D) } } },
		.tune = { .r_mul = 1, .r_div = 1 },
		.check = DG_CHECK_EXACT,
		.build = "src=f32,bf16",
	},
	[DG_OP_LAYERNORM_FWD] = {
		.family = "norm", .module = "norm",
		.about = "layer norm, no affine: y (R,D) = (x - mean) * rstd, rstd (R) f32 = 1/sqrt(var + eps), var biased",
		.fields = F(ARCH) | F(EMBD) | F(OUT) | F(SRC) | F(TILE),
		.tile = DG_TILE_THREADS,
		.out_fmts = FLOATS, .src_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(OUT), .out = DG_FMT_F32 },
		.n_args = 3, .args = {
			{ "x", false, DG_ARG_SRC, false, 2, { DIM(R), DIM(D) } },
			{ "y", true, DG_ARG_OUT, false, 2, { DIM(R), DIM(D) } },
			{ "rstd", true, DG_ARG_F32, false, 1, { DIM(R) } } },
		.tune = { .r_mul = 1, .r_div = 1 },
		.check = DG_CHECK_NORM,
		.build = "src=f32,bf16;out=f32,bf16",
	},
	[DG_OP_LAYERNORM_BWD] = {
		.family = "norm", .module = "norm",
		.about = "layer norm gradient: dx (R,D) f32 (+)= rstd * (dy - mean(dy) - y * mean(dy * y)), y the forward's output",
		.fields = F(ARCH) | F(EMBD) | F(SRC) | F(TILE),
		.tile = DG_TILE_THREADS,
		.src_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.n_args = 4, .args = {
			{ "dy", false, DG_ARG_F32, false, 2, { DIM(R), DIM(D) } },
			{ "y", false, DG_ARG_SRC, false, 2, { DIM(R), DIM(D) } },
			{ "rstd", false, DG_ARG_F32, false, 1, { DIM(R) } },
			{ "dx", true, DG_ARG_F32, false, 2, { DIM(R), DIM(D) } } },
		.tune = { .r_mul = 1, .r_div = 1 },
		.check = DG_CHECK_NORM,
		.build = "src=f32,bf16",
	},
	[DG_OP_RESID_LN_FWD] = {
		.family = "norm", .module = "norm",
		.about = "residual + layer norm: out (R,D) = LN(x + y) (x the residual stream, y the block's output), rstd (R) f32",
		.fields = F(ARCH) | F(EMBD) | F(OUT) | F(SRC) | F(TILE),
		.tile = DG_TILE_THREADS,
		.out_fmts = FLOATS, .src_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(OUT), .out = DG_FMT_F32 },
		.n_args = 4, .args = {
			{ "x", false, DG_ARG_SRC, false, 2, { DIM(R), DIM(D) } },
			{ "y", false, DG_ARG_SRC, false, 2, { DIM(R), DIM(D) } },
			{ "out", true, DG_ARG_OUT, false, 2, { DIM(R), DIM(D) } },
			{ "rstd", true, DG_ARG_F32, false, 1, { DIM(R) } } },
		.tune = { .r_mul = 1, .r_div = 1 },
		.check = DG_CHECK_NORM,
		.build = "src=f32,bf16;out=f32,bf16",
	},
	[DG_OP_RESID_LN_BWD] = {
		.family = "norm", .module = "norm",
		.about = "residual + layer norm gradient: g = LN gradient of dout (R,D); dx (R,D) f32 (+)= g, dy (R,D) f32 = g",
		.fields = F(ARCH) | F(EMBD) | F(SRC) | F(TILE),
		.tile = DG_TILE_THREADS,
		.src_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.n_args = 5, .args = {
			{ "dout", false, DG_ARG_F32, false, 2, { DIM(R), DIM(D) } },
			{ "out", false, DG_ARG_SRC, false, 2, { DIM(R), DIM(D) } },
			{ "rstd", false, DG_ARG_F32, false, 1, { DIM(R) } },
			{ "dx", true, DG_ARG_F32, false, 2, { DIM(R), DIM(D) } },
			{ "dy", true, DG_ARG_F32, false, 2, { DIM(R), DIM(D) } } },
		.tune = { .r_mul = 1, .r_div = 1 },
		.check = DG_CHECK_NORM,
		.build = "src=f32,bf16",
	},
	[DG_OP_LMHEAD_CE] = {
		.family = "loss", .module = "loss",
		.about = "lm_head + softmax cross-entropy: loss f32 = mean_r CE(x (R,D) . w (D,V), targets (R) i32); backward: dx (R,D), dw (D,V) (+)= f32; from V 4096 (bf16 x) or past 50304 (f32 x) on tensor cores, x and w rounded to bf16",
		.fields = F(ARCH) | F(EMBD) | F(SRC) | F(TILE) | F(VOCAB) | F(WEIGHT),
		.tile = DG_TILE_THREADS,
		.weight_fmts = FLOATS, .src_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(WEIGHT), .weight = DG_FMT_F32 },
		.n_args = 6, .args = {
			{ "x", false, DG_ARG_SRC, false, 2, { DIM(R), DIM(D) } },
			{ "w", false, DG_ARG_WEIGHT, false, 2, { DIM(D), DIM(V) } },
			{ "targets", false, DG_ARG_I32, false, 1, { DIM(R) } },
			{ "loss", true, DG_ARG_F32, false, 1, { DIM(ONE) } },
			{ "dx", true, DG_ARG_F32, false, 2, { DIM(R), DIM(D) }, true },
			{ "dw", true, DG_ARG_F32, false, 2, { DIM(D), DIM(V) }, true } },
		.tune = { .r_mul = 1, .r_div = 1 },
		.check = DG_CHECK_NORM,
		.build = "src=f32,bf16",
	},
	[DG_OP_LMHEAD_LOGITS] = {
		.family = "loss", .module = "logits",
		.about = "lm_head logits for decoding: logits (R,V) f32 = x (R,D) . w (D,V) f32, each summed in double (k in order) and rounded once",
		.fields = F(ARCH) | F(EMBD) | F(SRC) | F(TILE) | F(VOCAB),
		.tile = DG_TILE_THREADS,
		.src_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.n_args = 3, .args = {
			{ "x", false, DG_ARG_SRC, false, 2, { DIM(R), DIM(D) } },
			{ "w", false, DG_ARG_F32, false, 2, { DIM(D), DIM(V) } },
			{ "logits", true, DG_ARG_F32, false, 2, { DIM(R), DIM(V) } } },
		.tune = { .r_mul = 1, .r_div = 1 },
		.check = DG_CHECK_EXACT,
		.build = "src=f32,bf16",
	},
	/* ---- the gate (BDH's xy = dropout(xs · ys)) and the training step's
	 * element-wise glue. The dropout mask is dragon/rng.h's
	 * dg_dropout_keep of the flat element index plus the call's elem0; p,
	 * seed, step, layer and elem0 are the call's (run-time kernel
	 * arguments), never the spec's. */
	[DG_OP_GATE_FWD] = {
		.family = "gate", .module = "gate",
		.about = "gate: xy (B,H,T,N) = keep ? xs*ys/(1-p) : 0, keep the dropout mask of (seed, step, layer, elem0 + i)",
		.fields = F(ACT) | F(ARCH) | F(HEADS) | F(LATENT) | F(TILE),
		.tile = DG_TILE_THREADS,
		.act_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT, .latent_any = true,
		.defaults = { .fields = F(ACT), .act = DG_FMT_BF16 },
		.n_args = 3, .args = {
			{ "xs", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "ys", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "xy", true, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } } },
		.check = DG_CHECK_EXACT,
		.build = "act=f32,bf16",
	},
	[DG_OP_GATE_BWD] = {
		.family = "gate", .module = "gate",
		.about = "gate backward: g = keep ? dxy/(1-p) : 0; dxs = g*ys, dys = [ys > 0] g*xs over dxy (B,H,T,N); dxy, dys, dxs out",
		.fields = F(ACT) | F(ARCH) | F(HEADS) | F(LATENT) | F(OUT) | F(TILE),
		.tile = DG_TILE_THREADS,
		.act_fmts = FLOATS, .out_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT, .latent_any = true,
		.defaults = { .fields = F(ACT) | F(OUT), .act = DG_FMT_BF16, .out = GRAD_F32 },
		.quiet = F(OUT),
		.n_args = 4, .args = {
			{ "dxy", false, DG_ARG_OUT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "xs", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "ys", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "dxs", true, DG_ARG_OUT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } } },
		.check = DG_CHECK_EXACT,
		.build = "act=f32,bf16;out=f32,bf16",
		.inout = 1u << 0, /* dxy: dys is written over it */
	},
	[DG_OP_GATE_QUANT] = {
		.family = "gate", .module = "gate_quant",
		.about = "gate and token quantizer in one pass: codes (B,H,T,N) and a scale a token (B*T) = quantize_act ascale=token of gate_fwd(xs, ys) (src), bit for bit, no xy in memory",
		.fields = F(ACT) | F(ARCH) | F(HEADS) | F(LATENT) | F(SRC) | F(TILE),
		.tile = DG_TILE_THREADS,
		.act_fmts = B(INT8) | B(UINT8POS), .src_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT, .latent_any = true,
		.defaults = { .fields = F(ACT) | F(SRC), .act = DG_FMT_UINT8POS, .src = DG_FMT_BF16 },
		.n_args = 3, .args = {
			{ "xs", false, DG_ARG_SRC, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "ys", false, DG_ARG_SRC, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "codes", true, DG_ARG_ACT, true, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } } },
		.check = DG_CHECK_SCALED_CODES,
		.build = "src=bf16;act=uint8pos",
	},
	[DG_OP_ADD_MASK] = {
		.family = "step", .module = "step",
		.about = "masked sum: dxs (B,H,T,N) out = xs > 0 ? dxs + other : 0, in place; other src, xs act",
		.fields = F(ACT) | F(ARCH) | F(HEADS) | F(LATENT) | F(OUT) | F(SRC) | F(TILE),
		.tile = DG_TILE_THREADS,
		.act_fmts = FLOATS, .out_fmts = FLOATS, .src_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT, .latent_any = true,
		.defaults = { .fields = F(ACT) | F(OUT) | F(SRC), .act = DG_FMT_BF16, .out = GRAD_F32,
			      .src = GRAD_F32 },
		.quiet = F(OUT) | F(SRC),
		.n_args = 3, .args = {
			{ "dxs", true, DG_ARG_OUT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "other", false, DG_ARG_SRC, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "xs", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } } },
		.check = DG_CHECK_EXACT,
		.build = "act=f32,bf16;out=f32,bf16",
		.inout = 1u << 0, /* dxs: read, then overwritten */
	},
	[DG_OP_ADD3] = {
		.family = "step", .module = "step",
		.about = "sum of three: out (any shape) = (a + b) + c, f32, out may alias a",
		.fields = F(ARCH) | F(TILE),
		.tile = DG_TILE_THREADS,
		.pack_fmt = DG_FMT__COUNT,
		.n_args = 4, .args = {
			{ "a", false, DG_ARG_F32, false, 0, { 0 } },
			{ "b", false, DG_ARG_F32, false, 0, { 0 } },
			{ "c", false, DG_ARG_F32, false, 0, { 0 } },
			{ "out", true, DG_ARG_F32, false, 0, { 0 } } },
		.tune = { .r_mul = 1, .r_div = 1, .cols = 8192 }, /* rows of the BDH latent */
		.check = DG_CHECK_EXACT,
		.build = "",
	},
	[DG_OP_TRANSPOSE] = {
		.family = "step", .module = "step",
		.about = "transpose: in (R,D,N) f32 -> out (R,N,D) act, e.g. master weights [H,D,N] to (H,N,D)",
		.fields = F(ACT) | F(ARCH) | F(EMBD) | F(LATENT) | F(TILE),
		.tile = DG_TILE_THREADS,
		.act_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT, .latent_any = true,
		.defaults = { .fields = F(ACT), .act = DG_FMT_BF16 },
		.n_args = 2, .args = {
			{ "in", false, DG_ARG_F32, false, 3, { DIM(R), DIM(D), DIM(N) } },
			{ "out", true, DG_ARG_ACT, false, 3, { DIM(R), DIM(N), DIM(D) } } },
		.tune = { .r_mul = 1, .r_div = 1024, .r_max = 4 }, /* the BDH heads from 4096 rows */
		.check = DG_CHECK_EXACT,
		.build = "act=f32,bf16",
	},
	/* The inverse of the quantizers, for GEMMs that read a float copy of
	 * codes (the sm_90 projection gradients' bf16 operands): rows R of C
	 * codes, a row one scale (ascale=token) or all one (tensor). */
	[DG_OP_DEQUANTIZE] = {
		.family = "quantize", .module = "dequantize",
		.about = "dequantize: codes (R,C) act, a scale a tensor or a row (ascale=token) -> out (R,C) bf16|f32 = code*s, rounded once",
		.fields = F(ACT) | F(ARCH) | F(ASCALE) | F(OUT) | F(TILE),
		.tile = DG_TILE_THREADS,
		.act_fmts = B(INT8) | B(INT4) | B(UINT8POS), .out_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT,
		.defaults = { .fields = F(OUT), .out = DG_FMT_BF16 },
		.n_args = 2, .args = {
			{ "codes", false, DG_ARG_ACT, true, 0, { 0 } },
			{ "out", true, DG_ARG_OUT, false, 0, { 0 } } },
		.tune = { .r_mul = 4, .r_div = 1, .cols = 256 }, /* the BDH a stack's rows of embd */
		.check = DG_CHECK_EXACT,
		.build = "act=int8;ascale=tensor,token",
	},
	/* decoder_grad_input with gate_bwd in its epilogue: the model's
	 * backward on sm_90a, where dxy's round trip through memory was a
	 * third of the two ops' traffic (templates/decoder_gate.lua). */
	[DG_OP_DECODER_GATE_BWD] = {
		.family = "gate", .module = "decoder_gate",
		.about = "decoder input gradient into the gate's backward: dxy = grad (B,1,T,D) f32 . w (D,H*N) per head; g = keep ? dxy/(1-p) : 0; dxs = g*ys, dys = [ys > 0] g*xs (B,H,T,N) out",
		.fields = DECODER_SHAPE | F(ACT) | F(OUT) | F(WEIGHT),
		.tile = DG_TILE_GEMM,
		.weight_fmts = FLOATS, .act_fmts = FLOATS, .out_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT, .latent_any = true,
		.defaults = { .fields = F(ACT) | F(OUT) | F(WEIGHT), .act = DG_FMT_BF16,
			      .out = DG_FMT_BF16, .weight = DG_FMT_BF16 },
		.n_args = 6, .args = {
			{ "grad", false, DG_ARG_F32, false, 4, { DIM(B), DIM(ONE), DIM(T), DIM(D) } },
			{ "w", false, DG_ARG_WEIGHT, false, 2, { DIM(D), DIM(HN) } },
			{ "xs", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "ys", false, DG_ARG_ACT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "dxs", true, DG_ARG_OUT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "dys", true, DG_ARG_OUT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } } },
		.check = DG_CHECK_NORM,
		.build = "",
	},
	/* decoder_gate_bwd with ys made in the tile instead of read: ys =
	 * lowrank_fwd (in_heads = heads) of the encoder_v projection's codes,
	 * rounded to src, so the step need not keep ys (templates/decoder_gate.lua).
	 * w is the decoder's bf16 copy whatever the spec's weight, which is
	 * ev's codes (a ternary recipe passes its int8 codes and scale). */
	[DG_OP_DECODER_GATE_BWD_YS] = {
		.family = "gate", .module = "decoder_gate",
		.about = "decoder_gate_bwd with ys made in the tile: ys (B,H,T,N) src = relu(s * aq (B,H,T,D) act . ev (H,N,D)^T - thr), lowrank_fwd's bit for bit; dxy = grad (B,1,T,D) f32 . w (D,H*N) bf16 per head; g = keep ? dxy/(1-p) : 0; dxs = g*ys, dys = [ys > 0] g*xs (B,H,T,N) out",
		.fields = DECODER_SHAPE | F(ACT) | F(WEIGHT) | F(ASCALE) | F(WSCALE) | F(RELU) | F(SRC) | F(OUT),
		.tile = DG_TILE_GEMM,
		.weight_fmts = B(INT8), .act_fmts = B(INT8) | B(UINT8POS), .out_fmts = FLOATS,
		.src_fmts = FLOATS,
		.pack_fmt = DG_FMT__COUNT, .latent_any = true,
		.defaults = { .fields = F(ACT) | F(WEIGHT) | F(ASCALE) | F(WSCALE) | F(RELU) | F(SRC) | F(OUT),
			      .act = DG_FMT_INT8, .weight = DG_FMT_INT8, .ascale = DG_SCALE_TOKEN,
			      .wscale = DG_SCALE_CHANNEL, .relu = true, .relu_thr = 0.0f,
			      .src = DG_FMT_BF16, .out = DG_FMT_BF16 },
		.n_args = 7, .args = {
			{ "grad", false, DG_ARG_F32, false, 4, { DIM(B), DIM(ONE), DIM(T), DIM(D) } },
			{ "w", false, DG_ARG_BF16, false, 2, { DIM(D), DIM(HN) } },
			{ "xs", false, DG_ARG_SRC, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "aq", false, DG_ARG_ACT, true, 4, { DIM(B), DIM(H), DIM(T), DIM(D) } },
			{ "ev", false, DG_ARG_WEIGHT, true, 3, { DIM(H), DIM(N), DIM(D) } },
			{ "dxs", true, DG_ARG_OUT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } },
			{ "dys", true, DG_ARG_OUT, false, 4, { DIM(B), DIM(H), DIM(T), DIM(N) } } },
		.check = DG_CHECK_NORM,
		.build = "",
	},
	/* The optimizer: one fused AdamW update a tensor, its scalars from the
	 * step's control block (dragon/optim.h dg_adamw_ctl), so a captured
	 * training step replays every step; the gradient norm's entries beside
	 * it (templates/optim.lua). The control block and the optional bf16
	 * copy travel outside the table (dg_adamw_args). */
	[DG_OP_ADAMW_UPDATE] = {
		.family = "optim", .module = "optim",
		.about = "AdamW: p, m, v (any shape) f32 updated in place from grad f32 and the step's control block (lr, bias corrections, clip factor)",
		.fields = F(ARCH) | F(TILE),
		.tile = DG_TILE_THREADS,
		.pack_fmt = DG_FMT__COUNT,
		.n_args = 4, .args = {
			{ "p", true, DG_ARG_F32, false, 0, { 0 } },
			{ "grad", false, DG_ARG_F32, false, 0, { 0 } },
			{ "m", true, DG_ARG_F32, false, 0, { 0 } },
			{ "v", true, DG_ARG_F32, false, 0, { 0 } } },
		.inout = (1u << 0) | (1u << 2) | (1u << 3),
		.tune = { .r_mul = 1, .r_div = 1, .cols = 8192 },
		.check = DG_CHECK_EXACT,
		.build = "",
	},
};

static const char *const names[DG_OP__COUNT] = {
#define DG__OP_STR(e, name) [e] = #name,
	DG_OP_LIST(DG__OP_STR)
#undef DG__OP_STR
};

const dg_op_info *dg_op_info_of(dg_op op)
{
	return (unsigned)op < DG_OP__COUNT ? &rows[op] : NULL;
}

int64_t dg_op_dim_extent(const dg_spec *s, dg_dim d, int64_t b, int64_t t, int64_t r)
{
	switch (d) {
	case DG_DIM_B:
		return b;
	case DG_DIM_T:
		return t;
	case DG_DIM_R:
		return r;
	case DG_DIM_H:
		return s->heads;
	case DG_DIM_HIN:
		return s->in_heads;
	case DG_DIM_D:
		return s->embd;
	case DG_DIM_N:
		return s->latent;
	case DG_DIM_HN:
		return (int64_t)s->heads * s->latent;
	case DG_DIM_V:
		return s->vocab;
	case DG_DIM_C:
		return s->chunk;
	case DG_DIM_S:
		return s->chunk > 0 ? 2 * (int64_t)s->latent * (t / s->chunk) : 0;
	default:
		return 1;
	}
}

dg_fmt dg_op_arg_fmt(const dg_spec *s, dg_arg_fmt f)
{
	const dg_op_info *row;
	switch (f) {
	case DG_ARG_ACT:
		return s->act;
	case DG_ARG_WEIGHT:
		return s->weight;
	case DG_ARG_OUT:
		return s->out;
	case DG_ARG_SRC:
		return s->src;
	case DG_ARG_INT8:
		return DG_FMT_INT8;
	case DG_ARG_PACK:
		row = dg_op_info_of(s->op);
		return row ? row->pack_fmt : DG_FMT__COUNT;
	case DG_ARG_I32:
		return DG_FMT_I32;
	case DG_ARG_BF16:
		return DG_FMT_BF16;
	default:
		return DG_FMT_F32;
	}
}

bool dg_op_arg_used(const dg_spec *s, int i)
{
	const dg_op_info *row = s ? dg_op_info_of(s->op) : NULL;
	if (!row || i < 0 || i >= row->n_args)
		return false;
	unsigned e = row->args[i].epi;
	return e == 0 || ((unsigned)s->epi < 32 && ((e >> (unsigned)s->epi) & 1u));
}

const char *dg_op_name(dg_op op)
{
	return (unsigned)op < DG_OP__COUNT ? names[op] : "?";
}

bool dg_op_from_name(const char *name, dg_op *out)
{
	for (int i = 0; name && i < DG_OP__COUNT; i++) {
		if (strcmp(name, names[i]) == 0) {
			*out = (dg_op)i;
			return true;
		}
	}
	return false;
}

unsigned dg_spec_uses(dg_op op)
{
	return (unsigned)op < DG_OP__COUNT ? rows[op].fields : 0;
}
