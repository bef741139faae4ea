/*
 * Prepared ops: an op checked, its kernels fetched and its launches laid
 * out once (dg__prepare, registry.c, and the op's dg__prep_<name>), then
 * launched with only the call's tensors compared against the prepared
 * ones. A launch reads each kernel parameter from where the layout says
 * (a tensor's pointer, the workspace, a number fixed at prepare, a scalar
 * of the call) and calls the driver: no spec text, no hash, no lookup.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ops/ops_int.h"

/* ---- the layout (at prepare) ---------------------------------------------- */

dg__prep_launch *dg__prep_add(dg_prepared *p, const dg_kernel *k, const dg_launch *l,
			      dg_status *st)
{
	if (p->n_launch == DG__PREP_LAUNCHES) {
		*st = dg__dev_fail(p->dev, DG_ERR_INTERNAL, "%s: more than %d launches to prepare",
				   p->fn, DG__PREP_LAUNCHES);
		return NULL;
	}
	dg__prep_launch *L = &p->launch[p->n_launch];
	memset(L, 0, sizeof(*L));
	*st = dg__kernel_geometry(p->dev, k, l, &L->l);
	if (*st)
		return NULL;
	L->k = k;
	p->n_launch++;
	return L;
}

static dg__arg *next_arg(dg_prepared *p, dg__prep_launch *L, dg__arg_kind kind)
{
	if (!L || L->n_args == DG__PREP_ARGS) {
		/* refused at prepare (overflow); the write lands in p's own
		 * sink, never in memory another thread's prepare writes */
		p->overflow = true;
		return &p->sink;
	}
	dg__arg *a = &L->args[L->n_args++];
	memset(a, 0, sizeof(*a));
	a->kind = (uint8_t)kind;
	return a;
}

void dg__arg_data(dg_prepared *p, dg__prep_launch *L, int i)
{
	dg__arg_data_at(p, L, i, 0);
}

void dg__arg_data_at(dg_prepared *p, dg__prep_launch *L, int i, int64_t byte_off)
{
	dg__arg *a = next_arg(p, L, DG__ARG_DATA);
	a->i = (uint8_t)i;
	a->imm = byte_off;
}

void dg__arg_scale(dg_prepared *p, dg__prep_launch *L, int i)
{
	next_arg(p, L, DG__ARG_SCALE)->i = (uint8_t)i;
}

void dg__arg_ws(dg_prepared *p, dg__prep_launch *L, int64_t byte_off)
{
	next_arg(p, L, DG__ARG_WS)->imm = byte_off;
}

void dg__arg_i32(dg_prepared *p, dg__prep_launch *L, int64_t v)
{
	if (v < INT32_MIN || v > INT32_MAX)
		p->overflow = true;
	next_arg(p, L, DG__ARG_I32)->imm = v;
}

void dg__arg_i64(dg_prepared *p, dg__prep_launch *L, int64_t v)
{
	next_arg(p, L, DG__ARG_I64)->imm = v;
}

void dg__arg_f32(dg_prepared *p, dg__prep_launch *L, float v)
{
	next_arg(p, L, DG__ARG_F32)->f = v;
}

void dg__arg_field(dg_prepared *p, dg__prep_launch *L, size_t off, size_t size)
{
	dg__arg *a = next_arg(p, L, DG__ARG_FIELD);
	if (size != 4 && size != 8)
		p->overflow = true;
	a->off = (uint16_t)off;
	a->size = (uint16_t)size;
}

void dg__arg_flag(dg_prepared *p, dg__prep_launch *L, size_t off)
{
	next_arg(p, L, DG__ARG_FLAG)->off = (uint16_t)off;
}

void dg__arg_blob(dg_prepared *p, dg__prep_launch *L, const void *bytes, size_t size)
{
	dg__arg *a = next_arg(p, L, DG__ARG_BLOB);
	size_t at = (p->blob_used + 15u) & ~(size_t)15u;
	if (at + size > DG__PREP_BLOB) {
		p->overflow = true;
		return;
	}
	memcpy(p->blob + at, bytes, size);
	a->off = (uint16_t)at;
	a->size = (uint16_t)size;
	p->blob_used = (uint16_t)(at + size);
}

void dg__arg_tmap(dg_prepared *p, dg__prep_launch *L, int which)
{
	next_arg(p, L, DG__ARG_TMAP)->imm = which;
}

bool dg__tma_abi(const dg_kernel *k)
{
	dg_kernel_info info;
	const dg_tile *t = &dg_kernel_spec(k)->tile;
	return dg_kernel_info_get(k, &info) == DG_OK && info.block_threads == t->wm * t->wn * 32 + 128;
}

dg_status dg__tma_rows_tile(dg_prepared *p, const char *entry, int ring_stages, dg_kernel **k)
{
	return dg__ws_rows_tile(p, entry, ring_stages, dg__tma_abi(*k), k);
}

dg_status dg__ws_rows_tile(dg_prepared *p, const char *entry, int ring_stages, bool ws, dg_kernel **k)
{
	if (!ws || p->shape.t % 64 == 0)
		return DG_OK;
	const dg_tile *t = &dg_kernel_spec(*k)->tile;
	if (!dg_tile_is_auto(&p->spec.tile))
		return dg__dev_fail(p->dev, DG_ERR_INVALID_ARG,
				    "%s: T = %lld: the warp-specialized tile (stages %d) reads 64 rows of T a box by TMA, which needs T %% 64 == 0; take a tile of 3 or 4 stages or an auto tile",
				    p->fn, (long long)p->shape.t, t->stages);
	return dg__kernel_retiled(p, *k, (dg_tile){ t->bm, t->bn, t->bk, t->wm, t->wn, ring_stages, 0 }, entry, k);
}

dg_status dg__kernel_retiled(dg_prepared *p, const dg_kernel *k, dg_tile tile, const char *entry, dg_kernel **out)
{
	dg_spec s = *dg_kernel_spec(k);
	s.tile = tile;
	dg_spec_normalize(&s);
	return dg_kernel_get(p->dev, &s, entry, out);
}

/* ---- the call against the prepared one ------------------------------------- */

/* The options that shape a prepared op's launches: its K splits, unpack
 * (the entry) and backward (lmhead_ce's launches). The rest of a call's
 * scalars and optional pointers (dropout, accumulate, the step and loss
 * scale pointers, 0 or not) are read at each launch. */
uint64_t dg__prep_opts(const dg__op_call *c)
{
	uint64_t o = (uint64_t)(c->splits & 0xff);
	o |= (uint64_t)c->unpack << 9;
	o |= (uint64_t)c->backward << 10;
	return o;
}

void dg__prep_sign(dg_prepared *p, const dg__op_call *c)
{
	const dg_op_info *row = dg_op_info_of(p->spec.op);
	p->n_sig = row->n_args;
	for (int i = 0; i < row->n_args; i++) {
		const dg_tensor *t = c->t[i];
		dg__prep_sig *s = &p->sig[i];
		memset(s, 0, sizeof(*s));
		if (!t)
			continue;
		s->given = true;
		s->fmt = t->fmt;
		s->ndim = t->ndim;
		memcpy(s->shape, t->shape, sizeof(s->shape[0]) * (size_t)t->ndim);
		s->scale = row->args[i].scale && dg_fmt_is_code(t->fmt);
	}
	p->opts = dg__prep_opts(c);
}

static const char *arg_name(const dg_prepared *p, int i)
{
	return dg_op_info_of(p->spec.op)->args[i].name;
}

static void shape_text(char *buf, size_t size, int ndim, const int64_t *shape)
{
	size_t n = 0;
	buf[0] = '\0';
	for (int d = 0; d < ndim && n < size; d++) {
		int w = snprintf(buf + n, size - n, "%s%lld", d ? "," : "(", (long long)shape[d]);
		if (w < 0)
			return;
		n += (size_t)w;
	}
	if (n < size)
		snprintf(buf + n, size - n, ")");
}

/* A tensor of c against the prepared one: the message names it. */
static dg_status tensor_ok(const dg_prepared *p, int i, const dg_tensor *t)
{
	const dg__prep_sig *s = &p->sig[i];
	const char *name = t && t->name ? t->name : arg_name(p, i);
	char want[96], got[96];

	if (!t || !s->given) {
		if (!t && !s->given)
			return DG_OK;
		return dg__dev_fail(p->dev, DG_ERR_INVALID_ARG,
				    "%s: %s: %s, but the op was prepared %s it", p->fn, name,
				    t ? "given" : "missing", t ? "without" : "with");
	}
	bool same = t->fmt == s->fmt && t->ndim == s->ndim;
	for (int d = 0; same && d < s->ndim; d++)
		same = t->shape[d] == s->shape[d] && t->stride[d] == 0;
	if (!same) {
		shape_text(want, sizeof(want), s->ndim, s->shape);
		shape_text(got, sizeof(got), t->ndim >= 0 && t->ndim <= DG_TENSOR_MAX_DIMS ? t->ndim : 0,
			   t->shape);
		return dg__dev_fail(p->dev, DG_ERR_INVALID_ARG,
				    "%s: %s: prepared for %s %s (contiguous), got %s %s; prepare the op again for another shape",
				    p->fn, name, dg_fmt_name(s->fmt), want, dg_fmt_name(t->fmt), got);
	}
	if (!t->data || t->data % 16)
		return dg__dev_fail(p->dev, DG_ERR_INVALID_ARG,
				    "%s: %s: data pointer 0x%llx is %s", p->fn, name,
				    (unsigned long long)t->data, t->data ? "not 16-byte aligned" : "0");
	if (s->scale && (!t->scale || t->scale % 4))
		return dg__dev_fail(p->dev, DG_ERR_INVALID_ARG,
				    "%s: %s: %s codes need their scale (a 4-byte aligned float on the device); scale is 0x%llx",
				    p->fn, name, dg_fmt_name(t->fmt), (unsigned long long)t->scale);
	return DG_OK;
}

static dg_status call_ok(const dg_prepared *p, const dg__op_call *c)
{
	dg_status st;

	if (!c)
		return dg__dev_fail(p->dev, DG_ERR_INVALID_ARG, "%s: args is NULL", p->fn);
	for (int i = 0; i < p->n_sig; i++)
		if ((st = tensor_ok(p, i, c->t[i])))
			return st;
	if (dg__prep_opts(c) != p->opts)
		return dg__dev_fail(p->dev, DG_ERR_INVALID_ARG,
				    "%s: the call's splits, unpack or backward differ from the prepared call's; prepare it again",
				    p->fn);
	if (p->ws_bytes) {
		if (!c->ws.ptr || c->ws.bytes < p->ws_bytes)
			return dg__dev_fail(p->dev, DG_ERR_INVALID_ARG,
					    "%s: ws: %zu bytes of workspace needed, %zu given%s", p->fn,
					    p->ws_bytes, c->ws.ptr ? c->ws.bytes : 0,
					    c->ws.ptr ? "" : " (ptr is 0)");
		if (c->ws.ptr % 256)
			return dg__dev_fail(p->dev, DG_ERR_INVALID_ARG,
					    "%s: ws: ptr 0x%llx must be 256-byte aligned", p->fn,
					    (unsigned long long)c->ws.ptr);
	}
	if (p->ptrs) {
		char msg[512];
		st = p->ptrs(p, c, msg, sizeof(msg));
		if (st)
			return dg__dev_fail_msg(p->dev, st, msg);
	}
	return DG_OK;
}

/* ---- the launch ------------------------------------------------------------- */

typedef union arg_val {
	uint64_t u64;
	int64_t i64;
	int32_t i32;
	float f32;
	unsigned char bytes[8];
} arg_val;

dg_status dg__prepared_launch(const dg_prepared *p, const dg__op_call *c)
{
	dg_status st = dg__dev_enter(p->dev);
	if (st)
		return st;
	if ((st = call_ok(p, c)))
		return st;
	dg__tmap maps[DG__PREP_TMAPS];
	bool mapped = false;
	for (int j = 0; j < p->n_launch; j++) {
		const dg__prep_launch *L = &p->launch[j];
		arg_val v[DG__PREP_ARGS];
		void *a[DG__PREP_ARGS];
		for (int i = 0; i < L->n_args; i++) {
			const dg__arg *x = &L->args[i];
			const dg_tensor *t = x->i < DG_OP_MAX_ARGS ? c->t[x->i] : NULL;
			a[i] = &v[i];
			v[i].u64 = 0;
			switch ((dg__arg_kind)x->kind) {
			case DG__ARG_DATA:
				v[i].u64 = t ? t->data + (uint64_t)x->imm : 0;
				break;
			case DG__ARG_SCALE:
				v[i].u64 = t ? t->scale : 0;
				break;
			case DG__ARG_WS:
				v[i].u64 = c->ws.ptr + (uint64_t)x->imm;
				break;
			case DG__ARG_I32:
				v[i].i32 = (int32_t)x->imm;
				break;
			case DG__ARG_I64:
				v[i].i64 = x->imm;
				break;
			case DG__ARG_F32:
				v[i].f32 = x->f;
				break;
			case DG__ARG_FIELD:
				memcpy(v[i].bytes, (const char *)c + x->off, x->size);
				break;
			case DG__ARG_FLAG: {
				bool b;
				memcpy(&b, (const char *)c + x->off, sizeof(b));
				v[i].i32 = b ? 1 : 0;
				break;
			}
			case DG__ARG_BLOB:
				a[i] = (void *)(p->blob + x->off);
				break;
			case DG__ARG_TMAP:
				if (!mapped) {
					if ((st = p->tmaps(p, c, maps)))
						return st;
					mapped = true;
				}
				a[i] = &maps[x->imm % DG__PREP_TMAPS];
				break;
			}
		}
		if ((st = dg__kernel_launch_raw(p->dev, L->k, &L->l, a)))
			return st;
	}
	return DG_OK;
}

/* ---- the door: prepare, then launch --------------------------------------------- */

dg_status dg__prepare(dg_device *dev, const dg_spec *spec, const dg__op_call *c, dg_prepared *p)
{
	char msg[512];
	dg_status st;

	memset(p, 0, offsetof(dg_prepared, launch));
	p->n_launch = 0;
	p->tmaps = NULL;
	p->ptrs = NULL;
	p->blob_used = 0;
	p->overflow = false;
	p->heap = false;
	if (!dev)
		return DG_ERR_INVALID_ARG;
	if (!spec || (unsigned)spec->op >= DG_OP__COUNT)
		return dg__dev_fail(dev, DG_ERR_INVALID_SPEC, "dg_prepare: no such op");
	p->dev = dev;
	p->spec = *spec;
	p->fn = dg__op_fn_name(spec->op);
	/* the whole check: the table's, then the family's own rules */
	st = dg__op_check(spec, spec->op, p->fn, c, &p->shape, msg, sizeof(msg));
	if (!st)
		st = dg__op_own_check(spec, c, msg, sizeof(msg));
	if (st)
		return dg__dev_fail_msg(dev, st, msg);
	/* then the device: a bad call is refused by what is wrong with it */
	if ((st = dg__dev_enter(dev)))
		return st;
	dg__prep_sign(p, c);
	st = dg__op_prep(p, c);
	if (!st && p->overflow)
		st = dg__dev_fail(dev, DG_ERR_INTERNAL,
				  "%s: its launches do not fit a prepared op (at most %d, %d parameters each, %d bytes of constants)",
				  p->fn, DG__PREP_LAUNCHES, DG__PREP_ARGS, DG__PREP_BLOB);
	return st;
}

dg_status dg__op_run(dg_device *dev, const dg_spec *spec, const dg__op_call *c)
{
	if (!spec || (unsigned)spec->op >= DG_OP__COUNT)
		return dg__dev_fail(dev, DG_ERR_INVALID_SPEC, "dg__op_run: no such op");
	if (!c)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "%s: args is NULL", dg__op_fn_name(spec->op));
	dg_prepared p;
	dg_status st = dg__prepare(dev, spec, c, &p);
	return st ? st : dg__prepared_launch(&p, c);
}

dg_status dg__op_workspace(dg_device *dev, const dg_spec *spec, const dg__op_call *c,
			   size_t *bytes)
{
	*bytes = 0;
	if (!spec || (unsigned)spec->op >= DG_OP__COUNT)
		return dg__dev_fail(dev, DG_ERR_INVALID_SPEC, "dg__op_workspace: no such op");
	if (!c)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "%s_workspace: args is NULL",
				    dg__op_fn_name(spec->op));
	dg_prepared p;
	dg_status st = dg__prepare(dev, spec, c, &p);
	if (!st)
		*bytes = p.ws_bytes;
	return st;
}

/* A typed call's spec must name its op: else the table's check says why. */
static dg_status typed_spec_ok(dg_device *dev, dg_op op, const dg_spec *spec,
			       const dg__op_call *c)
{
	char msg[512];

	if (spec && spec->op == op)
		return DG_OK;
	dg_status st = dg__op_check(spec, op, dg__op_fn_name(op), c, NULL, msg, sizeof(msg));
	return dg__dev_fail_msg(dev, st ? st : DG_ERR_INVALID_SPEC, msg);
}

dg_status dg__op_typed_run(dg_device *dev, dg_op op, const dg_spec *spec, const void *args)
{
	if (!dev)
		return DG_ERR_INVALID_ARG;
	dg__op_call c = dg__op_call_from_args(op, args);
	const dg__op_call *cp = args ? &c : NULL;
	dg_status st = typed_spec_ok(dev, op, spec, cp);
	return st ? st : dg__op_run(dev, spec, cp);
}

dg_status dg__op_typed_workspace(dg_device *dev, dg_op op, const dg_spec *spec,
				 const void *args, size_t *bytes)
{
	if (!dev)
		return DG_ERR_INVALID_ARG;
	if (!bytes)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "%s_workspace: bytes is NULL",
				    dg__op_fn_name(op));
	*bytes = 0;
	dg__op_call c = dg__op_call_from_args(op, args);
	const dg__op_call *cp = args ? &c : NULL;
	dg_status st = typed_spec_ok(dev, op, spec, cp);
	return st ? st : dg__op_workspace(dev, spec, cp, bytes);
}

/* ---- callers that hold their ops prepared ------------------------------------ */

dg__op_exec dg__exec_eager(dg_device *dev)
{
	dg__op_exec x;
	memset(&x, 0, sizeof(x));
	x.dev = dev;
	return x;
}

void dg__exec_begin(dg__op_exec *x, bool preparing)
{
	x->next = 0;
	x->preparing = preparing;
	if (preparing)
		x->n = 0;
}

static dg_status exec_grow(dg__op_exec *x)
{
	int cap = x->cap ? x->cap * 2 : 2;
	dg_prepared *p = realloc(x->plans, (size_t)cap * sizeof(*p));
	if (!p)
		return dg__dev_fail(x->dev, DG_ERR_NOMEM, "out of memory preparing an op");
	x->plans = p;
	x->cap = cap;
	return DG_OK;
}

dg_status dg__exec(dg__op_exec *x, const dg_spec *spec, const dg__op_call *c)
{
	dg_status st;

	if (x->preparing && x->sink)
		return spec ? x->sink(x->sink_user, spec) : DG_ERR_INVALID_SPEC;
	if (x->preparing) {
		if (x->next == x->cap && (st = exec_grow(x)))
			return st;
		if ((st = dg__prepare(x->dev, spec, c, &x->plans[x->next])))
			return st;
		x->n = ++x->next;
		return DG_OK;
	}
	if (!x->plans)
		return dg__op_run(x->dev, spec, c);
	if (x->next >= x->n || !spec || x->plans[x->next].spec.op != spec->op)
		return dg__dev_fail(x->dev, DG_ERR_INTERNAL,
				    "op %d of a prepared run is %s, not the %s it was prepared with",
				    x->next, spec ? dg_op_name(spec->op) : "(null)",
				    x->next < x->n ? dg_op_name(x->plans[x->next].spec.op) : "nothing");
	return dg__prepared_launch(&x->plans[x->next++], c);
}

dg_status dg__exec_args(dg__op_exec *x, const dg_spec *spec, const void *args)
{
	if (!spec || (unsigned)spec->op >= DG_OP__COUNT)
		return dg__dev_fail(x->dev, DG_ERR_INVALID_SPEC, "dg__exec: no such op");
	dg__op_call c = dg__op_call_from_args(spec->op, args);
	return dg__exec(x, spec, args ? &c : NULL);
}

size_t dg__exec_last_ws(const dg__op_exec *x)
{
	return x->preparing && x->next > 0 ? x->plans[x->next - 1].ws_bytes : 0;
}

void dg__exec_free(dg__op_exec *x)
{
	free(x->plans);
	x->plans = NULL;
	x->n = x->cap = x->next = 0;
}

/* ---- the public door ---------------------------------------------------------- */

dg_status dg_prepare(dg_device *dev, const dg_spec *spec, const void *args, dg_prepared **out)
{
	if (out)
		*out = NULL;
	if (!dev)
		return DG_ERR_INVALID_ARG;
	if (!out || !spec || !args)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_prepare: %s is NULL",
				    !out ? "out" : !spec ? "spec" : "args");
	if ((unsigned)spec->op >= DG_OP__COUNT)
		return dg__dev_fail(dev, DG_ERR_INVALID_SPEC, "dg_prepare: spec.op %d is no op",
				    (int)spec->op);
	dg_prepared *p = malloc(sizeof(*p));
	if (!p)
		return dg__dev_fail(dev, DG_ERR_NOMEM, "dg_prepare: out of memory");
	dg__op_call c = dg__op_call_from_args(spec->op, args);
	dg_status st = dg__prepare(dev, spec, &c, p);
	if (st) {
		free(p);
		return st;
	}
	p->heap = true;
	*out = p;
	return DG_OK;
}

dg_status dg_prepared_launch(const dg_prepared *p, const void *args)
{
	if (!p)
		return DG_ERR_INVALID_ARG;
	if (!args)
		return dg__dev_fail(p->dev, DG_ERR_INVALID_ARG, "%s: args is NULL", p->fn);
	dg__op_call c = dg__op_call_from_args(p->spec.op, args);
	return dg__prepared_launch(p, &c);
}

size_t dg_prepared_workspace(const dg_prepared *p)
{
	return p ? p->ws_bytes : 0;
}

void dg_prepared_destroy(dg_prepared *p)
{
	if (p && p->heap)
		free(p);
}
