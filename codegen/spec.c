/*
 * The specialization key: names, defaults, validation, canonical text.
 *
 * The canonical text is the identity of a kernel: it is hashed into cache
 * keys, written to manifests and tuning records, and shown to users. It
 * holds only the keys the op reads, sorted, so two specs naming the same
 * kernel always print the same. Floats print in the shortest decimal form
 * that reads back to the same float.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	default:
		return 0;
	}
}

/* GEMM-like ops take a block tile; the rest take a thread count. */
static bool op_is_gemm(dg_op op)
{
	return op == DG_OP_LOWRANK_FWD;
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

static dg_status fail(char *msg, size_t size, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static dg_status fail(char *msg, size_t size, const char *fmt, ...)
{
	if (msg && size) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, size, fmt, ap);
		va_end(ap);
	}
	return DG_ERR_INVALID_SPEC;
}

static bool fmt_in(dg_fmt f, unsigned mask)
{
	return (unsigned)f < DG_FMT__COUNT && (mask & (1u << f));
}

#define FMT_BIT(f) (1u << (f))
static const unsigned weight_fmts = FMT_BIT(DG_FMT_F32) | FMT_BIT(DG_FMT_BF16) |
	FMT_BIT(DG_FMT_INT8) | FMT_BIT(DG_FMT_TERNARY) | FMT_BIT(DG_FMT_SIGN1);
static const unsigned act_fmts = FMT_BIT(DG_FMT_F32) | FMT_BIT(DG_FMT_BF16) |
	FMT_BIT(DG_FMT_INT8) | FMT_BIT(DG_FMT_INT4) | FMT_BIT(DG_FMT_UINT8POS);
static const unsigned quant_fmts = FMT_BIT(DG_FMT_INT8) | FMT_BIT(DG_FMT_INT4) |
	FMT_BIT(DG_FMT_UINT8POS);
static const unsigned out_fmts = FMT_BIT(DG_FMT_F32) | FMT_BIT(DG_FMT_BF16) |
	FMT_BIT(DG_FMT_INT8) | FMT_BIT(DG_FMT_UINT8POS);
static const unsigned src_fmts = FMT_BIT(DG_FMT_F32) | FMT_BIT(DG_FMT_BF16);

/* "f32|bf16|int8" for messages. */
static const char *fmt_list(unsigned mask, char *buf, size_t size)
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

/* Bytes of shared memory a lowrank tile stages: codes as bytes on the
 * integer path, floats otherwise. */
static long lowrank_smem(const dg_spec *s, const dg_tile *t)
{
	int p = fmt_is_int(s->weight) && fmt_is_int(s->act) ? 1 : 4;
	return (long)t->stages * (t->bm + t->bn) * t->bk * p;
}

static dg_status validate_tile(const dg_spec *s, char *msg, size_t size)
{
	const dg_tile *t = &s->tile;
	char tb[64];

	if (dg_tile_is_auto(t))
		return DG_OK;
	dg_tile_to_string(t, tb, sizeof(tb));
	if (!op_is_gemm(s->op)) {
		if (t->bm || t->bn || t->bk || t->wm || t->wn || t->stages)
			return fail(msg, size,
				    "tile=%s: op %s takes a thread count (tile=t256), not a block tile",
				    tb, dg_op_name(s->op));
		if (t->threads < 32 || t->threads > 1024 || t->threads % 32)
			return fail(msg, size,
				    "tile=%s: threads must be a multiple of 32 between 32 and 1024",
				    tb);
		return DG_OK;
	}
	if (t->threads)
		return fail(msg, size,
			    "tile=%s: op %s takes a block tile BMxBNxBK/WMxWN/S (e.g. 64x64x64/2x2/2), not a thread count",
			    tb, dg_op_name(s->op));
	if (!is_pow2_in(t->bm, 16, 256) || !is_pow2_in(t->bn, 16, 256))
		return fail(msg, size,
			    "tile=%s: BM and BN must be powers of two from 16 to 256",
			    tb);
	if (!is_pow2_in(t->bk, 4, 128))
		return fail(msg, size,
			    "tile=%s: BK must be a power of two from 4 to 128", tb);
	int cpw = codes_per_word(s->weight);
	if (codes_per_word(s->act) > cpw)
		cpw = codes_per_word(s->act);
	if (t->bk % cpw)
		return fail(msg, size,
			    "tile=%s: BK must be a multiple of %d (weight=%s act=%s pack that many codes a word)",
			    tb, cpw, dg_fmt_name(s->weight), dg_fmt_name(s->act));
	if (s->embd % t->bk)
		return fail(msg, size,
			    "tile=%s: BK=%d must divide embd=%d", tb, t->bk,
			    s->embd);
	if (!is_pow2_in(t->wm, 1, 8) || !is_pow2_in(t->wn, 1, 8) ||
	    t->wm * t->wn > 16)
		return fail(msg, size,
			    "tile=%s: WM and WN must be 1, 2, 4 or 8 with WM*WN <= 16 warps",
			    tb);
	if ((t->bm / t->wm) % 4 || (t->bn / t->wn) % 8 || t->bm < t->wm * 4 ||
	    t->bn < t->wn * 8)
		return fail(msg, size,
			    "tile=%s: each warp's tile (BM/WM x BN/WN) must be at least 4x8 and a multiple of it",
			    tb);
	if ((t->bm / t->wm / 4) * (t->bn / t->wn / 8) > 64)
		return fail(msg, size,
			    "tile=%s: %d outputs per thread; at most 64 fit in registers (more warps or a smaller tile)",
			    tb, (t->bm / t->wm / 4) * (t->bn / t->wn / 8));
	if (t->stages < 1 || t->stages > 4)
		return fail(msg, size, "tile=%s: stages must be 1 to 4", tb);
	long smem = lowrank_smem(s, t);
	if (smem > DG_SMEM_LIMIT)
		return fail(msg, size,
			    "tile=%s: needs %ld bytes of shared memory, more than %d (fewer stages or a smaller tile)",
			    tb, smem, DG_SMEM_LIMIT);
	return DG_OK;
}

dg_status dg_spec_validate(const dg_spec *s, char *msg, size_t size)
{
	char fl[96];

	if (!s)
		return fail(msg, size, "spec is NULL");
	if ((unsigned)s->op >= DG_OP__COUNT)
		return fail(msg, size,
			    "op=%d: unknown; ops are lowrank_fwd, quantize_act, pack_i8x4, unpack_i8x4",
			    (int)s->op);
	unsigned uses = dg_spec_uses(s->op);
	const char *op = dg_op_name(s->op);

	if ((uses & DG_FIELD_HEADS) && (s->heads < 1 || s->heads > DG_MAX_HEADS))
		return fail(msg, size, "heads=%d: must be between 1 and %d",
			    s->heads, DG_MAX_HEADS);
	if ((uses & DG_FIELD_IN_HEADS) && s->in_heads != 1 &&
	    s->in_heads != s->heads)
		return fail(msg, size,
			    "in_heads=%d: must be 1 (input shared by all heads) or heads=%d",
			    s->in_heads, s->heads);
	if (uses & DG_FIELD_WEIGHT && !fmt_in(s->weight, weight_fmts))
		return fail(msg, size, "weight=%s: must be one of %s",
			    dg_fmt_name(s->weight),
			    fmt_list(weight_fmts, fl, sizeof(fl)));
	if (uses & DG_FIELD_ACT) {
		unsigned allowed = s->op == DG_OP_QUANTIZE_ACT ? quant_fmts
							       : act_fmts;
		if (!fmt_in(s->act, allowed))
			return fail(msg, size,
				    "act=%s: op %s takes one of %s", dg_fmt_name(s->act),
				    op, fmt_list(allowed, fl, sizeof(fl)));
	}
	if (uses & DG_FIELD_SRC && !fmt_in(s->src, src_fmts))
		return fail(msg, size, "src=%s: must be one of %s",
			    dg_fmt_name(s->src),
			    fmt_list(src_fmts, fl, sizeof(fl)));
	if (uses & DG_FIELD_OUT && !fmt_in(s->out, out_fmts))
		return fail(msg, size, "out=%s: must be one of %s",
			    dg_fmt_name(s->out),
			    fmt_list(out_fmts, fl, sizeof(fl)));
	if (uses & DG_FIELD_EMBD) {
		if (s->embd < 4 || s->embd > DG_MAX_EMBD)
			return fail(msg, size, "embd=%d: must be between 4 and %d",
				    s->embd, DG_MAX_EMBD);
		if (s->embd % 4)
			return fail(msg, size,
				    "embd=%d: must be a multiple of 4 (codes are packed four to a word along it)",
				    s->embd);
		if (uses & DG_FIELD_WEIGHT) {
			int cpw = codes_per_word(s->weight);
			if (cpw > 4 && s->embd % cpw)
				return fail(msg, size,
					    "embd=%d: weight=%s packs %d codes a word along embd, so embd must be a multiple of %d",
					    s->embd, dg_fmt_name(s->weight), cpw,
					    cpw);
		}
	}
	if (uses & DG_FIELD_LATENT) {
		if (s->latent < 1 || s->latent > DG_MAX_LATENT)
			return fail(msg, size,
				    "latent=%d: must be between 1 and %d",
				    s->latent, DG_MAX_LATENT);
		if (s->op == DG_OP_LOWRANK_FWD && s->latent % 4)
			return fail(msg, size,
				    "latent=%d: must be a multiple of 4 (output codes are packed four to a word for the next op)",
				    s->latent);
	}
	if (uses & DG_FIELD_RELU) {
		if (s->relu && !isfinite(s->relu_thr))
			return fail(msg, size,
				    "relu=%g: the threshold must be a finite number (or none)",
				    (double)s->relu_thr);
		if (uses & DG_FIELD_OUT && s->out == DG_FMT_UINT8POS && !s->relu)
			return fail(msg, size,
				    "out=uint8pos: needs relu (unsigned codes hold only values >= 0); use out=int8 or set relu");
	}
	if (uses & DG_FIELD_ARCH) {
		if (s->arch < 50 || s->arch > 199)
			return fail(msg, size,
				    "arch=sm_%d: must be sm_50 or newer, e.g. sm_90",
				    s->arch);
		if (s->arch_specific && s->arch < 90)
			return fail(msg, size,
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

void dg_tile_to_string(const dg_tile *t, char *buf, size_t size)
{
	if (dg_tile_is_auto(t))
		snprintf(buf, size, "auto");
	else if (t->threads)
		snprintf(buf, size, "t%d", t->threads);
	else
		snprintf(buf, size, "%dx%dx%d/%dx%d/%d", t->bm, t->bn, t->bk,
			 t->wm, t->wn, t->stages);
}

void dg_spec_default_tile(const dg_spec *s, dg_tile *tile)
{
	if (!dg_tile_is_auto(&s->tile)) {
		*tile = s->tile;
		return;
	}
	memset(tile, 0, sizeof(*tile));
	if (!op_is_gemm(s->op)) {
		tile->threads = 256;
		return;
	}
	/* 64x64 blocks of 2x2 warps (128 threads, 32 outputs a thread) keep
	 * enough blocks in flight at BDH shapes; BK is the largest step up to
	 * 64 that divides embd and whole storage words, double-buffered. */
	bool ints = fmt_is_int(s->weight) && fmt_is_int(s->act);
	int cpw = codes_per_word(s->weight);
	if (codes_per_word(s->act) > cpw)
		cpw = codes_per_word(s->act);
	if (cpw < 4)
		cpw = 4;
	int bk = ints ? 64 : 32;
	while (bk > cpw && (s->embd % bk))
		bk /= 2;
	tile->bm = 64;
	tile->bn = 64;
	tile->bk = bk;
	tile->wm = 2;
	tile->wn = 2;
	tile->stages = 2;
}

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
	char t[64];

	buf[0] = '\0';
	/* keys in sorted order */
	if (uses & DG_FIELD_ACT)
		sb_add(&b, "act", dg_fmt_name(s->act));
	if (uses & DG_FIELD_ARCH) {
		snprintf(t, sizeof(t), "sm_%d%s", s->arch,
			 s->arch_specific ? "a" : "");
		sb_add(&b, "arch", t);
	}
	if (uses & DG_FIELD_EMBD)
		sb_addi(&b, "embd", s->embd);
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
	if (uses & DG_FIELD_SRC)
		sb_add(&b, "src", dg_fmt_name(s->src));
	if (uses & DG_FIELD_TILE) {
		dg_tile_to_string(&s->tile, t, sizeof(t));
		sb_add(&b, "tile", t);
	}
	if (uses & DG_FIELD_WEIGHT)
		sb_add(&b, "weight", dg_fmt_name(s->weight));
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
	{ "embd", DG_FIELD_EMBD },     { "heads", DG_FIELD_HEADS },
	{ "in_heads", DG_FIELD_IN_HEADS }, { "latent", DG_FIELD_LATENT },
	{ "out", DG_FIELD_OUT },       { "relu", DG_FIELD_RELU },
	{ "src", DG_FIELD_SRC },       { "tile", DG_FIELD_TILE },
	{ "weight", DG_FIELD_WEIGHT },
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

/* "auto" | "t<threads>" | "BMxBNxBK/WMxWN/S" */
static bool parse_tile(const char *v, dg_tile *t)
{
	dg_tile r = { 0 };
	char tail;

	if (strcmp(v, "auto") == 0) {
		*t = r;
		return true;
	}
	if (v[0] == 't') {
		if (!parse_int(v + 1, 1, 1 << 20, &r.threads))
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
	case DG_FIELD_LATENT: {
		int x;
		if (!parse_int(v, 0, INT_MAX, &x))
			return fail(msg, size,
				    "%s=%s: must be a positive decimal integer",
				    k->name, v);
		if (k->field == DG_FIELD_HEADS)
			s->heads = x;
		else if (k->field == DG_FIELD_IN_HEADS)
			s->in_heads = x;
		else if (k->field == DG_FIELD_EMBD)
			s->embd = x;
		else
			s->latent = x;
		return DG_OK;
	}
	case DG_FIELD_WEIGHT:
	case DG_FIELD_ACT:
	case DG_FIELD_OUT:
	case DG_FIELD_SRC: {
		unsigned mask = k->field == DG_FIELD_WEIGHT ? weight_fmts
				: k->field == DG_FIELD_ACT  ? act_fmts
				: k->field == DG_FIELD_OUT  ? out_fmts
							    : src_fmts;
		if (!dg_fmt_from_name(v, &f) || !fmt_in(f, mask))
			return fail(msg, size, "%s=%s: must be one of %s",
				    k->name, v, fmt_list(mask, fl, sizeof(fl)));
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
			return fail(msg, size,
				    "relu=%s: must be none or a finite threshold such as 0 or 0.25",
				    v);
		s->relu = true;
		s->relu_thr = x == 0.0f ? 0.0f : x;
		return DG_OK;
	}
	case DG_FIELD_TILE:
		if (!parse_tile(v, &s->tile))
			return fail(msg, size,
				    "tile=%s: must be auto, t<threads> (e.g. t256) or BMxBNxBK/WMxWN/S (e.g. 64x64x64/2x2/2)",
				    v);
		return DG_OK;
	case DG_FIELD_ARCH:
		if (!parse_arch(v, &s->arch, &s->arch_specific))
			return fail(msg, size,
				    "arch=%s: must look like sm_90 or sm_90a", v);
		return DG_OK;
	}
	return fail(msg, size, "%s: unknown key", k->name);
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
	char kl[160];

	if (!s || !key || !value)
		return fail(msg, size, "spec, key and value must not be NULL");
	if (strcmp(key, "op") == 0) {
		dg_op op;
		if (!dg_op_from_name(value, &op))
			return fail(msg, size,
				    "op=%s: unknown; ops are lowrank_fwd, quantize_act, pack_i8x4, unpack_i8x4",
				    value);
		s->op = op;
		return DG_OK;
	}
	const key_info *k = find_key(key);
	if (!k)
		return fail(msg, size,
			    "%s: unknown key; keys are op, act, arch, embd, heads, in_heads, latent, out, relu, src, tile, weight",
			    key);
	if (!(dg_spec_uses(s->op) & k->field)) {
		list_keys(dg_spec_uses(s->op), kl, sizeof(kl));
		return fail(msg, size, "%s: op %s does not take it; it takes %s",
			    key, dg_op_name(s->op), kl);
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
		return fail(msg, size, "spec text and output must not be NULL");
	const char *p = text;
	while (*p) {
		const char *end = strchr(p, ';');
		if (!end)
			end = p + strlen(p);
		const char *eq = memchr(p, '=', (size_t)(end - p));
		char whole[128];
		if (!eq) {
			if (!trim_copy(p, end, whole, sizeof(whole)))
				return fail(msg, size, "spec: a token is too long");
			if (whole[0])
				return fail(msg, size,
					    "'%s': expected key=value (pairs end with ';')",
					    whole);
		} else {
			if (n == MAX_PAIRS)
				return fail(msg, size, "spec: too many keys");
			if (!trim_copy(p, eq, kbuf[n], sizeof(kbuf[n])) ||
			    !trim_copy(eq + 1, end, vbuf[n], sizeof(vbuf[n])))
				return fail(msg, size, "spec: a key or value is too long");
			if (!kbuf[n][0])
				return fail(msg, size, "'=%s': missing key", vbuf[n]);
			for (int i = 0; i < n; i++)
				if (strcmp(kbuf[i], kbuf[n]) == 0)
					return fail(msg, size, "%s: given twice",
						    kbuf[n]);
			if (strcmp(kbuf[n], "op") == 0)
				op_at = n;
			n++;
		}
		p = *end ? end + 1 : end;
	}
	if (op_at < 0)
		return fail(msg, size,
			    "spec: op is missing (e.g. op=lowrank_fwd;)");
	dg_op op;
	if (!dg_op_from_name(vbuf[op_at], &op))
		return fail(msg, size,
			    "op=%s: unknown; ops are lowrank_fwd, quantize_act, pack_i8x4, unpack_i8x4",
			    vbuf[op_at]);
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
