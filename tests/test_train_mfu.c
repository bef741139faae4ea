/*
 * The MFU of `dragon train`: the model's FLOPs a token
 * (dg_model_flops_per_token, runtime/train/model.c) and the peak it is
 * divided by (cli/dragon/peak.c):
 *   - a tiny config counted by hand, the arithmetic in the comment;
 *   - a sweep of shapes against a second count that walks every matmul
 *     of a step at its real shape, query by query for the causal ones
 *     (so the (t−1)/2 average is checked, not restated);
 *   - the peak table: the names the driver gives, each form factor its
 *     own row, and no peak (no MFU) for a device it does not know.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stddef.h>

#include "cli/dragon/peak.h"
#include "dragon/model.h"

static dg_model_config shape(int l, int d, int h, int n, int v)
{
	dg_model_config c;
	char msg[256];
	cr_assert_eq(dg_model_preset("f32", &c, msg, sizeof(msg)), DG_OK, "%s", msg);
	c.layers = l, c.embd = d, c.heads = h, c.neurons = n, c.vocab = v;
	return c;
}

Test(train_mfu, flops_of_a_tiny_config_by_hand)
{
	/* L 2, D 4, H 2, N 8, V 16, t 5; a query sees (5 − 1)/2 = 2 keys on
	 * average (0, 1, 2, 3, 4 of them):
	 *   encoder    2·D·H·N = 2·4·2·8 = 128
	 *   encoder_v  2·D·H·N           = 128
	 *   decoder    2·H·N·D           = 128
	 *   qr·qrᵀ     2·H·N·2 = 2·2·8·2 =  64
	 *   scores·x   2·H·D·2 = 2·2·4·2 =  32
	 *   a layer                        480, two: 960
	 *   lm_head    2·D·V = 2·4·16    = 128
	 *   forward 1088; with the backward (twice): 3264 */
	dg_model_config c = shape(2, 4, 2, 8, 16);
	cr_assert_eq(dg_model_flops_per_token(&c, 5), 3264.0);
	/* t 1: no key before the only query, no attention work */
	cr_assert_eq(dg_model_flops_per_token(&c, 1), 3 * (2 * 384.0 + 128));
	/* the 25M preset at T 512: a layer 6·256·4·8192 = 50,331,648 of
	 * projections and 2·4·(8192 + 256)·255.5 = 17,267,712 of attention,
	 * six of them 405,596,160, lm_head 2·256·256 = 131,072: forward
	 * 405,727,232, a token 1,217,181,696 (1.2 GFLOP) */
	dg_model_config p;
	char msg[256];
	cr_assert_eq(dg_model_preset("bf16", &p, msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_model_flops_per_token(&p, 512), 1217181696.0);
}

/* A second count: every multiply-add of a step of one row of t tokens,
 * matmul by matmul at its shape, over t. */
static double walked(const dg_model_config *c, int t)
{
	const double D = c->embd, H = c->heads, N = c->neurons, V = c->vocab;
	double macs = 0;
	for (int l = 0; l < c->layers; l++) {
		macs += t * H * D * N; /* x (t, D) · encoder (H, D, N) */
		for (int i = 0; i < t; i++)
			for (int j = 0; j < i; j++) /* tril(·, −1): keys before the query */
				macs += H * N;      /* qr[i] · qr[j] */
		for (int i = 0; i < t; i++)
			macs += H * D * i; /* att[i] = Σ_{j<i} scores[i, j] · x[j] */
		macs += t * H * D * N; /* LN(att) (H, t, D) · encoder_v (H, D, N) */
		macs += t * H * N * D; /* xy (t, H·N) · decoder (H·N, D) */
	}
	macs += t * D * V; /* lm_head */
	return 3 * 2 * macs / t;
}

Test(train_mfu, flops_match_a_walk_of_every_matmul)
{
	static const int shapes[][5] = { { 1, 4, 1, 4, 8 },   { 2, 32, 2, 64, 256 }, { 6, 256, 4, 8192, 256 },
					 { 3, 48, 3, 128, 97 }, { 1, 8, 8, 16, 256 } };
	static const int ts[] = { 1, 2, 3, 16, 64, 257 };
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
		for (size_t k = 0; k < sizeof(ts) / sizeof(ts[0]); k++) {
			const int *x = shapes[s];
			dg_model_config c = shape(x[0], x[1], x[2], x[3], x[4]);
			double a = dg_model_flops_per_token(&c, ts[k]), b = walked(&c, ts[k]);
			cr_assert(fabs(a - b) <= 1e-12 * b, "L%d D%d H%d N%d V%d t %d: %.17g, walked %.17g", x[0], x[1],
				  x[2], x[3], x[4], ts[k], a, b);
		}
}

Test(train_mfu, peaks_by_device_name)
{
	static const struct {
		const char *name;
		double peak;
	} cases[] = {
		{ "NVIDIA H200", 989.4e12 },
		{ "NVIDIA H200 (sm_90)", 989.4e12 }, /* as dragon's device line names it */
		{ "NVIDIA H200 NVL", 835.5e12 },
		{ "NVIDIA H100 80GB HBM3", 989.4e12 }, /* the SXM part */
		{ "NVIDIA H100 PCIe", 756.5e12 },
		{ "NVIDIA H100 NVL", 835.5e12 },
		{ "NVIDIA GH200 480GB", 989.4e12 },
		{ "NVIDIA A100-SXM4-80GB", 312e12 },
		{ "NVIDIA A100 80GB PCIe", 312e12 },
		{ "NVIDIA A100-PCIE-40GB", 312e12 },
		{ "NVIDIA GeForce RTX 4090", 0 },
		{ "NVIDIA L40S", 0 },
		{ "NVIDIA H1000", 0 }, /* a word, not a prefix */
		{ "XH100", 0 },
		{ "", 0 },
		{ NULL, 0 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		cr_assert_eq(dg__cli_peak_bf16(cases[i].name), cases[i].peak, "%s: %g, want %g",
			     cases[i].name ? cases[i].name : "(null)", dg__cli_peak_bf16(cases[i].name), cases[i].peak);
}
