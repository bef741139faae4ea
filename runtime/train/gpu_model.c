/*
 * The BDH model on the GPU (dragon/model.h dg_model_*): the step's tape
 * (runtime/train/bdh_tape.c, the CPU model's) run by the GPU ops.
 *
 * create: record the tape for (B, T) with the activations in the
 * recipe's precision, size each node's workspace by asking its op (with a
 * placeholder address a buffer: sizes depend on shapes and tiles, never
 * on data) and prepare its kernels (so a shape the templates refuse is
 * refused here, by field), plan the arenas, allocate each once. Nothing
 * is allocated after. set_weights: upload the masters, make the execution
 * copies (the transpose op: [H, D, N] → (H, N, D), [H·N, D] → (D, H·N), in
 * the activations' format; a low-bit recipe's then quantized — int8 a
 * scale a channel, ternary a scale a tensor, packed — with their scales)
 * and the RoPE table. step: upload the batch, run every node in order on
 * the calling thread's stream, read the loss (and the gradients) back.
 *
 * Recipes: float (f32, bf16) and low-bit with activations a scale a token
 * (w8a8, bitnet): quantize nodes before each projection and the decoder,
 * their codes (with scales) saved for the weight gradients. On sm_90 the
 * projections' gradient GEMMs read bf16 operands instead (their warpgroup
 * path): the encoders' input gradients a bf16 copy of each encoder's codes
 * × scales (exec_bf16, made with the copy, 16 MiB each at the 25M shape),
 * their weight gradients the saved codes dequantized by a node just before
 * (a temporary the plan reuses). The decoder keeps its codes. The f32
 * recipe is the parity one: its gradient GEMMs take the exact fp32 path.
 * The bf16 recipe on sm_90 runs its decoder forward as the projection's
 * input-gradient GEMM on the warpgroup path (xy · [H·N, D] summed over the
 * heads, f32 out, which the layer norm after it reads) from a bf16 copy of
 * the decoder master in its own layout (dec_fwd: set_weights rounds it on
 * the host, a training step's update writes it on the device): 53 ms a
 * step where the decoder's fp32 SIMT path took 123 ms (H200, B 8, T 512).
 * The (B,H,T,N) gradients (dxy, dxs, dys and their stacks) are in the
 * activations' format (grad_fmt): the bf16 recipes halve their bytes, the
 * f32 one keeps f32 everywhere.
 *
 * This file creates, plans, fills and runs the model; runtime/train/
 * gpu_nodes.c turns each node into its ops (gpu_model_int.h between them).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/msg.h"
#include "base/pool.h"
#include "dragon/fmt.h"
#include "dragon/model.h"
#include "dragon/ops.h"
#include "dragon/ref.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/ref/ref_ops.h"
#include "runtime/tunedb/form.h"
#include "runtime/train/gpu_model_int.h"

/* ---- create, plan ----------------------------------------------------------- */

static bool float_recipe(const dg_model_config *c)
{
	for (int i = 0; i < DG_PROJ__COUNT; i++) {
		const dg_proj_recipe *r = dg__proj_recipe(c, i);
		if (r->weight != c->precision || r->act != c->precision)
			return false;
	}
	return true;
}

/* A low-bit recipe the GPU model runs: integer weights and activations,
 * the activations a scale a token (the weight gradients are one GEMM over
 * every layer's rows, which one scale a layer cannot be), bf16 elsewhere;
 * else one line naming the field. */
static const char *lowbit_refusal(const dg_model_config *c, char *buf, size_t size)
{
	const char *no = dg__model_lowbit_why(c, buf, size);
	if (no)
		return no;
	if (c->precision != DG_FMT_BF16) {
		snprintf(buf, size, "precision=%s: a low-bit recipe keeps the rest in bf16", dg_fmt_name(c->precision));
		return buf;
	}
	/* packed weights: 16 ternary or 32 sign1 codes a 32-bit word, along
	 * the neurons (the decoder's rows, H·N) and the embedding */
	for (int i = 0; i < DG_PROJ__COUNT; i++) {
		const dg_fmt w = dg__proj_recipe(c, i)->weight;
		const int k = w == DG_FMT_TERNARY ? 16 : w == DG_FMT_SIGN1 ? 32 : 1;
		if (c->neurons % k || c->embd % k) {
			snprintf(buf, size,
				 "%s=%d: %s weights pack %d codes a 32-bit word along it, so it must be a multiple of %d",
				 c->neurons % k ? "neurons" : "embd", c->neurons % k ? c->neurons : c->embd,
				 dg_fmt_name(w), k, k);
			return buf;
		}
	}
	return NULL;
}

/* Records the tape, sizes the workspaces, plans. */
/* ---- sizing: every node's ops prepared, in parallel ----------------------- */

/* The threads that prepare a model's nodes: each takes the next node and
 * prepares its ops (the first use of a kernel compiles it, or reads it
 * from the cache; threads asking for one kernel share its build), so a
 * new shape's kernels compile on every core at once. The nodes are taken
 * the first of each kind first (kind, arg and direction: the layers'
 * nodes of one kind share their kernels), so every distinct kernel of the
 * step is being built before any thread waits on a build that another
 * holds — taken in tape order, the threads piled up on the first layer's
 * forward kernels while the backward's were not yet started. The first
 * failure by node order is the one reported. */
#define SIZE_THREADS_MAX 64

typedef struct sizer {
	dg_model *m;
	size_t *needs;
	const int *order;   /* the nodes in the order they are taken */
	pthread_mutex_t mu;
	int next;           /* the next of order to take */
	int failed_at;      /* the first failing node, or n_nodes */
	dg_status st;
	char msg[4096];
} sizer;

static void *size_worker(void *arg)
{
	sizer *z = arg;
	dg_model *m = z->m;
	for (;;) {
		pthread_mutex_lock(&z->mu);
		int n = z->next < m->t.n_nodes ? z->order[z->next++] : m->t.n_nodes;
		if (n > z->failed_at)
			n = m->t.n_nodes; /* past a failure: nothing to report */
		pthread_mutex_unlock(&z->mu);
		if (n >= m->t.n_nodes)
			return NULL;
		size_t need = 0;
		dg_status st = dg__gm_run_node(m, &m->t.nodes[n], NULL, &need);
		z->needs[n] = need;
		if (st) {
			pthread_mutex_lock(&z->mu);
			if (n < z->failed_at) {
				z->failed_at = n;
				z->st = st;
				snprintf(z->msg, sizeof(z->msg), "%s", dg_device_errmsg(m->dev));
			}
			pthread_mutex_unlock(&z->mu);
		}
	}
}

/* Whether nodes a and b are of one kind (their ops' kernels the same). */
static bool same_kind(const dg__tnode *a, const dg__tnode *b)
{
	return a->kind == b->kind && a->arg == b->arg && a->backward == b->backward;
}

/* order: the first node of each kind, in tape order, then the others. */
static void take_order(const dg__tape *t, int *order)
{
	int k = 0;
	for (int n = 0; n < t->n_nodes; n++) {
		bool first = true;
		for (int p = 0; p < n && first; p++)
			first = !same_kind(&t->nodes[p], &t->nodes[n]);
		if (first)
			order[k++] = n;
	}
	for (int n = 0; n < t->n_nodes; n++) {
		bool first = true;
		for (int p = 0; p < n && first; p++)
			first = !same_kind(&t->nodes[p], &t->nodes[n]);
		if (!first)
			order[k++] = n;
	}
}

/* needs[n]: node n's workspace bytes. */
static dg_status size_nodes(dg_model *m, size_t *needs)
{
	sizer z;
	memset(&z, 0, sizeof(z));
	int *order = malloc((size_t)(m->t.n_nodes > 0 ? m->t.n_nodes : 1) * sizeof(*order));
	if (!order)
		return dg__dev_fail(m->dev, DG_ERR_NOMEM, "out of memory (%d nodes)", m->t.n_nodes);
	take_order(&m->t, order);
	z.m = m;
	z.needs = needs;
	z.order = order;
	z.failed_at = m->t.n_nodes;
	pthread_mutex_init(&z.mu, NULL);
	int want = dg__pool_cores(SIZE_THREADS_MAX);
	dg__pool_run(size_worker, &z, want < m->t.n_nodes ? want : m->t.n_nodes);
	pthread_mutex_destroy(&z.mu);
	free(order);
	return z.st ? dg__dev_fail(m->dev, z.st, "%s", z.msg) : DG_OK;
}

static bool room_for(dg_model *m, size_t extra);
static bool room_total(dg_model *m, size_t total);

/* ---- the step's kernels, all at once ----------------------------------------
 *
 * Sizing prepares the nodes on every core, a node a thread, but a node's
 * ops one after another (the attention's chains: three or four kernels),
 * and the execution copies' and the optimizer's kernels are prepared
 * later still, one by one (dg_model_set_weights, dg_model_optim_init). So
 * first every op spec the step will prepare (dg__gm_step_specs: the
 * nodes', the copies', AdamW's) is compiled and loaded, a spec a thread,
 * all at once; sizing then finds them built. A spec that fails here is
 * left to the prepare that needs it, which reports it (the warm-up only
 * saves time). On the H200 (16 cores, empty cache, bench/shapes.sh's
 * first_step_s) it took the 25M w8a8 first step from 5.1 s to 1.1 s and
 * D 768's from 3.4 s to 2.4 s; DRAGON_PRECOMPILE=0 turns it off. */
typedef struct warm_list {
	dg_spec *specs;
	int n, cap;
	dg_device *dev;
	_Atomic int next;
} warm_list;

static dg_status warm_add(void *user, const dg_spec *spec)
{
	warm_list *w = user;
	for (int i = 0; i < w->n; i++)
		if (dg_spec_equal(&w->specs[i], spec))
			return DG_OK;
	if (w->n == w->cap) {
		int cap = w->cap ? 2 * w->cap : 64;
		dg_spec *p = realloc(w->specs, (size_t)cap * sizeof(*p));
		if (!p)
			return DG_ERR_NOMEM;
		w->specs = p;
		w->cap = cap;
	}
	w->specs[w->n++] = *spec;
	return DG_OK;
}

static void *warm_worker(void *arg)
{
	warm_list *w = arg;
	for (int i; (i = atomic_fetch_add(&w->next, 1)) < w->n;) {
		dg_kernel *k = NULL;
		(void)dg_kernel_get(w->dev, &w->specs[i], NULL, &k);
	}
	return NULL;
}

static bool precompile_on(void)
{
	return dg__env_switch("DRAGON_PRECOMPILE") != 0;
}

/* Every kernel of c's step at (b, t) on dev (an sm device), a spec a
 * thread on every core. */
static void warm_specs(dg_device *dev, int sm, const dg_model_config *c, int b, int t)
{
	warm_list w = { .dev = dev };
	atomic_init(&w.next, 0);
	char msg[256];
	const dg_device_info *di = dg__dev_info(dev);
	if (dg__gm_step_specs(c, b, t, sm, dg__dev_tune_db(dev), di ? di->name : NULL, warm_add, &w, msg,
			      sizeof(msg)) == DG_OK &&
	    w.n > 0) {
		int n = dg__pool_cores(SIZE_THREADS_MAX);
		dg__pool_run(warm_worker, &w, n < w.n ? n : w.n);
	}
	free(w.specs);
}

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void warm_kernels(dg_model *m, const dg_model_config *c, int b, int t)
{
	if (m->warm || m->decode || !precompile_on())
		return;
	m->warm = true;
	const double t0 = mono_s();
	warm_specs(m->dev, m->sm, c, b, t);
	m->compile_s = mono_s() - t0;
}

void dg__gm_create_times(const dg_model *m, double *compile_s, double *plan_s, double *alloc_s, double *upload_s)
{
	*compile_s = m ? m->compile_s : 0;
	*plan_s = m ? m->plan_s : 0;
	*alloc_s = m ? m->alloc_s : 0;
	*upload_s = m ? m->upload_s : 0;
}

void dg__gm_plan_modes(const dg_model *m, bool *keep_qr, bool *stack_pgrads, bool *recompute, bool *recompute_ys,
		       int *attn_chunk)
{
	*attn_chunk = m ? m->attn_chunk : 0;
	*keep_qr = m && m->keep_qr;
	*stack_pgrads = m && m->stack_pgrads;
	*recompute = m && m->recompute;
	*recompute_ys = m && m->recompute_ys;
}

/* The same ahead of the model, on a thread of its own (a trainer's while
 * it draws or loads the weights): dg_model_create then finds the kernels
 * loaded. Nothing is allocated on the device. */
struct dg__gm_warm {
	pthread_t th;
	dg_device *dev;
	dg_model_config c;
	int b, t, sm;
};

static void *warm_thread(void *arg)
{
	dg__gm_warm *w = arg;
	warm_specs(w->dev, w->sm, &w->c, w->b, w->t);
	return NULL;
}

dg__gm_warm *dg__gm_warm_start(dg_device *dev, const dg_model_config *c, int b, int t)
{
	if (!dev || !c || b < 1 || t < 1 || !precompile_on())
		return NULL;
	const dg_device_info *di = dg__dev_info(dev);
	dg__gm_warm *w = malloc(sizeof(*w));
	if (!di || !w) {
		free(w);
		return NULL;
	}
	*w = (dg__gm_warm){ .dev = dev, .c = *c, .b = b, .t = t, .sm = di->sm };
	if (pthread_create(&w->th, NULL, warm_thread, w)) {
		free(w);
		return NULL; /* dg_model_create compiles them itself */
	}
	return w;
}

double dg__gm_warm_join(dg__gm_warm *w)
{
	if (!w)
		return 0;
	const double t0 = mono_s();
	pthread_join(w->th, NULL);
	free(w);
	return mono_s() - t0;
}

/*
 * The attention's form at T (dg_attention_fwd_args.chunk): the chunked
 * form's chunk C, or 0 for the quadratic one. The chunked form runs on
 * the rope=pre path (bf16 on sm_90; gpu_nodes.c attn_spec), for a
 * training step (decoding runs attention_step), and needs T a multiple of
 * C. DRAGON_ATTN_CHUNK=C takes chunk C wherever it can run (0: the
 * quadratic form always); else the device's tuning DB's record of the
 * shape where it has one (runtime/tunedb/form.h: bench/attention --form
 * both --record FILE makes one from its measured rows; none is built in
 * yet); else the chunked form from T = ATTN_CHUNK_FROM on, C 256 (512
 * from T 32768, where the states of 256 would take twice the memory),
 * the largest that divides T. The quadratic form's scores
 * are B·H·T² act values a layer, saved: past T 16384 (25M, B 1: 2 GB a
 * layer) it does not fit, where the chunked form's are B·H·T·C and its
 * states a workspace of O(T). The crossover is measured (bench/attention
 * --form both on the H200, 25M shape, forward + backward a layer,
 * bench/results/attention-h200-2026-12-05.json): T 2048 (B 2) quadratic
 * 2.64 ms, chunked 4.70; T 4096 (B 1) 4.50 against 4.77; T 16384 71.0
 * against 19.1; T 65536 1297 against 64.2 — so the chunked form from
 * T 8192. A DRAGON_ATTN_CHUNK that is not a multiple of 64 dividing T is
 * refused (-1).
 */
#define ATTN_CHUNK_FROM 8192

/* Why m's training step cannot take the chunked form whatever T (and what
 * would let it), or NULL: it runs on the rope=pre path (bf16 activations
 * on sm_90), and its kernels read RoPE(xs) by rows of whole 16 bytes. */
static const char *chunk_refusal(const dg_model *m, const char **fix)
{
	if (m->act != DG_FMT_BF16 || m->sm != 90) {
		*fix = "the bf16 or a low-bit preset on an sm_90 GPU";
		return "the chunked form runs bf16 activations on sm_90";
	}
	if (m->N % 8) {
		*fix = "such neurons";
		return "the chunked form needs neurons a multiple of 8";
	}
	return NULL;
}

static int attn_chunk_for(const dg_model *m, int t)
{
	if (m->decode || m->act != DG_FMT_BF16 || m->sm != 90) /* DRAGON_ATTN_CHUNK too */
		return 0;
	const char *fix;
	const bool servable = !chunk_refusal(m, &fix);
	const char *e = getenv("DRAGON_ATTN_CHUNK");
	if (e && *e) {
		char *end;
		long c = strtol(e, &end, 10);
		if (*end || c < 0 || (c && (c % 64 || c > 4096 || t % c || !servable)))
			return -1;
		return (int)c;
	}
	if (!servable)
		return 0;
	/* the device's measured choice for the shape (a record of the tuning
	 * DB, runtime/tunedb/form.h: bench/attention --record makes one) */
	int c = 0;
	const dg_device_info *di = m->dev ? dg__dev_info(m->dev) : NULL;
	const dg_tune_db *db = di ? dg__dev_tune_db(m->dev) : m->list_db;
	const char *name = di ? di->name : m->list_device;
	if (db && name && dg__tune_db_attn_chunk(db, name, m->sm, m->c.heads, m->c.neurons, m->c.embd, m->act, t, &c, NULL))
		return c;
	if (t < ATTN_CHUNK_FROM)
		return 0;
	for (c = t >= 32768 ? 512 : 256; c >= 64; c /= 2)
		if (t % c == 0)
			return c;
	return 0;
}

static void fake_clear(dg_model *m)
{
	free(m->fake);
	m->fake = NULL;
	m->n_fake = 0;
}

/* The sizing pass's placeholder addresses (gpu_model_int.h). */
dg_status dg__gm_fake_layout(dg_model *m)
{
	fake_clear(m);
	m->n_fake = m->t.n_bufs;
	m->fake = malloc(((size_t)m->n_fake + 1) * sizeof(*m->fake));
	if (!m->fake) {
		m->n_fake = 0;
		return DG_ERR_NOMEM;
	}
	dg_dptr at = FAKE_BASE;
	for (int i = 0; i < m->n_fake; i++) {
		m->fake[i] = at;
		if (m->t.bufs[i].parent < 0)
			at += ((dg_dptr)m->t.bufs[i].bytes + 255) / 256 * 256 + 256;
	}
	m->fake[m->n_fake] = at;
	return DG_OK;
}

/* Whether the attention's backward turns xs on grad_xs's stages (its
 * persistent form with rope=load, templates/attention_tma.lua), making
 * RoPE(xs) neither kept (keep_qr's B·H·T·N act bytes a layer) nor again
 * (the backward's rope_fwd pass): DRAGON_ATTN_TURN=1, where the rope=pre
 * warpgroup path runs (bf16 on sm_90), the quadratic form, T % 8 == 0 (C
 * by TMA). The same bytes as keep_qr's step; not the default until the GPU
 * suite has run it (tests/test_gpu_attention.c
 * persistent_grad_xs_rope_load, tests/test_gpu_model.c). */
static bool attn_turns(const dg_model *m, int t)
{
	return m->act == DG_FMT_BF16 && m->sm == 90 && !m->decode && m->attn_chunk == 0 && t % 8 == 0 &&
	       dg__env_switch("DRAGON_ATTN_TURN") == 1;
}

/* Whether DEC_GATE can make ys itself (decoder_gate_bwd_ys, templates/
 * decoder_gate.lua): a low-bit recipe on sm_90 (dec_gate over codes)
 * whose encoder_v reads integer codes (int8 | uint8pos) against int8
 * weights — its execution copy's codes are what the kernel reads. */
static bool gate_ys_applies(const dg_model *m)
{
	const dg_proj_recipe *r = dg__gm_recipe(m, DG_PROJ_ENCODER_V);
	return m->lowbit && m->dec_gate && r->weight == DG_FMT_INT8 &&
	       (r->act == DG_FMT_INT8 || r->act == DG_FMT_UINT8POS);
}

/* m's model of c at (b, t): the tape recorded, each node's ops prepared
 * while sizing its workspace, the arenas planned. dev NULL: the specs
 * listed to sink instead (on an sm device), nothing planned. */
static dg_status build(dg_model *m, dg_device *dev, const dg_model_config *c, int b, int t, int accum,
		       int sm, dg_status (*sink)(void *, const dg_spec *), void *user)
{
	char msg[512];
	dg_status st = dg_model_config_check(c, msg, sizeof(msg));
	if (st)
		return dg__dev_fail(dev, st, "%s", msg);
	char why[256];
	const char *no = float_recipe(c) ? NULL : lowbit_refusal(c, why, sizeof(why));
	if (no)
		return dg__dev_fail(dev, DG_ERR_UNSUPPORTED, "preset %s: %s",
				    c->preset[0] ? c->preset : "(custom)", no);
	if (b < 1 || t < 1)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "batch %dx%d: B and T must be at least 1", b, t);
	if (accum < 1 || accum > 1024)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "accum %d: micro-batches a step must be 1..1024", accum);
	m->dev = dev;
	m->accum = accum;
	m->micro = 0;
	m->last = true;
	m->c = *c;
	m->B = b, m->T = t, m->H = c->heads, m->D = c->embd, m->N = c->neurons, m->V = c->vocab;
	m->act = c->precision;
	m->lowbit = !float_recipe(c);
	const dg_device_info *di = dev ? dg__dev_info(dev) : NULL;
	m->sm = di ? di->sm : sm;
	m->bf16_grads = m->lowbit && m->sm == 90;
	m->dec_gate = m->act == DG_FMT_BF16 && m->sm == 90;
	m->qw_ws = -1;
	m->attn_chunk = attn_chunk_for(m, t);
	if (m->attn_chunk < 0)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "DRAGON_ATTN_CHUNK=%s: the attention's chunk must be 0 (the quadratic form) or a multiple of 64 up to 4096 that divides T = %d (and the chunked form needs neurons a multiple of 8: %d)",
				    getenv("DRAGON_ATTN_CHUNK"), t, m->N);
	/* the chunked form does not keep RoPE(xs): with it, a step of two
	 * layers or more gave a NaN gradient from its second step on (the
	 * H200, 25M w8a8, T 1024 to 16384, chunks 128 to 512); without it,
	 * the same runs train. The cause: the chunked forward made RoPE(xs)
	 * only into its workspace, never into a kept buffer, so the backward
	 * read stale bytes. It now writes the kept buffer (the chains with it
	 * against the chains without, bit for bit, in
	 * tests/test_gpu_attention_chunk.c); keep_qr comes back to the chunked
	 * form once that test has passed on a device */
	if (m->attn_chunk > 0)
		m->keep_qr = false;
	m->attn_turn = attn_turns(m, t); /* keep_qr then off: qr_keepable */
	/* measured on an H100 at 25M w8a8: the step with ys made again 23.49
	 * ms this way, the same losses bit for bit as saving it (22.40 ms);
	 * DRAGON_GATE_YS=0: by a projection node */
	m->gate_ys = gate_ys_applies(m) && dg__env_switch("DRAGON_GATE_YS") != 0;
	/* decoder_gate_bwd by TMA, persistent (templates/decoder_gate_tma.lua:
	 * the warpgroup path's K = D a whole number of 64-wide steps, rows of
	 * N a tensor map's): the same bits as the ring form
	 * (test_gpu_decoder_gate persistent_form_is_the_ring_form); measured
	 * on an H100, w8a8: the node 3.38 -> 2.80 ms at 25M, 16.0 -> 11.5 ms
	 * at 1B. DRAGON_GATE_TMA=0: the ring form */
	m->gate_tma = m->dec_gate && m->act == DG_FMT_BF16 && m->sm == 90 && m->N % 8 == 0 && m->D % 64 == 0 &&
		      dg__env_switch("DRAGON_GATE_TMA") != 0;
	/* the encoder's projection makes RoPE(xs) into the kept qr too
	 * (lowrank_fwd epi=rope, templates/lowrank_wgmma.lua): no rope_fwd
	 * pass in the forward, the same bits (test_emu_lowrank,
	 * test_gpu_forward rope_epilogue); DRAGON_PROJ_ROPE=1 until the GPU
	 * suite and the step have run it */
	m->proj_rope = m->keep_qr && m->act == DG_FMT_BF16 && m->sm == 90 && !m->decode && m->attn_chunk == 0 &&
		       dg__env_switch("DRAGON_PROJ_ROPE") == 1;
	dg__tape_init(&m->t, c, b, t);
	dg__bdh_target tg = { .gpu = true, .act = m->act, .lowbit = m->lowbit,
			      .bf16_grads = m->bf16_grads, .dec_gate = m->dec_gate,
			      .dec_fwd_gemm = m->dec_gate && !m->lowbit, .keep_gexec = accum > 1,
			      .keep_qr = m->keep_qr, .proj_rope = m->proj_rope, .stack_pgrads = m->stack_pgrads, .recompute = m->recompute,
			      .recompute_ys = m->recompute_ys, .gate_ys = m->gate_ys,
			      .attn_chunk = m->attn_chunk,
			      /* DRAGON_GATE_QUANT=0: the gate and the quantizer apart */
			      .gate_quant = m->lowbit && dg__env_switch("DRAGON_GATE_QUANT") != 0 };
	st = dg__bdh_tape_build(&m->t, &m->id, &tg);
	if (st)
		return dg__dev_fail(dev, st, "the step's tape: %s", dg_status_str(st));
	/* a decoder runs the forward alone: the backward's nodes are neither
	 * prepared nor planned, so what only they touch takes no memory and
	 * the activations live through the forward only */
	if (m->decode)
		m->t.n_nodes = m->t.n_forward;
	/* a step that does not fit even without its workspaces is refused
	 * (by fits) before any kernel is prepared: preparing compiles and
	 * loads modules, which hold device memory and take seconds */
	if (!sink && dev) {
		st = dg__tape_plan(&m->t);
		if (st)
			return dg__dev_fail(dev, st, "the step's arena plan: %s", dg_status_str(st));
		if (!room_for(m, 0))
			return DG_OK;
		warm_kernels(m, c, b, t);
	}
	if (dg__gm_fake_layout(m))
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	m->sizing = true;
	int n_nodes = m->t.n_nodes;
	m->ex = calloc((size_t)n_nodes, sizeof(*m->ex));
	if (!m->ex)
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	for (int n = 0; n < n_nodes; n++) {
		m->ex[n] = dg__exec_eager(dev);
		m->ex[n].sink = sink;
		m->ex[n].sink_user = user;
	}
	size_t *needs = calloc((size_t)n_nodes + 1, sizeof(*needs));
	if (!needs)
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	st = sink ? DG_OK : size_nodes(m, needs);
	for (int n = 0; sink && n < n_nodes && !st; n++) { /* listing: one thread, in order */
		size_t need = 0;
		st = dg__gm_run_node(m, &m->t.nodes[n], NULL, &need);
		if (st)
			m->failed_node = n;
	}
	for (int n = 0; n < n_nodes && !st; n++) {
		size_t need = needs[n];
		if (need) {
			char nm[40];
			snprintf(nm, sizeof(nm), "ws.%d", n);
			int64_t sh[1] = { (int64_t)need };
			int id = dg__tape_buf(&m->t, nm, DG_FMT_INT8, DG__B_WORKSPACE, 1, sh);
			if (id < 0) {
				st = dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
				break;
			}
			m->t.nodes[n].ws = id;
		}
	}
	free(needs);
	if (st || sink)
		return st;
	/* a per-tensor weight scale's partial sums (the largest copy's) */
	for (int k = 0; m->lowbit && k < DG_PROJ__COUNT && !st; k++) {
		const dg_proj_recipe *r = dg__gm_recipe(m, k);
		if (r->wscale == DG_SCALE_CHANNEL)
			continue;
		dg_spec q = dg__gm_base_spec(m, DG_OP_QUANTIZE_WEIGHT);
		q.weight = r->weight;
		q.src = DG_FMT_F32;
		dg_spec_normalize(&q);
		int64_t E = k == DG_PROJ_DECODER ? (int64_t)m->H * m->N : m->D;
		int64_t R = (int64_t)m->H * m->N * m->D / E;
		dg_tensor wf = dg_tensor_2d("w", DG_FMT_F32, FAKE_BASE, R, E);
		dg_tensor cd = dg_tensor_2d("codes", DG_FMT_INT8, FAKE_BASE, R, E);
		cd.scale = FAKE_BASE;
		dg_quantize_weight_args qa = { .w = &wf, .codes = &cd };
		size_t need = 0;
		st = dg_quantize_weight_workspace(dev, &q, &qa, &need);
		if (!st && need && (m->qw_ws < 0 || m->t.bufs[m->qw_ws].bytes < need)) {
			int64_t sh[1] = { (int64_t)need };
			m->qw_ws = dg__tape_buf(&m->t, "exec.ws", DG_FMT_INT8, DG__B_LOWBIT, 1, sh);
		}
	}
	if (st)
		return st;
	m->sizing = false;
	fake_clear(m);
	st = dg__tape_plan(&m->t);
	if (st)
		return dg__dev_fail(dev, st, "the step's arena plan: %s", dg_status_str(st));
	return DG_OK;
}

/* What build made: the nodes' prepared slots and the tape. */
static void unbuild(dg_model *m)
{
	fake_clear(m);
	for (int n = 0; m->ex && n < m->t.n_nodes; n++)
		dg__exec_free(&m->ex[n]);
	free(m->ex);
	m->ex = NULL;
	dg__tape_free(&m->t);
}

/* Whether the attention can keep RoPE(xs): where it reads it pre-made (its
 * rope=pre path, gpu_nodes.c attn_spec) in a training step, and
 * DRAGON_KEEP_QR is not 0. */
static bool qr_keepable(const dg_model *m)
{
	return m->act == DG_FMT_BF16 && m->sm == 90 && !m->decode && !m->attn_turn &&
	       dg__env_switch("DRAGON_KEEP_QR") != 0;
}


/* Whether the encoders' weight gradients are made once over every
 * layer's stacked rows (stack_pgrads, dg__bdh_target) rather than a layer
 * at a time: DRAGON_STACK_PGRADS=0 never, =1 wherever the plan fits, else
 * where a layer's rows are few beside the weight (B·T <= STACK_PGRADS_BT):
 * a layer's GEMM then spends as long reading and writing the f32 gradient
 * (8·H·N·D bytes) as multiplying (2·B·T·H·N·D flops), and the stack turns
 * L - 1 of those passes and L - 1 pipeline fills a tile into more K steps
 * of one GEMM. Larger batches keep the layer-at-a-time form, which holds
 * a layer's gradients, not every layer's. Measured on the H200 (w8a8
 * training step, a layer at a time -> stacked; bench/step --train): 1B
 * (D 1280, H 16, N 16384, B 2) 149.6 -> 144.9 ms, its 12 GEMMs 28.3 ms
 * -> 2 in 22.9; H 16, N 65536 (B 1, T 256) 64.0 -> 59.6; D 768 (B 4)
 * 69.2 -> 68.5; D 512 (B 8) 34.6 -> 34.3; the 25M model (B 8) 22.97 ->
 * 22.72 for 2.7 GB more (peak 6.75 -> 9.44 GB), so not by default. */
#define STACK_PGRADS_BT 2048
static bool pgrads_stackable(const dg_model *m, int b, int t)
{
	const int env = dg__env_switch("DRAGON_STACK_PGRADS");
	if (m->decode || m->c.layers < 2 || env == 0)
		return false;
	return env == 1 || (int64_t)b * t <= STACK_PGRADS_BT;
}

/* build with the memory-for-time choices that fit the device's free
 * memory (or DRAGON_MEMORY's budget, when less): keep_qr (RoPE(xs) kept
 * for the attention's backward: no RoPE pass there, B·H·T·N act bytes a
 * layer more; 1.1 ms of RoPE passes a step fewer at 25M, B 8, T 512 on
 * the H200, for 1.6 GB) and stack_pgrads (pgrads_stackable: 2·(L-1)·B·H·
 * T·N act bytes more). The step's numbers are the same bits with or
 * without keep_qr (the backward would make the same qr again);
 * stack_pgrads sums each encoder's weight gradient over the layers inside
 * one GEMM, in another order than the layer-at-a-time f32 adds. The plan
 * that saves xs and ys is made first; where it does not fit, the one that
 * recomputes ys alone (recompute_ys: one projection a layer more, B·H·T·N
 * act bytes a layer fewer), then the one that recomputes both (recompute:
 * two projections a layer) — time for memory, the same bits — becomes the
 * base (a step that fits no way is refused by create, naming the last
 * plan's arenas); then, while the base's total and the extra bytes fit:
 * both, keep_qr alone, stack_pgrads alone — the first whose plan fits is
 * kept (an arena can come out larger than the sum). */
static dg_status build_fit(dg_model *m, dg_device *dev, const dg_model_config *c, int b, int t, int accum)
{
	m->keep_qr = false;
	m->stack_pgrads = false;
	/* DRAGON_RECOMPUTE (dg__recompute_env): 1 or all: xs and ys always,
	 * ys: ys alone always, 0: never; else by the memory */
	const dg__rec_mode rec_env = m->decode ? DG__REC_NONE : dg__recompute_env();
	m->recompute = rec_env == DG__REC_ALL;
	m->recompute_ys = rec_env == DG__REC_YS;
	dg_status st = build(m, dev, c, b, t, accum, 0, NULL, NULL);
	if (st)
		return st;
	for (int rung = 0; rec_env == DG__REC_AUTO && rung < 2 && !room_for(m, 0); rung++) {
		unbuild(m);
		m->recompute_ys = rung == 0;
		m->recompute = rung == 1;
		if ((st = build(m, dev, c, b, t, accum, 0, NULL, NULL)))
			return st;
	}
	const bool qr = qr_keepable(m), spg = pgrads_stackable(m, b, t);
	const size_t layer = (size_t)b * (size_t)c->heads * (size_t)t * (size_t)c->neurons * dg_fmt_row_bytes(m->act, 1);
	const size_t qr_b = (size_t)c->layers * layer, spg_b = 2 * (size_t)(c->layers - 1) * layer;
	dg_model_memory base;
	dg__tape_report(&m->t, &base);
	const bool tries[3][2] = { { true, true }, { true, false }, { false, true } };
	bool rebuilt = false;
	for (int i = 0; i < 3; i++) {
		const bool kq = tries[i][0], ks = tries[i][1];
		if ((kq && !qr) || (ks && !spg) || !room_total(m, base.total + (kq ? qr_b : 0) + (ks ? spg_b : 0)))
			continue;
		unbuild(m);
		rebuilt = true;
		m->keep_qr = kq;
		m->stack_pgrads = ks;
		st = build(m, dev, c, b, t, accum, 0, NULL, NULL);
		if (st || room_for(m, 0))
			return st;
	}
	if (!rebuilt)
		return DG_OK;
	unbuild(m);
	m->keep_qr = false;
	m->stack_pgrads = false;
	return build(m, dev, c, b, t, accum, 0, NULL, NULL);
}

dg_status dg_model_plan(dg_device *dev, const dg_model_config *c, int b, int t, dg_model_memory *out)
{
	if (!dev || !c || !out)
		return dev ? dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_model_plan: NULL argument")
			   : DG_ERR_INVALID_ARG;
	dg_model m;
	memset(&m, 0, sizeof(m));
	char why[200];
	dg_status st = dg__memory_budget(&m.budget, why, sizeof(why));
	if (st)
		return dg__dev_fail(dev, st, "%s", why);
	st = build_fit(&m, dev, c, b, t, 1);
	if (!st)
		dg__tape_report(&m.t, out);
	unbuild(&m);
	return st;
}

void dg_model_destroy(dg_model *m)
{
	if (!m)
		return;
	if (m->tr_free)
		m->tr_free(m);
	if (m->dc_free)
		m->dc_free(m);
	for (int k = 0; k < DG__B__COUNT; k++)
		(void)dg_free(m->dev, m->alloc[k]);
	unbuild(m);
	if (!m->shares) {
		(void)dg_free(m->dev, m->state);
		(void)dg_free(m->dev, m->pos_d);
		(void)dg_free(m->dev, m->freq_d);
	}
	free(m->pos);
	free(m);
}

void dg_model_memory_of(const dg_model *m, dg_model_memory *out)
{
	if (m && out)
		dg__tape_report(&m->t, out);
}

/* The specs of execution copy k's ops: the transpose ([H, D, N] → (H, N,
 * D), [H·N, D] → (D, H·N): rows of E, L of them), and a low-bit recipe's
 * weight quantizer, the bf16 copy's dequantize (when made) and the pack
 * (a packed format). */
static dg_spec copy_transpose_spec(const dg_model *m, dg_proj k)
{
	const bool dec = k == DG_PROJ_DECODER;
	dg_spec s = dg__gm_op_spec(m, DG_OP_TRANSPOSE);
	s.embd = dec ? m->H * m->N : m->D;
	s.latent = dec ? m->D : m->N;
	if (m->lowbit)
		s.act = DG_FMT_F32;
	dg_spec_normalize(&s);
	return s;
}

static dg_spec copy_quant_spec(const dg_model *m, dg_proj k)
{
	const dg_proj_recipe *r = dg__gm_recipe(m, k);
	dg_spec q = dg__gm_base_spec(m, DG_OP_QUANTIZE_WEIGHT);
	q.weight = r->weight;
	q.wscale = r->wscale;
	q.src = DG_FMT_F32;
	dg_spec_normalize(&q);
	return q;
}

static bool copy_has_bf16(const dg_model *m, dg_proj k)
{
	return m->lowbit && m->bf16_grads && (k != DG_PROJ_DECODER || m->dec_gate);
}

static dg_spec copy_dequant_spec(const dg_model *m, dg_proj k)
{
	const dg_proj_recipe *r = dg__gm_recipe(m, k);
	return dg__gm_dequant_spec(m, DG_FMT_INT8, r->wscale == DG_SCALE_CHANNEL ? DG_SCALE_TOKEN : DG_SCALE_TENSOR);
}

static bool copy_packed(const dg_model *m, dg_proj k)
{
	return m->lowbit && dg__gm_recipe(m, k)->weight != DG_FMT_INT8;
}

static dg_spec copy_pack_spec(const dg_model *m, dg_proj k)
{
	const dg_proj_recipe *r = dg__gm_recipe(m, k);
	dg_spec ps = dg__gm_base_spec(m, r->weight == DG_FMT_TERNARY ? DG_OP_PACK_TERNARY : DG_OP_PACK_SIGN1);
	ps.embd = k == DG_PROJ_DECODER ? m->H * m->N : m->D;
	dg_spec_normalize(&ps);
	return ps;
}

/* Execution copy k (dragon/model.h dg_proj) from its master. */
dg_status dg__gm_make_copy(dg_model *m, dg_proj k)
{
	dg_device *dev = m->dev;
	bool dec = k == DG_PROJ_DECODER;
	int64_t R = dec ? 1 : m->H, E = dec ? (int64_t)m->H * m->N : m->D, L = dec ? m->D : m->N;
	dg_spec s = copy_transpose_spec(m, k);
	int src = m->id.params[k == DG_PROJ_ENCODER ? DG_PARAM_ENCODER
			       : k == DG_PROJ_ENCODER_V ? DG_PARAM_ENCODER_V : DG_PARAM_DECODER];
	dg_tensor i = dg__gm_tn(m, src), o = dg__gm_tn(m, m->lowbit ? m->id.exec_f32 : m->id.exec[k]);
	dg_tensor i3 = dg_tensor_3d(i.name, DG_FMT_F32, i.data, R, E, L);
	dg_tensor o3 = dg_tensor_3d(o.name, m->lowbit ? DG_FMT_F32 : m->act, o.data, R, L, E);
	dg_transpose_args a = { .in = &i3, .out = &o3 };
	dg_status st = dg_transpose(dev, &s, &a);
	if (st || !m->lowbit)
		return st;
	/* quantize the (R·L, E) rows: a scale a channel is a scale a row */
	const dg_proj_recipe *r = dg__gm_recipe(m, k);
	dg_tensor exec = dg__gm_tn(m, m->id.exec[k]);
	bool packed = copy_packed(m, k);
	dg_spec q = copy_quant_spec(m, k);
	dg_tensor wf = dg_tensor_2d("w (f32, execution layout)", DG_FMT_F32, o.data, R * L, E);
	dg_tensor codes = dg_tensor_2d("codes", DG_FMT_INT8,
				       packed ? dg__gm_addr(m, m->id.exec_codes) : exec.data, R * L, E);
	codes.scale = exec.scale;
	dg_quantize_weight_args qa = { .w = &wf, .codes = &codes };
	if (m->qw_ws >= 0) {
		qa.ws.ptr = dg__gm_addr(m, m->qw_ws);
		qa.ws.bytes = m->t.bufs[m->qw_ws].bytes;
	}
	st = dg_quantize_weight(dev, &q, &qa);
	if (!st && copy_has_bf16(m, k)) {
		/* the input gradient's bf16 copy: the codes (before packing)
		 * times their scale, a channel's a row (the decoder's: what
		 * decoder_gate_bwd reads) */
		dg_spec ds = copy_dequant_spec(m, k);
		dg_tensor bf = dg_tensor_2d("w (bf16, dequantized)", DG_FMT_BF16,
					    dg__gm_addr(m, m->id.exec_bf16[k]), R * L, E);
		dg_dequantize_args da = { .codes = &codes, .out = &bf };
		st = dg_dequantize(dev, &ds, &da);
	}
	if (st || !packed)
		return st;
	dg_spec ps = copy_pack_spec(m, k);
	dg_tensor pk = dg_tensor_2d("packed", r->weight, exec.data, R * L, E);
	dg_pack_weight_args pa = { .codes = &codes, .packed = &pk };
	return dg_pack_weight(dev, &ps, &pa);
}

/* Buffer id (bf16) from n = its elements of host f32, each rounded to
 * nearest even (dg_f32_to_bf16, what the device's copies round by). */
static dg_status upload_bf16(dg_model *m, int id, const float *src)
{
	size_t n = (size_t)m->t.bufs[id].bytes / 2;
	uint16_t *h = malloc(n * 2 + 2);
	if (!h)
		return dg__dev_fail(m->dev, DG_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		h[i] = dg_f32_to_bf16(src[i]);
	dg_status st = dg_memcpy_htod(m->dev, dg__gm_addr(m, id), h, n * 2);
	/* the copy is from pageable memory: staged before the call returns */
	free(h);
	return st;
}

/* The RoPE table's rows a worker takes at a time. */
#define ROPE_ROWS 64

typedef struct rope_work {
	float *table;
	const float *freq;
	int t, n;
	atomic_int next; /* the next block of ROPE_ROWS rows */
} rope_work;

static void *rope_worker(void *arg)
{
	rope_work *w = arg;
	for (int i; (i = atomic_fetch_add(&w->next, 1)) * ROPE_ROWS < w->t;) {
		int t0 = i * ROPE_ROWS, t1 = t0 + ROPE_ROWS < w->t ? t0 + ROPE_ROWS : w->t;
		dg_ref_rope_pairs_rows(t0, t1, w->n, w->freq, w->table);
	}
	return NULL;
}

/* The RoPE table (T, N) the attention reads, made on the host
 * (dg_ref_rope_pairs's bits) a block of rows a thread on every core: its
 * T·N/2 cosines and sines took 10.2 s of a single core at T 65536 (the
 * 25M model's first step 12.2 s on the H200). None for a decoder or a
 * window model, whose attention (attention_step) makes each token's
 * phases itself. */
static dg_status upload_rope(dg_model *m)
{
	if (m->decode)
		return DG_OK;
	const size_t bytes = (size_t)m->T * m->N * sizeof(float);
	float *rope = malloc(bytes + 4), *freq = malloc((size_t)m->N * sizeof(float));
	if (!rope || !freq) {
		free(rope);
		free(freq);
		return dg__dev_fail(m->dev, DG_ERR_NOMEM, "out of memory (the RoPE table, %zu bytes)", bytes);
	}
	dg_ref_rope_freq(m->N, freq);
	rope_work w = { .table = rope, .freq = freq, .t = m->T, .n = m->N };
	atomic_init(&w.next, 0);
	const int blocks = (m->T + ROPE_ROWS - 1) / ROPE_ROWS, cores = dg__pool_cores(SIZE_THREADS_MAX);
	dg__pool_run(rope_worker, &w, cores < blocks ? cores : blocks);
	dg_status st = dg_memcpy_htod(m->dev, dg__gm_tn(m, m->id.rope).data, rope, bytes);
	free(rope);
	free(freq);
	return st;
}

dg_status dg_model_set_weights(dg_model *m, const dg_model_weights *w)
{
	if (!m || !w)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg_model_set_weights: NULL argument")
			 : DG_ERR_INVALID_ARG;
	dg_device *dev = m->dev;
	if (memcmp(&w->config, &m->c, sizeof(m->c)) != 0)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "dg_model_set_weights: the weights' config is not the model's");
	dg_status st = DG_OK;
	for (int p = 0; p < DG_MODEL_N_PARAMS && !st; p++)
		st = dg_memcpy_htod(dev, dg__gm_tn(m, m->id.params[p]).data, w->params[p],
				    m->t.bufs[m->id.params[p]].bytes);
	/* the execution copies: [H, D, N] → (H, N, D); [H·N, D] → (D, H·N), in
	 * the activations' format, or (low-bit) in f32, then quantized (and
	 * packed) with their scales */
	for (int k = 0; k < DG_PROJ__COUNT && !st; k++)
		st = dg__gm_make_copy(m, k);
	if (!st && m->id.dec_fwd >= 0)
		st = upload_bf16(m, m->id.dec_fwd, w->params[DG_PARAM_DECODER]);
	if (st)
		return st;
	return upload_rope(m);
}

/* AdamW's two moments of every parameter (gpu_train.c allocates them
 * beside the plan's arenas when the model trains). */
static size_t moment_bytes(const dg_model *m)
{
	return m->decode ? 0 : 2 * m->t.arena[DG__B_PARAMS];
}

/* Whether a plan of `total` bytes fits the device's free memory (a device
 * that cannot say: yes) and DRAGON_MEMORY's budget (m->budget, the
 * moments counted in it). */
static bool room_total(dg_model *m, size_t total)
{
	if (m->budget && total + moment_bytes(m) > m->budget)
		return false;
	size_t free_b = 0, total_b = 0;
	return dg_device_mem_info(m->dev, &free_b, &total_b) || total <= free_b;
}

/* Whether the plan and extra bytes more fit the device's free memory. */
static bool room_for(dg_model *m, size_t extra)
{
	dg_model_memory mm;
	dg__tape_report(&m->t, &mm);
	return room_total(m, mm.total + extra);
}

/* The planned arenas against the device's free memory, before any is
 * allocated: DG_ERR_NOMEM naming both, by bucket, when they do not fit
 * (a device that cannot say is let through: the allocation then tells). */
static dg_status fits(dg_model *m, int accum)
{
	if (room_for(m, 0))
		return DG_OK;
	dg_model_memory mm;
	dg__tape_report(&m->t, &mm);
	size_t free_b = 0, total_b = 0;
	const bool known = !dg_device_mem_info(m->dev, &free_b, &total_b);
	const double g = 1.0 / (1 << 30);
	char acc[48] = "";
	if (accum > 1)
		snprintf(acc, sizeof(acc), " (accum %d)", accum);
	/* where the quadratic attention's saved scores (B·H·T² act a layer)
	 * are the most of it at a long T: why not the chunked form */
	char why[320] = "";
	const size_t scores = (size_t)m->c.layers * (size_t)m->B * (size_t)m->H * (size_t)m->T * (size_t)m->T *
			      dg_fmt_row_bytes(m->act, 1);
	if (!m->attn_chunk && !m->decode && m->T >= ATTN_CHUNK_FROM && 2 * scores > mm.total) {
		const char *fix = "such a --time", *no = chunk_refusal(m, &fix);
		snprintf(why, sizeof(why),
			 "; %.2f GiB of it the attention's (B,H,T,T) scores of its quadratic form: %s, so take %s",
			 scores * g, no ? no : "the chunked form needs T a multiple of 64", fix);
	}
	/* the limit it passed: the budget (its moments counted), or the free
	 * memory */
	char over[600];
	const bool budget = m->budget && mm.total + moment_bytes(m) > m->budget && (!known || mm.total <= free_b);
	if (budget)
		snprintf(over, sizeof(over),
			 " and AdamW's moments %.2f, more than DRAGON_MEMORY=%s (%.2f GiB) even recomputing its "
			 "projections%s; raise it, or",
			 moment_bytes(m) * g, getenv("DRAGON_MEMORY"), m->budget * g, why);
	else
		snprintf(over, sizeof(over), ", more than the device's %.2f GiB free (of %.2f)%s;", free_b * g,
			 total_b * g, why);
	return dg__dev_fail(m->dev, DG_ERR_NOMEM,
			    "batch %dx%d%s: the model needs %.2f GiB (masters %.2f, copies %.2f, gradients %.2f, "
			    "activations %.2f)%s take a smaller --batch (--accum K keeps the batch), --time or shape",
			    m->B, m->T, acc, mm.total * g, mm.params * g, mm.lowbit * g, mm.grads * g,
			    mm.activations * g, over);
}

dg_status dg_model_create(dg_device *dev, const dg_model_weights *w, int b, int t, dg_model **out)
{
	return dg_model_create_accum(dev, w, b, t, 1, out);
}

dg_status dg_model_create_accum(dg_device *dev, const dg_model_weights *w, int b, int t, int accum,
				dg_model **out)
{
	return dg__gm_create(dev, w, b, t, accum, false, false, out);
}

dg_status dg__model_create_warmed(dg_device *dev, const dg_model_weights *w, int b, int t, int accum,
				  dg_model **out)
{
	return dg__gm_create(dev, w, b, t, accum, false, true, out);
}

/* A decoder's state, positions and frequencies (before its nodes are
 * sized: they read the addresses); a window model's are its decoder's. */
static dg_status decode_alloc(dg_model *m, dg_device *dev, const dg_model_config *c, int b)
{
	if (b < 1)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "a decoder of %d rows: at least 1", b);
	const size_t state = (size_t)c->layers * (size_t)b * (size_t)c->heads * (size_t)c->neurons *
			     (size_t)c->embd * sizeof(float);
	m->decode = true;
	if (m->shares) {
		m->state = m->shares->state;
		m->pos_d = m->shares->pos_d;
		m->freq_d = m->shares->freq_d;
		return DG_OK;
	}
	m->pos = calloc((size_t)b, sizeof(int64_t));
	float *freq = malloc((size_t)c->neurons * sizeof(float));
	dg_status st = m->pos && freq ? DG_OK : dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	if (!st)
		st = dg_malloc(dev, state, &m->state);
	if (!st)
		st = dg_memset8(dev, m->state, 0, state);
	if (!st)
		st = dg_malloc(dev, (size_t)b * 2 * sizeof(float), &m->pos_d);
	if (!st)
		st = dg_malloc(dev, (size_t)c->neurons * sizeof(float), &m->freq_d);
	if (!st) {
		dg_ref_rope_freq(c->neurons, freq);
		st = dg_memcpy_htod(dev, m->freq_d, freq, (size_t)c->neurons * sizeof(float));
	}
	free(freq);
	return st;
}

/* A window model's weights (dg__gm_create_window): its parameters are its
 * decoder's arena, so only what it keeps of its own is made: the
 * execution copies from them on the device, the bf16 decoder copy from the
 * decoder's (no RoPE table: attention_step makes its phases). */
static dg_status window_weights(dg_model *m)
{
	dg_device *dev = m->dev;
	const dg_model *d = m->shares;
	dg_status st = DG_OK;
	for (int k = 0; k < DG_PROJ__COUNT && !st; k++)
		st = dg__gm_make_copy(m, k);
	if (!st && m->id.dec_fwd >= 0)
		st = dg_memcpy_dtod(dev, dg__gm_addr(m, m->id.dec_fwd), dg__gm_addr(d, d->id.dec_fwd),
				    m->t.bufs[m->id.dec_fwd].bytes);
	return st;
}

/* A model of c at (b, t) (see dg__gm_create), its weights w's; or, with
 * share (w NULL), a window model of that decoder. */
static dg_status create(dg_device *dev, const dg_model_config *c, const dg_model_weights *w, int b, int t,
			int accum, bool decode, bool warmed, const dg_model *share, dg_model **out)
{
	dg_model *m = calloc(1, sizeof(*m));
	if (!m)
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	m->dev = dev;
	m->warm = warmed;
	m->shares = share;
	const double t0 = mono_s();
	char why[200];
	dg_status st = dg__memory_budget(&m->budget, why, sizeof(why));
	if (st) {
		free(m);
		return dg__dev_fail(dev, st, "%s", why);
	}
	if (decode)
		st = decode_alloc(m, dev, c, b);
	if (!st)
		st = build_fit(m, dev, c, b, t, accum);
	if (!st)
		st = fits(m, accum);
	const double t1 = mono_s();
	for (int k = 0; !st && k < DG__B__COUNT; k++) {
		m->base[k] = 0;
		/* the parameters come first in the tape, their shapes the
		 * config's: a window model's arena is its decoder's, byte for
		 * byte, and is used in place */
		if (share && k == DG__B_PARAMS) {
			if (m->t.arena[k] != share->t.arena[k])
				st = dg__dev_fail(dev, DG_ERR_INTERNAL,
						  "a window model's parameters (%zu bytes) are not its decoder's (%zu)",
						  m->t.arena[k], share->t.arena[k]);
			m->base[k] = share->base[k];
			continue;
		}
		/* a decoder has no gradients: its forward alone is planned */
		if (m->t.arena[k] && !(decode && k == DG__B_GRADS))
			st = dg_malloc(dev, m->t.arena[k], &m->alloc[k]);
		m->base[k] = m->alloc[k];
	}
	const double t2 = mono_s();
	if (!st)
		st = share ? window_weights(m) : dg_model_set_weights(m, w);
	m->plan_s = t1 - t0 - m->compile_s;
	m->alloc_s = t2 - t1;
	m->upload_s = mono_s() - t2;
	if (st) {
		dg_model_destroy(m);
		return st;
	}
	*out = m;
	return DG_OK;
}

dg_status dg__gm_create(dg_device *dev, const dg_model_weights *w, int b, int t, int accum, bool decode,
		       bool warmed, dg_model **out)
{
	if (!dev || !w || !out)
		return dev ? dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_model_create: NULL argument")
			   : DG_ERR_INVALID_ARG;
	*out = NULL;
	return create(dev, &w->config, w, b, t, accum, decode, warmed, NULL, out);
}

dg_status dg__gm_create_window(dg_device *dev, const dg_model *dec, int t, dg_model **out)
{
	if (!dev || !dec || !out || !dec->decode || dec->shares)
		return dev ? dg__dev_fail(dev, DG_ERR_INVALID_ARG, "a window model needs a decoder")
			   : DG_ERR_INVALID_ARG;
	*out = NULL;
	return create(dev, &dec->c, NULL, dec->B, t, 1, true, false, dec, out);
}

/* The batch's checks and upload (nothing runs). */
dg_status dg__gm_upload(dg_model *m, const dg_model_batch *bt)
{
	dg_device *dev = m->dev;
	if (bt->b != m->B || bt->t != m->T)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "batch %dx%d: the model was planned for %dx%d (B x T)", bt->b, bt->t,
				    m->B, m->T);
	int64_t n = (int64_t)m->B * m->T;
	for (int64_t i = 0; i < n; i++) {
		if (bt->idx[i] < 0 || bt->idx[i] >= m->V)
			return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "idx[%lld] = %d: outside the vocabulary 0..%d",
					    (long long)i, bt->idx[i], m->V - 1);
		if (bt->targets[i] < 0 || bt->targets[i] >= m->V)
			return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
					    "targets[%lld] = %d: outside the vocabulary 0..%d", (long long)i,
					    bt->targets[i], m->V - 1);
	}
	dg_status st = dg_memcpy_htod(dev, dg__gm_tn(m, m->id.tokens).data, bt->idx, (size_t)n * 4);
	if (!st)
		st = dg_memcpy_htod(dev, dg__gm_tn(m, m->id.targets).data, bt->targets, (size_t)n * 4);
	if (!st)
		st = dg_memset8(dev, dg__gm_tn(m, m->id.bad).data, 0, 4);
	return st;
}

/* The batch uploaded, then the nodes. */
static dg_status run(dg_model *m, const dg_model_batch *bt, bool backward)
{
	dg_status st = dg__gm_upload(m, bt);
	int end = backward ? m->t.n_nodes : m->t.n_forward;
	for (int k = 0; k < end && !st; k++)
		st = dg__gm_run_node(m, &m->t.nodes[k], bt, NULL);
	return st;
}


dg_status dg_model_profile(dg_model *m, const dg_model_batch *bt, dg_model_time *out, int cap,
			   int *n)
{
	if (!m || !bt || !bt->idx || !bt->targets || !out || !n)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg_model_profile: NULL argument")
			 : DG_ERR_INVALID_ARG;
	dg_device *dev = m->dev;
	*n = 0;
	/* the batch, then the nodes one by one */
	dg_status st = dg__gm_upload(m, bt);
	dg_event *e0 = NULL, *e1 = NULL;
	if (!st)
		st = dg_event_create(dev, &e0);
	if (!st)
		st = dg_event_create(dev, &e1);
	int kind_row[DG__N__COUNT];
	for (int k = 0; k < DG__N__COUNT; k++)
		kind_row[k] = -1;
	for (int i = 0; i < m->t.n_nodes && !st; i++) {
		const dg__tnode *nd = &m->t.nodes[i];
		float ms = 0;
		st = dg_event_record(e0);
		if (!st)
			st = dg__gm_run_node(m, nd, bt, NULL);
		if (!st)
			st = dg_event_record(e1);
		if (!st)
			st = dg_event_synchronize(e1);
		if (!st)
			st = dg_event_elapsed_ms(e0, e1, &ms);
		if (st)
			break;
		int r = kind_row[nd->kind];
		if (r < 0 && *n < cap) {
			r = kind_row[nd->kind] = (*n)++;
			out[r].what = dg__nkind_name(nd->kind);
			out[r].count = 0;
			out[r].ms = 0;
		}
		if (r >= 0) {
			out[r].count++;
			out[r].ms += ms;
		}
	}
	dg_event_destroy(e0);
	dg_event_destroy(e1);
	return st;
}

dg_status dg_model_run(dg_model *m, const dg_model_batch *bt, bool backward)
{
	if (!m || !bt || !bt->idx || !bt->targets)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg_model_run: NULL argument")
			 : DG_ERR_INVALID_ARG;
	return run(m, bt, backward);
}

dg_status dg_model_step(dg_model *m, const dg_model_batch *bt, double *loss, dg_model_weights *grads)
{
	if (!m || !bt || !loss || !bt->idx || !bt->targets)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg_model_step: NULL argument")
			 : DG_ERR_INVALID_ARG;
	dg_device *dev = m->dev;
	dg_status st = run(m, bt, grads != NULL);
	float l = 0;
	int32_t bad = 0;
	if (!st)
		st = dg_memcpy_dtoh(dev, &l, dg__gm_tn(m, m->id.loss).data, sizeof(l));
	if (!st)
		st = dg_memcpy_dtoh(dev, &bad, dg__gm_tn(m, m->id.bad).data, sizeof(bad));
	if (!st && bad)
		st = dg__dev_fail(dev, DG_ERR_INTERNAL, "a token reached the GPU outside the vocabulary");
	if (!st)
		*loss = l;
	for (int p = 0; grads && !st && p < DG_MODEL_N_PARAMS; p++)
		st = dg_memcpy_dtoh(dev, grads->params[p], dg__gm_tn(m, m->id.grads[p]).data,
				    m->t.bufs[m->id.grads[p]].bytes);
	return st;
}

/* ---- under a framework's optimizer -------------------------------------------- */

dg_status dg_model_param_buffers(const dg_model *m, dg_model_param p, dg_dptr *master, dg_dptr *grad)
{
	if (!m || (unsigned)p >= DG_MODEL_N_PARAMS)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg_model_param_buffers: param %d: not 0..%d",
					(int)p, DG_MODEL_N_PARAMS - 1)
			 : DG_ERR_INVALID_ARG;
	if (master)
		*master = dg__gm_addr(m, m->id.params[p]);
	if (grad)
		*grad = dg__gm_addr(m, m->id.grads[p]);
	return DG_OK;
}

dg_dptr dg_model_loss_addr(const dg_model *m)
{
	return m ? dg__gm_addr(m, m->id.loss) : 0;
}

dg_dptr dg_model_bad_addr(const dg_model *m)
{
	return m ? dg__gm_addr(m, m->id.bad) : 0;
}

/* The bf16 copy of the decoder's master in its own layout (dec_fwd) from
 * the master on the device: a transpose whose moved axis has length 1
 * ((H·N, D, 1) to (H·N, 1, D): the same layout), which rounds to bf16 as
 * the update's copy does. */
static dg_status dec_fwd_copy(dg_model *m)
{
	dg_spec s = dg__gm_op_spec(m, DG_OP_TRANSPOSE);
	s.act = DG_FMT_BF16;
	s.embd = m->D;
	s.latent = 1;
	dg_spec_normalize(&s);
	const int64_t rows = (int64_t)m->H * m->N;
	dg_tensor i = dg_tensor_3d("decoder", DG_FMT_F32, dg__gm_addr(m, m->id.params[DG_PARAM_DECODER]), rows,
				   m->D, 1);
	dg_tensor o = dg_tensor_3d("decoder (bf16)", DG_FMT_BF16, dg__gm_addr(m, m->id.dec_fwd), rows, 1, m->D);
	dg_transpose_args a = { .in = &i, .out = &o };
	return dg_transpose(m->dev, &s, &a);
}

dg_status dg_model_sync_copies(dg_model *m)
{
	if (!m)
		return DG_ERR_INVALID_ARG;
	dg_status st = DG_OK;
	for (int k = 0; k < DG_PROJ__COUNT && !st; k++)
		st = dg__gm_make_copy(m, k);
	if (!st && m->id.dec_fwd >= 0)
		st = dec_fwd_copy(m);
	return st;
}

dg_status dg_model_run_device(dg_model *m, const dg_model_batch *bt, dg_dptr idx, dg_dptr targets, bool backward)
{
	if (!m || !bt || !idx || !targets)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg_model_run_device: NULL argument")
			 : DG_ERR_INVALID_ARG;
	dg_device *dev = m->dev;
	if (bt->b != m->B || bt->t != m->T)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "batch %dx%d: the model was planned for %dx%d (B x T)", bt->b, bt->t,
				    m->B, m->T);
	const size_t bytes = (size_t)m->B * (size_t)m->T * 4;
	dg_status st = dg_memcpy_dtod(dev, dg__gm_tn(m, m->id.tokens).data, idx, bytes);
	if (!st)
		st = dg_memcpy_dtod(dev, dg__gm_tn(m, m->id.targets).data, targets, bytes);
	if (!st)
		st = dg_memset8(dev, dg__gm_tn(m, m->id.bad).data, 0, 4);
	int end = backward ? m->t.n_nodes : m->t.n_forward;
	for (int k = 0; k < end && !st; k++)
		st = dg__gm_run_node(m, &m->t.nodes[k], bt, NULL);
	return st;
}

dg_status dg_model_run_backward(dg_model *m, const dg_model_batch *bt)
{
	if (!m || !bt)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg_model_run_backward: NULL argument")
			 : DG_ERR_INVALID_ARG;
	if (bt->b != m->B || bt->t != m->T)
		return dg__dev_fail(m->dev, DG_ERR_INVALID_ARG,
				    "batch %dx%d: the model was planned for %dx%d (B x T)", bt->b, bt->t,
				    m->B, m->T);
	dg_status st = DG_OK;
	for (int k = m->t.n_forward; k < m->t.n_nodes && !st; k++)
		st = dg__gm_run_node(m, &m->t.nodes[k], bt, NULL);
	return st;
}

dg_dptr dg_model_hidden_addr(const dg_model *m, dg_fmt *fmt)
{
	if (!m)
		return 0;
	if (fmt)
		*fmt = m->t.bufs[m->id.x_final].fmt;
	return dg__gm_addr(m, m->id.x_final);
}

/* ---- logits ------------------------------------------------------------------ */

/* The forward (dropout off; zero targets when the batch has none: the
 * loss node runs and is not read), then x_final's rows at pos and
 * lm_head's master read back, their product summed on the host in double
 * (dg_model_cpu_logits's order). */
dg_status dg_model_logits(dg_model *m, const dg_model_batch *batch, int pos, float *out)
{
	if (!m || !batch || !batch->idx || !out)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg_model_logits: NULL argument")
			 : DG_ERR_INVALID_ARG;
	dg_device *dev = m->dev;
	if (pos < 0 || pos >= batch->t)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "pos %d: outside the batch's positions 0..%d",
				    pos, batch->t - 1);
	dg_model_batch b = *batch;
	b.train = false;
	int32_t *zeros = NULL;
	if (!b.targets) {
		zeros = calloc((size_t)(b.b > 0 ? b.b : 1) * (size_t)b.t, sizeof(int32_t));
		if (!zeros)
			return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
		b.targets = zeros;
	}
	dg_status st = run(m, &b, false); /* refuses a batch of another shape */
	free(zeros);
	const dg__tbuf *xf = &m->t.bufs[m->id.x_final];
	const size_t es = xf->fmt == DG_FMT_BF16 ? 2 : 4, row = (size_t)m->D * es;
	uint8_t *x = malloc((size_t)m->B * row + 4);
	float *lm = malloc((size_t)m->D * m->V * sizeof(float) + 4);
	if (!st && (!x || !lm))
		st = dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	/* x_final (B,1,T,D): row r's position pos at (r·T + pos)·D */
	dg_dptr xd = dg__gm_tn(m, m->id.x_final).data;
	for (int r = 0; r < m->B && !st; r++)
		st = dg_memcpy_dtoh(dev, x + (size_t)r * row, xd + ((dg_dptr)r * m->T + (dg_dptr)pos) * row, row);
	if (!st)
		st = dg_memcpy_dtoh(dev, lm, dg__gm_tn(m, m->id.params[DG_PARAM_LM_HEAD]).data,
				    (size_t)m->D * m->V * sizeof(float));
	for (int r = 0; r < m->B && !st; r++) {
		const uint8_t *xr = x + (size_t)r * row;
		for (int v = 0; v < m->V; v++) {
			double z = 0.0;
			for (int k = 0; k < m->D; k++) {
				float xk;
				if (es == 2) {
					uint16_t h;
					memcpy(&h, xr + (size_t)k * 2, 2);
					xk = dg_bf16_to_f32(h);
				} else {
					memcpy(&xk, xr + (size_t)k * 4, 4);
				}
				z += (double)xk * lm[(int64_t)k * m->V + v];
			}
			out[(int64_t)r * m->V + v] = (float)z;
		}
	}
	free(x);
	free(lm);
	return st;
}

dg_status dg__gm_step_specs(const dg_model_config *c, int b, int t, int sm, const dg_tune_db *db, const char *device,
			    dg_status (*sink)(void *user, const dg_spec *spec), void *user, char *msg,
			    size_t msg_size)
{
	if (msg && msg_size)
		msg[0] = '\0';
	if (!c || !sink)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg__gm_step_specs: NULL argument");
	dg_status st = dg_model_config_check(c, msg, msg_size);
	if (st)
		return st;
	if (!float_recipe(c)) {
		char why[256];
		const char *no = lowbit_refusal(c, why, sizeof(why));
		if (no)
			return dg__msgf(DG_ERR_UNSUPPORTED, msg, msg_size, "preset %s: %s",
					c->preset[0] ? c->preset : "(custom)", no);
	}
	dg_model *m = calloc(1, sizeof(*m));
	if (!m)
		return dg__msgf(DG_ERR_NOMEM, msg, msg_size, "out of memory");
	m->failed_node = -1;
	m->list_db = db;
	m->list_device = device;
	/* DRAGON_RECOMPUTE's plans as create makes them (its memory rungs,
	 * which need the device's free memory, are not taken here) */
	const dg__rec_mode rec = dg__recompute_env();
	m->recompute = rec == DG__REC_ALL;
	m->recompute_ys = rec == DG__REC_YS;
	st = build(m, NULL, c, b, t, 1, sm, sink, user);
	/* the execution copies' ops and the optimizer's */
	for (int k = 0; k < DG_PROJ__COUNT && !st; k++) {
		dg_spec s = copy_transpose_spec(m, (dg_proj)k);
		st = sink(user, &s);
		if (!st && m->lowbit) {
			s = copy_quant_spec(m, (dg_proj)k);
			st = sink(user, &s);
		}
		if (!st && copy_has_bf16(m, (dg_proj)k)) {
			s = copy_dequant_spec(m, (dg_proj)k);
			st = sink(user, &s);
		}
		if (!st && copy_packed(m, (dg_proj)k)) {
			s = copy_pack_spec(m, (dg_proj)k);
			st = sink(user, &s);
		}
	}
	if (!st) {
		dg_spec s = dg__gm_op_spec(m, DG_OP_ADAMW_UPDATE);
		st = sink(user, &s);
	}
	if (st && msg && msg_size && !msg[0] && m->failed_node >= 0)
		dg__msgf(st, msg, msg_size, "node %d (%s, layer %d) at this shape: %s", m->failed_node,
			 dg__nkind_name(m->t.nodes[m->failed_node].kind), m->t.nodes[m->failed_node].layer,
			 dg_status_str(st));
	else if (st && msg && msg_size && !msg[0])
		dg__msgf(st, msg, msg_size, "the step's specs at this shape: %s", dg_status_str(st));
	free(m->ex);
	fake_clear(m);
	dg__tape_free(&m->t);
	free(m);
	return st;
}
