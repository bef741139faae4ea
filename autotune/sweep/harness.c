/*
 * The sweep's harness: for each op, the tensors of one call at a shape,
 * random inputs, the call through the public ops API (dragon/ops.h) with a
 * candidate's spec, and the comparison with the CPU reference
 * (dragon/ref.h) — integer outputs bit for bit, float outputs within
 * atol + rtol·|ref|, gradients by their norm error (bf16 tensor cores),
 * like the GPU tests.
 *
 * Shapes at R rows (B = 1, T = R; H, Hin, E, L from the spec):
 *   lowrank_fwd          x (1,Hin,R,E), w (H,L,E) → out (1,H,R,L)
 *   relu_mask            x, w as lowrank_fwd, grad (1,H,R,L) → grad_out
 *   decoder_fwd          y (1,H,R,L), w (E,H·L) → out (1,1,R,E)
 *   lowrank_grad_input   grad (1,H,R,L), w (H,L,E) → grad_x (1,Hin,R,E)
 *   lowrank_grad_weight  grad (1,H,R,L), x (1,Hin,R,E) → grad_w (H,L,E)
 *   decoder_grad_input   grad (1,1,R,E), w (E,H·L) → grad_y (1,H,R,L)
 *   decoder_grad_weight  grad (1,1,R,E), y (1,H,R,L) → grad_w (E,H·L)
 *   quantize_act         x (R, 32768) → codes: the BDH latent, H·L wide
 *   quantize_weight      w (8R, 256) → codes: at R = 4096 the BDH weight
 *   pack_ternary/sign1   codes (8R, E) → packed
 *   pack_i8x4            codes (N, E, L) → packed (N, L, E), N = 4 (the
 *                        BDH heads) from R = 1024 on, else 1
 *   unpack_i8x4          packed (N, L, E) → codes (N, E, L)
 * The ops whose spec has no shape of their own (quantize, pack) get the
 * BDH sizes, so their timings speak of a training step.
 *
 * Large inputs of a timing case are made from a 16 MiB random block
 * uploaded again and again (the values do not change the speed); a check
 * case keeps its whole host inputs for the reference.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autotune/sweep/sweep_int.h"
#include "dragon/ops.h"
#include "dragon/ref.h"
#include "dragon/tensor.h"
#include "runtime/gpu/gpu_int.h"

#define QACT_COLS 32768
#define QW_COLS 256
#define FILL_BLOCK ((size_t)16 << 20)

typedef struct tbuf {
	dg_fmt fmt;
	size_t n;      /* elements */
	size_t bytes;  /* storage */
	void *host;    /* check cases: the data */
	dg_dptr d;
	dg_dptr scale; /* device float, code formats */
	float sval;
} tbuf;

struct dg__at_case {
	dg_device *dev;
	dg_spec spec;
	int rows;
	bool check;
	uint64_t rng;
	tbuf in[3];
	int n_in;
	tbuf out;
	dg_tensor tin[3], tout;
	void *want;       /* reference output (check), out.bytes */
	float want_scale; /* quantize ops: the reference scale */
	size_t dev_bytes;
};

static bool is_code(dg_fmt f)
{
	return f == DG_FMT_INT8 || f == DG_FMT_INT4 || f == DG_FMT_UINT8POS ||
	       f == DG_FMT_TERNARY || f == DG_FMT_SIGN1;
}

static uint64_t next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static float uniform(uint64_t *s)
{
	return (float)((double)(next(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static size_t storage_bytes(dg_fmt f, size_t n)
{
	switch (f) {
	case DG_FMT_F32:
		return n * 4;
	case DG_FMT_BF16:
		return n * 2;
	case DG_FMT_TERNARY:
		return n / 4;
	case DG_FMT_SIGN1:
		return n / 8;
	default:
		return n;
	}
}

/* n random values of f into p (storage; packed formats along the flat
 * order, n a multiple of 32). */
static void random_fill(uint64_t *s, dg_fmt f, void *p, size_t n)
{
	uint8_t *b = p;

	switch (f) {
	case DG_FMT_F32:
		for (size_t i = 0; i < n; i++)
			((float *)p)[i] = uniform(s);
		return;
	case DG_FMT_BF16:
		for (size_t i = 0; i < n; i++)
			((uint16_t *)p)[i] = dg_ref_f32_to_bf16(uniform(s));
		return;
	case DG_FMT_TERNARY:
		memset(p, 0, n / 4);
		for (size_t i = 0; i < n; i++) {
			uint64_t c = next(s) % 3; /* 0, +1 (01), -1 (11) */
			((uint32_t *)p)[i / 16] |= (uint32_t)(c == 0 ? 0 : c == 1 ? 1 : 3)
						   << (2 * (i % 16));
		}
		return;
	case DG_FMT_SIGN1:
		for (size_t i = 0; i < n / 32; i++)
			((uint32_t *)p)[i] = (uint32_t)next(s);
		return;
	case DG_FMT_INT4:
		for (size_t i = 0; i < n; i++)
			b[i] = (uint8_t)(int8_t)((int)(next(s) % 15) - 7);
		return;
	case DG_FMT_UINT8POS:
		for (size_t i = 0; i < n; i++)
			b[i] = (uint8_t)(next(s) % 256);
		return;
	default:
		for (size_t i = 0; i < n; i++)
			b[i] = (uint8_t)(int8_t)((int)(next(s) % 255) - 127);
		return;
	}
}

/* Allocates b on the device and fills it; keep: the host copy stays. */
static dg_status buf_make(dg__at_case *c, tbuf *b, dg_fmt f, size_t n, bool fill,
			  bool keep)
{
	dg_status st;

	b->fmt = f;
	b->n = n;
	b->bytes = storage_bytes(f, n);
	st = dg_malloc(c->dev, b->bytes ? b->bytes : 1, &b->d);
	if (st)
		return st;
	c->dev_bytes += b->bytes;
	if (is_code(f)) {
		b->sval = f == DG_FMT_INT8 || f == DG_FMT_INT4 || f == DG_FMT_UINT8POS
				  ? 1.0f / (float)dg_ref_qmax(f)
				  : 0.05f;
		st = dg_malloc(c->dev, sizeof(float), &b->scale);
		if (!st)
			st = dg_memcpy_htod(c->dev, b->scale, &b->sval, sizeof(float));
		if (st)
			return st;
	}
	if (!fill)
		return DG_OK;
	size_t whole = b->bytes;
	/* A block of whole 32-value groups (packed words stay aligned). */
	size_t block_vals = keep ? n : (FILL_BLOCK / 4) / 32 * 32;
	if (block_vals > n)
		block_vals = n;
	size_t block_bytes = storage_bytes(f, block_vals);
	void *h = malloc(block_bytes ? block_bytes : 1);
	if (!h)
		return dg__dev_fail(c->dev, DG_ERR_NOMEM,
				    "out of memory: %zu bytes of host inputs", block_bytes);
	random_fill(&c->rng, f, h, block_vals);
	for (size_t off = 0; off < whole && !st; off += block_bytes) {
		size_t k = whole - off < block_bytes ? whole - off : block_bytes;
		st = dg_memcpy_htod(c->dev, b->d + off, h, k);
	}
	if (st || !keep)
		free(h);
	else
		b->host = h;
	return st;
}

/* ---- the ops' tensors ---------------------------------------------------------- */

static int pack_mats(int rows)
{
	return rows >= 1024 ? 4 : 1;
}

/* One buffer to make: what, its format, elements, random or not. */
typedef struct plan {
	tbuf *b;
	dg_fmt f;
	int64_t n;
	bool fill;
} plan;

/* The tensors of c->spec at c->rows (data pointers set by setup). */
static dg_status describe(dg__at_case *c, plan *p, int *np)
{
	const dg_spec *s = &c->spec;
	const int64_t H = s->heads, Hin = s->in_heads, E = s->embd, L = s->latent;
	const int64_t R = c->rows, N = pack_mats(c->rows);
	tbuf *in = c->in, *out = &c->out;
	dg_fmt pf = s->op == DG_OP_PACK_SIGN1 ? DG_FMT_SIGN1 : DG_FMT_TERNARY;
	int k = 0;

	switch (s->op) {
	case DG_OP_LOWRANK_FWD:
	case DG_OP_RELU_MASK:
		p[k++] = (plan){ &in[0], s->act, Hin * R * E, true };
		p[k++] = (plan){ &in[1], s->weight, H * L * E, true };
		c->tin[0] = dg_tensor_4d("x", s->act, 0, 1, Hin, R, E);
		c->tin[1] = dg_tensor_3d("w", s->weight, 0, H, L, E);
		if (s->op == DG_OP_RELU_MASK) {
			p[k++] = (plan){ &in[2], DG_FMT_F32, H * R * L, true };
			c->tin[2] = dg_tensor_4d("grad", DG_FMT_F32, 0, 1, H, R, L);
			p[k++] = (plan){ out, DG_FMT_F32, H * R * L, false };
			c->tout = dg_tensor_4d("grad_out", DG_FMT_F32, 0, 1, H, R, L);
		} else {
			p[k++] = (plan){ out, s->out, H * R * L, false };
			c->tout = dg_tensor_4d("out", s->out, 0, 1, H, R, L);
		}
		break;
	case DG_OP_DECODER_FWD:
		p[k++] = (plan){ &in[0], s->act, H * R * L, true };
		p[k++] = (plan){ &in[1], s->weight, E * H * L, true };
		p[k++] = (plan){ out, s->out, R * E, false };
		c->tin[0] = dg_tensor_4d("y", s->act, 0, 1, H, R, L);
		c->tin[1] = dg_tensor_2d("w", s->weight, 0, E, H * L);
		c->tout = dg_tensor_4d("out", s->out, 0, 1, 1, R, E);
		break;
	case DG_OP_LOWRANK_GRAD_INPUT:
		p[k++] = (plan){ &in[0], DG_FMT_F32, H * R * L, true };
		p[k++] = (plan){ &in[1], s->weight, H * L * E, true };
		p[k++] = (plan){ out, DG_FMT_F32, Hin * R * E, false };
		c->tin[0] = dg_tensor_4d("grad", DG_FMT_F32, 0, 1, H, R, L);
		c->tin[1] = dg_tensor_3d("w", s->weight, 0, H, L, E);
		c->tout = dg_tensor_4d("grad_x", DG_FMT_F32, 0, 1, Hin, R, E);
		break;
	case DG_OP_LOWRANK_GRAD_WEIGHT:
		p[k++] = (plan){ &in[0], DG_FMT_F32, H * R * L, true };
		p[k++] = (plan){ &in[1], s->act, Hin * R * E, true };
		p[k++] = (plan){ out, DG_FMT_F32, H * L * E, false };
		c->tin[0] = dg_tensor_4d("grad", DG_FMT_F32, 0, 1, H, R, L);
		c->tin[1] = dg_tensor_4d("x", s->act, 0, 1, Hin, R, E);
		c->tout = dg_tensor_3d("grad_w", DG_FMT_F32, 0, H, L, E);
		break;
	case DG_OP_DECODER_GRAD_INPUT:
		p[k++] = (plan){ &in[0], DG_FMT_F32, R * E, true };
		p[k++] = (plan){ &in[1], s->weight, E * H * L, true };
		p[k++] = (plan){ out, DG_FMT_F32, H * R * L, false };
		c->tin[0] = dg_tensor_4d("grad", DG_FMT_F32, 0, 1, 1, R, E);
		c->tin[1] = dg_tensor_2d("w", s->weight, 0, E, H * L);
		c->tout = dg_tensor_4d("grad_y", DG_FMT_F32, 0, 1, H, R, L);
		break;
	case DG_OP_DECODER_GRAD_WEIGHT:
		p[k++] = (plan){ &in[0], DG_FMT_F32, R * E, true };
		p[k++] = (plan){ &in[1], s->act, H * R * L, true };
		p[k++] = (plan){ out, DG_FMT_F32, E * H * L, false };
		c->tin[0] = dg_tensor_4d("grad", DG_FMT_F32, 0, 1, 1, R, E);
		c->tin[1] = dg_tensor_4d("y", s->act, 0, 1, H, R, L);
		c->tout = dg_tensor_2d("grad_w", DG_FMT_F32, 0, E, H * L);
		break;
	case DG_OP_QUANTIZE_ACT:
		p[k++] = (plan){ &in[0], s->src, R * QACT_COLS, true };
		p[k++] = (plan){ out, s->act, R * QACT_COLS, false };
		c->tin[0] = dg_tensor_2d("x", s->src, 0, R, QACT_COLS);
		c->tout = dg_tensor_2d("codes", s->act, 0, R, QACT_COLS);
		break;
	case DG_OP_QUANTIZE_WEIGHT:
		p[k++] = (plan){ &in[0], s->src, 8 * R * QW_COLS, true };
		p[k++] = (plan){ out, DG_FMT_INT8, 8 * R * QW_COLS, false };
		c->tin[0] = dg_tensor_2d("w", s->src, 0, 8 * R, QW_COLS);
		c->tout = dg_tensor_2d("codes", DG_FMT_INT8, 0, 8 * R, QW_COLS);
		break;
	case DG_OP_PACK_TERNARY:
	case DG_OP_PACK_SIGN1:
		/* codes of the packed format, made by setup */
		p[k++] = (plan){ &in[0], DG_FMT_INT8, 8 * R * E, false };
		p[k++] = (plan){ out, pf, 8 * R * E, false };
		c->tin[0] = dg_tensor_2d("codes", DG_FMT_INT8, 0, 8 * R, E);
		c->tout = dg_tensor_2d("packed", pf, 0, 8 * R, E);
		break;
	case DG_OP_PACK_I8X4:
		p[k++] = (plan){ &in[0], DG_FMT_INT8, N * E * L, true };
		p[k++] = (plan){ out, DG_FMT_INT8, N * E * L, false };
		c->tin[0] = dg_tensor_3d("codes", DG_FMT_INT8, 0, N, E, L);
		c->tout = dg_tensor_3d("packed", DG_FMT_INT8, 0, N, L, E);
		break;
	case DG_OP_UNPACK_I8X4:
		p[k++] = (plan){ &in[0], DG_FMT_INT8, N * E * L, true };
		p[k++] = (plan){ out, DG_FMT_INT8, N * E * L, false };
		c->tin[0] = dg_tensor_3d("packed", DG_FMT_INT8, 0, N, L, E);
		c->tout = dg_tensor_3d("codes", DG_FMT_INT8, 0, N, E, L);
		break;
	default:
		return dg__dev_fail(c->dev, DG_ERR_UNSUPPORTED, "op %s: no tuning harness",
				    dg_op_name(s->op));
	}
	*np = k;
	c->n_in = k - 1;
	return DG_OK;
}

/* Codes of a packed weight format (one a byte) into in[0]: random
 * storage unpacked, so every code is one the format can hold. */
static dg_status pack_codes(dg__at_case *c)
{
	dg_fmt pf = c->spec.op == DG_OP_PACK_SIGN1 ? DG_FMT_SIGN1 : DG_FMT_TERNARY;
	size_t n = c->in[0].n, rows = n / (size_t)c->spec.embd;
	void *words = malloc(storage_bytes(pf, n) + 4);
	int8_t *codes = malloc(n + 1);
	dg_status st;

	if (!words || !codes) {
		free(words);
		free(codes);
		return dg__dev_fail(c->dev, DG_ERR_NOMEM, "out of memory: %zu codes", n);
	}
	random_fill(&c->rng, pf, words, n);
	st = pf == DG_FMT_TERNARY ? dg_ref_unpack_ternary(words, codes, rows, c->spec.embd)
				  : dg_ref_unpack_sign1(words, codes, rows, c->spec.embd);
	free(words);
	if (st)
		st = dg__dev_fail(c->dev, DG_ERR_INTERNAL, "random %s storage does not unpack",
				  dg_fmt_name(pf));
	if (!st)
		st = dg_memcpy_htod(c->dev, c->in[0].d, codes, n);
	if (st || !c->check)
		free(codes);
	else
		c->in[0].host = codes;
	return st;
}

/* Makes the inputs and output of c->spec at c->rows. */
static dg_status setup(dg__at_case *c)
{
	plan p[4];
	int np = 0;
	dg_status st = describe(c, p, &np);

	for (int i = 0; !st && i < np; i++)
		st = buf_make(c, p[i].b, p[i].f, (size_t)p[i].n, p[i].fill, c->check);
	if (!st && (c->spec.op == DG_OP_PACK_TERNARY || c->spec.op == DG_OP_PACK_SIGN1))
		st = pack_codes(c);
	if (st)
		return st;
	for (int i = 0; i < c->n_in; i++) {
		c->tin[i].data = c->in[i].d;
		c->tin[i].scale = c->in[i].scale;
	}
	c->tout.data = c->out.d;
	c->tout.scale = c->out.scale;
	return DG_OK;
}

/* ---- the reference ---------------------------------------------------------------- */

static dg_status reference(dg__at_case *c)
{
	const dg_spec *s = &c->spec;
	const void *a = c->in[0].host, *b = c->in[1].host;
	int R = c->rows;
	dg_status st;

	c->want = malloc(c->out.bytes + 16);
	if (!c->want)
		return DG_ERR_NOMEM;
	switch (s->op) {
	case DG_OP_LOWRANK_FWD: {
		dg_ref_lowrank_args ra = { .x = a, .w = b, .sa = c->in[0].sval,
					   .sw = c->in[1].sval, .out = c->want, .batch = 1,
					   .time = R };
		if (is_code(s->out)) {
			/* an out scale that spans the codes, some clamped */
			dg_spec fs = *s;
			float *y = malloc(c->out.n * 4 + 4), ymax = 0;
			if (!y)
				return DG_ERR_NOMEM;
			fs.out = DG_FMT_F32;
			ra.out = y;
			st = dg_ref_lowrank_fwd(&fs, &ra);
			for (size_t i = 0; !st && i < c->out.n; i++)
				ymax = fmaxf(ymax, fabsf(y[i]));
			free(y);
			if (st)
				return st;
			c->out.sval = ymax > 0 ? ymax / 100.0f : 1.0f;
			ra.out = c->want;
			st = dg_memcpy_htod(c->dev, c->out.scale, &c->out.sval, sizeof(float));
			if (st)
				return st;
		}
		ra.so = c->out.sval;
		return dg_ref_lowrank_fwd(s, &ra);
	}
	case DG_OP_RELU_MASK:
		return dg_ref_relu_mask(s, a, b, c->in[0].sval, c->in[1].sval, c->in[2].host,
					c->want, 1, R);
	case DG_OP_DECODER_FWD: {
		dg_ref_decoder_args ra = { .y = a, .w = b, .sa = c->in[0].sval,
					   .sw = c->in[1].sval, .out = c->want, .batch = 1,
					   .time = R };
		return dg_ref_decoder_fwd(s, &ra);
	}
	case DG_OP_LOWRANK_GRAD_INPUT:
		return dg_ref_lowrank_grad_input(s, a, b, c->in[1].sval, c->want, 1, R);
	case DG_OP_LOWRANK_GRAD_WEIGHT:
		return dg_ref_lowrank_grad_weight(s, a, b, c->in[1].sval, c->want, 1, R);
	case DG_OP_DECODER_GRAD_INPUT:
		return dg_ref_decoder_grad_input(s, a, b, c->in[1].sval, c->want, 1, R);
	case DG_OP_DECODER_GRAD_WEIGHT:
		return dg_ref_decoder_grad_weight(s, a, b, c->in[1].sval, c->want, 1, R);
	case DG_OP_QUANTIZE_ACT:
		return dg_ref_quantize_act(s->src, s->act, a, c->in[0].n, c->want,
					   &c->want_scale);
	case DG_OP_QUANTIZE_WEIGHT: {
		size_t n = c->in[0].n;
		float *w = malloc(n * 4 + 4);
		if (!w)
			return DG_ERR_NOMEM;
		for (size_t i = 0; i < n; i++)
			w[i] = s->src == DG_FMT_BF16 ? dg_ref_bf16_to_f32(((const uint16_t *)a)[i])
						     : ((const float *)a)[i];
		st = dg_ref_quantize_weight(s->weight, w, n, c->want, &c->want_scale);
		free(c->in[1].host); /* the floats, for the rule with the GPU's scale */
		c->in[1].host = w;
		return st;
	}
	case DG_OP_PACK_TERNARY:
		return dg_ref_pack_ternary(a, c->want, (size_t)(8 * R), s->embd);
	case DG_OP_PACK_SIGN1:
		return dg_ref_pack_sign1(a, c->want, (size_t)(8 * R), s->embd);
	case DG_OP_PACK_I8X4:
		return dg_ref_pack_i8x4(a, c->want, (size_t)pack_mats(R), s->embd, s->latent);
	case DG_OP_UNPACK_I8X4:
		return dg_ref_unpack_i8x4(a, c->want, (size_t)pack_mats(R), s->embd, s->latent);
	default:
		return DG_ERR_UNSUPPORTED;
	}
}

dg_status dg__at_case_create(dg_device *dev, const dg_spec *spec, int rows, bool check,
			     uint64_t seed, dg__at_case **out)
{
	dg_status st;

	*out = NULL;
	dg__at_case *c = calloc(1, sizeof(*c));
	if (!c)
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	c->dev = dev;
	c->spec = *spec;
	memset(&c->spec.tile, 0, sizeof(c->spec.tile));
	c->rows = rows;
	c->check = check;
	c->rng = seed;
	st = setup(c);
	if (!st && check) {
		st = reference(c);
		if (st == DG_ERR_NOMEM)
			dg__dev_fail(dev, st, "out of memory computing the reference");
		else if (st)
			dg__dev_fail(dev, st, "the CPU reference of %s failed: %s",
				     dg_op_name(spec->op), dg_status_str(st));
	}
	if (st) {
		dg__at_case_destroy(c);
		return st;
	}
	*out = c;
	return DG_OK;
}

void dg__at_case_destroy(dg__at_case *c)
{
	if (!c)
		return;
	tbuf *all[4] = { &c->in[0], &c->in[1], &c->in[2], &c->out };
	for (int i = 0; i < 4; i++) {
		(void)dg_free(c->dev, all[i]->d);
		(void)dg_free(c->dev, all[i]->scale);
		free(all[i]->host);
	}
	free(c->want);
	free(c);
}

size_t dg__at_case_bytes(const dg__at_case *c)
{
	return c ? c->dev_bytes : 0;
}

/* ---- run and compare ------------------------------------------------------------- */

dg_status dg__at_case_run(dg__at_case *c, const dg_spec *k)
{
	const dg_tensor *t = c->tin;

	switch (k->op) {
	case DG_OP_LOWRANK_FWD: {
		dg_lowrank_fwd_args a = { .x = &t[0], .w = &t[1], .out = &c->tout };
		return dg_lowrank_fwd(c->dev, k, &a);
	}
	case DG_OP_RELU_MASK: {
		dg_relu_mask_args a = { .x = &t[0], .w = &t[1], .grad = &t[2],
					.grad_out = &c->tout };
		return dg_relu_mask(c->dev, k, &a);
	}
	case DG_OP_DECODER_FWD: {
		dg_decoder_fwd_args a = { .y = &t[0], .w = &t[1], .out = &c->tout };
		return dg_decoder_fwd(c->dev, k, &a);
	}
	case DG_OP_LOWRANK_GRAD_INPUT: {
		dg_lowrank_grad_input_args a = { &t[0], &t[1], &c->tout };
		return dg_lowrank_grad_input(c->dev, k, &a);
	}
	case DG_OP_LOWRANK_GRAD_WEIGHT: {
		dg_lowrank_grad_weight_args a = { &t[0], &t[1], &c->tout, false };
		return dg_lowrank_grad_weight(c->dev, k, &a);
	}
	case DG_OP_DECODER_GRAD_INPUT: {
		dg_decoder_grad_input_args a = { &t[0], &t[1], &c->tout };
		return dg_decoder_grad_input(c->dev, k, &a);
	}
	case DG_OP_DECODER_GRAD_WEIGHT: {
		dg_decoder_grad_weight_args a = { &t[0], &t[1], &c->tout, false };
		return dg_decoder_grad_weight(c->dev, k, &a);
	}
	case DG_OP_QUANTIZE_ACT:
		return dg_quantize_act(c->dev, k, &t[0], &c->tout);
	case DG_OP_QUANTIZE_WEIGHT:
		return dg_quantize_weight(c->dev, k, &t[0], &c->tout);
	case DG_OP_PACK_TERNARY:
	case DG_OP_PACK_SIGN1:
		return dg_pack_weight(c->dev, k, &t[0], &c->tout, false);
	case DG_OP_PACK_I8X4:
		return dg_pack_i8x4(c->dev, k, &t[0], &c->tout);
	case DG_OP_UNPACK_I8X4:
		return dg_pack_i8x4(c->dev, k, &c->tout, &t[0]);
	default:
		return dg__dev_fail(c->dev, DG_ERR_UNSUPPORTED, "op %s: no tuning harness",
				    dg_op_name(k->op));
	}
}

static bool same_bytes(const void *got, const void *want, size_t n, char *why, size_t size)
{
	const uint8_t *g = got, *w = want;
	size_t bad = 0, first = 0;

	for (size_t i = 0; i < n; i++)
		if (g[i] != w[i] && bad++ == 0)
			first = i;
	if (bad)
		snprintf(why, size, "%zu of %zu bytes differ from the reference; first at byte %zu: 0x%02x, want 0x%02x",
			 bad, n, first, g[first], w[first]);
	return bad == 0;
}

static float value(dg_fmt f, const void *p, size_t i)
{
	switch (f) {
	case DG_FMT_F32:
		return ((const float *)p)[i];
	case DG_FMT_BF16:
		return dg_ref_bf16_to_f32(((const uint16_t *)p)[i]);
	case DG_FMT_UINT8POS:
		return (float)((const uint8_t *)p)[i];
	default:
		return (float)((const int8_t *)p)[i];
	}
}

static bool close_values(dg_fmt f, const void *got, const void *want, size_t n, float atol,
			 float rtol, char *why, size_t size)
{
	size_t bad = 0, first = 0;

	for (size_t i = 0; i < n; i++) {
		float g = value(f, got, i), w = value(f, want, i);
		bool ok = fabsf(g - w) <= atol + rtol * fabsf(w) || (isnan(g) && isnan(w));
		if (!ok && bad++ == 0)
			first = i;
	}
	if (bad)
		snprintf(why, size, "%zu of %zu values outside atol %g + rtol %g; first [%zu]: %.9g, want %.9g",
			 bad, n, (double)atol, (double)rtol, first,
			 (double)value(f, got, first), (double)value(f, want, first));
	return bad == 0;
}

/* ‖got − want‖ ≤ rel·‖want‖ and every |got − want| ≤ elem·max|want|. */
static bool close_norm(const float *got, const float *want, size_t n, double rel,
		       float elem, char *why, size_t size)
{
	double d2 = 0.0, w2 = 0.0;
	float wmax = 0.0f, dmax = 0.0f;
	size_t at = 0;

	for (size_t i = 0; i < n; i++) {
		float d = fabsf(got[i] - want[i]);
		if (isnan(got[i]) != isnan(want[i]))
			d = INFINITY;
		d2 += (double)d * d;
		w2 += (double)want[i] * want[i];
		if (fabsf(want[i]) > wmax)
			wmax = fabsf(want[i]);
		if (!(d <= dmax)) {
			dmax = d;
			at = i;
		}
	}
	double err = w2 > 0.0 ? sqrt(d2 / w2) : sqrt(d2);
	if (err <= rel && dmax <= elem * wmax)
		return true;
	snprintf(why, size,
		 "norm error %.3g (at most %.3g), largest difference %.3g at [%zu]: %.9g, want %.9g (at most %.3g)",
		 err, rel, (double)dmax, at, (double)got[at], (double)want[at], (double)(elem * wmax));
	return false;
}

/* The quantize rule of a weight format with a given scale. */
static int8_t weight_code(dg_fmt f, float v, float s)
{
	if (f == DG_FMT_INT8) {
		if (s == 0.0f)
			return 0;
		float r = rintf(v / s);
		return (int8_t)(r < -127.0f ? -127 : r > 127.0f ? 127 : (int)r);
	}
	if (f == DG_FMT_TERNARY)
		return (int8_t)(fabsf(v) < s ? 0 : (v > 0.0f) - (v < 0.0f));
	return (int8_t)(v >= 0.0f ? 1 : -1);
}

static bool compare(dg__at_case *c, const void *got, float gscale, char *why, size_t size)
{
	const dg_spec *s = &c->spec;
	bool ints = is_code(s->act) && is_code(s->weight);
	size_t n = c->out.n, bytes = c->out.bytes;

	switch (s->op) {
	case DG_OP_LOWRANK_FWD:
	case DG_OP_DECODER_FWD:
		/* integer sums are exact, and the epilogue rounds like the reference */
		if (ints)
			return same_bytes(got, c->want, bytes, why, size);
		return close_values(c->out.fmt, got, c->want, n, is_code(c->out.fmt) ? 1.0f : 2e-3f,
				    c->out.fmt == DG_FMT_BF16 ? 1e-2f : 2e-3f, why, size);
	case DG_OP_RELU_MASK: {
		if (ints)
			return same_bytes(got, c->want, bytes, why, size);
		/* float sums: y within rounding of thr may flip the mask */
		const float *g = got, *w = c->want, *grad = c->in[2].host;
		size_t off = 0;
		for (size_t i = 0; i < n; i++) {
			if (memcmp(&g[i], &w[i], 4) == 0)
				continue;
			if (g[i] != 0.0f && g[i] != grad[i]) {
				snprintf(why, size, "grad_out[%zu] = %.9g is neither grad nor 0", i,
					 (double)g[i]);
				return false;
			}
			off++;
		}
		if (off > n / 1000 + 2) {
			snprintf(why, size, "%zu of %zu mask values differ from the reference", off, n);
			return false;
		}
		return true;
	}
	case DG_OP_LOWRANK_GRAD_INPUT:
	case DG_OP_DECODER_GRAD_INPUT:
	case DG_OP_LOWRANK_GRAD_WEIGHT:
	case DG_OP_DECODER_GRAD_WEIGHT:
		/* The tensor-core path rounds the gradient to bf16 (2^-9
		 * relative a term), so a sum that cancels can be off by 1% of
		 * itself: judge the whole result by its norm error, as the GPU
		 * tests do, plus a bound on any one element; an indexing error
		 * is off by about 100% of the norm. */
		return close_norm(got, c->want, n, 1e-2, 5e-2f, why, size);
	case DG_OP_QUANTIZE_ACT: {
		/* the scale within float summation error; the codes exactly the
		 * reference's for the GPU's scale */
		if (!(fabsf(gscale - c->want_scale) <= 1e-5f * fabsf(c->want_scale))) {
			snprintf(why, size, "scale %.9g, reference %.9g", (double)gscale,
				 (double)c->want_scale);
			return false;
		}
		if (dg_ref_quantize_act_apply(s->src, s->act, c->in[0].host, n, gscale, c->want)) {
			snprintf(why, size, "the reference apply step failed");
			return false;
		}
		return same_bytes(got, c->want, bytes, why, size);
	}
	case DG_OP_QUANTIZE_WEIGHT: {
		float ws = c->want_scale;
		if (!(fabsf(gscale - ws) <= nextafterf(ws, INFINITY) - ws)) {
			snprintf(why, size, "scale %.9g, reference %.9g (more than one ulp)",
				 (double)gscale, (double)ws);
			return false;
		}
		const float *w = c->in[1].host;
		int8_t *want = c->want;
		for (size_t i = 0; i < n; i++)
			want[i] = weight_code(s->weight, w[i], gscale);
		return same_bytes(got, want, bytes, why, size);
	}
	default:
		return same_bytes(got, c->want, bytes, why, size);
	}
}

dg_status dg__at_case_check(dg__at_case *c, const dg_spec *cand, dg__at_verdict *verdict,
			    char *why, size_t why_size)
{
	float gscale = 0.0f;
	dg_status st;

	*verdict = DG__AT_REFUSED;
	why[0] = '\0';
	if (!c->check || !c->want)
		return dg__dev_fail(c->dev, DG_ERR_INTERNAL, "not a check case");
	st = dg_memset8(c->dev, c->out.d, 0xff, c->out.bytes);
	if (!st)
		st = dg__at_case_run(c, cand);
	if (st) {
		/* a refusal of this candidate, not of the device */
		if (st == DG_ERR_INVALID_ARG || st == DG_ERR_INVALID_SPEC ||
		    st == DG_ERR_UNSUPPORTED || st == DG_ERR_COMPILE) {
			snprintf(why, why_size, "%s", dg_device_errmsg(c->dev));
			return DG_OK;
		}
		return st;
	}
	void *got = malloc(c->out.bytes + 16);
	if (!got)
		return dg__dev_fail(c->dev, DG_ERR_NOMEM, "out of memory");
	st = dg_memcpy_dtoh(c->dev, got, c->out.d, c->out.bytes);
	if (!st && c->out.scale)
		st = dg_memcpy_dtoh(c->dev, &gscale, c->out.scale, sizeof(float));
	if (!st)
		*verdict = compare(c, got, gscale, why, why_size) ? DG__AT_RIGHT : DG__AT_WRONG;
	free(got);
	return st;
}
