/*
 * Ops: weight quantize and the ternary / sign1 storage packers
 * (dragon/ops.h: dg_quantize_weight, dg_pack_weight), kernels from
 * templates/qweight.lua.
 *
 * quantize_weight runs three launches: per-block partial sums of |w| in
 * double (device scratch slot 0, one double a block), the scale from
 * them in a fixed order, then the codes. The number of partial blocks
 * depends only on the size of w, so the scale is the same on every device;
 * it equals dg_ref_quantize_weight's except when the exact double sum
 * falls within ~1e-15 relative of a float rounding boundary (then it is
 * one ulp away), and the codes are exactly the reference's codes for that
 * scale.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dragon/ops.h"
#include "dragon/spec.h"
#include "dragon/tensor.h"
#include "runtime/gpu/gpu_int.h"

#define MAX_PARTIALS 1024 /* blocks of the absum pass */

static dg_status spec_ok(const dg_spec *spec, bool pack, char *msg,
			 size_t size)
{
	if (!spec) {
		snprintf(msg, size, "spec is NULL");
		return DG_ERR_INVALID_SPEC;
	}
	if (pack ? spec->op != DG_OP_PACK_TERNARY && spec->op != DG_OP_PACK_SIGN1
		 : spec->op != DG_OP_QUANTIZE_WEIGHT) {
		snprintf(msg, size, "op=%s: this call runs op %s",
			 dg_op_name(spec->op),
			 pack ? "pack_ternary or pack_sign1" : "quantize_weight");
		return DG_ERR_INVALID_SPEC;
	}
	return dg_spec_validate(spec, msg, size);
}

/* The kernel `entry` of spec and its threads a block, read back from the
 * loaded kernel's canonical spec (the JIT resolves an auto tile). */
static dg_status kernel_get(dg_device *dev, const dg_spec *spec,
			    const char *entry, dg_kernel **k, int *threads)
{
	dg_kernel_info info;
	dg_spec ks;
	char msg[256];
	dg_status st = dg_kernel_get(dev, spec, entry, k);

	if (st)
		return st;
	memset(&info, 0, sizeof(info));
	st = dg_kernel_info_get(*k, &info);
	if (st == DG_OK)
		st = dg_spec_parse(info.canonical, &ks, msg, sizeof(msg));
	if (st || ks.tile.threads < 32 || ks.tile.threads > 1024)
		return dg__dev_fail(dev, DG_ERR_INTERNAL,
				    "%s: the loaded kernel's threads cannot be read back from '%s'",
				    entry, info.canonical);
	*threads = ks.tile.threads;
	return DG_OK;
}

static unsigned grid_for(int64_t units, int threads, int64_t cap)
{
	int64_t g = (units + threads - 1) / threads;

	if (g < 1)
		g = 1;
	if (g > cap)
		g = cap;
	return (unsigned)g;
}

static dg_launch flat_launch(unsigned grid, int threads)
{
	dg_launch l;

	memset(&l, 0, sizeof(l));
	l.grid[0] = grid;
	l.grid[1] = l.grid[2] = 1;
	l.block[0] = (unsigned)threads;
	l.block[1] = l.block[2] = 1;
	return l;
}

/* ---- quantize_weight ------------------------------------------------------ */

dg_status dg_quantize_weight_check(const dg_spec *spec, const dg_tensor *w,
				   const dg_tensor *codes, char *msg,
				   size_t msg_size)
{
	char local[512];
	dg_status st;

	if (!msg || !msg_size) { /* the caller wants no message */
		msg = local;
		msg_size = sizeof(local);
	}
	st = spec_ok(spec, false, msg, msg_size);
	if (st)
		return st;
	st = dg_tensor_expect(w, "w", spec->src, w ? w->ndim : 1, NULL, false,
			      msg, msg_size);
	if (st)
		return st;
	return dg_tensor_expect(codes, "codes", DG_FMT_INT8, w->ndim, w->shape,
				true, msg, msg_size);
}

dg_status dg_quantize_weight(dg_device *dev, const dg_spec *spec,
			     const dg_tensor *w, const dg_tensor *codes)
{
	char msg[512];
	dg_status st = dg_quantize_weight_check(spec, w, codes, msg, sizeof(msg));

	if (st)
		return dg__dev_fail_msg(dev, st, msg);
	dg_kernel *k1 = NULL, *k2 = NULL, *k3 = NULL;
	int nt = 0;
	long long n = (long long)dg_tensor_numel(w);
	int ve = spec->src == DG_FMT_BF16 ? 8 : 4; /* values a 16-byte load */
	dg_dptr partials = 0;

	st = kernel_get(dev, spec, "dg_quantize_weight_absum", &k1, &nt);
	if (!st)
		st = kernel_get(dev, spec, "dg_quantize_weight_scale", &k2, &nt);
	if (!st)
		st = kernel_get(dev, spec, "dg_quantize_weight_apply", &k3, &nt);
	if (st)
		return st;
	/* Partial blocks from the size alone (about 16 loads a thread), so
	 * the partials, and the scale, do not depend on the device. */
	unsigned g = grid_for(n / ve / 16 + 1, nt, MAX_PARTIALS);
	int n_partials = (int)g;

	st = dg__dev_scratch(dev, 0, (size_t)g * sizeof(double), &partials);
	if (st)
		return st;
	dg_dptr wp = w->data, cp = codes->data, sp = codes->scale;

	dg_launch l = flat_launch(g, nt);
	void *a1[] = { &wp, &n, &partials };
	st = dg_kernel_launch(dev, k1, &l, a1);
	if (st)
		return st;
	l = flat_launch(1, nt);
	void *a2[] = { &partials, &n_partials, &n, &sp };
	st = dg_kernel_launch(dev, k2, &l, a2);
	if (st)
		return st;
	l = flat_launch(grid_for(n / ve + 1, nt,
				 8 * (int64_t)dg__dev_info(dev)->sm_count),
			nt);
	void *a3[] = { &wp, &n, &sp, &cp };
	return dg_kernel_launch(dev, k3, &l, a3);
}

/* ---- pack_ternary / pack_sign1 -------------------------------------------- */

dg_status dg_pack_weight_check(const dg_spec *spec, const dg_tensor *codes,
			       const dg_tensor *packed, bool unpack,
			       char *msg, size_t msg_size)
{
	char local[512];
	dg_status st;
	(void)unpack; /* the same shapes either way */

	if (!msg || !msg_size) { /* the caller wants no message */
		msg = local;
		msg_size = sizeof(local);
	}
	st = spec_ok(spec, true, msg, msg_size);
	if (st)
		return st;
	/* (R, K) with K = embd, the packed axis last. */
	int64_t shape[2] = { -1, spec->embd };
	dg_fmt pf = spec->op == DG_OP_PACK_TERNARY ? DG_FMT_TERNARY
						   : DG_FMT_SIGN1;
	st = dg_tensor_expect(codes, "codes", DG_FMT_INT8, 2, shape, false, msg,
			      msg_size);
	if (st)
		return st;
	shape[0] = codes->shape[0];
	return dg_tensor_expect(packed, "packed", pf, 2, shape, false, msg,
				msg_size);
}

dg_status dg_pack_weight(dg_device *dev, const dg_spec *spec,
			 const dg_tensor *codes, const dg_tensor *packed,
			 bool unpack)
{
	char msg[512];
	dg_status st = dg_pack_weight_check(spec, codes, packed, unpack, msg,
					    sizeof(msg));

	if (st)
		return dg__dev_fail_msg(dev, st, msg);
	bool tern = spec->op == DG_OP_PACK_TERNARY;
	long long rows = (long long)codes->shape[0];
	int64_t words = rows * (spec->embd / (tern ? 16 : 32));
	const char *entry = tern ? (unpack ? "dg_unpack_ternary" : "dg_pack_ternary")
				 : (unpack ? "dg_unpack_sign1" : "dg_pack_sign1");
	dg_kernel *k = NULL;
	int nt = 0;

	if (words == 0)
		return DG_OK;
	st = kernel_get(dev, spec, entry, &k, &nt);
	if (st)
		return st;
	dg_launch l = flat_launch(grid_for(words, nt,
					   8 * (int64_t)dg__dev_info(dev)->sm_count),
				  nt);
	dg_dptr c = codes->data, p = packed->data;
	void *args[3] = { unpack ? (void *)&p : (void *)&c,
			  unpack ? (void *)&c : (void *)&p, &rows };
	return dg_kernel_launch(dev, k, &l, args);
}
