/*
 * The specialization key: names, defaults, normalization, validation and
 * the default tile. Its text form (canonical text, parser, setters) is in
 * codegen/spec_text.c; the format sets both use are in codegen/spec_int.h.
 *
 * Validation is where a spec earns a kernel: every field the op reads is
 * range-checked, and every refusal names the key, the value and the fix
 * ("embd=6: must be a multiple of 4 (codes are packed four to a word
 * along it)").
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/msg.h"
#include "codegen/spec_int.h"
#include "dragon/spec.h"

#define DG_MAX_HEADS 64
#define DG_MAX_EMBD 65536
#define DG_MAX_LATENT (1 << 20)
#define DG_SMEM_LIMIT (48 * 1024) /* static shared memory without opt-in */

static const char *const op_names[] = {
#define DG__OP_STR(e, s) s,
	DG_OP_LIST(DG__OP_STR)
#undef DG__OP_STR
};

static const char *const fmt_names[] = {
#define DG__FMT_STR(e, s) s,
	DG_FMT_LIST(DG__FMT_STR)
#undef DG__FMT_STR
};

const char *dg_op_name(dg_op op)
{
	return (unsigned)op < DG_OP__COUNT ? op_names[op] : "?";
}

const char *dg_fmt_name(dg_fmt fmt)
{
	return (unsigned)fmt < DG_FMT__COUNT ? fmt_names[fmt] : "?";
}

bool dg_op_from_name(const char *name, dg_op *out)
{
	for (int i = 0; i < DG_OP__COUNT; i++) {
		if (name && strcmp(name, op_names[i]) == 0) {
			*out = (dg_op)i;
			return true;
		}
	}
	return false;
}

bool dg_fmt_from_name(const char *name, dg_fmt *out)
{
	for (int i = 0; i < DG_FMT__COUNT; i++) {
		if (name && strcmp(name, fmt_names[i]) == 0) {
			*out = (dg_fmt)i;
			return true;
		}
	}
	return false;
}

unsigned dg_spec_uses(dg_op op)
{
	switch (op) {
	case DG_OP_LOWRANK_FWD:
		return DG_FIELD_ACT | DG_FIELD_ARCH | DG_FIELD_EMBD |
		       DG_FIELD_HEADS | DG_FIELD_IN_HEADS | DG_FIELD_LATENT |
		       DG_FIELD_OUT | DG_FIELD_RELU | DG_FIELD_TILE |
		       DG_FIELD_WEIGHT;
	case DG_OP_QUANTIZE_ACT:
		return DG_FIELD_ACT | DG_FIELD_ARCH | DG_FIELD_SRC |
		       DG_FIELD_TILE;
	case DG_OP_PACK_I8X4:
	case DG_OP_UNPACK_I8X4:
		return DG_FIELD_ARCH | DG_FIELD_EMBD | DG_FIELD_LATENT |
		       DG_FIELD_TILE;
	case DG_OP_QUANTIZE_WEIGHT:
		return DG_FIELD_ARCH | DG_FIELD_SRC | DG_FIELD_TILE |
		       DG_FIELD_WEIGHT;
	case DG_OP_PACK_TERNARY:
	case DG_OP_PACK_SIGN1:
		/* embd = the row length packed (the reduction axis) */
		return DG_FIELD_ARCH | DG_FIELD_EMBD | DG_FIELD_TILE;
	case DG_OP_RELU_MASK:
		return DG_FIELD_ACT | DG_FIELD_ARCH | DG_FIELD_EMBD |
		       DG_FIELD_HEADS | DG_FIELD_IN_HEADS | DG_FIELD_LATENT |
		       DG_FIELD_RELU | DG_FIELD_TILE | DG_FIELD_WEIGHT;
	case DG_OP_DECODER_FWD:
		return DG_FIELD_ACT | DG_FIELD_ARCH | DG_FIELD_EMBD |
		       DG_FIELD_HEADS | DG_FIELD_LATENT | DG_FIELD_OUT |
		       DG_FIELD_TILE | DG_FIELD_WEIGHT;
	case DG_OP_LOWRANK_GRAD_INPUT:
		return DG_FIELD_ARCH | DG_FIELD_EMBD | DG_FIELD_HEADS |
		       DG_FIELD_IN_HEADS | DG_FIELD_LATENT | DG_FIELD_TILE |
		       DG_FIELD_WEIGHT;
	case DG_OP_LOWRANK_GRAD_WEIGHT:
		return DG_FIELD_ACT | DG_FIELD_ARCH | DG_FIELD_EMBD |
		       DG_FIELD_HEADS | DG_FIELD_IN_HEADS | DG_FIELD_LATENT |
		       DG_FIELD_TILE;
	case DG_OP_DECODER_GRAD_INPUT:
		return DG_FIELD_ARCH | DG_FIELD_EMBD | DG_FIELD_HEADS |
		       DG_FIELD_LATENT | DG_FIELD_TILE | DG_FIELD_WEIGHT;
	case DG_OP_DECODER_GRAD_WEIGHT:
		return DG_FIELD_ACT | DG_FIELD_ARCH | DG_FIELD_EMBD |
		       DG_FIELD_HEADS | DG_FIELD_LATENT | DG_FIELD_TILE;
	default:
		return 0;
	}
}

/* GEMM-like ops take a block tile; the rest take a thread count. */
static bool op_is_gemm(dg_op op)
{
	switch (op) {
	case DG_OP_LOWRANK_FWD:
	case DG_OP_RELU_MASK:
	case DG_OP_DECODER_FWD:
	case DG_OP_LOWRANK_GRAD_INPUT:
	case DG_OP_LOWRANK_GRAD_WEIGHT:
	case DG_OP_DECODER_GRAD_INPUT:
	case DG_OP_DECODER_GRAD_WEIGHT:
		return true;
	default:
		return false;
	}
}

/* The reduction length a GEMM op has as a compile-time constant (a block
 * tile's BK must divide it); 0 when it is B*T, known only at run time. */
static int gemm_reduction(const dg_spec *s)
{
	switch (s->op) {
	case DG_OP_LOWRANK_FWD:
	case DG_OP_RELU_MASK:
	case DG_OP_DECODER_GRAD_INPUT:
		return s->embd;
	case DG_OP_DECODER_FWD:
	case DG_OP_LOWRANK_GRAD_INPUT:
		return s->latent;
	default:
		return 0;
	}
}

/* The formats a GEMM op reads along its reduction axis: packed codes make
 * BK a multiple of the codes a storage word holds. */
static bool gemm_reads_weight_codes(dg_op op)
{
	return op == DG_OP_LOWRANK_FWD || op == DG_OP_RELU_MASK ||
	       op == DG_OP_DECODER_FWD;
}

void dg_spec_init(dg_spec *spec, dg_op op)
{
	memset(spec, 0, sizeof(*spec));
	spec->op = op;
	spec->heads = 4;
	spec->in_heads = 1;
	spec->embd = 256;
	spec->latent = 8192;
	spec->weight = DG_FMT_INT8;
	spec->act = DG_FMT_INT8;
	spec->out = DG_FMT_INT8;
	spec->src = DG_FMT_F32;
	spec->relu = false;
	spec->relu_thr = 0.0f;
	spec->arch = 90;
	spec->arch_specific = false;
}

void dg_spec_normalize(dg_spec *spec)
{
	dg_spec d;
	unsigned uses = dg_spec_uses(spec->op);

	dg_spec_init(&d, spec->op);
	if (!(uses & DG_FIELD_HEADS))
		spec->heads = d.heads;
	if (!(uses & DG_FIELD_IN_HEADS))
		spec->in_heads = d.in_heads;
	if (!(uses & DG_FIELD_EMBD))
		spec->embd = d.embd;
	if (!(uses & DG_FIELD_LATENT))
		spec->latent = d.latent;
	if (!(uses & DG_FIELD_WEIGHT))
		spec->weight = d.weight;
	if (!(uses & DG_FIELD_ACT))
		spec->act = d.act;
	if (!(uses & DG_FIELD_OUT))
		spec->out = d.out;
	if (!(uses & DG_FIELD_SRC))
		spec->src = d.src;
	if (!(uses & DG_FIELD_RELU)) {
		spec->relu = d.relu;
		spec->relu_thr = d.relu_thr;
	}
	if (!spec->relu)
		spec->relu_thr = 0.0f;
	if (spec->relu_thr == 0.0f)
		spec->relu_thr = 0.0f; /* -0 → +0: same function */
	if (!(uses & DG_FIELD_TILE))
		memset(&spec->tile, 0, sizeof(spec->tile));
}

/* ---- validation ----------------------------------------------------------- */

#define FMT_BIT(f) (1u << (f))

const unsigned dg__spec_weight_fmts = FMT_BIT(DG_FMT_F32) |
	FMT_BIT(DG_FMT_BF16) | FMT_BIT(DG_FMT_INT8) | FMT_BIT(DG_FMT_TERNARY) |
	FMT_BIT(DG_FMT_SIGN1);
const unsigned dg__spec_act_fmts = FMT_BIT(DG_FMT_F32) | FMT_BIT(DG_FMT_BF16) |
	FMT_BIT(DG_FMT_INT8) | FMT_BIT(DG_FMT_INT4) | FMT_BIT(DG_FMT_UINT8POS);
const unsigned dg__spec_quant_fmts = FMT_BIT(DG_FMT_INT8) |
	FMT_BIT(DG_FMT_INT4) | FMT_BIT(DG_FMT_UINT8POS);
const unsigned dg__spec_out_fmts = FMT_BIT(DG_FMT_F32) | FMT_BIT(DG_FMT_BF16) |
	FMT_BIT(DG_FMT_INT8) | FMT_BIT(DG_FMT_UINT8POS);
const unsigned dg__spec_src_fmts = FMT_BIT(DG_FMT_F32) | FMT_BIT(DG_FMT_BF16);
const unsigned dg__spec_wquant_fmts = FMT_BIT(DG_FMT_INT8) |
	FMT_BIT(DG_FMT_TERNARY) | FMT_BIT(DG_FMT_SIGN1);

bool dg__spec_fmt_in(dg_fmt f, unsigned mask)
{
	return (unsigned)f < DG_FMT__COUNT && (mask & (1u << f));
}

const char *dg__spec_fmt_list(unsigned mask, char *buf, size_t size)
{
	size_t n = 0;
	buf[0] = '\0';
	for (int i = 0; i < DG_FMT__COUNT; i++) {
		if (!(mask & (1u << i)))
			continue;
		int w = snprintf(buf + n, size - n, "%s%s", n ? "|" : "",
				 fmt_names[i]);
		if (w < 0 || (size_t)w >= size - n)
			break;
		n += (size_t)w;
	}
	return buf;
}

static bool fmt_is_int(dg_fmt f)
{
	return f == DG_FMT_INT8 || f == DG_FMT_TERNARY || f == DG_FMT_SIGN1 ||
	       f == DG_FMT_INT4 || f == DG_FMT_UINT8POS;
}

/* Codes a storage word holds along the reduction axis (1 for floats). */
static int codes_per_word(dg_fmt f)
{
	switch (f) {
	case DG_FMT_TERNARY:
		return 16;
	case DG_FMT_SIGN1:
		return 32;
	case DG_FMT_F32:
	case DG_FMT_BF16:
		return 1;
	default:
		return 4;
	}
}

static bool is_pow2_in(int v, int lo, int hi)
{
	return v >= lo && v <= hi && (v & (v - 1)) == 0;
}

/* Bytes an output element of the op's epilogue staging takes (relu_mask
 * stages one mask byte an element). */
static int out_elem_bytes(const dg_spec *s)
{
	if (s->op == DG_OP_RELU_MASK)
		return 1;
	return s->out == DG_FMT_F32 ? 4 : s->out == DG_FMT_BF16 ? 2 : 1;
}

/*
 * The warpgroup tensor-core path (wgmma, sm_90a) applies, mirroring
 * templates/lowrank_wgmma.lua M.fits and templates/decoder.lua
 * M.wgmma_fits: integer × integer on sm_90a, warps WM x 1 in whole
 * warpgroups of 64 rows (BM = 16·WM);
 *   lowrank_fwd: BN 64 or 128, stages 1 or 2 (the weight tile is always
 *     triple-buffered; stages 1: packed weights are unpacked to s8 by the
 *     op before the launch, runtime/ops/ops_forward.c),
 *     E a multiple of 64 (128 for sign1), L of 16, E·(BM + 3·BN) bytes of
 *     shared memory (the whole reduction resident);
 *   decoder_fwd: BN 64, 128 or 256, BK a multiple of 32 (64 ternary, 128
 *     sign1), stages 3 to 8, stages·(BM + BN)·BK bytes.
 * *smem gets the bytes when it applies.
 */
static bool wgmma_fits(const dg_spec *s, const dg_tile *t, long *smem)
{
	if (s->arch != 90 || !s->arch_specific || !fmt_is_int(s->weight) ||
	    !fmt_is_int(s->act) || t->wn != 1 || t->wm % 4 || t->wm > 16 ||
	    t->bm != 16 * t->wm)
		return false;
	if (s->op == DG_OP_LOWRANK_FWD) {
		int ke = s->weight == DG_FMT_SIGN1 ? 128 : 64;
		*smem = (long)s->embd * (t->bm + 3 * t->bn);
		return (t->bn == 64 || t->bn == 128) && (t->stages == 1 || t->stages == 2) &&
		       s->embd % ke == 0 && s->latent % 16 == 0 && *smem <= 227 * 1024;
	}
	if (s->op == DG_OP_DECODER_FWD) {
		int unit = s->weight == DG_FMT_TERNARY ? 64
			   : s->weight == DG_FMT_SIGN1 ? 128
						       : 32;
		int red = gemm_reduction(s);
		*smem = (long)t->stages * (t->bm + t->bn) * t->bk;
		return (t->bn == 64 || t->bn == 128 || t->bn == 256) && t->bk % unit == 0 &&
		       red && red % t->bk == 0 && t->stages >= 3 && t->stages <= 8 &&
		       *smem <= 227 * 1024;
	}
	return false;
}

/* The tensor-core path of lowrank_fwd / relu_mask / decoder_fwd applies
 * (templates/mma.lua M.fits): sm_80 or newer, integer × integer, BK a
 * multiple of 32, the warp tile whole 16x8 fragments. */
static bool mma_fits(const dg_spec *s, const dg_tile *t)
{
	return s->arch >= 80 && fmt_is_int(s->weight) && fmt_is_int(s->act) &&
	       t->bk % 32 == 0 &&
	       (t->bm / t->wm) % 16 == 0 && (t->bn / t->wn) % 8 == 0;
}

/*
 * Shared memory (bytes) a GEMM tile takes, per path, mirroring the
 * templates:
 *   tensor cores (mma.lua): max(2, stages) buffers of (BM + BN) rows of RS
 *     bytes (RS = BK padded to ≡ KC mod 128, KC = 64 when BK % 64 == 0 else
 *     32); lowrank also stages its output tile, BM rows of
 *     BN·osz + max(16, 8·osz) bytes, in the same (dynamic) buffer;
 *   decoder SIMT (decoder.lua): (BM + BN)·(min(BK, 32) + 1)·4, dynamic;
 *   lowrank SIMT (dp4a / fp32, lowrank.lua): min(stages, 2)·(BM + BN)·BK·P
 *     with P = 1 (codes) or 4 (floats), static (48 KiB at most).
 * *is_static tells which limit applies.
 */
static long lowrank_smem(const dg_spec *s, const dg_tile *t, bool *is_static)
{
	*is_static = false;
	if (mma_fits(s, t)) {
		long kc = t->bk % 64 == 0 ? 64 : 32;
		long rs = t->bk + (((kc - t->bk) % 128) + 128) % 128;
		long st = t->stages < 2 ? 2 : t->stages;
		long pipe = st * (t->bm + t->bn) * rs;
		if (s->op == DG_OP_DECODER_FWD)
			return pipe;
		long osz = out_elem_bytes(s);
		long stage = (long)t->bm * (t->bn * osz + (8 * osz > 16 ? 8 * osz : 16));
		return pipe > stage ? pipe : stage;
	}
	if (s->op == DG_OP_DECODER_FWD) {
		long ks = t->bk < 32 ? t->bk : 32;
		return (long)(t->bm + t->bn) * (ks + 1) * 4;
	}
	int p = fmt_is_int(s->weight) && fmt_is_int(s->act) ? 1 : 4;
	*is_static = true;
	return (long)(t->stages < 2 ? t->stages : 2) * (t->bm + t->bn) * t->bk * p;
}

/* Shared memory one block may use (dynamic, opted in above 48 KiB). */
static long smem_limit(int arch)
{
	if (arch >= 90)
		return 227 * 1024;
	if (arch == 80 || arch == 87)
		return 163 * 1024;
	if (arch >= 86)
		return 99 * 1024;
	if (arch >= 70)
		return arch == 75 ? 64 * 1024 : 96 * 1024;
	return DG_SMEM_LIMIT;
}

/* The four backward GEMMs (templates/backward.lua). */
static bool op_is_backward(dg_op op)
{
	return op == DG_OP_LOWRANK_GRAD_INPUT || op == DG_OP_DECODER_GRAD_INPUT ||
	       op == DG_OP_LOWRANK_GRAD_WEIGHT || op == DG_OP_DECODER_GRAD_WEIGHT;
}

/*
 * The tile rules of the four backward GEMMs (templates/backward.lua picks
 * the path from the tile and mirrors these rules): tensor cores (mma.sync
 * m16n8k16 bf16, f32 sums) on sm_80+ when BK is a multiple of 16 and each
 * warp tile is whole 16x16 blocks; fp32 SIMT otherwise, under the rules
 * every GEMM tile had before. Tensor-core shared memory (dynamic,
 * templates/backward_mma.lua M.smem_bytes): a ring of max(2, stages) f32
 * A steps of BM·BK floats, and two bf16 buffers of the A tile — BM·(BK+8)
 * (grad_input, A k-contiguous) or BK·(BM+8) (grad_weight, A m-contiguous)
 * — and the B tile BK·(BN+8). Auto tiles are DG_OK.
 */
static dg_status validate_backward_tile(const dg_spec *s, char *msg, size_t size)
{
	const dg_tile *t = &s->tile;
	char tb[64];
	bool gi = s->op == DG_OP_LOWRANK_GRAD_INPUT || s->op == DG_OP_DECODER_GRAD_INPUT;

	if (dg_tile_is_auto(t))
		return DG_OK;
	dg_tile_to_string(t, tb, sizeof(tb));
	if (t->threads)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"tile=%s: op %s takes a block tile BMxBNxBK/WMxWN/S (e.g. 64x64x64/2x2/2), not a thread count",
				tb, dg_op_name(s->op));
	if (!is_pow2_in(t->bm, 16, 256) || !is_pow2_in(t->bn, 16, 256))
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"tile=%s: BM and BN must be powers of two from 16 to 256", tb);
	if (!is_pow2_in(t->bk, 4, 128))
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"tile=%s: BK must be a power of two from 4 to 128", tb);
	int red = gemm_reduction(s);
	if (red && red % t->bk)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"tile=%s: BK=%d must divide %s=%d (the reduction length)", tb,
				t->bk, s->op == DG_OP_LOWRANK_GRAD_INPUT ? "latent" : "embd", red);
	if (!is_pow2_in(t->wm, 1, 8) || !is_pow2_in(t->wn, 1, 8) || t->wm * t->wn > 16)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"tile=%s: WM and WN must be 1, 2, 4 or 8 with WM*WN <= 16 warps", tb);
	if (t->stages < 1 || t->stages > 4)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size, "tile=%s: stages must be 1 to 4", tb);
	int wtm = t->bm / t->wm, wtn = t->bn / t->wn;
	long smem;
	if (s->arch >= 80 && t->bk % 16 == 0 && wtm % 16 == 0 && wtn % 16 == 0) {
		if (wtm * wtn / 32 > 128)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"tile=%s: %d f32 accumulators a thread on the tensor-core path; at most 128 (more warps or a smaller tile)",
					tb, wtm * wtn / 32);
		long a16 = gi ? (long)t->bm * (t->bk + 8) : (long)t->bk * (t->bm + 8);
		smem = (t->stages < 2 ? 2 : t->stages) * (long)t->bm * t->bk * 4 +
		       2 * (a16 + (long)t->bk * (t->bn + 8)) * 2;
	} else {
		if (wtm % 4 || wtn % 8 || t->bm < t->wm * 4 || t->bn < t->wn * 8)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"tile=%s: each warp's tile (BM/WM x BN/WN) must be at least 4x8 and a multiple of it",
					tb);
		if ((wtm / 4) * (wtn / 8) > 64)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"tile=%s: %d outputs per thread; at most 64 fit in registers (more warps or a smaller tile)",
					tb, (wtm / 4) * (wtn / 8));
		smem = (long)t->stages * (t->bm + t->bn) * t->bk *
		       (fmt_is_int(s->weight) && fmt_is_int(s->act) ? 1 : 4);
	}
	if (smem > smem_limit(s->arch))
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"tile=%s: needs %ld bytes of shared memory, more than the %ld an sm_%d block can have (fewer stages or a smaller tile)",
				tb, smem, smem_limit(s->arch), s->arch);
	return DG_OK;
}

/*
 * Default tiles of the backward GEMMs (false for other ops). Tensor cores
 * on sm_80+ when BK (halved from 64 / 32 until it divides the grad_input
 * reduction) is at least 16; at the BDH shape (H 4, E 256, L 8192, B·T
 * 4096):
 *   lowrank_grad_input 64x128x64/2x4/4: (E/128)·(B·T/64) = 128 blocks for
 *     132 SMs, 8 warps of 32x32 a block (one block an SM, two warps a
 *     scheduler), 116 KiB: three 16 KiB gradient steps in flight a block
 *     (the op streams 537 MB of gradient);
 *   decoder_grad_input 128x128x32/2x2/3: K = E = 256 is 8 steps, so two
 *     blocks an SM (85 KiB each) overlap one block's stores with the
 *     other's math; 64x64 warp tiles;
 *   lowrank_grad_weight, decoder_grad_weight 128x128x32/2x2/4: 64x64 warp
 *     tiles (the least shared-memory traffic a MMA), 98 KiB, two blocks an SM.
 * Otherwise (before sm_80, or a reduction 16 does not divide) the SIMT
 * default every GEMM had: 64x64 blocks of 2x2 warps, double-buffered.
 */
static bool backward_default_tile(const dg_spec *s, dg_tile *tile)
{
	if (!op_is_backward(s->op))
		return false;
	if (!dg_tile_is_auto(&s->tile)) {
		*tile = s->tile;
		return true;
	}
	memset(tile, 0, sizeof(*tile));
	int red = gemm_reduction(s);
	int bk = s->op == DG_OP_LOWRANK_GRAD_INPUT ? 64 : 32;
	while (red && bk > 16 && red % bk)
		bk /= 2;
	if (s->arch >= 80 && !(red && red % bk)) {
		bool gw = s->op == DG_OP_LOWRANK_GRAD_WEIGHT || s->op == DG_OP_DECODER_GRAD_WEIGHT;
		tile->bm = s->op == DG_OP_LOWRANK_GRAD_INPUT ? 64 : 128;
		tile->bn = 128;
		tile->bk = bk;
		tile->wm = 2;
		tile->wn = s->op == DG_OP_LOWRANK_GRAD_INPUT ? 4 : 2;
		tile->stages = gw || s->op == DG_OP_LOWRANK_GRAD_INPUT ? 4 : 3;
		return true;
	}
	bk = fmt_is_int(s->weight) && fmt_is_int(s->act) ? 64 : 32;
	while (red && bk > 4 && red % bk)
		bk /= 2;
	tile->bm = 64;
	tile->bn = 64;
	tile->bk = bk;
	tile->wm = 2;
	tile->wn = 2;
	tile->stages = 2;
	return true;
}

static dg_status validate_tile(const dg_spec *s, char *msg, size_t size)
{
	if (op_is_backward(s->op)) return validate_backward_tile(s, msg, size);
	const dg_tile *t = &s->tile;
	char tb[64];

	if (dg_tile_is_auto(t))
		return DG_OK;
	dg_tile_to_string(t, tb, sizeof(tb));
	if (!op_is_gemm(s->op)) {
		if (t->bm || t->bn || t->bk || t->wm || t->wn || t->stages)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"tile=%s: op %s takes a thread count (tile=t256), not a block tile",
					tb, dg_op_name(s->op));
		if (t->threads < 32 || t->threads > 1024 || t->threads % 32)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"tile=%s: threads must be a multiple of 32 between 32 and 1024",
					tb);
		return DG_OK;
	}
	if (t->threads)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"tile=%s: op %s takes a block tile BMxBNxBK/WMxWN/S (e.g. 64x64x64/2x2/2), not a thread count",
				tb, dg_op_name(s->op));
	if (!is_pow2_in(t->bm, 16, 256) || !is_pow2_in(t->bn, 16, 256))
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"tile=%s: BM and BN must be powers of two from 16 to 256",
				tb);
	if (!is_pow2_in(t->bk, 4, 128))
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"tile=%s: BK must be a power of two from 4 to 128",
				tb);
	if (gemm_reads_weight_codes(s->op)) {
		int cpw = codes_per_word(s->weight);
		if (codes_per_word(s->act) > cpw)
			cpw = codes_per_word(s->act);
		if (t->bk % cpw)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"tile=%s: BK must be a multiple of %d (weight=%s act=%s pack that many codes a word)",
					tb, cpw, dg_fmt_name(s->weight),
					dg_fmt_name(s->act));
	}
	int red = gemm_reduction(s);
	if (red && red % t->bk)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"tile=%s: BK=%d must divide %s=%d (the reduction length)",
				tb, t->bk,
				red == s->embd && s->op != DG_OP_DECODER_FWD &&
						s->op != DG_OP_LOWRANK_GRAD_INPUT
					? "embd"
					: "latent",
				red);
	long wg_smem = 0;
	if (wgmma_fits(s, t, &wg_smem))
		return DG_OK; /* its own rules hold (registers: BN/2 accumulators) */
	if (!is_pow2_in(t->wm, 1, 8) || !is_pow2_in(t->wn, 1, 8) ||
	    t->wm * t->wn > 16)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"tile=%s: WM and WN must be 1, 2, 4 or 8 with WM*WN <= 16 warps",
				tb);
	if ((t->bm / t->wm) % 4 || (t->bn / t->wn) % 8 || t->bm < t->wm * 4 ||
	    t->bn < t->wn * 8)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"tile=%s: each warp's tile (BM/WM x BN/WN) must be at least 4x8 and a multiple of it",
				tb);
	if ((t->bm / t->wm / 4) * (t->bn / t->wn / 8) > 64)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"tile=%s: %d outputs per thread; at most 64 fit in registers (more warps or a smaller tile)",
				tb, (t->bm / t->wm / 4) * (t->bn / t->wn / 8));
	if (t->stages < 1 || t->stages > 4)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"tile=%s: stages must be 1 to 4", tb);
	if (mma_fits(s, t) && (s->op == DG_OP_LOWRANK_FWD || s->op == DG_OP_RELU_MASK ||
			       s->op == DG_OP_DECODER_FWD)) {
		/* registers a thread: the int32 accumulators plus the A
		 * fragments of one K chunk (two rows of KC/4 bytes an m16 tile) */
		int acc = (t->bm / t->wm) * (t->bn / t->wn) / 32;
		int afrag = (t->bm / t->wm / 16) * 2 * (t->bk % 64 == 0 ? 4 : 2);
		if (acc + afrag > 128)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"tile=%s: the tensor-core path needs %d accumulator and %d fragment registers a thread; at most 128 (more warps or a smaller tile)",
					tb, acc, afrag);
	}
	bool is_static = false;
	long smem = s->op == DG_OP_LOWRANK_FWD || s->op == DG_OP_RELU_MASK ||
				    s->op == DG_OP_DECODER_FWD
			    ? lowrank_smem(s, t, &is_static)
			    : (long)t->stages * (t->bm + t->bn) * t->bk *
				      (fmt_is_int(s->weight) && fmt_is_int(s->act) ? 1 : 4);
	long limit = is_static ? DG_SMEM_LIMIT : smem_limit(s->arch);
	if (smem > limit)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"tile=%s: needs %ld bytes of shared memory, more than the %ld an sm_%d block can have (fewer stages or a smaller tile)",
				tb, smem, limit, s->arch);
	return DG_OK;
}

dg_status dg_spec_validate(const dg_spec *s, char *msg, size_t size)
{
	char fl[96];

	if (!s)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size, "spec is NULL");
	if ((unsigned)s->op >= DG_OP__COUNT)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"op=%d: unknown op",
				(int)s->op);
	unsigned uses = dg_spec_uses(s->op);
	const char *op = dg_op_name(s->op);

	if ((uses & DG_FIELD_HEADS) && (s->heads < 1 || s->heads > DG_MAX_HEADS))
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"heads=%d: must be between 1 and %d", s->heads,
				DG_MAX_HEADS);
	if ((uses & DG_FIELD_IN_HEADS) && s->in_heads != 1 &&
	    s->in_heads != s->heads)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"in_heads=%d: must be 1 (input shared by all heads) or heads=%d",
				s->in_heads, s->heads);
	if (s->op == DG_OP_QUANTIZE_WEIGHT &&
	    !dg__spec_fmt_in(s->weight, dg__spec_wquant_fmts))
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"weight=%s: op quantize_weight makes one of %s",
				dg_fmt_name(s->weight),
				dg__spec_fmt_list(dg__spec_wquant_fmts, fl,
						  sizeof(fl)));
	if (uses & DG_FIELD_WEIGHT &&
	    !dg__spec_fmt_in(s->weight, dg__spec_weight_fmts))
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"weight=%s: must be one of %s",
				dg_fmt_name(s->weight),
				dg__spec_fmt_list(dg__spec_weight_fmts, fl,
						  sizeof(fl)));
	if (uses & DG_FIELD_ACT) {
		unsigned allowed = s->op == DG_OP_QUANTIZE_ACT
					   ? dg__spec_quant_fmts
					   : dg__spec_act_fmts;
		if (!dg__spec_fmt_in(s->act, allowed))
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"act=%s: op %s takes one of %s",
					dg_fmt_name(s->act), op,
					dg__spec_fmt_list(allowed, fl,
							  sizeof(fl)));
	}
	if (uses & DG_FIELD_SRC && !dg__spec_fmt_in(s->src, dg__spec_src_fmts))
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"src=%s: must be one of %s", dg_fmt_name(s->src),
				dg__spec_fmt_list(dg__spec_src_fmts, fl,
						  sizeof(fl)));
	if (s->op == DG_OP_DECODER_FWD &&
	    !dg__spec_fmt_in(s->out, dg__spec_src_fmts))
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"out=%s: op decoder_fwd writes one of %s (its output joins the float residual stream)",
				dg_fmt_name(s->out),
				dg__spec_fmt_list(dg__spec_src_fmts, fl,
						  sizeof(fl)));
	if (s->op == DG_OP_RELU_MASK && !s->relu)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"relu=none: op relu_mask needs the forward's threshold (relu=0 or relu=T)");
	if (uses & DG_FIELD_OUT && !dg__spec_fmt_in(s->out, dg__spec_out_fmts))
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"out=%s: must be one of %s", dg_fmt_name(s->out),
				dg__spec_fmt_list(dg__spec_out_fmts, fl,
						  sizeof(fl)));
	if (uses & DG_FIELD_EMBD) {
		if (s->embd < 4 || s->embd > DG_MAX_EMBD)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"embd=%d: must be between 4 and %d",
					s->embd, DG_MAX_EMBD);
		if (s->embd % 4)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"embd=%d: must be a multiple of 4 (codes are packed four to a word along it)",
					s->embd);
		if (uses & DG_FIELD_WEIGHT && s->op != DG_OP_DECODER_FWD &&
		    s->op != DG_OP_DECODER_GRAD_INPUT &&
		    s->op != DG_OP_QUANTIZE_WEIGHT) {
			int cpw = codes_per_word(s->weight);
			if (cpw > 4 && s->embd % cpw)
				return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
						"embd=%d: weight=%s packs %d codes a word along embd, so embd must be a multiple of %d",
						s->embd, dg_fmt_name(s->weight),
						cpw, cpw);
		}
	}
	if (uses & DG_FIELD_LATENT) {
		if (s->latent < 1 || s->latent > DG_MAX_LATENT)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"latent=%d: must be between 1 and %d",
					s->latent, DG_MAX_LATENT);
		if (s->op != DG_OP_PACK_I8X4 && s->op != DG_OP_UNPACK_I8X4 &&
		    s->latent % 4)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"latent=%d: must be a multiple of 4 (codes are packed four to a word along it)",
					s->latent);
		if (s->op == DG_OP_DECODER_FWD || s->op == DG_OP_DECODER_GRAD_INPUT) {
			int cpw = codes_per_word(s->weight);
			if (cpw > 4 && s->latent % cpw)
				return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
						"latent=%d: weight=%s packs %d codes a word along the decoder's rows (heads*latent), so latent must be a multiple of %d",
						s->latent, dg_fmt_name(s->weight),
						cpw, cpw);
		}
	}
	if (uses & DG_FIELD_RELU) {
		if (s->relu && !isfinite(s->relu_thr))
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"relu=%g: the threshold must be a finite number (or none)",
					(double)s->relu_thr);
		if (uses & DG_FIELD_OUT && s->out == DG_FMT_UINT8POS && !s->relu)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"out=uint8pos: needs relu (unsigned codes hold only values >= 0); use out=int8 or set relu");
	}
	if (uses & DG_FIELD_ARCH) {
		if (s->arch < 50 || s->arch > 999)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"arch=sm_%d: must be between sm_50 and sm_999, e.g. sm_90",
					s->arch);
		if (s->arch_specific && s->arch < 90)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"arch=sm_%da: arch-specific targets exist from sm_90a on",
					s->arch);
	}
	if (uses & DG_FIELD_TILE)
		return validate_tile(s, msg, size);
	return DG_OK;
}

/* ---- tile ----------------------------------------------------------------- */

bool dg_tile_is_auto(const dg_tile *t)
{
	return !t->bm && !t->bn && !t->bk && !t->wm && !t->wn && !t->stages &&
	       !t->threads;
}

void dg_spec_default_tile(const dg_spec *s, dg_tile *tile)
{
	if (backward_default_tile(s, tile)) return;
	if (!dg_tile_is_auto(&s->tile)) {
		*tile = s->tile;
		return;
	}
	memset(tile, 0, sizeof(*tile));
	if (!op_is_gemm(s->op)) {
		tile->threads = 256;
		return;
	}
	bool ints = fmt_is_int(s->weight) && fmt_is_int(s->act);
	/* BK stays a multiple of the codes a storage word holds only where
	 * the reduction runs along packed codes (the backward GEMMs reduce
	 * along latent / embd of f32 gradients). */
	int cpw = 4;
	if (gemm_reads_weight_codes(s->op)) {
		if (codes_per_word(s->weight) > cpw)
			cpw = codes_per_word(s->weight);
		if (codes_per_word(s->act) > cpw)
			cpw = codes_per_word(s->act);
	}
	int red = gemm_reduction(s);
	bool mma_op = s->op == DG_OP_LOWRANK_FWD || s->op == DG_OP_RELU_MASK ||
		      s->op == DG_OP_DECODER_FWD;
	if (ints && s->arch == 90 && s->arch_specific &&
	    (s->op == DG_OP_LOWRANK_FWD || s->op == DG_OP_DECODER_FWD)) {
		/* Warpgroup tensor cores (sm_90a; wgmma_fits): two warpgroups
		 * of 64 rows; the projection keeps E resident with 64 latent
		 * columns a tile (two blocks an SM), the decoder walks K in
		 * 128-code steps, 4 stages, all 256 columns of BDH's E. From
		 * `dragon-gen tune` on the H200 (M = 4096): projection
		 * 128x64/8x1/2 122 us, 256x64/16x1/2 125, 128x128/8x1/2 142,
		 * 64x64/4x1/2 205, stages 1 (weights unpacked first) 175-236;
		 * decoder (ternary) 128x256x128/8x1/4 123, 128x256x64/8x1/6
		 * 129, 256x128x64/16x1/6 148. */
		dg_tile w = { .bm = 128, .bn = 64, .bk = 64, .wm = 8, .wn = 1, .stages = 2 };
		if (s->op == DG_OP_DECODER_FWD) {
			w.bn = s->embd >= 256 ? 256 : s->embd > 64 ? 128 : 64;
			w.bk = red % 128 == 0 ? 128 : red % 64 == 0 ? 64 : 32;
			w.stages = 4;
		}
		long sm;
		if (wgmma_fits(s, &w, &sm)) {
			*tile = w;
			return;
		}
	}
	if (ints && mma_op && s->arch >= 80 && red && red % 32 == 0) {
		/* Tensor cores (templates/mma.lua), from a sweep on the H200
		 * (bench/kernels --tile, BDH shape, M = 4096):
		 *   lowrank / relu_mask 128x128x64/2x4/4 (64x32 warp tiles, 2
		 *     blocks an SM): 277 us int8 out; 4x2 warps 312, 64x128
		 *     329, 64x64 389, 128x64 334, 64x256 349;
		 *   decoder 64x128x64/2x2/4 (4 warps, several blocks an SM):
		 *     152 us int8 weights; 128x64 205, 128x128/2x4/3 193,
		 *     128x128 239, 128x256/4x4 269, 64x256 252.
		 * K = embd in 4 steps at BDH (the whole K in flight). */
		tile->bk = red % 64 == 0 ? 64 : 32;
		tile->stages = 4;
		if (s->op == DG_OP_DECODER_FWD) {
			tile->bm = 64;
			tile->bn = 128;
			tile->wm = 2;
			tile->wn = 2;
		} else {
			tile->bm = 128;
			tile->bn = 128;
			tile->wm = 2;
			tile->wn = 4;
		}
		return;
	}
	/* SIMT (dp4a / fp32): 64x64 blocks of 2x2 warps (128 threads, 32
	 * outputs a thread); BK is the largest step up to 64 (codes) or 32
	 * (floats) that divides the reduction and whole storage words,
	 * double-buffered. */
	int bk = ints ? 64 : 32;
	while (red && bk > cpw && (red % bk))
		bk /= 2;
	tile->bm = 64;
	tile->bn = 64;
	tile->bk = bk;
	tile->wm = 2;
	tile->wn = 2;
	tile->stages = 2;
}


void dg_spec_default_resolve(dg_spec *s, int device_sm)
{
	if (dg_tile_is_auto(&s->tile) && device_sm == 90 && s->arch == 90 &&
	    !s->arch_specific &&
	    (s->op == DG_OP_LOWRANK_FWD || s->op == DG_OP_DECODER_FWD)) {
		/* sm_90a where its default tile takes the wgmma path */
		dg_spec a = *s;
		long sm;
		a.arch_specific = true;
		dg_spec_default_tile(&a, &a.tile);
		if (wgmma_fits(&a, &a.tile, &sm)) {
			*s = a;
			return;
		}
	}
	dg_spec_default_tile(s, &s->tile);
}
