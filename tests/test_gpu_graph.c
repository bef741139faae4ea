/*
 * Graph-safe ops: the ops of one BDH-like training sequence, captured into
 * a CUDA graph on the device's own stream and replayed, give bit for bit
 * what they give when run eagerly (runtime/gpu/graph.c; ops.h's promise
 * that nothing on a launch path allocates, frees or synchronizes).
 *
 * The sequence (H 4, E 256, L 1024, B 2, T 256; auto tiles, so on an H200
 * the projection and the decoder take their sm_90a wgmma paths):
 *
 *   quantize_act     x f32 (B,1,T,D)            → xq int8, sx
 *   quantize_weight  w_enc f32 (H,N,D)          → codes int8, swe (ternary)
 *   pack_ternary     codes (H·N, D)             → w_enc ternary
 *   quantize_weight  w_dec f32 (D,H·N)          → codes int8, swd (ternary)
 *   pack_ternary     codes (D, H·N)             → w_dec ternary
 *   lowrank_fwd      xq · w_enc, relu 0         → y uint8pos (B,H,T,N)
 *   lowrank_fwd      xq · w_enc, relu 0         → y bf16 (B,H,T,N)
 *   decoder_fwd      y · w_dec (uint8pos·ternary) → out bf16 (B,1,T,D)
 *   decoder_grad_input   g_out f32, w_dec       → g_y f32 (B,H,T,N)
 *   relu_mask        xq, w_enc, g_y             → g_pre f32
 *   lowrank_grad_input   g_pre, w_enc           → g_x f32 (B,1,T,D)
 *   lowrank_grad_weight  g_pre, xq              → g_w_enc f32 (H,N,D)
 *   decoder_grad_weight  g_out, y               → g_w_dec f32 (D,H·N)
 *
 * with the workspaces their _workspace queries ask for (B·T 512 splits
 * both grad_weight reductions over the few output tiles of L 1024, so
 * their workspaces are used, and replayed; lowrank_grad_input's K = 4096
 * over B·T x E splits where the device's SM count asks for it). The eager run loads every
 * kernel; the capture then runs nothing and loads nothing; every replay,
 * from outputs reset to 0xff, must write every output byte as the eager
 * run did. Also: dg_graph_end without a capture, a second begin, and a
 * dg_malloc during capture fail cleanly and leave the device usable.
 * Skips without a device (gh_open).
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_helpers.h"

enum { H = 4, E = 256, L = 1024, B = 2, T = 256, HL = H * L, BT = B * T };
#define REPLAYS 10

/* An output of the sequence: its memory, its eager bytes. */
typedef struct out_buf {
	const char *name;
	dg_dptr d;
	size_t bytes;
	dg_fmt fmt; /* for the written check: f32 / bf16 values, else codes */
	unsigned char *eager;
} out_buf;

#define MAX_OUTS 16

typedef struct seq {
	dg_device *dev;
	/* specs */
	dg_spec qa, qw, pk_enc, pk_dec, fwd_u8, fwd_bf16, dec, dgi, mask, lgi, lgw, dgw;
	/* tensors: inputs */
	dg_tensor x, w_enc_f, w_dec_f, g_out;
	/* tensors: made by the sequence */
	dg_tensor xq, c_enc, c_enc2d, w_enc, c_dec, w_dec, y_u8, y_bf16, dec_out, g_y, g_pre, g_x,
		g_w_enc, g_w_dec;
	dg_workspace ws_qa, ws_qw_enc, ws_qw_dec, ws_dec, ws_lgi, ws_lgw, ws_dgw;
	out_buf outs[MAX_OUTS];
	int n_outs;
} seq;

static dg_dptr add_out(seq *q, const char *name, dg_fmt fmt, size_t bytes)
{
	cr_assert_lt(q->n_outs, MAX_OUTS);
	out_buf *o = &q->outs[q->n_outs++];
	o->name = name;
	o->fmt = fmt;
	o->bytes = bytes;
	o->d = gh_alloc_ff(q->dev, bytes);
	o->eager = gh_xmalloc(bytes);
	return o->d;
}

static dg_tensor out_tensor(seq *q, const char *name, dg_fmt fmt, int ndim, const int64_t *shape)
{
	dg_tensor t = dg_tensor_make(name, fmt, 0, ndim, shape);
	size_t n = (size_t)dg_tensor_numel(&t);
	t.data = add_out(q, name, fmt, gh_bytes(fmt, n));
	return t;
}

static void spec_shape(dg_spec *s, dg_op op, int sm)
{
	dg_spec_init(s, op);
	s->arch = sm;
	s->arch_specific = false;
	if (dg_spec_uses(op) & DG_FIELD_HEADS)
		s->heads = H;
	if (dg_spec_uses(op) & DG_FIELD_IN_HEADS)
		s->in_heads = 1;
	if (dg_spec_uses(op) & DG_FIELD_EMBD)
		s->embd = E;
	if (dg_spec_uses(op) & DG_FIELD_LATENT)
		s->latent = L;
}

static void ok(seq *q, dg_status st, const char *what)
{
	cr_assert_eq(st, DG_OK, "%s: %s: %s", what, dg_status_str(st), dg_device_errmsg(q->dev));
}

/* The specs, the inputs (random, from seed 61) and the outputs of the
 * sequence, and the workspaces its ops ask for. */
static void seq_make(seq *q, dg_device *dev)
{
	dg_device_info info;
	memset(q, 0, sizeof(*q));
	q->dev = dev;
	ok(q, dg_device_info_get(dev, &info), "dg_device_info_get");
	const int sm = info.sm;

	spec_shape(&q->qa, DG_OP_QUANTIZE_ACT, sm);
	q->qa.src = DG_FMT_F32;
	q->qa.act = DG_FMT_INT8;
	spec_shape(&q->qw, DG_OP_QUANTIZE_WEIGHT, sm);
	q->qw.src = DG_FMT_F32;
	q->qw.weight = DG_FMT_TERNARY;
	spec_shape(&q->pk_enc, DG_OP_PACK_TERNARY, sm);
	q->pk_dec = q->pk_enc;
	q->pk_dec.embd = HL; /* the decoder's weight is packed along H·L */
	spec_shape(&q->fwd_u8, DG_OP_LOWRANK_FWD, sm);
	q->fwd_u8.weight = DG_FMT_TERNARY;
	q->fwd_u8.act = DG_FMT_INT8;
	q->fwd_u8.out = DG_FMT_UINT8POS;
	q->fwd_u8.relu = true;
	q->fwd_u8.relu_thr = 0.0f;
	q->fwd_bf16 = q->fwd_u8;
	q->fwd_bf16.out = DG_FMT_BF16;
	spec_shape(&q->dec, DG_OP_DECODER_FWD, sm);
	q->dec.weight = DG_FMT_TERNARY;
	q->dec.act = DG_FMT_UINT8POS;
	q->dec.out = DG_FMT_BF16;
	spec_shape(&q->dgi, DG_OP_DECODER_GRAD_INPUT, sm);
	q->dgi.weight = DG_FMT_TERNARY;
	spec_shape(&q->mask, DG_OP_RELU_MASK, sm);
	q->mask.weight = DG_FMT_TERNARY;
	q->mask.act = DG_FMT_INT8;
	q->mask.relu = true;
	q->mask.relu_thr = 0.0f;
	spec_shape(&q->lgi, DG_OP_LOWRANK_GRAD_INPUT, sm);
	q->lgi.weight = DG_FMT_TERNARY;
	spec_shape(&q->lgw, DG_OP_LOWRANK_GRAD_WEIGHT, sm);
	q->lgw.act = DG_FMT_INT8;
	spec_shape(&q->dgw, DG_OP_DECODER_GRAD_WEIGHT, sm);
	q->dgw.act = DG_FMT_UINT8POS;
	const dg_spec *all[] = { &q->qa, &q->qw, &q->pk_enc, &q->pk_dec, &q->fwd_u8, &q->fwd_bf16,
				 &q->dec, &q->dgi, &q->mask, &q->lgi, &q->lgw, &q->dgw };
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		char m[512];
		cr_assert_eq(dg_spec_validate(all[i], m, sizeof(m)), DG_OK, "%s", m);
	}

	/* inputs */
	gh_seed(61);
	size_t nx = (size_t)BT * E, nw = (size_t)HL * E;
	float *xh = gh_rand_storage(DG_FMT_F32, nx, NULL);
	float *weh = gh_rand_storage(DG_FMT_F32, nw, NULL);
	float *wdh = gh_rand_storage(DG_FMT_F32, nw, NULL);
	float *gh = gh_rand_storage(DG_FMT_F32, nx, NULL);
	q->x = dg_tensor_4d("x", DG_FMT_F32, gh_upload(dev, xh, nx * 4), B, 1, T, E);
	q->w_enc_f = dg_tensor_3d("w", DG_FMT_F32, gh_upload(dev, weh, nw * 4), H, L, E);
	q->w_dec_f = dg_tensor_2d("w", DG_FMT_F32, gh_upload(dev, wdh, nw * 4), E, HL);
	q->g_out = dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, gh, nx * 4), B, 1, T, E);
	free(xh);
	free(weh);
	free(wdh);
	free(gh);

	/* outputs; the quantizers' scales are outputs too, the projection's
	 * code scale an input (codes of y span 0..255 with some clamping) */
	const int64_t s_x[4] = { B, 1, T, E }, s_enc[3] = { H, L, E }, s_enc2d[2] = { HL, E },
		      s_dec[2] = { E, HL }, s_y[4] = { B, H, T, L };
	q->xq = out_tensor(q, "xq", DG_FMT_INT8, 4, s_x);
	q->xq.scale = add_out(q, "sx", DG_FMT_F32, 4);
	q->c_enc = out_tensor(q, "codes_enc", DG_FMT_INT8, 3, s_enc);
	q->c_enc.scale = add_out(q, "swe", DG_FMT_F32, 4);
	q->c_enc2d = dg_tensor_make("codes", DG_FMT_INT8, q->c_enc.data, 2, s_enc2d);
	q->w_enc = out_tensor(q, "w_enc", DG_FMT_TERNARY, 2, s_enc2d);
	q->w_enc.ndim = 3; /* the words of (H·N, D) read as (H, N, D) */
	q->w_enc.shape[0] = H;
	q->w_enc.shape[1] = L;
	q->w_enc.shape[2] = E;
	q->w_enc.scale = q->c_enc.scale;
	q->c_dec = out_tensor(q, "codes_dec", DG_FMT_INT8, 2, s_dec);
	q->c_dec.scale = add_out(q, "swd", DG_FMT_F32, 4);
	q->w_dec = out_tensor(q, "w_dec", DG_FMT_TERNARY, 2, s_dec);
	q->w_dec.scale = q->c_dec.scale;
	q->y_u8 = out_tensor(q, "y_u8", DG_FMT_UINT8POS, 4, s_y);
	q->y_u8.scale = gh_scalar(dev, 0.05f);
	q->y_bf16 = out_tensor(q, "y_bf16", DG_FMT_BF16, 4, s_y);
	q->dec_out = out_tensor(q, "dec_out", DG_FMT_BF16, 4, s_x);
	q->g_y = out_tensor(q, "g_y", DG_FMT_F32, 4, s_y);
	q->g_pre = out_tensor(q, "g_pre", DG_FMT_F32, 4, s_y);
	q->g_x = out_tensor(q, "g_x", DG_FMT_F32, 4, s_x);
	q->g_w_enc = out_tensor(q, "g_w_enc", DG_FMT_F32, 3, s_enc);
	q->g_w_dec = out_tensor(q, "g_w_dec", DG_FMT_F32, 2, s_dec);
}

/* The sequence's calls; with sizes true, first asks each op for its
 * workspace and allocates it (before the eager run, never in a capture). */
static void seq_run(seq *q, bool sizes)
{
	dg_device *dev = q->dev;
	size_t need;

	dg_quantize_act_args qa = { .x = &q->x, .codes = &q->xq, .ws = q->ws_qa };
	if (sizes) {
		ok(q, dg_quantize_act_workspace(dev, &q->qa, &qa, &need), "quantize_act_workspace");
		qa.ws = q->ws_qa = gh_workspace(dev, need);
	}
	ok(q, dg_quantize_act(dev, &q->qa, &qa), "quantize_act");

	dg_quantize_weight_args qwe = { .w = &q->w_enc_f, .codes = &q->c_enc, .ws = q->ws_qw_enc };
	if (sizes) {
		ok(q, dg_quantize_weight_workspace(dev, &q->qw, &qwe, &need), "quantize_weight_workspace");
		qwe.ws = q->ws_qw_enc = gh_workspace(dev, need);
	}
	ok(q, dg_quantize_weight(dev, &q->qw, &qwe), "quantize_weight (encoder)");
	dg_tensor packed_enc = q->w_enc;
	packed_enc.name = "packed";
	packed_enc.ndim = 2;
	packed_enc.shape[0] = HL;
	packed_enc.shape[1] = E;
	packed_enc.scale = 0;
	dg_pack_weight_args pe = { .codes = &q->c_enc2d, .packed = &packed_enc };
	ok(q, dg_pack_weight(dev, &q->pk_enc, &pe), "pack_ternary (encoder)");

	dg_quantize_weight_args qwd = { .w = &q->w_dec_f, .codes = &q->c_dec, .ws = q->ws_qw_dec };
	if (sizes) {
		ok(q, dg_quantize_weight_workspace(dev, &q->qw, &qwd, &need), "quantize_weight_workspace");
		qwd.ws = q->ws_qw_dec = gh_workspace(dev, need);
	}
	ok(q, dg_quantize_weight(dev, &q->qw, &qwd), "quantize_weight (decoder)");
	dg_tensor packed_dec = q->w_dec;
	packed_dec.name = "packed";
	packed_dec.scale = 0;
	dg_pack_weight_args pd = { .codes = &q->c_dec, .packed = &packed_dec };
	ok(q, dg_pack_weight(dev, &q->pk_dec, &pd), "pack_ternary (decoder)");

	dg_lowrank_fwd_args f1 = { .x = &q->xq, .w = &q->w_enc, .out = &q->y_u8 };
	ok(q, dg_lowrank_fwd(dev, &q->fwd_u8, &f1), "lowrank_fwd (uint8pos)");
	dg_lowrank_fwd_args f2 = { .x = &q->xq, .w = &q->w_enc, .out = &q->y_bf16 };
	ok(q, dg_lowrank_fwd(dev, &q->fwd_bf16, &f2), "lowrank_fwd (bf16)");

	dg_tensor y = q->y_u8;
	y.name = "y";
	dg_decoder_fwd_args d = { .y = &y, .w = &q->w_dec, .out = &q->dec_out, .ws = q->ws_dec };
	if (sizes) {
		ok(q, dg_decoder_fwd_workspace(dev, &q->dec, &d, &need), "decoder_fwd_workspace");
		cr_assert_gt(need, 0);
		d.ws = q->ws_dec = gh_workspace(dev, need);
	}
	ok(q, dg_decoder_fwd(dev, &q->dec, &d), "decoder_fwd");

	dg_tensor g_y = q->g_y;
	g_y.name = "grad_y";
	dg_decoder_grad_input_args gi = { .grad = &q->g_out, .w = &q->w_dec, .grad_y = &g_y };
	ok(q, dg_decoder_grad_input(dev, &q->dgi, &gi), "decoder_grad_input");

	dg_tensor grad = q->g_y, grad_out = q->g_pre;
	grad.name = "grad";
	grad_out.name = "grad_out";
	dg_relu_mask_args m = { .x = &q->xq, .w = &q->w_enc, .grad = &grad, .grad_out = &grad_out };
	ok(q, dg_relu_mask(dev, &q->mask, &m), "relu_mask");

	dg_tensor g_pre = q->g_pre, g_x = q->g_x, g_we = q->g_w_enc, g_wd = q->g_w_dec;
	g_pre.name = "grad";
	g_x.name = "grad_x";
	g_we.name = g_wd.name = "grad_w";
	dg_lowrank_grad_input_args li = { .grad = &g_pre, .w = &q->w_enc, .grad_x = &g_x,
					  .ws = q->ws_lgi };
	if (sizes) {
		ok(q, dg_lowrank_grad_input_workspace(dev, &q->lgi, &li, &need),
		   "lowrank_grad_input_workspace");
		li.ws = q->ws_lgi = gh_workspace(dev, need);
	}
	ok(q, dg_lowrank_grad_input(dev, &q->lgi, &li), "lowrank_grad_input");

	dg_lowrank_grad_weight_args lw = { .grad = &g_pre, .x = &q->xq, .grad_w = &g_we,
					   .ws = q->ws_lgw };
	if (sizes) {
		ok(q, dg_lowrank_grad_weight_workspace(dev, &q->lgw, &lw, &need),
		   "lowrank_grad_weight_workspace");
		cr_assert_gt(need, 0, "lowrank_grad_weight: B·T %d is not split at L %d", BT, L);
		lw.ws = q->ws_lgw = gh_workspace(dev, need);
	}
	ok(q, dg_lowrank_grad_weight(dev, &q->lgw, &lw), "lowrank_grad_weight");

	dg_decoder_grad_weight_args dw = { .grad = &q->g_out, .y = &y, .grad_w = &g_wd,
					   .ws = q->ws_dgw };
	if (sizes) {
		ok(q, dg_decoder_grad_weight_workspace(dev, &q->dgw, &dw, &need),
		   "decoder_grad_weight_workspace");
		cr_assert_gt(need, 0, "decoder_grad_weight: B·T %d is not split at L %d", BT, L);
		dw.ws = q->ws_dgw = gh_workspace(dev, need);
	}
	ok(q, dg_decoder_grad_weight(dev, &q->dgw, &dw), "decoder_grad_weight");
}

static void seq_reset(seq *q)
{
	for (int i = 0; i < q->n_outs; i++)
		ok(q, dg_memset8(q->dev, q->outs[i].d, 0xff, q->outs[i].bytes), "dg_memset8");
}

static void seq_free(seq *q)
{
	for (int i = 0; i < q->n_outs; i++)
		free(q->outs[i].eager);
}

/* No NaN in a float output (0xff bytes are NaN: an element never written). */
static void expect_written(const out_buf *o, const unsigned char *bytes)
{
	if (o->fmt == DG_FMT_F32) {
		for (size_t i = 0; i < o->bytes / 4; i++)
			cr_assert(!isnan(((const float *)bytes)[i]), "%s[%zu] never written", o->name, i);
	} else if (o->fmt == DG_FMT_BF16) {
		for (size_t i = 0; i < o->bytes / 2; i++)
			cr_assert(!isnan(dg_bf16_to_f32(((const uint16_t *)bytes)[i])),
				  "%s[%zu] never written", o->name, i);
	}
}

Test(gpu_graph, replays_match_the_eager_run)
{
	dg_device *dev = gh_open();
	seq q;
	char why[512];

	cr_assert_not_null(dg_device_stream(dev), "the device's own stream");
	seq_make(&q, dev);
	seq_run(&q, true); /* eager: loads every kernel */
	gh_sync(dev);
	for (int i = 0; i < q.n_outs; i++) {
		gh_download(dev, q.outs[i].eager, q.outs[i].d, q.outs[i].bytes);
		expect_written(&q.outs[i], q.outs[i].eager);
	}
	for (int i = 0; i < q.n_outs; i++)
		if (q.outs[i].bytes == 4) /* the quantizers' scales */
			cr_assert_gt(*(const float *)q.outs[i].eager, 0.0f, "%s", q.outs[i].name);
	dg_device_stats before;
	ok(&q, dg_device_stats_get(dev, &before), "dg_device_stats_get");

	/* capture: nothing runs, nothing loads */
	seq_reset(&q);
	gh_sync(dev);
	dg_graph *g = NULL;
	ok(&q, dg_graph_begin(dev), "dg_graph_begin");
	seq_run(&q, false);
	ok(&q, dg_graph_end(dev, &g), "dg_graph_end");
	cr_assert_not_null(g);
	gh_sync(dev);
	for (int i = 0; i < q.n_outs; i++) {
		unsigned char *got = gh_xmalloc(q.outs[i].bytes), *ff = gh_xmalloc(q.outs[i].bytes);
		memset(ff, 0xff, q.outs[i].bytes);
		gh_download(dev, got, q.outs[i].d, q.outs[i].bytes);
		cr_assert(dg_ref_same_bytes(got, ff, q.outs[i].bytes, why, sizeof(why)),
			  "%s changed during the capture: %s", q.outs[i].name, why);
		free(got);
		free(ff);
	}
	dg_device_stats after;
	ok(&q, dg_device_stats_get(dev, &after), "dg_device_stats_get");
	cr_assert_eq(after.modules, before.modules, "a kernel was loaded during the capture");
	cr_assert_eq(after.compiled + after.cached, before.compiled + before.cached);

	/* replays, each from outputs reset to 0xff */
	for (int rep = 0; rep < REPLAYS; rep++) {
		seq_reset(&q);
		ok(&q, dg_graph_launch(g), "dg_graph_launch");
		gh_sync(dev);
		for (int i = 0; i < q.n_outs; i++) {
			unsigned char *got = gh_xmalloc(q.outs[i].bytes);
			gh_download(dev, got, q.outs[i].d, q.outs[i].bytes);
			cr_assert(dg_ref_same_bytes(got, q.outs[i].eager, q.outs[i].bytes, why, sizeof(why)),
				  "replay %d: %s: %s", rep, q.outs[i].name, why);
			free(got);
		}
	}
	dg_graph_destroy(g);
	dg_graph_destroy(NULL);
	seq_free(&q);
	gh_close(dev);
}

/* A small graph of one memset; returns it. */
static dg_graph *memset_graph(dg_device *dev, dg_dptr p, uint8_t v, size_t bytes)
{
	dg_graph *g = NULL;
	cr_assert_eq(dg_graph_begin(dev), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_memset8(dev, p, v, bytes), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_graph_end(dev, &g), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_not_null(g);
	return g;
}

/* The device still captures and replays: a memset graph writes its bytes. */
static void expect_graphs_work(dg_device *dev)
{
	const size_t n = 4096;
	dg_dptr p = gh_alloc(dev, n);
	unsigned char got[4096], want[4096];
	dg_graph *g = memset_graph(dev, p, 0x5a, n);
	gh_download(dev, got, p, n);
	memset(want, 0, n);
	gh_expect_bytes("nothing ran at capture", got, want, n);
	cr_assert_eq(dg_graph_launch(g), DG_OK, "%s", dg_device_errmsg(dev));
	gh_sync(dev);
	gh_download(dev, got, p, n);
	memset(want, 0x5a, n);
	gh_expect_bytes("the replayed memset", got, want, n);
	dg_graph_destroy(g);
}

/* dg_graph_end with no capture begun fails with a message, hands out no
 * graph, and the device goes on; a second begin is refused while the
 * first capture runs, which is then ended normally. */
Test(gpu_graph, end_without_begin_and_begin_twice)
{
	dg_device *dev = gh_open();
	dg_graph *g = (dg_graph *)0x1;

	dg_status st = dg_graph_end(dev, &g);
	cr_assert_neq(st, DG_OK, "an end without a begin");
	cr_assert_null(g);
	cr_assert(strstr(dg_device_errmsg(dev), "cuStreamEndCapture"), "%s", dg_device_errmsg(dev));
	gh_sync(dev);
	expect_graphs_work(dev);

	dg_dptr p = gh_alloc(dev, 256);
	cr_assert_eq(dg_graph_begin(dev), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_graph_begin(dev), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "already capturing"), "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_memset8(dev, p, 1, 256), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_graph_end(dev, &g), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_not_null(g);
	dg_graph_destroy(g);
	cr_assert_eq(dg_graph_launch(NULL), DG_ERR_INVALID_ARG);
	gh_close(dev);
}

/* An allocation inside a capture is what CUDA forbids there: dg_malloc
 * fails, the capture is invalidated and dg_graph_end reports it instead of
 * handing out half a graph; the stream is not left capturing. */
Test(gpu_graph, malloc_during_capture_fails_the_capture)
{
	dg_device *dev = gh_open();
	dg_dptr p = gh_alloc(dev, 4096), q = 1;
	dg_graph *g = (dg_graph *)0x1;

	cr_assert_eq(dg_graph_begin(dev), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_memset8(dev, p, 7, 4096), DG_OK, "%s", dg_device_errmsg(dev));
	dg_status st = dg_malloc(dev, 1 << 20, &q);
	cr_assert_neq(st, DG_OK, "dg_malloc succeeded inside a capture");
	cr_assert_eq(q, 0);
	cr_assert(strstr(dg_device_errmsg(dev), "cuMemAlloc"), "%s", dg_device_errmsg(dev));
	st = dg_graph_end(dev, &g);
	cr_assert_neq(st, DG_OK, "the capture survived an allocation");
	cr_assert_null(g);
	cr_assert(strstr(dg_device_errmsg(dev), "cuStreamEndCapture"), "%s", dg_device_errmsg(dev));
	gh_sync(dev);
	expect_graphs_work(dev);
	gh_close(dev);
}
