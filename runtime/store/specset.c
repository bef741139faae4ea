/*
 * Spec flags → the Cartesian product of specs, checked, planned and
 * deduplicated (rules in runtime/store/specset.h). The default build set
 * is this same expansion run on the op table's build lists, so it obeys
 * exactly the rules a user's flags do.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fnv.h"
#include "dragon/jit.h"
#include "runtime/store/specset.h"

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

bool dg__spec_flags_put(dg__spec_flags *f, dg__spec_flag flag, const char *value)
{
	int i = (int)flag;
	if (i < 0 || i >= DG__SF__COUNT)
		return false;
	size_t old = f->val[i] ? strlen(f->val[i]) : 0;
	char *v = realloc(f->val[i], old + strlen(value) + 2);
	if (!v)
		return false;
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

/* The flag whose spec key is key[0..n) (op excluded), or -1. */
static int flag_of_key(const char *key, size_t n)
{
	for (int f = 1; f < DG__SF__COUNT; f++)
		if (strlen(flag_infos[f].key) == n && strncmp(flag_infos[f].key, key, n) == 0)
			return f;
	return -1;
}

/* The op table's build lists of op ("in_heads=1,4;weight=int8,ternary")
 * into lists[] (given[f] set for each key it names). */
static dg_status parse_build(dg_op op, list *lists, bool *given, char *msg, size_t size)
{
	const char *b = dg_op_info_of(op)->build;
	char item[256];

	for (const char *p = b ? b : ""; *p;) {
		size_t len = strcspn(p, ";");
		const char *eq = memchr(p, '=', len);
		int f = eq ? flag_of_key(p, (size_t)(eq - p)) : -1;
		if (f < 0 || given[f] || len >= sizeof(item)) {
			snprintf(msg, size, "op table: %s.build \"%s\": '%.*s' is not key=v1,v2 of a spec key it names once",
				 dg_op_name(op), b, (int)len, p);
			return DG_ERR_INTERNAL;
		}
		snprintf(item, sizeof(item), "%.*s", (int)(len - (size_t)(eq + 1 - p)), eq + 1);
		dg_status st = split(flag_infos[f].flag, item, &lists[f], msg, size);
		if (st) {
			if (st == DG_ERR_INVALID_SPEC)
				st = DG_ERR_INTERNAL;
			return st;
		}
		given[f] = true;
		p += len + (p[len] == ';');
	}
	return DG_OK;
}

/* Combinations of op's lists (the flags it reads), saturating past the cap. */
static size_t op_product(dg_op op, const list *lists, const bool *given)
{
	unsigned uses = dg_spec_uses(op);
	size_t p = 1;
	for (int f = 1; f < DG__SF__COUNT; f++) {
		if (!given[f] || !(uses & flag_infos[f].field))
			continue;
		p = p > DG__SPECSET_MAX ? p : p * lists[f].n;
	}
	return p > DG__SPECSET_MAX ? DG__SPECSET_MAX + 1 : p;
}

size_t dg__specset_default_size(void)
{
	size_t total = 0;
	char msg[256];

	for (int op = 0; op < DG_OP__COUNT; op++) {
		list lists[DG__SF__COUNT] = { { 0 } };
		bool given[DG__SF__COUNT] = { 0 };
		if (parse_build((dg_op)op, lists, given, msg, sizeof(msg)) == DG_OK)
			total += op_product((dg_op)op, lists, given);
		for (int f = 0; f < DG__SF__COUNT; f++)
			list_free(&lists[f]);
	}
	return total;
}

/* ---- dedupe ---------------------------------------------------------------- */

/* Open-addressing set of the canonical texts already in the result. */
typedef struct seen {
	size_t *slot; /* index + 1 into set->canonical; 0 = empty */
	size_t cap;   /* power of two, > 2 × the product */
} seen;

/* True if text is new (and now recorded as index idx). */
static bool seen_add(seen *t, char *const *texts, const char *text, size_t idx)
{
	size_t m = t->cap - 1, i = (size_t)dg__fnv1a(text) & m;
	for (; t->slot[i]; i = (i + 1) & m)
		if (strcmp(texts[t->slot[i] - 1], text) == 0)
			return false;
	t->slot[i] = idx + 1;
	return true;
}

/* ---- expansion ------------------------------------------------------------- */

#define MAX_ARCH_CHECKS 32

typedef struct expander {
	dg_codegen *cg;
	list lists[DG__SF__COUNT]; /* the user's lists, or the current op's build lists */
	bool given[DG__SF__COUNT];
	dg_op ops[DG_OP__COUNT];
	size_t n_ops;
	dg__specset *out;
	seen seen;
	struct {
		int arch;
		bool specific;
		dg_status st;
		char why[512];
	} archs[MAX_ARCH_CHECKS]; /* NVRTC's answers so far */
	size_t n_archs;
	char *msg;
	size_t size;
} expander;

/* The flag (given, read by the op) whose key a message starts with
 * ("latent=8190: ..."), or -1. */
static int flag_of_message(const expander *x, unsigned uses, const char *why)
{
	int f = flag_of_key(why, strcspn(why, "=:"));
	return f >= 0 && x->given[f] && (uses & flag_infos[f].field) ? f : -1;
}

static dg_status add_spec(expander *x, dg_spec *s)
{
	char text[DG_SPEC_TEXT_MAX];
	dg__specset *o = x->out;

	dg_spec_normalize(s);
	if (dg_spec_to_string(s, text, sizeof(text))) {
		snprintf(x->msg, x->size, "spec text too long for %s", dg_op_name(s->op));
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

/* Counts a refused combination; the first one's reason is kept, named by
 * the flag value it starts with (f: the flag being set, or -1). */
static void drop(expander *x, dg_op op, const size_t *idx, int f, const char *why)
{
	if (x->out->dropped++)
		return;
	if (f < 0)
		f = flag_of_message(x, dg_spec_uses(op), why);
	if (f > 0)
		snprintf(x->out->first_drop, sizeof(x->out->first_drop), "--%s %s: %s",
			 flag_infos[f].flag, x->lists[f].item[idx[f]], why);
	else
		snprintf(x->out->first_drop, sizeof(x->out->first_drop), "--op %s: %s",
			 dg_op_name(op), why);
}

/* NVRTC's answer for the spec's target, asked once per target. */
static dg_status check_arch(expander *x, const dg_spec *s, char *why, size_t size)
{
	for (size_t i = 0; i < x->n_archs; i++)
		if (x->archs[i].arch == s->arch && x->archs[i].specific == s->arch_specific) {
			snprintf(why, size, "%s", x->archs[i].why);
			return x->archs[i].st;
		}
	dg_status st = dg_jit_check_arch(s->arch, s->arch_specific, why, size);
	if (x->n_archs < MAX_ARCH_CHECKS) {
		x->archs[x->n_archs].arch = s->arch;
		x->archs[x->n_archs].specific = s->arch_specific;
		x->archs[x->n_archs].st = st;
		snprintf(x->archs[x->n_archs].why, sizeof(x->archs[0].why), "%.500s", st ? why : "");
		x->n_archs++;
	}
	return st;
}

/* One combination: idx[f] picks the item of every flag the op reads. */
static dg_status combine(expander *x, dg_op op, const size_t *idx)
{
	char why[1024];
	unsigned uses = dg_spec_uses(op);
	dg_spec s;
	dg_plan plan;

	dg_spec_init(&s, op);
	for (int f = 1; f < DG__SF__COUNT; f++) {
		if (!x->given[f] || !(uses & flag_infos[f].field))
			continue;
		if (dg_spec_set(&s, flag_infos[f].key, x->lists[f].item[idx[f]], why, sizeof(why))) {
			drop(x, op, idx, f, why);
			return DG_OK;
		}
	}
	if (dg_spec_validate(&s, why, sizeof(why))) {
		drop(x, op, idx, -1, why);
		return DG_OK;
	}
	/* NVRTC's range is no op's rule: an arch it cannot target is a usage
	 * error, whatever else the product holds */
	if (check_arch(x, &s, why, sizeof(why))) {
		if (x->given[DG__SF_ARCH])
			snprintf(x->msg, x->size, "--arch %s: %s", x->lists[DG__SF_ARCH].item[idx[DG__SF_ARCH]],
				 why);
		else
			snprintf(x->msg, x->size, "%s", why);
		return DG_ERR_INVALID_SPEC;
	}
	dg_status st = dg_codegen_plan(x->cg, &s, &plan);
	if (st == DG_ERR_INVALID_SPEC) {
		drop(x, op, idx, -1, dg_codegen_errmsg(x->cg));
		return DG_OK;
	}
	if (st) {
		snprintf(x->msg, x->size, "%s", dg_codegen_errmsg(x->cg));
		return st;
	}
	return add_spec(x, &s);
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
			if (!x->given[f] || !(uses & flag_infos[f].field))
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
	char why[512];

	if (!x->given[DG__SF_OP]) {
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
		if (!x->given[f])
			continue;
		unsigned field = flag_infos[f].field;
		bool used = false;
		for (size_t i = 0; i < x->n_ops; i++)
			used |= (dg_spec_uses(x->ops[i]) & field) != 0;
		if (used)
			continue;
		char ops[256] = "", readers[400] = "";
		for (size_t i = 0; i < x->n_ops; i++)
			snprintf(ops + strlen(ops), sizeof(ops) - strlen(ops), "%s%s",
				 i ? ", " : "", dg_op_name(x->ops[i]));
		for (int op = 0; op < DG_OP__COUNT; op++)
			if (dg_spec_uses((dg_op)op) & field)
				snprintf(readers + strlen(readers), sizeof(readers) - strlen(readers),
					 "%s%s", readers[0] ? "," : "", dg_op_name((dg_op)op));
		snprintf(x->msg, x->size, "--%s: none of the ops (%s) reads it; drop it or add --op %s",
			 flag_infos[f].flag, ops, readers);
		return DG_ERR_INVALID_SPEC;
	}
	return DG_OK;
}

/* A value no op of the product can take at all (a typo, a format no op
 * reads, tile=7x7) is a usage error, not a combination to leave out. */
static dg_status check_values(expander *x)
{
	char why[1024], first[1024];

	for (int f = 1; f < DG__SF__COUNT; f++) {
		if (!x->given[f])
			continue;
		for (size_t i = 0; i < x->lists[f].n; i++) {
			bool ok = false;
			first[0] = '\0';
			for (size_t k = 0; k < x->n_ops && !ok; k++) {
				if (!(dg_spec_uses(x->ops[k]) & flag_infos[f].field))
					continue;
				dg_spec s;
				dg_spec_init(&s, x->ops[k]);
				ok = dg_spec_set(&s, flag_infos[f].key, x->lists[f].item[i], why,
						 sizeof(why)) == DG_OK;
				if (!ok && !first[0])
					snprintf(first, sizeof(first), "%s", why);
			}
			if (!ok) {
				snprintf(x->msg, x->size, "--%s %s: %s", flag_infos[f].flag,
					 x->lists[f].item[i], first);
				return DG_ERR_INVALID_SPEC;
			}
		}
	}
	return DG_OK;
}

static dg_status allocate(expander *x, size_t total)
{
	dg__specset *o = x->out;

	o->combinations = total;
	x->seen.cap = 1;
	while (x->seen.cap < 2 * total + 2)
		x->seen.cap *= 2;
	x->seen.slot = calloc(x->seen.cap, sizeof(*x->seen.slot));
	o->specs = calloc(total ? total : 1, sizeof(*o->specs));
	o->canonical = calloc(total ? total : 1, sizeof(*o->canonical));
	if (!x->seen.slot || !o->specs || !o->canonical) {
		snprintf(x->msg, x->size, "out of memory expanding the spec flags");
		return DG_ERR_NOMEM;
	}
	return DG_OK;
}

static dg_status expand_user(expander *x, const dg__spec_flags *fl)
{
	dg_status st;

	for (int f = 0; f < DG__SF__COUNT; f++) {
		if (!fl->val[f])
			continue;
		x->given[f] = true;
		st = split(flag_infos[f].flag, fl->val[f], &x->lists[f], x->msg, x->size);
		if (st)
			return st;
	}
	if ((st = pick_ops(x)) || (st = check_flags_used(x)) || (st = check_values(x)))
		return st;
	size_t total = 0;
	for (size_t i = 0; i < x->n_ops && total <= DG__SPECSET_MAX; i++)
		total += op_product(x->ops[i], x->lists, x->given);
	if (total > DG__SPECSET_MAX) {
		snprintf(x->msg, x->size,
			 "the spec flags make more than %d combinations; narrow the lists",
			 DG__SPECSET_MAX);
		return DG_ERR_INVALID_SPEC;
	}
	if ((st = allocate(x, total)))
		return st;
	for (size_t i = 0; i < x->n_ops; i++)
		if ((st = expand_op(x, x->ops[i])))
			return st;
	dg__specset *o = x->out;
	if (o->n == 0) {
		if (o->combinations > 1)
			snprintf(x->msg, x->size, "%s (the ops' rules refuse all %zu combinations)",
				 o->first_drop, o->combinations);
		else
			snprintf(x->msg, x->size, "%s", o->first_drop);
		return DG_ERR_INVALID_SPEC;
	}
	return DG_OK;
}

/* Every op's build lists, one op at a time. */
static dg_status expand_default(expander *x)
{
	dg_status st = allocate(x, dg__specset_default_size());

	for (int op = 0; op < DG_OP__COUNT && !st; op++) {
		memset(x->given, 0, sizeof(x->given));
		st = parse_build((dg_op)op, x->lists, x->given, x->msg, x->size);
		if (!st && x->out->n + op_product((dg_op)op, x->lists, x->given) >
				   x->out->combinations) {
			snprintf(x->msg, x->size, "op table: the build lists changed while expanding");
			st = DG_ERR_INTERNAL;
		}
		if (!st)
			st = expand_op(x, (dg_op)op);
		for (int f = 0; f < DG__SF__COUNT; f++)
			list_free(&x->lists[f]);
	}
	if (!st && x->out->n == 0) {
		snprintf(x->msg, x->size, "the default build set is empty: %s", x->out->first_drop);
		st = DG_ERR_INTERNAL;
	}
	return st;
}

dg_status dg__specset_expand(dg_codegen *cg, const dg__spec_flags *f, dg__specset *out,
			     char *msg, size_t size)
{
	expander *x = calloc(1, sizeof(*x));

	memset(out, 0, sizeof(*out));
	if (!x) {
		snprintf(msg, size, "out of memory expanding the spec flags");
		return DG_ERR_NOMEM;
	}
	x->cg = cg;
	x->out = out;
	x->msg = msg;
	x->size = size;
	dg_status st = dg__spec_flags_any(f) ? expand_user(x, f) : expand_default(x);
	for (int i = 0; i < DG__SF__COUNT; i++)
		list_free(&x->lists[i]);
	free(x->seen.slot);
	free(x);
	if (st) {
		char keep[sizeof(out->first_drop)];
		memcpy(keep, out->first_drop, sizeof(keep));
		dg__specset_free(out);
		memcpy(out->first_drop, keep, sizeof(keep));
	}
	return st;
}

bool dg__specset_dropped_line(const dg__specset *set, char *buf, size_t size)
{
	if (size)
		buf[0] = '\0';
	if (!set->dropped)
		return false;
	snprintf(buf, size, "left out %zu combination%s the ops' rules refuse; first: %.*s",
		 set->dropped, set->dropped == 1 ? "" : "s", (int)strcspn(set->first_drop, "\n"),
		 set->first_drop);
	return true;
}

/* ---- text ------------------------------------------------------------------- */

void dg__spec_flags_of(const dg_spec *spec, char *buf, size_t size)
{
	char def[DG_SPEC_TEXT_MAX + 1] = ";", canon[DG_SPEC_TEXT_MAX], pair[DG_SPEC_TEXT_MAX + 1];
	dg_spec d, s = *spec;
	size_t n = 0;

	buf[0] = '\0';
	dg_spec_normalize(&s);
	dg_spec_init(&d, s.op);
	dg_spec_to_string(&d, def + 1, sizeof(def) - 1);
	dg_spec_to_string(&s, canon, sizeof(canon));
	for (const char *p = canon; *p;) {
		const char *end = strchr(p, ';'), *eq = strchr(p, '=');
		if (!end || !eq || eq > end)
			break;
		snprintf(pair, sizeof(pair), ";%.*s", (int)(end - p + 1), p);
		int f = flag_of_key(p, (size_t)(eq - p));
		if (f > 0 && !strstr(def, pair)) {
			int w = snprintf(buf + n, size - n, "%s--%s %.*s", n ? " " : "",
					 flag_infos[f].flag, (int)(end - eq - 1), eq + 1);
			if (w < 0 || (size_t)w >= size - n)
				return;
			n += (size_t)w;
		}
		p = end + 1;
	}
}
