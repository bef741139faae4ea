/*
 * The text form of a spec: canonical text, the "key=value;" parser, the
 * per-key setter, and the float, tile and arch spellings they share.
 *
 * The canonical text is the identity of a kernel: it is hashed into cache
 * keys, written to manifests and tuning records, and shown to users. It
 * holds only the keys the op reads, sorted, so two specs naming the same
 * kernel always print the same. Floats print in the shortest decimal form
 * that reads back to the same float. The parser is a fuzz target
 * (tests/fuzz/fuzz_spec.c).
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/msg.h"
#include "codegen/spec_int.h"
#include "dragon/spec.h"

/* ---- canonical text --------------------------------------------------------- */

/* Shortest "%.Ng" that reads back to the same float. */
static void float_to_string(float v, char *buf, size_t size)
{
	if (v == 0.0f)
		v = 0.0f;
	for (int p = 1; p <= 9; p++) {
		snprintf(buf, size, "%.*g", p, (double)v);
		if (strtof(buf, NULL) == v)
			return;
	}
}

typedef struct strbuf {
	char *p;
	size_t size, len;
	bool overflow;
} strbuf;

static void sb_add(strbuf *b, const char *key, const char *val)
{
	int w = snprintf(b->p + b->len, b->size - b->len, "%s=%s;", key, val);
	if (w < 0 || (size_t)w >= b->size - b->len) {
		b->overflow = true;
		return;
	}
	b->len += (size_t)w;
}

static void sb_addi(strbuf *b, const char *key, int v)
{
	char t[16];
	snprintf(t, sizeof(t), "%d", v);
	sb_add(b, key, t);
}

dg_status dg_spec_to_string(const dg_spec *s, char *buf, size_t size)
{
	if (!s || !buf || !size)
		return DG_ERR_INVALID_ARG;
	strbuf b = { buf, size, 0, false };
	unsigned uses = dg_spec_uses(s->op);
	const dg_op_info *row = dg_op_info_of(s->op);
	char t[64];
	dg_spec d;

	buf[0] = '\0';
	dg_spec_init(&d, s->op);
	/* a quiet field at the op's default is left out (dg_op_info.quiet) */
	if (row && (row->quiet & DG_FIELD_OUT) && s->out == d.out)
		uses &= ~(unsigned)DG_FIELD_OUT;
	if (row && (row->quiet & DG_FIELD_SRC) && s->src == d.src)
		uses &= ~(unsigned)DG_FIELD_SRC;
	/* keys in sorted order */
	if (uses & DG_FIELD_ACT)
		sb_add(&b, "act", dg_fmt_name(s->act));
	if (uses & DG_FIELD_ARCH) {
		snprintf(t, sizeof(t), "sm_%d%s", s->arch,
			 s->arch_specific ? "a" : "");
		sb_add(&b, "arch", t);
	}
	/* the scales: named when not tensor, or when the op's default is not
	 * (so that ascale=tensor reads back as itself) */
	if ((uses & DG_FIELD_ASCALE) && (s->ascale != DG_SCALE_TENSOR || d.ascale != DG_SCALE_TENSOR))
		sb_add(&b, "ascale", dg_scale_name(s->ascale));
	if (uses & DG_FIELD_CHUNK)
		sb_addi(&b, "chunk", s->chunk);
	if (uses & DG_FIELD_EMBD)
		sb_addi(&b, "embd", s->embd);
	if ((uses & DG_FIELD_EPI) && s->epi != DG_EPI_STORE)
		sb_add(&b, "epi", dg_epi_name(s->epi));
	if (uses & DG_FIELD_HEADS)
		sb_addi(&b, "heads", s->heads);
	if (uses & DG_FIELD_IN_HEADS)
		sb_addi(&b, "in_heads", s->in_heads);
	if (uses & DG_FIELD_LATENT)
		sb_addi(&b, "latent", s->latent);
	sb_add(&b, "op", dg_op_name(s->op));
	if (uses & DG_FIELD_OUT)
		sb_add(&b, "out", dg_fmt_name(s->out));
	if (uses & DG_FIELD_RELU) {
		if (s->relu)
			float_to_string(s->relu_thr, t, sizeof(t));
		else
			snprintf(t, sizeof(t), "none");
		sb_add(&b, "relu", t);
	}
	if ((uses & DG_FIELD_ROPE) && s->rope_pre)
		sb_add(&b, "rope", "pre");
	if (uses & DG_FIELD_SRC)
		sb_add(&b, "src", dg_fmt_name(s->src));
	if (uses & DG_FIELD_TILE) {
		dg_tile_to_string(&s->tile, t, sizeof(t));
		sb_add(&b, "tile", t);
	}
	if (uses & DG_FIELD_VOCAB)
		sb_addi(&b, "vocab", s->vocab);
	if (uses & DG_FIELD_WEIGHT)
		sb_add(&b, "weight", dg_fmt_name(s->weight));
	if ((uses & DG_FIELD_WSCALE) && (s->wscale != DG_SCALE_TENSOR || d.wscale != DG_SCALE_TENSOR))
		sb_add(&b, "wscale", dg_scale_name(s->wscale));
	return b.overflow ? DG_ERR_INVALID_ARG : DG_OK;
}

bool dg_spec_equal(const dg_spec *a, const dg_spec *b)
{
	char ta[DG_SPEC_TEXT_MAX], tb[DG_SPEC_TEXT_MAX];
	dg_spec na = *a, nb = *b;

	dg_spec_normalize(&na);
	dg_spec_normalize(&nb);
	return dg_spec_to_string(&na, ta, sizeof(ta)) == DG_OK &&
	       dg_spec_to_string(&nb, tb, sizeof(tb)) == DG_OK &&
	       strcmp(ta, tb) == 0;
}

/* ---- parsing ------------------------------------------------------------- */

typedef struct key_info {
	const char *name;
	dg_field field;
} key_info;

static const key_info keys[] = {
	{ "act", DG_FIELD_ACT },       { "arch", DG_FIELD_ARCH },
	{ "ascale", DG_FIELD_ASCALE }, { "chunk", DG_FIELD_CHUNK },    { "embd", DG_FIELD_EMBD },     { "epi", DG_FIELD_EPI },
	{ "heads", DG_FIELD_HEADS },
	{ "in_heads", DG_FIELD_IN_HEADS }, { "latent", DG_FIELD_LATENT },
	{ "out", DG_FIELD_OUT },       { "relu", DG_FIELD_RELU },    { "rope", DG_FIELD_ROPE },
	{ "src", DG_FIELD_SRC },       { "tile", DG_FIELD_TILE },
	{ "vocab", DG_FIELD_VOCAB },   { "weight", DG_FIELD_WEIGHT },
	{ "wscale", DG_FIELD_WSCALE },
};

static const key_info *find_key(const char *name)
{
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (strcmp(keys[i].name, name) == 0)
			return &keys[i];
	return NULL;
}

static bool parse_int(const char *v, int lo, int hi, int *out)
{
	char *end;
	if (!isdigit((unsigned char)v[0]))
		return false;
	errno = 0;
	long x = strtol(v, &end, 10);
	if (errno || *end || x < lo || x > hi)
		return false;
	*out = (int)x;
	return true;
}

/* "auto" | "t<threads>" | "t<threads>/<stages>" | "BMxBNxBK/WMxWN/S" */
static bool parse_tile(const char *v, dg_tile *t)
{
	dg_tile r = { 0 };
	char tail;

	if (strcmp(v, "auto") == 0) {
		*t = r;
		return true;
	}
	if (v[0] == 't') {
		char num[16];
		const char *slash = strchr(v, '/');
		size_t n = slash ? (size_t)(slash - (v + 1)) : strlen(v + 1);
		if (n == 0 || n >= sizeof(num))
			return false;
		memcpy(num, v + 1, n);
		num[n] = '\0';
		if (!parse_int(num, 1, 1 << 20, &r.threads))
			return false;
		if (slash && !parse_int(slash + 1, 1, 64, &r.stages))
			return false;
		*t = r;
		return true;
	}
	for (const char *p = v; *p; p++)
		if (!isdigit((unsigned char)*p) && *p != 'x' && *p != '/')
			return false;
	if (sscanf(v, "%4dx%4dx%4d/%2dx%2d/%2d%c", &r.bm, &r.bn, &r.bk, &r.wm,
		   &r.wn, &r.stages, &tail) != 6)
		return false;
	if (r.bm <= 0 || r.bn <= 0 || r.bk <= 0 || r.wm <= 0 || r.wn <= 0 ||
	    r.stages <= 0)
		return false;
	*t = r;
	return true;
}

static bool parse_arch(const char *v, int *arch, bool *specific)
{
	char digits[8];
	size_t n;

	if (strncmp(v, "sm_", 3) == 0)
		v += 3;
	else if (strncmp(v, "compute_", 8) == 0)
		v += 8;
	n = strlen(v);
	bool a = n > 0 && v[n - 1] == 'a';
	if (a)
		n--;
	if (n < 2 || n > 3)
		return false;
	memcpy(digits, v, n);
	digits[n] = '\0';
	if (!parse_int(digits, 10, 999, arch))
		return false;
	*specific = a;
	return true;
}

static dg_status set_field(dg_spec *s, const key_info *k, const char *v,
			   char *msg, size_t size)
{
	char fl[96];
	dg_fmt f;

	switch (k->field) {
	case DG_FIELD_HEADS:
	case DG_FIELD_IN_HEADS:
	case DG_FIELD_EMBD:
	case DG_FIELD_LATENT:
	case DG_FIELD_VOCAB:
	case DG_FIELD_CHUNK: {
		int x;
		if (!parse_int(v, 0, INT_MAX, &x))
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"%s=%s: must be a positive decimal integer",
					k->name, v);
		if (k->field == DG_FIELD_HEADS)
			s->heads = x;
		else if (k->field == DG_FIELD_IN_HEADS)
			s->in_heads = x;
		else if (k->field == DG_FIELD_EMBD)
			s->embd = x;
		else if (k->field == DG_FIELD_VOCAB)
			s->vocab = x;
		else if (k->field == DG_FIELD_CHUNK)
			s->chunk = x;
		else
			s->latent = x;
		return DG_OK;
	}
	case DG_FIELD_WEIGHT:
	case DG_FIELD_ACT:
	case DG_FIELD_OUT:
	case DG_FIELD_SRC: {
		unsigned mask = dg__spec_fmts(dg_op_info_of(s->op), k->field);
		if (!dg_fmt_from_name(v, &f) || !(mask & DG_FMT_BIT(f)))
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"%s=%s: op %s takes one of %s", k->name, v,
					dg_op_name(s->op), dg_fmt_list(mask, fl, sizeof(fl)));
		if (k->field == DG_FIELD_WEIGHT)
			s->weight = f;
		else if (k->field == DG_FIELD_ACT)
			s->act = f;
		else if (k->field == DG_FIELD_OUT)
			s->out = f;
		else
			s->src = f;
		return DG_OK;
	}
	case DG_FIELD_RELU: {
		if (strcmp(v, "none") == 0) {
			s->relu = false;
			s->relu_thr = 0.0f;
			return DG_OK;
		}
		char *end;
		errno = 0;
		float x = strtof(v, &end);
		/* ERANGE with a non-zero result is a subnormal: exact, keep it;
		 * underflow to zero or overflow to inf is refused. */
		if (!*v || *end || !isfinite(x) || isspace((unsigned char)v[0]) ||
		    (errno == ERANGE && x == 0.0f))
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"relu=%s: must be none or a finite threshold such as 0 or 0.25",
					v);
		s->relu = true;
		s->relu_thr = x == 0.0f ? 0.0f : x;
		return DG_OK;
	}
	case DG_FIELD_ASCALE:
	case DG_FIELD_WSCALE: {
		bool a = k->field == DG_FIELD_ASCALE;
		dg_scale_gran g;
		if (strcmp(v, "tensor") == 0)
			g = DG_SCALE_TENSOR;
		else if (a && strcmp(v, "token") == 0)
			g = DG_SCALE_TOKEN;
		else if (!a && strcmp(v, "channel") == 0)
			g = DG_SCALE_CHANNEL;
		else
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size, "%s=%s: must be tensor or %s",
					k->name, v, a ? "token" : "channel");
		if (a)
			s->ascale = g;
		else
			s->wscale = g;
		return DG_OK;
	}
	case DG_FIELD_ROPE:
		if (strcmp(v, "load") == 0 || strcmp(v, "pre") == 0) {
			s->rope_pre = v[0] == 'p';
			return DG_OK;
		}
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"rope=%s: must be load (RoPE on the GEMM's load) or pre (xs is RoPE(xs) already)",
				v);
	case DG_FIELD_EPI:
		if (strcmp(v, "store") == 0 || strcmp(v, "mask") == 0 || strcmp(v, "rope") == 0) {
			s->epi = v[0] == 'm' ? DG_EPI_MASK : (v[0] == 'r' ? DG_EPI_ROPE : DG_EPI_STORE);
			return DG_OK;
		}
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"epi=%s: must be store (write the output), mask (attention_grad_xs: add it into dxs in place, masked by mask_xs > 0) or rope (lowrank_fwd: RoPE(out) into qr too)",
				v);
	case DG_FIELD_TILE:
		if (!parse_tile(v, &s->tile))
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"tile=%s: must be auto, t<threads> (e.g. t256; t<threads>/<stages> where the op stages its rows) or BMxBNxBK/WMxWN/S (e.g. 64x64x64/2x2/2)",
					v);
		return DG_OK;
	case DG_FIELD_ARCH:
		if (!parse_arch(v, &s->arch, &s->arch_specific))
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"arch=%s: must look like sm_90 or sm_90a",
					v);
		return DG_OK;
	}
	return dg__msgf(DG_ERR_INVALID_SPEC, msg, size, "%s: unknown key",
			k->name);
}

/* "lowrank_fwd, relu_mask, ..." : every op of the op table. */
static const char *op_list(char *buf, size_t size)
{
	size_t n = 0;
	buf[0] = '\0';
	for (int i = 0; i < DG_OP__COUNT; i++) {
		int w = snprintf(buf + n, size - n, "%s%s", i ? ", " : "", dg_op_name((dg_op)i));
		if (w < 0 || (size_t)w >= size - n)
			break;
		n += (size_t)w;
	}
	return buf;
}

static void list_keys(unsigned uses, char *buf, size_t size)
{
	size_t n = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		if (!(uses & keys[i].field))
			continue;
		int w = snprintf(buf + n, size - n, "%s%s", n ? ", " : "",
				 keys[i].name);
		if (w < 0 || (size_t)w >= size - n)
			return;
		n += (size_t)w;
	}
}

dg_status dg_spec_set(dg_spec *s, const char *key, const char *value,
		      char *msg, size_t size)
{
	char kl[400];

	if (!s || !key || !value)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"spec, key and value must not be NULL");
	if (strcmp(key, "op") == 0) {
		dg_op op;
		if (!dg_op_from_name(value, &op))
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"op=%s: unknown; ops are %s", value, op_list(kl, sizeof(kl)));
		s->op = op;
		return DG_OK;
	}
	const key_info *k = find_key(key);
	if (!k)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"%s: unknown key; keys are op, act, arch, ascale, chunk, embd, epi, heads, in_heads, latent, out, relu, rope, src, tile, vocab, weight, wscale",
				key);
	if (!(dg_spec_uses(s->op) & k->field)) {
		list_keys(dg_spec_uses(s->op), kl, sizeof(kl));
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"%s: op %s does not take it; it takes %s", key,
				dg_op_name(s->op), kl);
	}
	return set_field(s, k, value, msg, size);
}

/* Copies the trimmed [b, e) into dst (size cap); false if it does not fit. */
static bool trim_copy(const char *b, const char *e, char *dst, size_t cap)
{
	while (b < e && isspace((unsigned char)*b))
		b++;
	while (e > b && isspace((unsigned char)e[-1]))
		e--;
	if ((size_t)(e - b) >= cap)
		return false;
	memcpy(dst, b, (size_t)(e - b));
	dst[e - b] = '\0';
	return true;
}

#define MAX_PAIRS 16

dg_status dg_spec_parse(const char *text, dg_spec *out, char *msg, size_t size)
{
	char kbuf[MAX_PAIRS][32], vbuf[MAX_PAIRS][64];
	int n = 0, op_at = -1;

	if (!text || !out)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"spec text and output must not be NULL");
	const char *p = text;
	while (*p) {
		const char *end = strchr(p, ';');
		if (!end)
			end = p + strlen(p);
		const char *eq = memchr(p, '=', (size_t)(end - p));
		char whole[128];
		if (!eq) {
			if (!trim_copy(p, end, whole, sizeof(whole)))
				return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
						"spec: a token is too long");
			if (whole[0])
				return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
						"'%s': expected key=value (pairs end with ';')",
						whole);
		} else {
			if (n == MAX_PAIRS)
				return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
						"spec: too many keys");
			if (!trim_copy(p, eq, kbuf[n], sizeof(kbuf[n])) ||
			    !trim_copy(eq + 1, end, vbuf[n], sizeof(vbuf[n])))
				return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
						"spec: a key or value is too long");
			if (!kbuf[n][0])
				return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
						"'=%s': missing key", vbuf[n]);
			for (int i = 0; i < n; i++)
				if (strcmp(kbuf[i], kbuf[n]) == 0)
					return dg__msgf(DG_ERR_INVALID_SPEC,
							msg, size,
							"%s: given twice",
							kbuf[n]);
			if (strcmp(kbuf[n], "op") == 0)
				op_at = n;
			n++;
		}
		p = *end ? end + 1 : end;
	}
	if (op_at < 0)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"spec: op is missing (e.g. op=lowrank_fwd;)");
	dg_op op;
	if (!dg_op_from_name(vbuf[op_at], &op)) {
		char ol[400];
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size, "op=%s: unknown; ops are %s",
				vbuf[op_at], op_list(ol, sizeof(ol)));
	}
	dg_spec s;
	dg_spec_init(&s, op);
	for (int i = 0; i < n; i++) {
		if (i == op_at)
			continue;
		dg_status st = dg_spec_set(&s, kbuf[i], vbuf[i], msg, size);
		if (st)
			return st;
	}
	dg_status st = dg_spec_validate(&s, msg, size);
	if (st)
		return st;
	dg_spec_normalize(&s);
	*out = s;
	return DG_OK;
}
