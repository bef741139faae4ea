/*
 * The quantize family: activations (quantize_act, templates/quantize.lua)
 * and weights (quantize_weight, templates/qweight.lua). Each runs three
 * launches: per-block partial sums of |x| (in the caller's workspace), the
 * scale from them in a fixed order, then the codes.
 *
 * quantize_act's partial blocks are a few an SM: the partials are
 * deterministic for a given grid, which depends only on n and the device.
 * quantize_weight's depend only on the size of w (about 16 loads a
 * thread), so its scale is the same on every device; it equals
 * dg_ref_quantize_weight's except when the exact double sum falls within
 * ~1e-15 relative of a float rounding boundary (then it is one ulp away),
 * and the codes are exactly the reference's codes for that scale.
 *
 * A scale a row (ascale=token, wscale=channel) is one launch instead
 * (templates/qrows.lua): a warp a row for short rows, a block a row for
 * long ones, each computing its row's max|x| (or Σ|w|) in a fixed order,
 * its scale, then its codes; codes->scale points to one float a row.
 */
#include <stdint.h>
#include <stdio.h>

#include "runtime/ops/ops_int.h"

#define QW_MAX_PARTIALS 1024 /* blocks of quantize_weight's absum pass */

/* The three kernels of a quantizer and their threads a block. */
static dg_status kernels(dg_device *dev, const dg_spec *spec, const char *prefix,
			 dg_kernel *k[3], int *nt)
{
	static const char *const suffix[3] = { "_absum", "_scale", "_apply" };
	char entry[64];

	for (int i = 0; i < 3; i++) {
		snprintf(entry, sizeof(entry), "%s%s", prefix, suffix[i]);
		dg_status st = dg_kernel_get(dev, spec, entry, &k[i]);
		if (st)
			return st;
	}
	*nt = dg_kernel_spec(k[0])->tile.threads;
	return DG_OK;
}

static dg_launch flat(unsigned grid, int threads)
{
	dg_launch l = { { grid, 1, 1 }, { (unsigned)threads, 1, 1 }, 0 };
	return l;
}

/* The partial blocks of n values: quantize_act's or quantize_weight's rule. */
static unsigned partial_blocks(dg_device *dev, const dg_spec *spec, long long n, int nt)
{
	const long long ve = spec->src == DG_FMT_BF16 ? 8 : 4; /* values a 16-byte load */
	if (spec->op == DG_OP_QUANTIZE_ACT) {
		int sms = dg__dev_info(dev)->sm_count;
		return dg__op_grid(n, (long long)nt * ve, 4LL * (sms > 0 ? sms : 1));
	}
	return dg__op_grid(n / ve / 16 + 1, nt, QW_MAX_PARTIALS);
}

/* A scale a row (ascale=token, wscale=channel): one launch of a rows
 * entry, no workspace. The rows: a token (b, t) of a (B, G, T, C)
 * activation over its G heads, or a row of the weight's last dimension. */
static bool by_rows(const dg_spec *spec)
{
	return spec->op == DG_OP_QUANTIZE_ACT ? spec->ascale == DG_SCALE_TOKEN
					      : spec->wscale == DG_SCALE_CHANNEL;
}

/* Rows of at most this many values run the _rows_warp entry (a warp a
 * row, which keeps up to 2048 bf16 or 512 f32 values in registers), longer
 * ones _rows (a block a row: 256 threads keep 32768 bf16). At the BDH
 * shapes the x and a tokens (256 values) take the warp entry and the xy
 * token (4 × 8192) the block entry. The activations' bf16 tokens take the
 * warp entry up to the 2048 its lanes keep (ROWS_WARP_MAX_BF16: at 1B, D
 * 1280, the a tokens — 16 heads × 1024 rows a layer — ran a block a row,
 * 1.7 ms of the w8a8 step's quantize_act); their max is the same bits by
 * either entry. */
#define ROWS_WARP_MAX 1024
#define ROWS_WARP_MAX_BF16 2048

/* Rows of a vector a lane at most that the warp entry's warps take at a
 * time (templates/qrows.lua WR): the grid gives each warp that many. */
#define ROWS_WARP_AT_ONCE 2

/* The longest row a rows entry takes: its element loops count in int. */
#define ROWS_MAX_VALUES (1LL << 30)

static bool rows_warp(const dg_spec *spec, long long values)
{
	const bool bf16_act = spec->op == DG_OP_QUANTIZE_ACT && spec->src == DG_FMT_BF16;
	return values <= (bf16_act ? ROWS_WARP_MAX_BF16 : ROWS_WARP_MAX);
}

const char *dg__quantize_rows_entry(const dg_spec *spec, long long values)
{
	bool act = spec->op == DG_OP_QUANTIZE_ACT;
	if (rows_warp(spec, values))
		return act ? "dg_quantize_act_rows_warp" : "dg_quantize_weight_rows_warp";
	return act ? "dg_quantize_act_rows" : "dg_quantize_weight_rows";
}

/* Blocks of k (nt threads) an SM can hold at once: by registers (a
 * register file of regs_per_block, allocated 8 a thread at a time), by
 * shared memory (the plan's dynamic and the cubin's static, 1 KiB a block
 * reserved) and by threads (2048 an SM); at least 1. */
static long long resident_blocks(dg_device *dev, const dg_kernel *k, int nt)
{
	const dg_device_info *di = dg__dev_info(dev);
	dg_kernel_info ki;
	long long n = 2048 / (nt > 0 ? nt : 1);
	if (dg_kernel_info_get(k, &ki) != DG_OK)
		return 1;
	long long regs = ((long long)ki.regs + 7) / 8 * 8 * nt;
	if (regs > 0 && di->regs_per_block > 0 && di->regs_per_block / regs < n)
		n = di->regs_per_block / regs;
	long long smem = (long long)ki.dyn_smem + ki.static_smem + 1024;
	if (di->smem_optin > 0 && (di->smem_optin + 1024) / smem < n)
		n = (di->smem_optin + 1024) / smem;
	return n > 0 ? n : 1;
}

/* The rows entry's launch: rows (long long), G, T and C (int), the
 * scales (one a row) and the codes. */
static dg_status prep_rows(dg_prepared *p, const dg__op_call *c)
{
	const dg_spec *spec = &p->spec;
	const dg_tensor *x = c->t[0];
	long long rows, G = 1, T = 1, C = x->shape[x->ndim - 1];
	dg_kernel *k;

	if (spec->op == DG_OP_QUANTIZE_ACT) { /* x is 4-D: check() saw to it */
		rows = x->shape[0] * x->shape[2];
		G = x->shape[1];
		T = x->shape[2];
	} else {
		rows = C ? dg_tensor_numel(x) / C : 0;
	}
	if (T > INT32_MAX || C > ROWS_MAX_VALUES || G > ROWS_MAX_VALUES || G * C > ROWS_MAX_VALUES)
		return dg__dev_fail(p->dev, DG_ERR_INVALID_ARG,
				    "%s: %s: rows of %lld × %lld values, at most %lld a row%s", p->fn,
				    x->name ? x->name : "x", G, C, ROWS_MAX_VALUES,
				    T > INT32_MAX ? " and 2^31 - 1 tokens a batch" : "");
	dg_status st = dg_kernel_get(p->dev, spec, dg__quantize_rows_entry(spec, G * C), &k);
	if (st || rows == 0)
		return st;
	const int nt = dg_kernel_spec(k)->tile.threads, sms = dg__dev_info(p->dev)->sm_count;
	/* rows a block: the warp entry's warps a row each, or
	 * ROWS_WARP_AT_ONCE rows each where a row is a vector a lane at most
	 * (templates/qrows.lua WR; this only sizes the grid) */
	const long long ve = spec->src == DG_FMT_BF16 ? 8 : 4;
	const long long per_warp = C % ve == 0 && G * C <= 32 * ve ? ROWS_WARP_AT_ONCE : 1;
	const long long per_block = rows_warp(spec, G * C) ? nt / 32 * per_warp : 1;
	/* the block entry: one block a row slot that stays resident (its stage
	 * prefetches the block's next row), the warp entry as many as fit */
	const long long blocks = rows_warp(spec, G * C) ? 32 : resident_blocks(p->dev, k, nt);
	dg_launch l = flat(dg__op_grid(rows, per_block, blocks * (sms > 0 ? sms : 1)), nt);
	dg__prep_launch *L = dg__prep_add(p, k, &l, &st);
	if (!L)
		return st;
	dg__arg_data(p, L, 0);  /* x */
	dg__arg_i64(p, L, rows);
	dg__arg_i32(p, L, G);
	dg__arg_i32(p, L, T);
	dg__arg_i32(p, L, C);
	dg__arg_scale(p, L, 1); /* scales: one a row */
	dg__arg_data(p, L, 1);  /* codes */
	return DG_OK;
}

/* The op table's check (x of any shape, codes of x's), then quantize_act's
 * own rule: ascale=token's rows are tokens (b, t) over the G heads of a
 * (B, G, T, C) x, so any other rank is refused here, where the FFI's and
 * the typed _check see it, not only at the launch. quantize_weight's
 * channel rows are any shape's last dimension: the table's check alone. */
dg_status dg__check_quantize_act(const dg_spec *spec, const dg__op_call *c, char *msg,
				 size_t size)
{
	static const char fn[] = "dg_quantize_act";
	char local[512];
	if (!msg || !size) {
		msg = local;
		size = sizeof(local);
	}
	dg_status st = dg__op_check(spec, DG_OP_QUANTIZE_ACT, fn, c, NULL, msg, size);
	if (st || spec->ascale != DG_SCALE_TOKEN)
		return st;
	const dg_tensor *x = c->t[0];
	if (x->ndim != 4) {
		snprintf(msg, size,
			 "%s: x: ascale=token reads a (B, G, T, C) tensor, a token (b, t) over its G heads; got %d dimensions",
			 fn, x->ndim);
		return DG_ERR_INVALID_ARG;
	}
	return DG_OK;
}

/* Either quantizer: the rows entry, or the three launches over the
 * partials in the workspace (one a block: float for activations, double
 * for weights). */
static dg_status prep(dg_prepared *p, const dg__op_call *c)
{
	const dg_spec *spec = &p->spec;
	const bool act = spec->op == DG_OP_QUANTIZE_ACT;
	dg_kernel *k[3];
	int nt;

	if (by_rows(spec))
		return prep_rows(p, c); /* a block a row: no partials */
	dg_status st = kernels(p->dev, spec, act ? "dg_quantize_act" : "dg_quantize_weight", k, &nt);
	if (st)
		return st;
	long long n = p->shape.n;
	unsigned g = partial_blocks(p->dev, spec, n, nt);
	p->ws_bytes = (size_t)g * (act ? sizeof(float) : sizeof(double));

	/* the partials: x, n, partials */
	dg_launch l = flat(g, nt);
	dg__prep_launch *L = dg__prep_add(p, k[0], &l, &st);
	if (!L)
		return st;
	dg__arg_data(p, L, 0);
	dg__arg_i64(p, L, n);
	dg__arg_ws(p, L, 0);

	/* the scale: partials, n_partials (int), n, scale */
	l = flat(1, nt);
	if (!(L = dg__prep_add(p, k[1], &l, &st)))
		return st;
	dg__arg_ws(p, L, 0);
	dg__arg_i32(p, L, g);
	dg__arg_i64(p, L, n);
	dg__arg_scale(p, L, 1);

	/* the codes: x, n, scale, codes */
	const long long ve = spec->src == DG_FMT_BF16 ? 8 : 4;
	const int sms = dg__dev_info(p->dev)->sm_count;
	l = act ? flat(dg__op_grid(n, (long long)nt * ve, 16LL * (sms > 0 ? sms : 1)), nt)
		: flat(dg__op_grid(n / ve + 1, nt, 8LL * sms), nt);
	if (!(L = dg__prep_add(p, k[2], &l, &st)))
		return st;
	dg__arg_data(p, L, 0);
	dg__arg_i64(p, L, n);
	dg__arg_scale(p, L, 1);
	dg__arg_data(p, L, 1);
	return DG_OK;
}

/* ---- quantize_act, quantize_weight ------------------------------------------ */

dg_status dg__prep_quantize_act(dg_prepared *p, const dg__op_call *c)
{
	return prep(p, c);
}

dg_status dg__prep_quantize_weight(dg_prepared *p, const dg__op_call *c)
{
	return prep(p, c);
}
