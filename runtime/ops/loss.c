/*
 * The loss family: lm_head and softmax cross-entropy fused (lmhead_ce,
 * templates/loss.lua). Three launches: the fused kernel (a block a few
 * rows: logits in shared memory, the row losses, and with backward
 * dlogits and dx), the mean of the row losses in a fixed order, and with
 * backward the dw GEMM over dlogits (with splits of R a fourth: their sum
 * in order). Nothing uses atomics: the loss, dx
 * and dw are bitwise the same run to run, on any device of the same arch.
 *
 * Workspace (caller-owned, dg_lmhead_ce_workspace): the row losses, R
 * floats, then (backward) dlogits (R, V) in f32, or bf16 when src is bf16,
 * then (backward, dw_splits > 1) the dw GEMM's parts (splits, E, V) f32,
 * each part 256-byte aligned. Its size depends on R, E, V, src and
 * backward only, so _check judges it without a device.
 *
 * A large vocabulary takes the tensor-core path instead (prep_tc, below;
 * templates/loss_tc.lua): x and w cast to bf16, the lm_head GEMM twice
 * (the softmax's statistics, then dlogits in bf16), dx and dw GEMMs.
 *
 * And a decoder's logits (lmhead_logits, templates/logits.lua): x·w into
 * global memory, each sum in double in a fixed order, no workspace.
 */
#include <stdio.h>

#include "runtime/ops/ops_int.h"

#define FN "dg_lmhead_ce"

/* Bytes of the row losses (the dlogits follow them). */
static size_t loss_bytes(int64_t rows)
{
	return dg__op_align256((size_t)rows * sizeof(float));
}

/* The dw GEMM's splits of R (templates/loss.lua): chunks of 128 rows a
 * split, at most 32, and parts (splits, E, V) f32 of at most 16 Mi floats;
 * 1 (dw written directly) where that leaves one. From R, E and V alone, so
 * dw's sums have the same order on any device. */
static int dw_splits(const dg_spec *s, int64_t rows)
{
	int64_t ev = (int64_t)s->embd * s->vocab;
	int64_t n = (rows + 127) / 128;
	if (n > 32)
		n = 32;
	if (ev > 0 && n > (16LL << 20) / ev)
		n = (16LL << 20) / ev;
	return n < 2 ? 1 : (int)n;
}

/* Bytes of the row losses and (backward) dlogits, each part 256-byte
 * aligned; the dw parts follow where dw_splits > 1. */
static size_t dlogits_bytes(const dg_spec *s, int64_t rows)
{
	return dg__op_align256((size_t)rows * (size_t)s->vocab * (s->src == DG_FMT_BF16 ? 2 : 4));
}

/* ---- the tensor-core path (templates/loss_tc.lua) ---------------------------
 * Taken for a large vocabulary, by loss_tc.lua's rule (M.applies): E a
 * multiple of 8, and V >= 4096 for a bf16 x, V > 50304 for an f32 x.
 * Workspace, each part 256-byte aligned: the row losses, (backward)
 * dlogits (R, VP) bf16, the logits' statistics (R, NTV) float2, lse (R),
 * the target's logit (R), xb (R, E) and wb (E, VP) bf16, and (backward,
 * splits > 1) dx's parts (splits, R, E) f32. VP is V rounded up to 8, NTV
 * the 128-column tiles of a row. */
static bool tc_path(const dg_spec *s)
{
	if (s->embd % 8)
		return false;
	return s->src == DG_FMT_BF16 ? s->vocab >= 4096 : s->vocab > 50304;
}

typedef struct tc_layout {
	int64_t vp, ntv;
	int splits; /* dx's splits of its K tiles (VP / 32) */
	size_t dlogits, stats, lse, zt, xb, wb, parts, total;
} tc_layout;

/* dx has ceil(R/128)·ceil(E/128) tiles and a long K (VP): splits of K, in
 * order, for two waves of 132 SMs, at most 16 and at least 16 K tiles a
 * split. From R, E and V alone, so dx is the same bits on any device. */
static int dx_splits(int64_t rows, int E, int64_t vp)
{
	long long blocks = dg__op_cdiv(rows, 128) * dg__op_cdiv(E, 128);
	long long kt = dg__op_cdiv(vp, 32), sp = 264 / blocks;
	if (sp > 16)
		sp = 16;
	if (sp > kt / 16)
		sp = kt / 16;
	return sp < 2 ? 1 : (int)sp;
}

static tc_layout tc_of(const dg_spec *s, int64_t rows, bool backward)
{
	tc_layout L = { .vp = (s->vocab + 7) / 8 * 8, .ntv = dg__op_cdiv(s->vocab, 128), .splits = 1 };
	const size_t r = (size_t)rows, e = (size_t)s->embd;
	size_t off = loss_bytes(rows);
	if (backward) {
		L.dlogits = off;
		off += dg__op_align256(r * (size_t)L.vp * 2);
	}
	L.stats = off;
	off += dg__op_align256(r * (size_t)L.ntv * 8);
	L.lse = off;
	off += dg__op_align256(r * 4);
	L.zt = off;
	off += dg__op_align256(r * 4);
	L.xb = off;
	off += dg__op_align256(r * e * 2);
	L.wb = off;
	off += dg__op_align256(e * (size_t)L.vp * 2);
	if (backward)
		L.splits = dx_splits(rows, s->embd, L.vp);
	if (L.splits > 1) {
		L.parts = off;
		off += dg__op_align256((size_t)L.splits * r * e * 4);
	}
	L.total = off;
	return L;
}

static size_t ws_need(const dg_spec *s, int64_t rows, bool backward)
{
	if (tc_path(s))
		return tc_of(s, rows, backward).total;
	if (!backward)
		return loss_bytes(rows);
	int sp = dw_splits(s, rows);
	size_t parts = sp > 1 ? (size_t)sp * (size_t)s->embd * (size_t)s->vocab * sizeof(float) : 0;
	return loss_bytes(rows) + dlogits_bytes(s, rows) + dg__op_align256(parts);
}

/* The call's own pointers: bad (an int32) and grad_scale (a float),
 * 4-byte aligned or 0. */
static dg_status ptrs_ok(const dg__op_call *c, char *msg, size_t size)
{
	if (c->bad % 4) {
		snprintf(msg, size, "%s: bad: pointer 0x%llx is not 4-byte aligned (an int32 on the device)",
			 FN, (unsigned long long)c->bad);
		return DG_ERR_INVALID_ARG;
	}
	if (c->grad_scale % 4) {
		snprintf(msg, size,
			 "%s: grad_scale: pointer 0x%llx is not 4-byte aligned (a float on the device)", FN,
			 (unsigned long long)c->grad_scale);
		return DG_ERR_INVALID_ARG;
	}
	return DG_OK;
}

/* The table's check, then what it cannot say: the backward's tensors, at
 * least one row, bad's alignment, and (with_ws) the workspace. */
static dg_status check(const dg_spec *spec, const dg__op_call *c, bool with_ws, dg__op_shape *shape,
		       char *msg, size_t size)
{
	char local[512];
	dg__op_shape sh;
	if (!msg || !size) {
		msg = local;
		size = sizeof(local);
	}
	dg_status st = dg__op_check(spec, DG_OP_LMHEAD_CE, FN, c, &sh, msg, size);
	if (st)
		return st;
	const dg_op_info *row = dg_op_info_of(DG_OP_LMHEAD_CE);
	for (int i = 4; i < 6; i++) {
		if (c->backward && !c->t[i]) {
			snprintf(msg, size, "%s: missing (expected f32 %s; backward needs it)",
				 row->args[i].name, i == 4 ? "(R, E)" : "(E, V)");
			return DG_ERR_INVALID_ARG;
		}
		if (!c->backward && c->t[i]) {
			snprintf(msg, size, "%s: given without backward (set backward, or pass NULL)",
				 row->args[i].name);
			return DG_ERR_INVALID_ARG;
		}
	}
	if (sh.r < 1) {
		snprintf(msg, size, "targets: 0 rows; the mean loss needs at least one");
		return DG_ERR_INVALID_ARG;
	}
	if ((st = ptrs_ok(c, msg, size)))
		return st;
	if (with_ws) {
		size_t need = ws_need(spec, sh.r, c->backward);
		if (!c->ws.ptr || c->ws.bytes < need) {
			snprintf(msg, size,
				 "ws: %zu bytes of workspace needed, %zu given%s; size it with dg_lmhead_ce_workspace",
				 need, c->ws.ptr ? c->ws.bytes : 0, c->ws.ptr ? "" : " (ptr is 0)");
			return DG_ERR_INVALID_ARG;
		}
		if (c->ws.ptr % 256) {
			snprintf(msg, size, "ws: ptr 0x%llx must be 256-byte aligned",
				 (unsigned long long)c->ws.ptr);
			return DG_ERR_INVALID_ARG;
		}
	}
	if (shape)
		*shape = sh;
	return DG_OK;
}

/* The typed check (checks.h) with the workspace's rule, which needs no
 * device here; dg_lmhead_ce itself is typed.c's one line. */
dg_status dg_lmhead_ce_check(const dg_spec *spec, const dg_lmhead_ce_args *a, char *msg,
			     size_t msg_size)
{
	dg__op_call c = dg__op_call_from_args(DG_OP_LMHEAD_CE, a);
	return check(spec, a ? &c : NULL, true, NULL, msg, msg_size);
}

/* Without the workspace, as dg_lmhead_ce_workspace checks: a device-free
 * check (the FFI's, the prepare's) comes before the workspace is sized and
 * given, and a launch still refuses a short one. */
dg_status dg__check_lmhead_ce(const dg_spec *spec, const dg__op_call *c, char *msg,
			      size_t msg_size)
{
	return check(spec, c, false, NULL, msg, msg_size);
}

/* The pointer rules at every launch of a prepared op (the check's, for
 * the launch's own bad and grad_scale). */
static dg_status ptrs(const dg_prepared *p, const dg__op_call *c, char *msg, size_t size)
{
	(void)p;
	return ptrs_ok(c, msg, size);
}

/*
 * The fused kernel: x, w, targets, row_loss (ws), dlogits (ws past the
 * row losses), dx, rows (long long), inv_rows (float), grad_scale,
 * backward (int), bad; dlogits, dx and grad_scale 0 without backward.
 * The mean: row_loss, rows, loss. With backward the dw GEMM: x, dlogits,
 * dw or the parts, rows, splits (int), accumulate (int); with splits > 1
 * their sum: parts, dw, splits, accumulate.
 */
/* The tensor-core path's launches (templates/loss_tc.lua): the casts to
 * bf16; the logits' statistics; lse and the row losses; their mean; with
 * backward dlogits, dx (and its splits' sum), dw. */
static dg_status prep_tc(dg_prepared *p, const dg__op_call *c)
{
	dg_device *dev = p->dev;
	const dg_spec *spec = &p->spec;
	static const char *const entries[8] = { FN "_cast",    FN,       FN "_rows",   FN "_loss",
						FN "_dlogits", FN "_dx", FN "_dx_sum", FN "_dw" };
	const long long rows = p->shape.r, E = spec->embd;
	if (dg__op_cdiv(rows, 128) > 65535) /* the row tiles are grid y */
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, FN ": %lld rows: at most %d on the tensor-core path",
				    rows, 65535 * 128);
	dg_kernel *k[8];
	dg_status st;
	for (int i = 0; i < 8; i++)
		if ((st = dg_kernel_get(dev, spec, entries[i], &k[i])))
			return st;
	const bool backward = c->backward;
	const tc_layout T = tc_of(spec, rows, backward);
	const int sms = dg__dev_info(dev)->sm_count > 0 ? dg__dev_info(dev)->sm_count : 1;
	const unsigned rt = (unsigned)dg__op_cdiv(rows, 128);
	p->ws_bytes = T.total;
	p->ptrs = ptrs;

	dg_launch l = { { dg__op_grid(rows * E + E * T.vp, 256, 64LL * sms), 1, 1 }, { 0, 0, 0 }, 0 };
	dg__prep_launch *L = dg__prep_add(p, k[0], &l, &st);
	if (!L)
		return st;
	dg__arg_data(p, L, 0); /* x */
	dg__arg_data(p, L, 1); /* w */
	dg__arg_ws(p, L, (int64_t)T.xb);
	dg__arg_ws(p, L, (int64_t)T.wb);
	dg__arg_i64(p, L, rows);

	dg_launch lz = { { (unsigned)T.ntv, rt, 1 }, { 0, 0, 0 }, 0 };
	if (!(L = dg__prep_add(p, k[1], &lz, &st)))
		return st;
	dg__arg_ws(p, L, (int64_t)T.xb);
	dg__arg_ws(p, L, (int64_t)T.wb);
	dg__arg_data(p, L, 2); /* targets */
	dg__arg_ws(p, L, (int64_t)T.stats);
	dg__arg_ws(p, L, (int64_t)T.zt);
	dg__arg_i64(p, L, rows);

	dg_launch lr = { { dg__op_grid(rows, 8, 64LL * sms), 1, 1 }, { 0, 0, 0 }, 0 };
	if (!(L = dg__prep_add(p, k[2], &lr, &st)))
		return st;
	dg__arg_ws(p, L, (int64_t)T.stats);
	dg__arg_ws(p, L, (int64_t)T.zt);
	dg__arg_data(p, L, 2);
	dg__arg_ws(p, L, 0); /* row_loss */
	dg__arg_ws(p, L, (int64_t)T.lse);
	dg__arg_i64(p, L, rows);
	DG__ARG_OF(p, L, bad);

	dg_launch l1 = { { 1, 1, 1 }, { 0, 0, 0 }, 0 };
	if (!(L = dg__prep_add(p, k[3], &l1, &st)))
		return st;
	dg__arg_ws(p, L, 0);
	dg__arg_i64(p, L, rows);
	dg__arg_data(p, L, 3); /* loss */
	if (!backward)
		return DG_OK;

	if (!(L = dg__prep_add(p, k[4], &lz, &st)))
		return st;
	dg__arg_ws(p, L, (int64_t)T.xb);
	dg__arg_ws(p, L, (int64_t)T.wb);
	dg__arg_data(p, L, 2);
	dg__arg_ws(p, L, (int64_t)T.lse);
	dg__arg_ws(p, L, (int64_t)T.dlogits);
	dg__arg_i64(p, L, rows);
	dg__arg_f32(p, L, (float)(1.0 / (double)rows));
	DG__ARG_OF(p, L, grad_scale);

	dg_launch lx = { { (unsigned)dg__op_cdiv(E, 128), rt, (unsigned)T.splits }, { 0, 0, 0 }, 0 };
	if (!(L = dg__prep_add(p, k[5], &lx, &st)))
		return st;
	dg__arg_ws(p, L, (int64_t)T.dlogits);
	dg__arg_ws(p, L, (int64_t)T.wb);
	if (T.splits > 1)
		dg__arg_ws(p, L, (int64_t)T.parts);
	else
		dg__arg_data(p, L, 4); /* dx */
	dg__arg_i64(p, L, rows);
	dg__arg_i32(p, L, T.splits);
	if (T.splits > 1) {
		dg_launch ls = { { dg__op_grid(rows * E, 256, 64LL * sms), 1, 1 }, { 0, 0, 0 }, 0 };
		if (!(L = dg__prep_add(p, k[6], &ls, &st)))
			return st;
		dg__arg_ws(p, L, (int64_t)T.parts);
		dg__arg_data(p, L, 4);
		dg__arg_i64(p, L, rows);
		dg__arg_i32(p, L, T.splits);
	}

	dg_launch lw = { { (unsigned)T.ntv, (unsigned)dg__op_cdiv(E, 128), 1 }, { 0, 0, 0 }, 0 };
	if (!(L = dg__prep_add(p, k[7], &lw, &st)))
		return st;
	dg__arg_ws(p, L, (int64_t)T.xb);
	dg__arg_ws(p, L, (int64_t)T.dlogits);
	dg__arg_data(p, L, 5); /* dw */
	dg__arg_i64(p, L, rows);
	DG__FLAG_OF(p, L, accumulate);
	return DG_OK;
}

dg_status dg__prep_lmhead_ce(dg_prepared *p, const dg__op_call *c)
{
	if (tc_path(&p->spec))
		return prep_tc(p, c);
	dg_device *dev = p->dev;
	const dg_spec *spec = &p->spec;
	dg_kernel *k[4];
	static const char *const entries[4] = { FN, FN "_loss", FN "_dw", FN "_dw_sum" };
	dg_status st;

	p->ptrs = ptrs;
	for (int i = 0; i < 4; i++)
		if ((st = dg_kernel_get(dev, spec, entries[i], &k[i])))
			return st;
	dg_kernel_info info;
	if ((st = dg_kernel_info_get(k[0], &info)))
		return st;
	/* the template's dynamic shared memory is BR rows of E + V floats */
	int br = info.dyn_smem / (4 * (spec->embd + spec->vocab));
	if (br < 1)
		return dg__dev_fail(dev, DG_ERR_INTERNAL, FN ": the kernel asks for %d bytes of shared memory, less than a row",
				    info.dyn_smem);
	int nt = dg_kernel_spec(k[0])->tile.threads;
	int sms = dg__dev_info(dev)->sm_count;
	long long rows = p->shape.r;
	float inv_rows = (float)(1.0 / (double)rows);
	const bool backward = c->backward;
	p->ws_bytes = ws_need(spec, rows, backward);

	dg_launch l = { { dg__op_grid(rows, br, 64LL * (sms > 0 ? sms : 1)), 1, 1 },
			{ (unsigned)nt, 1, 1 }, 0 };
	dg__prep_launch *L = dg__prep_add(p, k[0], &l, &st);
	if (!L)
		return st;
	dg__arg_data(p, L, 0); /* x */
	dg__arg_data(p, L, 1); /* w */
	dg__arg_data(p, L, 2); /* targets */
	dg__arg_ws(p, L, 0);   /* row_loss */
	if (backward) {
		dg__arg_ws(p, L, (int64_t)loss_bytes(rows)); /* dlogits */
		dg__arg_data(p, L, 4);                        /* dx */
	} else {
		dg__arg_i64(p, L, 0);
		dg__arg_i64(p, L, 0);
	}
	dg__arg_i64(p, L, rows);
	dg__arg_f32(p, L, inv_rows);
	if (backward)
		DG__ARG_OF(p, L, grad_scale);
	else
		dg__arg_i64(p, L, 0);
	DG__FLAG_OF(p, L, backward);
	DG__ARG_OF(p, L, bad);

	dg_launch l2 = { { 1, 1, 1 }, { (unsigned)nt, 1, 1 }, 0 };
	if (!(L = dg__prep_add(p, k[1], &l2, &st)))
		return st;
	dg__arg_ws(p, L, 0); /* row_loss */
	dg__arg_i64(p, L, rows);
	dg__arg_data(p, L, 3); /* loss */
	if (!backward)
		return DG_OK;

	/* dw: one block a 32x32 tile and split of R (templates/loss.lua);
	 * with splits the parts, then their sum in order */
	int splits = dw_splits(spec, rows);
	int64_t parts = (int64_t)(loss_bytes(rows) + dlogits_bytes(spec, rows));
	long long tiles = dg__op_cdiv(spec->embd, 32) * dg__op_cdiv(spec->vocab, 32);
	dg_launch l3 = { { dg__op_grid(tiles, 1, 1LL << 30), (unsigned)splits, 1 }, { 0, 0, 0 }, 0 };
	if (!(L = dg__prep_add(p, k[2], &l3, &st)))
		return st;
	dg__arg_data(p, L, 0);                        /* x */
	dg__arg_ws(p, L, (int64_t)loss_bytes(rows)); /* dlogits */
	if (splits > 1)
		dg__arg_ws(p, L, parts); /* the parts */
	else
		dg__arg_data(p, L, 5); /* dw */
	dg__arg_i64(p, L, rows);
	dg__arg_i32(p, L, splits);
	DG__FLAG_OF(p, L, accumulate);
	if (splits == 1)
		return DG_OK;
	int64_t ev = (int64_t)spec->embd * spec->vocab;
	dg_launch l4 = { { dg__op_grid(ev, 256, 64LL * (sms > 0 ? sms : 1)), 1, 1 }, { 0, 0, 0 }, 0 };
	if (!(L = dg__prep_add(p, k[3], &l4, &st)))
		return st;
	dg__arg_ws(p, L, parts);
	dg__arg_data(p, L, 5); /* dw */
	dg__arg_i32(p, L, splits);
	DG__FLAG_OF(p, L, accumulate);
	return DG_OK;
}

/* Without a device: the workspace depends on R, V, src and backward alone
 * (the generic door, dg__op_workspace, prepares the op instead). */
dg_status dg_lmhead_ce_workspace(dg_device *dev, const dg_spec *spec, const dg_lmhead_ce_args *a,
				 size_t *bytes)
{
	char msg[512];
	dg__op_shape sh;

	if (!bytes)
		return dev ? dg__dev_fail(dev, DG_ERR_INVALID_ARG, FN "_workspace: bytes is NULL")
			   : DG_ERR_INVALID_ARG;
	*bytes = 0;
	dg__op_call c = dg__op_call_from_args(DG_OP_LMHEAD_CE, a);
	dg_status st = check(spec, a ? &c : NULL, false, &sh, msg, sizeof(msg));
	if (st)
		return dev ? dg__dev_fail_msg(dev, st, msg) : st;
	*bytes = ws_need(spec, sh.r, c.backward);
	return DG_OK;
}

/* ---- lmhead_logits (templates/logits.lua) -------------------------------------
 * One launch: x, w, logits, rows (long long); a block unit is 4 rows by
 * the tile's columns (the template's BR), units grid-stride. R = 0
 * launches nothing. */
dg_status dg__prep_lmhead_logits(dg_prepared *p, const dg__op_call *c)
{
	(void)c;
	const dg_spec *spec = &p->spec;
	long long rows = p->shape.r;
	if (rows == 0)
		return DG_OK;
	dg_kernel *k;
	dg_status st = dg_kernel_get(p->dev, spec, "dg_lmhead_logits", &k);
	if (st)
		return st;
	int nt = dg_kernel_spec(k)->tile.threads;
	int sms = dg__dev_info(p->dev)->sm_count;
	long long units = dg__op_cdiv(rows, 4) * dg__op_cdiv(spec->vocab, nt);
	dg_launch l = { { dg__op_grid(units, 1, 8LL * (sms > 0 ? sms : 1)), 1, 1 }, { (unsigned)nt, 1, 1 }, 0 };
	dg__prep_launch *L = dg__prep_add(p, k, &l, &st);
	if (!L)
		return st;
	dg__arg_data(p, L, 0); /* x */
	dg__arg_data(p, L, 1); /* w */
	dg__arg_data(p, L, 2); /* logits */
	dg__arg_i64(p, L, rows);
	return DG_OK;
}
