/*
 * Spec flags → the Cartesian product of specs, validated and deduplicated
 * (rules in specset.h). The built-in default set is this same expansion
 * run on fixed flag values, so it obeys exactly the rules a user's flags do.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/dragon-gen/specset.h"

typedef struct flag_info {
	const char *flag; /* "in-heads" */
	const char *key;  /* "in_heads", as dg_spec_set takes it */
	unsigned field;   /* dg_field; 0 for op */
} flag_info;

static const flag_info flag_infos[DG__SF__COUNT] = {
#define DG__SF_INFO(e, flag, key, field) [DG__SF_##e] = { flag, key, field },
	DG__SPEC_FLAG_LIST(DG__SF_INFO)
#undef DG__SF_INFO
};

/* The built-in default set, as flag values (see specset.h). */
static const char *const default_vals[DG__SF__COUNT] = {
	[DG__SF_OP] = "lowrank_fwd,quantize_act,pack_i8x4,unpack_i8x4",
	[DG__SF_HEADS] = "4",
	[DG__SF_IN_HEADS] = "1,4",
	[DG__SF_EMBD] = "256",
	[DG__SF_LATENT] = "8192",
	[DG__SF_WEIGHT] = "f32,bf16,int8,ternary,sign1",
	[DG__SF_ACT] = "int8",
	[DG__SF_OUT] = "f32,bf16,int8,uint8pos",
	[DG__SF_RELU] = "none,0",
	[DG__SF_SRC] = "f32,bf16",
	[DG__SF_ARCH] = "sm_90",
};

const char *dg__spec_flag_name(dg__spec_flag f)
{
	return (unsigned)f < DG__SF__COUNT ? flag_infos[f].flag : "?";
}

const char *dg__spec_flag_key(dg__spec_flag f)
{
	return (unsigned)f < DG__SF__COUNT ? flag_infos[f].key : "?";
}

unsigned dg__spec_flag_field(dg__spec_flag f)
{
	return (unsigned)f < DG__SF__COUNT ? flag_infos[f].field : 0;
}

const char dg__specset_help[] =
	"Spec flags (each takes a comma-separated list; the product is built):\n"
	"  --op LIST          lowrank_fwd, relu_mask, decoder_fwd, quantize_act,\n"
	"                     quantize_weight, pack_i8x4, unpack_i8x4, pack_ternary,\n"
	"                     pack_sign1, lowrank_grad_input, lowrank_grad_weight,\n"
	"                     decoder_grad_input, decoder_grad_weight\n"
	"                     (default set: the forward ops lowrank_fwd,\n"
	"                     quantize_act, pack_i8x4, unpack_i8x4)\n"
	"  --heads LIST       output heads H (1..64)\n"
	"  --in-heads LIST    input heads: 1 (shared) or H\n"
	"  --embd LIST        model width E (multiple of 4)\n"
	"  --latent LIST      latent width L per head\n"
	"  --weight LIST      f32, bf16, int8, ternary, sign1\n"
	"  --act LIST         f32, bf16, int8, int4, uint8pos\n"
	"  --out-format LIST  f32, bf16, int8, uint8pos (uint8pos needs --relu)\n"
	"  --relu LIST        none, or a threshold such as 0 or 0.25\n"
	"  --src LIST         quantize_act input: f32, bf16\n"
	"  --tile LIST        auto, t<threads> (t256), or BMxBNxBK/WMxWN/S\n"
	"  --arch LIST        sm_80, sm_90, sm_90a, ...\n"
	"A flag applies to the ops that read it; fields without a flag keep\n"
	"the op's default. With no spec flag the built-in default set is used\n"
	"(`dragon-gen list` shows it). Combinations out-format=uint8pos with\n"
	"relu=none are left out of a product.\n";

bool dg__spec_flags_add(dg__spec_flags *f, int id, const char *value)
{
	int i = id - DG__SPEC_OPT_BASE;
	if (i < 0 || i >= DG__SF__COUNT)
		return false;
	size_t old = f->val[i] ? strlen(f->val[i]) : 0;
	char *v = realloc(f->val[i], old + strlen(value) + 2);
	if (!v) {
		dg__gen_err(DG__GEN_FAIL, "out of memory reading flags");
		return false;
	}
	if (old)
		v[old++] = ',';
	strcpy(v + old, value);
	f->val[i] = v;
	return true;
}

bool dg__spec_flags_any(const dg__spec_flags *f)
{
	for (int i = 0; i < DG__SF__COUNT; i++)
		if (f->val[i])
			return true;
	return false;
}

void dg__spec_flags_free(dg__spec_flags *f)
{
	for (int i = 0; i < DG__SF__COUNT; i++) {
		free(f->val[i]);
		f->val[i] = NULL;
	}
}

void dg__specset_free(dg__specset *set)
{
	for (size_t i = 0; set->canonical && i < set->n; i++)
		free(set->canonical[i]);
	free(set->canonical);
	free(set->specs);
	memset(set, 0, sizeof(*set));
}

/* ---- lists --------------------------------------------------------------- */

/* One flag's items, split in place in a private copy of its value. */
typedef struct list {
	char *buf;
	char **item;
	size_t n;
} list;

static void list_free(list *l)
{
	free(l->buf);
	free(l->item);
	memset(l, 0, sizeof(*l));
}

static char *trim(char *s)
{
	while (isspace((unsigned char)*s))
		s++;
	char *e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

static dg_status split(const char *flag, const char *value, list *l, char *msg,
		       size_t size)
{
	size_t n = 1;
	for (const char *p = value; *p; p++)
		n += *p == ',';
	l->buf = strdup(value);
	l->item = calloc(n, sizeof(*l->item));
	if (!l->buf || !l->item) {
		snprintf(msg, size, "out of memory reading --%s", flag);
		return DG_ERR_NOMEM;
	}
	char *p = l->buf;
	for (size_t i = 0; i < n; i++) {
		char *c = strchr(p, ',');
		if (c)
			*c = '\0';
		l->item[i] = trim(p);
		if (!l->item[i][0]) {
			snprintf(msg, size,
				 "--%s '%s': empty item; give a comma-separated list such as --%s a,b",
				 flag, value, flag);
			return DG_ERR_INVALID_SPEC;
		}
		p = c ? c + 1 : p + strlen(p);
	}
	l->n = n;
	return DG_OK;
}

/* ---- dedupe ---------------------------------------------------------------- */

/* Open-addressing set of the canonical texts already in the result. */
typedef struct seen {
	size_t *slot; /* index + 1 into set->canonical; 0 = empty */
	size_t cap;   /* power of two, > 2 × DG__SPECSET_MAX */
} seen;

static size_t hash_str(const char *s)
{
	size_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

/* True if text is new (and now recorded as index idx). */
static bool seen_add(seen *t, char *const *texts, const char *text, size_t idx)
{
	size_t m = t->cap - 1, i = hash_str(text) & m;
	for (; t->slot[i]; i = (i + 1) & m)
		if (strcmp(texts[t->slot[i] - 1], text) == 0)
			return false;
	t->slot[i] = idx + 1;
	return true;
}

/* ---- expansion ------------------------------------------------------------- */

typedef struct expander {
	const char *const *vals; /* flag values: the user's or the default set */
	list lists[DG__SF__COUNT];
	dg_op ops[DG_OP__COUNT];
	size_t n_ops;
	dg__specset *out;
	seen seen;
	char *msg;
	size_t size;
	char first_drop[512]; /* why the first dropped combination was */
} expander;

/* The flag (given in this expansion) whose key a validator message starts
 * with ("latent=8190: ..."), or -1. */
static int flag_of_message(const expander *x, unsigned uses, const char *why)
{
	size_t n = strcspn(why, "=:");
	for (int f = 1; f < DG__SF__COUNT; f++)
		if (x->vals[f] && (uses & flag_infos[f].field) &&
		    strlen(flag_infos[f].key) == n &&
		    strncmp(flag_infos[f].key, why, n) == 0)
			return f;
	return -1;
}

static dg_status add_spec(expander *x, dg_spec *s)
{
	char text[DG_SPEC_TEXT_MAX];
	dg__specset *o = x->out;

	dg_spec_normalize(s);
	if (dg_spec_to_string(s, text, sizeof(text))) {
		snprintf(x->msg, x->size, "spec text too long for %s",
			 dg_op_name(s->op));
		return DG_ERR_INTERNAL;
	}
	char *copy = strdup(text);
	if (!copy) {
		snprintf(x->msg, x->size, "out of memory expanding the spec flags");
		return DG_ERR_NOMEM;
	}
	o->canonical[o->n] = copy;
	if (!seen_add(&x->seen, o->canonical, copy, o->n)) {
		free(copy);
		o->canonical[o->n] = NULL;
		return DG_OK;
	}
	o->specs[o->n++] = *s;
	return DG_OK;
}

/* True when the one thing wrong with s is out=uint8pos without relu (the
 * combination a product leaves out): with relu on, it would be valid. */
static bool only_needs_relu(const dg_spec *s)
{
	dg_spec r = *s;

	if (!(dg_spec_uses(s->op) & DG_FIELD_OUT) || s->out != DG_FMT_UINT8POS ||
	    s->relu)
		return false;
	r.relu = true;
	r.relu_thr = 0.0f;
	return dg_spec_validate(&r, NULL, 0) == DG_OK;
}

/* One combination: idx[f] picks the item of every flag the op reads. */
static dg_status combine(expander *x, dg_op op, const size_t *idx)
{
	char why[512];
	unsigned uses = dg_spec_uses(op);
	dg_spec s;

	dg_spec_init(&s, op);
	for (int f = 1; f < DG__SF__COUNT; f++) {
		if (!x->vals[f] || !(uses & flag_infos[f].field))
			continue;
		const char *v = x->lists[f].item[idx[f]];
		if (dg_spec_set(&s, flag_infos[f].key, v, why, sizeof(why))) {
			snprintf(x->msg, x->size, "--%s %s: %s", flag_infos[f].flag,
				 v, why);
			return DG_ERR_INVALID_SPEC;
		}
	}
	if (dg_spec_validate(&s, why, sizeof(why)) == DG_OK)
		return add_spec(x, &s);
	if (only_needs_relu(&s)) {
		if (!x->out->dropped++)
			snprintf(x->first_drop, sizeof(x->first_drop), "%s", why);
		return DG_OK;
	}
	int f = flag_of_message(x, uses, why);
	if (f >= 0)
		snprintf(x->msg, x->size, "--%s %s: %s", flag_infos[f].flag,
			 x->lists[f].item[idx[f]], why);
	else
		snprintf(x->msg, x->size, "op=%s: %s", dg_op_name(op), why);
	return DG_ERR_INVALID_SPEC;
}

/* Every combination of the op's flag lists (last flag fastest). */
static dg_status expand_op(expander *x, dg_op op)
{
	size_t idx[DG__SF__COUNT] = { 0 };
	unsigned uses = dg_spec_uses(op);

	for (;;) {
		dg_status st = combine(x, op, idx);
		if (st)
			return st;
		int f = DG__SF__COUNT - 1;
		for (; f >= 1; f--) {
			if (!x->vals[f] || !(uses & flag_infos[f].field))
				continue;
			if (++idx[f] < x->lists[f].n)
				break;
			idx[f] = 0;
		}
		if (f < 1)
			return DG_OK;
	}
}

/* Ops from --op, or every op. */
static dg_status pick_ops(expander *x)
{
	char why[256];

	if (!x->vals[DG__SF_OP]) {
		for (int i = 0; i < DG_OP__COUNT; i++)
			x->ops[x->n_ops++] = (dg_op)i;
		return DG_OK;
	}
	const list *l = &x->lists[DG__SF_OP];
	for (size_t i = 0; i < l->n; i++) {
		dg_op op;
		if (!dg_op_from_name(l->item[i], &op)) {
			dg_spec s;
			dg_spec_init(&s, DG_OP_LOWRANK_FWD);
			dg_spec_set(&s, "op", l->item[i], why, sizeof(why));
			snprintf(x->msg, x->size, "--op %s: %s", l->item[i], why);
			return DG_ERR_INVALID_SPEC;
		}
		bool dup = false;
		for (size_t j = 0; j < x->n_ops; j++)
			dup |= x->ops[j] == op;
		if (!dup)
			x->ops[x->n_ops++] = op;
	}
	return DG_OK;
}

/* A flag no op of the product reads is a mistake worth stopping for. */
static dg_status check_flags_used(expander *x)
{
	for (int f = 1; f < DG__SF__COUNT; f++) {
		if (!x->vals[f])
			continue;
		unsigned field = flag_infos[f].field;
		bool used = false;
		for (size_t i = 0; i < x->n_ops; i++)
			used |= (dg_spec_uses(x->ops[i]) & field) != 0;
		if (used)
			continue;
		char ops[128] = "", readers[128] = "";
		for (size_t i = 0; i < x->n_ops; i++)
			snprintf(ops + strlen(ops), sizeof(ops) - strlen(ops),
				 "%s%s", i ? ", " : "", dg_op_name(x->ops[i]));
		for (int op = 0; op < DG_OP__COUNT; op++)
			if (dg_spec_uses((dg_op)op) & field)
				snprintf(readers + strlen(readers),
					 sizeof(readers) - strlen(readers), "%s%s",
					 readers[0] ? ", " : "",
					 dg_op_name((dg_op)op));
		snprintf(x->msg, x->size,
			 "--%s: none of the ops (%s) reads it; drop it or add --op %s",
			 flag_infos[f].flag, ops, readers);
		return DG_ERR_INVALID_SPEC;
	}
	return DG_OK;
}

/* Number of combinations, saturating just past the cap. */
static size_t product_size(const expander *x)
{
	size_t total = 0;
	for (size_t i = 0; i < x->n_ops; i++) {
		unsigned uses = dg_spec_uses(x->ops[i]);
		size_t p = 1;
		for (int f = 1; f < DG__SF__COUNT; f++) {
			if (!x->vals[f] || !(uses & flag_infos[f].field))
				continue;
			p = p > DG__SPECSET_MAX ? p : p * x->lists[f].n;
		}
		total += p > DG__SPECSET_MAX ? DG__SPECSET_MAX + 1 : p;
		if (total > DG__SPECSET_MAX)
			return DG__SPECSET_MAX + 1;
	}
	return total;
}

static dg_status expand(expander *x)
{
	dg_status st;

	for (int f = 0; f < DG__SF__COUNT; f++) {
		if (!x->vals[f])
			continue;
		st = split(flag_infos[f].flag, x->vals[f], &x->lists[f], x->msg,
			   x->size);
		if (st)
			return st;
	}
	if ((st = pick_ops(x)) || (st = check_flags_used(x)))
		return st;
	size_t total = product_size(x);
	if (total > DG__SPECSET_MAX) {
		snprintf(x->msg, x->size,
			 "the spec flags make more than %d combinations; narrow the lists",
			 DG__SPECSET_MAX);
		return DG_ERR_INVALID_SPEC;
	}
	dg__specset *o = x->out;
	x->seen.cap = 1;
	while (x->seen.cap < 2 * total + 2)
		x->seen.cap *= 2;
	x->seen.slot = calloc(x->seen.cap, sizeof(*x->seen.slot));
	o->specs = calloc(total, sizeof(*o->specs));
	o->canonical = calloc(total, sizeof(*o->canonical));
	if (!x->seen.slot || !o->specs || !o->canonical) {
		snprintf(x->msg, x->size, "out of memory expanding the spec flags");
		return DG_ERR_NOMEM;
	}
	for (size_t i = 0; i < x->n_ops; i++)
		if ((st = expand_op(x, x->ops[i])))
			return st;
	if (o->n == 0) {
		snprintf(x->msg, x->size,
			 "--out-format uint8pos: %s (every combination was left out)",
			 x->first_drop);
		return DG_ERR_INVALID_SPEC;
	}
	return DG_OK;
}

dg_status dg__specset_expand(const dg__spec_flags *f, dg__specset *out,
			     char *msg, size_t size)
{
	expander x;

	memset(&x, 0, sizeof(x));
	memset(out, 0, sizeof(*out));
	x.vals = dg__spec_flags_any(f) ? (const char *const *)f->val : default_vals;
	x.out = out;
	x.msg = msg;
	x.size = size;
	dg_status st = expand(&x);
	for (int i = 0; i < DG__SF__COUNT; i++)
		list_free(&x.lists[i]);
	free(x.seen.slot);
	if (st)
		dg__specset_free(out);
	return st;
}
