/*
 * The specialization key: defaults, normalization, validation and the
 * tile's text. Its text form (canonical text, parser, setters) is in
 * codegen/spec_text.c, which uses this file and never the other way.
 *
 * Validation reads the op table (codegen/optable.c): the fields an op
 * reads, the formats each takes, how its axes are packed. Every refusal
 * names the key, the value and the fix ("embd=6: must be a multiple of 4
 * (codes are packed four to a word along it)"). Tile values are not
 * judged here: the template that renders the op owns those rules
 * (dg_codegen_plan); only the tile's kind (block tile or thread count) is
 * the op table's.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/msg.h"
#include "codegen/spec_int.h"
#include "dragon/spec.h"

#define DG_MAX_HEADS 64
#define DG_MAX_EMBD (1 << 20) /* a row of the decoder's K = H·N (its transposes, quantizers, packs) */
#define DG_MAX_LATENT (1 << 20)
#define DG_MAX_VOCAB 65536
#define DG_MAX_CHUNK 4096

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
	else if (t->threads && t->stages)
		snprintf(buf, size, "t%d/%d", t->threads, t->stages);
	else if (t->threads)
		snprintf(buf, size, "t%d", t->threads);
	else
		snprintf(buf, size, "%dx%dx%d/%dx%d/%d", t->bm, t->bn, t->bk,
			 t->wm, t->wn, t->stages);
}

/* ---- defaults and normalization ------------------------------------------- */

/* The defaults every op starts from (BDH's shape, int8 codes). */
static void common_defaults(dg_spec *spec, dg_op op)
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
	spec->vocab = 256;
	spec->chunk = 256;
}

void dg_spec_init(dg_spec *spec, dg_op op)
{
	const dg_op_info *row = dg_op_info_of(op);

	common_defaults(spec, op);
	if (!row)
		return;
	const dg_op_defaults *d = &row->defaults;
	if (d->fields & DG_FIELD_WEIGHT)
		spec->weight = d->weight;
	if (d->fields & DG_FIELD_ACT)
		spec->act = d->act;
	if (d->fields & DG_FIELD_OUT)
		spec->out = d->out;
	if (d->fields & DG_FIELD_SRC)
		spec->src = d->src;
	if (d->fields & DG_FIELD_ASCALE)
		spec->ascale = d->ascale;
	if (d->fields & DG_FIELD_WSCALE)
		spec->wscale = d->wscale;
	if (d->fields & DG_FIELD_RELU) {
		spec->relu = d->relu;
		spec->relu_thr = d->relu_thr;
	}
	if (d->fields & DG_FIELD_ARCH)
		spec->arch_specific = d->arch_specific;
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
	if (!(uses & DG_FIELD_VOCAB))
		spec->vocab = d.vocab;
	if (!(uses & DG_FIELD_CHUNK))
		spec->chunk = d.chunk;
	if (!(uses & DG_FIELD_WEIGHT))
		spec->weight = d.weight;
	if (!(uses & DG_FIELD_ACT))
		spec->act = d.act;
	if (!(uses & DG_FIELD_OUT))
		spec->out = d.out;
	if (!(uses & DG_FIELD_SRC))
		spec->src = d.src;
	if (!(uses & DG_FIELD_ASCALE))
		spec->ascale = d.ascale;
	if (!(uses & DG_FIELD_WSCALE))
		spec->wscale = d.wscale;
	if (!(uses & DG_FIELD_ROPE))
		spec->rope_pre = d.rope_pre;
	if (!(uses & DG_FIELD_EPI))
		spec->epi = d.epi;
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

const char *dg_scale_name(dg_scale_gran g)
{
	switch (g) {
	case DG_SCALE_TENSOR:
		return "tensor";
	case DG_SCALE_TOKEN:
		return "token";
	case DG_SCALE_CHANNEL:
		return "channel";
	}
	return "?";
}

const char *dg_epi_name(dg_epi e)
{
	switch (e) {
	case DG_EPI_STORE:
		return "store";
	case DG_EPI_MASK:
		return "mask";
	case DG_EPI_ROPE:
		return "rope";
	}
	return "?";
}

/* ascale and wscale: the granularities each takes, and that anything
 * finer than a tensor scales codes (a float operand has no scale). */
static dg_status check_scales(const dg_spec *s, unsigned uses, char *msg, size_t size)
{
	if (uses & DG_FIELD_ASCALE) {
		if (s->ascale != DG_SCALE_TENSOR && s->ascale != DG_SCALE_TOKEN)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"ascale=%s: activations take tensor or token",
					dg_scale_name(s->ascale));
		if (s->ascale == DG_SCALE_TOKEN && !dg_fmt_is_code(s->act))
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"ascale=token: act=%s has no scale; use an integer act (int8, int4, uint8pos) or ascale=tensor",
					dg_fmt_name(s->act));
	}
	if (uses & DG_FIELD_WSCALE) {
		if (s->wscale != DG_SCALE_TENSOR && s->wscale != DG_SCALE_CHANNEL)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"wscale=%s: weights take tensor or channel",
					dg_scale_name(s->wscale));
		if (s->wscale == DG_SCALE_CHANNEL && !dg_fmt_is_code(s->weight))
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"wscale=channel: weight=%s has no scale; use an integer weight (int8, ternary, sign1) or wscale=tensor",
					dg_fmt_name(s->weight));
	}
	/* Output codes are rounded from one per-launch map of the sum
	 * (runtime/ref/ref_ops.h lowrank_fwd), which a scale a row or a column breaks. */
	if ((uses & DG_FIELD_OUT) && (uses & DG_FIELD_RELU) && dg_fmt_is_code(s->out) &&
	    ((s->ascale != DG_SCALE_TENSOR) || (s->wscale != DG_SCALE_TENSOR)))
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"out=%s: output codes need per-tensor input scales (ascale=tensor, wscale=tensor); use out=bf16 or out=f32",
				dg_fmt_name(s->out));
	return DG_OK;
}

unsigned dg__spec_fmts(const dg_op_info *row, dg_field field)
{
	switch (field) {
	case DG_FIELD_WEIGHT:
		return row->weight_fmts;
	case DG_FIELD_ACT:
		return row->act_fmts;
	case DG_FIELD_OUT:
		return row->out_fmts;
	case DG_FIELD_SRC:
		return row->src_fmts;
	default:
		return 0;
	}
}

static dg_status check_fmt(const dg_op_info *row, dg_op op, const char *key,
			   dg_field field, dg_fmt f, char *msg, size_t size)
{
	char fl[96];
	unsigned mask = dg__spec_fmts(row, field);

	if ((unsigned)f < DG_FMT__COUNT && (mask & DG_FMT_BIT(f)))
		return DG_OK;
	return dg__msgf(DG_ERR_INVALID_SPEC, msg, size, "%s=%s: op %s takes one of %s", key,
			dg_fmt_name(f), dg_op_name(op), dg_fmt_list(mask, fl, sizeof(fl)));
}

/* A length along which a format's codes are packed must fill whole words. */
/* len along key holds codes of f: a whole number of words. The message
 * names what packs them: what=value (value NULL: f's name). */
static dg_status check_packed(const char *key, int len, dg_fmt f, const char *what,
			      const char *value, char *msg, size_t size)
{
	int per = dg_fmt_per_word(f);

	if (per <= 4 || len % per == 0)
		return DG_OK;
	return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
			"%s=%d: %s=%s packs %d codes a word along %s, so %s must be a multiple of %d",
			key, len, what, value ? value : dg_fmt_name(f), per, key, key, per);
}

static dg_status check_tile_kind(const dg_spec *s, const dg_op_info *row, char *msg,
				 size_t size)
{
	const dg_tile *t = &s->tile;
	char tb[64];

	if (dg_tile_is_auto(t))
		return DG_OK;
	dg_tile_to_string(t, tb, sizeof(tb));
	if (row->tile == DG_TILE_GEMM && t->threads)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"tile=%s: op %s takes a block tile BMxBNxBK/WMxWN/S (e.g. 64x64x64/2x2/2), not a thread count",
				tb, dg_op_name(s->op));
	if (row->tile == DG_TILE_THREADS && (t->bm || t->bn || t->bk || t->wm || t->wn || !t->threads))
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"tile=%s: op %s takes a thread count (tile=t256, or t256/1), not a block tile",
				tb, dg_op_name(s->op));
	return DG_OK;
}

dg_status dg_spec_validate(const dg_spec *s, char *msg, size_t size)
{
	dg_status st;

	if (!s)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size, "spec is NULL");
	const dg_op_info *row = dg_op_info_of(s->op);
	if (!row)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size, "op=%d: unknown op", (int)s->op);
	unsigned uses = row->fields;

	if ((uses & DG_FIELD_HEADS) && (s->heads < 1 || s->heads > DG_MAX_HEADS))
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"heads=%d: must be between 1 and %d", s->heads, DG_MAX_HEADS);
	if ((uses & DG_FIELD_IN_HEADS) && s->in_heads != 1 && s->in_heads != s->heads)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"in_heads=%d: must be 1 (input shared by all heads) or heads=%d",
				s->in_heads, s->heads);
	static const struct {
		dg_field field;
		const char *key;
		size_t off;
	} fmt_fields[] = {
		{ DG_FIELD_WEIGHT, "weight", offsetof(dg_spec, weight) },
		{ DG_FIELD_ACT, "act", offsetof(dg_spec, act) },
		{ DG_FIELD_SRC, "src", offsetof(dg_spec, src) },
		{ DG_FIELD_OUT, "out", offsetof(dg_spec, out) },
	};
	for (size_t i = 0; i < sizeof(fmt_fields) / sizeof(fmt_fields[0]); i++) {
		if (!(uses & fmt_fields[i].field))
			continue;
		dg_fmt f;
		memcpy(&f, (const char *)s + fmt_fields[i].off, sizeof(f));
		st = check_fmt(row, s->op, fmt_fields[i].key, fmt_fields[i].field, f, msg, size);
		if (st)
			return st;
	}
	if (row->needs_relu && !s->relu)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"relu=none: op %s needs the forward's threshold (relu=0 or relu=T)",
				dg_op_name(s->op));
	if (uses & DG_FIELD_EMBD) {
		if (s->embd < 4 || s->embd > DG_MAX_EMBD)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"embd=%d: must be between 4 and %d", s->embd, DG_MAX_EMBD);
		if (s->embd % 4)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"embd=%d: must be a multiple of 4 (codes are packed four to a word along it)",
					s->embd);
		if (row->weight_axis == DG_FIELD_EMBD &&
		    (st = check_packed("embd", s->embd, s->weight, "weight", NULL, msg, size)))
			return st;
		if (row->pack_fmt != DG_FMT__COUNT &&
		    (st = check_packed("embd", s->embd, row->pack_fmt, "op", dg_op_name(s->op), msg, size)))
			return st;
	}
	if (uses & DG_FIELD_LATENT) {
		if (s->latent < 1 || s->latent > DG_MAX_LATENT)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"latent=%d: must be between 1 and %d", s->latent, DG_MAX_LATENT);
		if (!row->latent_any && s->latent % 4)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"latent=%d: must be a multiple of 4 (codes are packed four to a word along it)",
					s->latent);
		if (row->weight_axis == DG_FIELD_LATENT &&
		    (st = check_packed("latent", s->latent, s->weight, "weight", NULL, msg, size)))
			return st;
	}
	if ((uses & DG_FIELD_VOCAB) && (s->vocab < 2 || s->vocab > DG_MAX_VOCAB))
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"vocab=%d: must be between 2 and %d (token ids 0..vocab-1)", s->vocab,
				DG_MAX_VOCAB);
	if ((uses & DG_FIELD_CHUNK) && (s->chunk < 64 || s->chunk > DG_MAX_CHUNK || s->chunk % 64))
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				"chunk=%d: must be a multiple of 64 between 64 and %d (the rows of T a state covers)",
				s->chunk, DG_MAX_CHUNK);
	if (uses & DG_FIELD_RELU) {
		if (s->relu && !isfinite(s->relu_thr))
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"relu=%g: the threshold must be a finite number (or none)",
					(double)s->relu_thr);
		if ((uses & DG_FIELD_OUT) && s->out == DG_FMT_UINT8POS && !s->relu)
			return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
					"out=uint8pos: needs relu (unsigned codes hold only values >= 0); use out=int8 or set relu");
	}
	if ((st = check_scales(s, uses, msg, size)))
		return st;
	/* store, and the op's other epilogue: lowrank_fwd's rope,
	 * attention_grad_xs's mask */
	const bool lr = s->op == DG_OP_LOWRANK_FWD;
	if ((uses & DG_FIELD_EPI) && s->epi != DG_EPI_STORE && s->epi != (lr ? DG_EPI_ROPE : DG_EPI_MASK)) {
		char en[16]; /* its name, or its number outside the enum */
		snprintf(en, sizeof(en), "%s", dg_epi_name(s->epi));
		if (en[0] == '?')
			snprintf(en, sizeof(en), "%d", (int)s->epi);
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, size,
				lr ? "epi=%s: lowrank_fwd's must be store (out alone) or rope (out, and RoPE(out) into qr)"
				   : "epi=%s: must be store (write grad_xs) or mask (dxs = (dxs + grad_xs)·[mask_xs > 0] in place)",
				en);
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
		return check_tile_kind(s, row, msg, size);
	return DG_OK;
}
