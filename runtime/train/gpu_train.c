/*
 * Training on the GPU (dragon/model.h "training on the GPU"): AdamW's
 * moments and the step's control block beside the model, the step's whole
 * work queued on the device, and its capture into one CUDA graph.
 *
 * A step's work (the body): every node of the tape (the gates read the
 * dropout's step from the control block: m->step_at), the gradients'
 * norm and clip factor into the control block (grad_norm), the AdamW
 * update of the five masters (adamw_update; the bf16 recipe's decoder
 * writes its forward copy as it goes), then the execution copies remade
 * from the masters (dg__gm_make_copy). Before it, outside any graph: the
 * batch and the bad flag (dg__gm_upload), the control block's host half
 * (one copy of DG_ADAMW_CTL_HOST_BYTES from pageable memory, staged
 * before the call returns; the device's half, the loss scaler's state
 * among it, is written once by dg_model_optim_init and carried by the
 * steps). After it: the loss, the bad flag and the control block copied
 * into a page-locked ring slot, an event recorded; the host waits on that
 * event only when it asks for the step's result.
 *
 * Graph: step 1 of a model runs the body eagerly (every kernel loaded),
 * step 2 captures it and launches the graph, every later step launches
 * it again. The graph holds the addresses it was captured with: the
 * arenas, the moments, the control block and the dropout seed are
 * recorded and compared before each launch; a difference recaptures.
 *
 * Gradient accumulation (K micro-batches a step, dg_model_train_step's batch->micro):
 * micro-batch i runs the nodes alone with the loss's gradient times 1/K
 * (a device float, the loss's grad_scale), the weight-gradient nodes
 * writing (i = 0) or adding (i > 0) into the gradients (the execution
 * layouts' kept in the gradients' arena, their transposes to the masters'
 * only in the last); the last runs the tail too. Each micro-batch's loss
 * and bad flag are copied into the ring slot's row of K; the event after
 * the last. Each index i has its own graph: the dropout's first element
 * (row0) and whether it writes or adds are baked into its launches.
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/comm.h"
#include "dragon/model.h"
#include "dragon/ops.h"
#include "dragon/ref.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/train/gpu_model_int.h"

/* A ring slot: what a step sends back (its micro-batches' losses and bad
 * flags in the ring's rows of K, mloss and mbad). */
typedef struct slot {
	dg_adamw_ctl ctl; /* norm, scale, skip, the scaler after the step */
} slot;

/* A captured micro-batch and what it was captured with. */
typedef struct gcap {
	dg_graph *graph;
	dg_dptr base[DG__B__COUNT];
	uint64_t seed;
	uint32_t row0;
} gcap;

typedef struct dg__gm_train {
	dg_adamw_config opt;
	dg_loss_scaler ls;                 /* mode and interval (its state is ctl's) */
	bool use_graph;
	dg_dptr mom;                       /* one allocation: m1[p] then v1[p] */
	dg_dptr m1[DG_MODEL_N_PARAMS], v1[DG_MODEL_N_PARAMS];
	dg_dptr ctl;                       /* a dg_adamw_ctl */
	dg_dptr norm_ws;                   /* grad_norm's partials */
	size_t norm_ws_bytes;
	int64_t queued;                    /* steps queued on this model */
	gcap *gr;                          /* K: micro-batch i's graph */
	int next_micro;                    /* the micro-batch the next call must be */
	int64_t micro_t;                   /* the step the micro-batches under way are of */
	dg_dptr inv_k;                     /* accum > 1: a device float, 1/K */
	slot *ring;                        /* DG_MODEL_TRAIN_RING, page-locked */
	float *mloss;                      /* DG_MODEL_TRAIN_RING × K, page-locked */
	int32_t *mbad;                     /* DG_MODEL_TRAIN_RING × K, page-locked */
	dg_event *ev[DG_MODEL_TRAIN_RING];
	int64_t ring_step[DG_MODEL_TRAIN_RING];
	struct dg_comm *comm;              /* data parallel: the gradients' and loss's mean over the ranks */
	/* the all-reduce's overlap with the end of the backward: a gradient's
	 * bucket goes to comm_stream as soon as the node that writes it last
	 * (last_writer) is queued, and the step's stream joins it before the
	 * norm; inside the graph a fork and a join of the capture */
	void *comm_stream;
	dg_event *ready[DG_MODEL_N_PARAMS], *reduced;
	int last_writer[DG_MODEL_N_PARAMS];
} dg__gm_train;

static size_t param_bytes(const dg_model *m, int p)
{
	return m->t.bufs[m->id.params[p]].bytes;
}

/* Frees the training state (m->tr_free). */
static void train_free(dg_model *m)
{
	dg__gm_train *tr = m->tr;
	if (!tr)
		return;
	for (int i = 0; tr->gr && i < m->accum; i++)
		dg_graph_destroy(tr->gr[i].graph);
	free(tr->gr);
	dg_host_free(m->dev, tr->mloss);
	dg_host_free(m->dev, tr->mbad);
	(void)dg_free(m->dev, tr->inv_k);
	for (int k = 0; k < DG_MODEL_TRAIN_RING; k++)
		dg_event_destroy(tr->ev[k]);
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++)
		dg_event_destroy(tr->ready[p]);
	dg_event_destroy(tr->reduced);
	dg_stream_destroy(m->dev, tr->comm_stream);
	dg_host_free(m->dev, tr->ring);
	(void)dg_free(m->dev, tr->mom);
	(void)dg_free(m->dev, tr->ctl);
	(void)dg_free(m->dev, tr->norm_ws);
	free(tr);
	m->tr = NULL;
}

/* Every micro-batch's graph destroyed (captured again when next used). */
static void drop_graphs(dg_model *m)
{
	dg__gm_train *tr = m->tr;
	for (int i = 0; tr->gr && i < m->accum; i++) {
		dg_graph_destroy(tr->gr[i].graph);
		tr->gr[i].graph = NULL;
	}
}

/* The moments from host arrays (or zeros). */
static dg_status put_moments(dg_model *m, float *const *m1, float *const *v1)
{
	dg__gm_train *tr = m->tr;
	dg_status st = DG_OK;
	for (int p = 0; p < DG_MODEL_N_PARAMS && !st; p++) {
		size_t b = param_bytes(m, p);
		st = m1 ? dg_memcpy_htod(m->dev, tr->m1[p], m1[p], b) : dg_memset8(m->dev, tr->m1[p], 0, b);
		if (!st)
			st = v1 ? dg_memcpy_htod(m->dev, tr->v1[p], v1[p], b)
				: dg_memset8(m->dev, tr->v1[p], 0, b);
	}
	return st;
}

dg_status dg_model_optim_init(dg_model *m, const dg_adamw_config *c, float *const *m1,
			      float *const *v1, bool graph, const dg_loss_scaler *ls)
{
	if (!m || !c)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg_model_optim_init: NULL argument")
			 : DG_ERR_INVALID_ARG;
	dg_device *dev = m->dev;
	char msg[256];
	dg_status st = dg_adamw_check(c, msg, sizeof(msg));
	if (st)
		return dg__dev_fail(dev, st, "%s", msg);
	dg_loss_scaler sc;
	dg_loss_scaler_defaults(&sc, false);
	if (ls && ls->mode != DG_LOSS_SCALE_OFF) {
		sc = *ls;
		if (sc.mode != DG_LOSS_SCALE_DYNAMIC || sc.growth_interval < 1 || !(sc.scale > 0.0f) ||
		    !isfinite(sc.scale))
			return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
					    "dg_model_optim_init: loss scaler mode %u, interval %u, scale %g: "
					    "want mode 1 (dynamic), an interval >= 1 and a finite scale > 0",
					    sc.mode, sc.growth_interval, (double)sc.scale);
		if (m->accum > 1)
			return dg__dev_fail(dev, DG_ERR_UNSUPPORTED,
					    "the loss scaler with gradient accumulation (accum %d): not supported "
					    "(the loss's gradient would be S, not S/K); accumulate without it, or "
					    "take a K-times-larger batch",
					    m->accum);
	}
	if (!m->tr) {
		dg__gm_train *tr = calloc(1, sizeof(*tr));
		if (!tr)
			return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
		m->tr = tr;
		m->tr_free = train_free;
		size_t total = 0;
		for (int p = 0; p < DG_MODEL_N_PARAMS; p++)
			total += 2 * ((param_bytes(m, p) + 255) / 256 * 256);
		tr->norm_ws_bytes = dg_grad_norm_workspace(DG_MODEL_N_PARAMS);
		size_t free_b = 0, total_b = 0;
		if (!dg_device_mem_info(dev, &free_b, &total_b) && total > free_b) {
			const double g = 1.0 / (1 << 30);
			st = dg__dev_fail(dev, DG_ERR_NOMEM,
					  "AdamW's moments need %.2f GiB, more than the device's %.2f GiB free (of "
					  "%.2f) beside the model; take a smaller --batch (--accum K keeps the "
					  "batch), --time or shape",
					  total * g, free_b * g, total_b * g);
			train_free(m);
			return st;
		}
		st = dg_malloc(dev, total, &tr->mom);
		if (!st)
			st = dg_malloc(dev, sizeof(dg_adamw_ctl), &tr->ctl);
		if (!st)
			st = dg_malloc(dev, tr->norm_ws_bytes, &tr->norm_ws);
		if (!st)
			st = dg_host_alloc(dev, sizeof(slot) * DG_MODEL_TRAIN_RING, (void **)&tr->ring);
		const size_t rk = (size_t)DG_MODEL_TRAIN_RING * (size_t)m->accum;
		if (!st)
			st = dg_host_alloc(dev, 4 * rk, (void **)&tr->mloss);
		if (!st)
			st = dg_host_alloc(dev, 4 * rk, (void **)&tr->mbad);
		if (!st && !(tr->gr = calloc((size_t)m->accum, sizeof(*tr->gr))))
			st = dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
		if (!st && m->accum > 1) {
			const float inv = (float)(1.0 / m->accum);
			st = dg_malloc(dev, sizeof(float), &tr->inv_k);
			if (!st)
				st = dg_memcpy_htod(dev, tr->inv_k, &inv, sizeof(inv));
		}
		for (int k = 0; k < DG_MODEL_TRAIN_RING && !st; k++) {
			st = dg_event_create(dev, &tr->ev[k]);
			tr->ring_step[k] = -1;
		}
		if (st) {
			train_free(m);
			return st;
		}
		dg_dptr at = tr->mom;
		for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
			size_t b = (param_bytes(m, p) + 255) / 256 * 256;
			tr->m1[p] = at;
			tr->v1[p] = at + b;
			at += 2 * b;
		}
	}
	dg__gm_train *tr = m->tr;
	if (tr->ls.mode != sc.mode) /* the loss's node reads S or not: recapture */
		drop_graphs(m);
	tr->opt = *c;
	tr->ls = sc;
	tr->use_graph = graph;
	/* the whole control block once: the device's half carries the
	 * scaler's state from step to step */
	dg_adamw_ctl ctl;
	dg_adamw_ctl_fill(c, 0, c->lr, &ctl);
	ctl.scaler = sc.mode;
	ctl.growth_interval = sc.growth_interval;
	ctl.loss_scale = sc.scale;
	ctl.good_steps = sc.good_steps;
	st = dg_memcpy_htod(dev, tr->ctl, &ctl, sizeof(ctl));
	return st ? st : put_moments(m, m1, v1);
}

static dg_status tail(dg_model *m);

/* Data parallel: count f32 values at buf averaged over the ranks on
 * comm_stream (NCCL, in place) once the step's stream has reached here
 * (ready recorded on it, comm_stream waiting for it), while the step's
 * stream goes on; done, when not NULL, recorded on comm_stream after. */
static dg_status reduce_on_comm(dg_model *m, dg_event *ready, dg_dptr buf, size_t count, dg_event *done)
{
	dg__gm_train *tr = m->tr;
	void *step_stream = dg_device_stream(m->dev);
	dg_status st = dg_event_record(ready);
	if (!st)
		st = dg_device_set_stream(m->dev, tr->comm_stream);
	if (st)
		return st;
	st = dg_event_wait(ready);
	if (!st)
		st = dg_comm_allreduce(tr->comm, buf, count, DG_FMT_F32, 1);
	if (!st && done)
		st = dg_event_record(done);
	dg_status back = dg_device_set_stream(m->dev, step_stream);
	return st ? st : back;
}

/* Gradient p, just written by its last writer: nothing after it touches
 * the gradient before the join (the norm and the update are the tail's). */
static dg_status reduce_bucket(dg_model *m, int p)
{
	return reduce_on_comm(m, m->tr->ready[p], dg__gm_addr(m, m->id.grads[p]), param_bytes(m, p) / 4, NULL);
}

/* The loss's mean (the forward's, long done) behind the buckets, then the
 * step's stream waits for comm_stream: the join before the norm. */
static dg_status reduce_join(dg_model *m)
{
	dg__gm_train *tr = m->tr;
	dg_status st = reduce_on_comm(m, tr->reduced, dg__gm_addr(m, m->id.loss), 1, tr->reduced);
	return st ? st : dg_event_wait(tr->reduced);
}

/* The overlap's stream and events, and each gradient's last writer in the
 * tape (made once, when a communicator is first set). */
static dg_status comm_init(dg_model *m)
{
	dg__gm_train *tr = m->tr;
	if (tr->comm_stream)
		return DG_OK;
	dg_status st = dg_stream_create(m->dev, &tr->comm_stream);
	for (int p = 0; p < DG_MODEL_N_PARAMS && !st; p++)
		st = dg_event_create(m->dev, &tr->ready[p]);
	if (!st)
		st = dg_event_create(m->dev, &tr->reduced);
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		tr->last_writer[p] = -1;
		for (int k = 0; k < m->t.n_nodes; k++)
			for (int o = 0; o < DG__TAPE_OUT; o++)
				if (m->t.nodes[k].out[o] == m->id.grads[p])
					tr->last_writer[p] = k;
		if (!st && tr->last_writer[p] < 0)
			st = dg__dev_fail(m->dev, DG_ERR_INTERNAL, "the tape writes no gradient of param %d", p);
	}
	if (st) { /* nothing half made stays */
		for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
			dg_event_destroy(tr->ready[p]);
			tr->ready[p] = NULL;
		}
		dg_event_destroy(tr->reduced);
		tr->reduced = NULL;
		dg_stream_destroy(m->dev, tr->comm_stream);
		tr->comm_stream = NULL;
	}
	return st;
}

/* Micro-batch i's work on the device, after its batch and control block:
 * the nodes (and, the last, the all-reduce and the tail). */
static dg_status body(dg_model *m, const dg_model_batch *bt, int i)
{
	dg__gm_train *tr = m->tr;
	dg_status st = DG_OK;
	const bool last = i == m->accum - 1;
	m->step_at = tr->ctl + offsetof(dg_adamw_ctl, step);
	m->grad_scale_at = tr->ls.mode ? tr->ctl + offsetof(dg_adamw_ctl, loss_scale) : tr->inv_k;
	m->micro = i;
	m->last = last;
	for (int k = 0; k < m->t.n_nodes && !st; k++) {
		st = dg__gm_run_node(m, &m->t.nodes[k], bt, NULL);
		for (int p = 0; tr->comm && last && p < DG_MODEL_N_PARAMS && !st; p++)
			if (tr->last_writer[p] == k)
				st = reduce_bucket(m, p);
	}
	m->step_at = 0;
	m->grad_scale_at = 0;
	m->micro = 0;
	m->last = true;
	if (!last || st)
		return st;
	if (tr->comm)
		st = reduce_join(m);
	return st ? st : tail(m);
}

dg_status dg_model_optim_comm(dg_model *m, struct dg_comm *comm)
{
	if (!m || !m->tr)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg_model_optim_comm: no optimizer (dg_model_optim_init first)")
			 : DG_ERR_INVALID_ARG;
	if (comm) {
		dg_status st = comm_init(m);
		if (st)
			return st;
	}
	if (m->tr->comm != comm) {
		m->tr->comm = comm;
		drop_graphs(m); /* captured without it: captured again */
	}
	return DG_OK;
}

/* The step's tail: the norm and clip, the updates, the copies. */
static dg_status tail(dg_model *m)
{
	dg__gm_train *tr = m->tr;
	dg_device *dev = m->dev;
	dg_status st = DG_OK;
	dg_spec s = dg__gm_op_spec(m, DG_OP_ADAMW_UPDATE);
	dg_tensor g[DG_MODEL_N_PARAMS];
	const dg_tensor *gp[DG_MODEL_N_PARAMS];
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		g[p] = dg__gm_tn(m, m->id.grads[p]);
		gp[p] = &g[p];
	}
	dg_grad_norm_args na = { .grads = gp, .n = DG_MODEL_N_PARAMS, .ctl = tr->ctl,
				 .ws = { tr->norm_ws, tr->norm_ws_bytes } };
	st = dg_grad_norm(dev, &s, &na);
	for (int p = 0; p < DG_MODEL_N_PARAMS && !st; p++) {
		dg_tensor w = dg__gm_tn(m, m->id.params[p]);
		dg_tensor m1 = dg_tensor_make("adamw.m", DG_FMT_F32, tr->m1[p], w.ndim, w.shape);
		dg_tensor v1 = dg_tensor_make("adamw.v", DG_FMT_F32, tr->v1[p], w.ndim, w.shape);
		dg_adamw_update_args a = { .p = &w, .grad = &g[p], .m = &m1, .v = &v1, .ctl = tr->ctl,
					   .decay = true };
		if (p == DG_PARAM_DECODER && m->id.dec_fwd >= 0)
			a.copy = dg__gm_addr(m, m->id.dec_fwd);
		st = dg_adamw_update(dev, &s, &a);
	}
	for (int k = 0; k < DG_PROJ__COUNT && !st; k++)
		st = dg__gm_make_copy(m, k);
	return st;
}

/* Whether micro-batch i's graph was captured with the model's buffers,
 * seed and row0. */
static bool graph_current(const dg_model *m, int i, uint64_t seed, uint32_t row0)
{
	const gcap *c = &m->tr->gr[i];
	return c->graph && c->seed == seed && c->row0 == row0 && memcmp(c->base, m->base, sizeof(c->base)) == 0;
}

static dg_status capture(dg_model *m, const dg_model_batch *bt, int i)
{
	gcap *c = &m->tr->gr[i];
	dg_graph_destroy(c->graph);
	c->graph = NULL;
	dg_status st = dg_graph_begin(m->dev);
	if (st)
		return st;
	st = body(m, bt, i);
	dg_graph *g = NULL;
	dg_status end = dg_graph_end(m->dev, &g);
	if (st || end) {
		dg_graph_destroy(g);
		return st ? st : end;
	}
	c->graph = g;
	memcpy(c->base, m->base, sizeof(c->base));
	c->seed = bt->seed;
	c->row0 = bt->row0;
	return DG_OK;
}

dg_status dg_model_train_step(dg_model *m, const dg_model_batch *batch, int64_t t, float lr)
{
	if (!m || !batch || !batch->idx || !batch->targets)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg_model_train_step: NULL argument")
			 : DG_ERR_INVALID_ARG;
	const int i = batch->micro;
	dg_device *dev = m->dev;
	dg__gm_train *tr = m->tr;
	if (!tr)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "dg_model_train_step: no optimizer (dg_model_optim_init first)");
	if (t < 0 || t > (int64_t)UINT32_MAX)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_model_train_step: step %lld out of range",
				    (long long)t);
	if (i != tr->next_micro || (i > 0 && t != tr->micro_t))
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "dg_model_train_step: micro-batch %d of step %lld: the next is micro-batch %d%s",
				    i, (long long)t, tr->next_micro, i > 0 && t != tr->micro_t ? " of another step" : "");
	dg_model_batch bt = *batch;
	bt.step = 0; /* the step is the control block's */
	bt.train = true;
	const int K = m->accum;
	const int k = (int)(t % DG_MODEL_TRAIN_RING);
	dg_status st = dg__gm_upload(m, &bt);
	if (!st && i == 0) {
		dg_adamw_ctl ctl;
		dg_adamw_ctl_fill(&tr->opt, t, lr, &ctl);
		ctl.scaler = tr->ls.mode;
		ctl.growth_interval = tr->ls.growth_interval;
		st = dg_memcpy_htod(dev, tr->ctl, &ctl, DG_ADAMW_CTL_HOST_BYTES);
		/* the slot's last reader was DG_MODEL_TRAIN_RING steps ago:
		 * waited for by its event */
		if (!st)
			st = dg_event_synchronize(tr->ev[k]);
		tr->ring_step[k] = -1;
	}
	if (st)
		return st;
	if (tr->use_graph && tr->queued > 0 && !graph_current(m, i, bt.seed, bt.row0))
		st = capture(m, &bt, i);
	if (!st)
		st = tr->gr[i].graph && tr->use_graph ? dg_graph_launch(tr->gr[i].graph) : body(m, &bt, i);
	/* this micro-batch's loss and bad flag into the slot's row */
	const size_t at = (size_t)k * (size_t)K + (size_t)i;
	if (!st)
		st = dg_memcpy_dtoh_async(dev, &tr->mloss[at], dg__gm_addr(m, m->id.loss), sizeof(float));
	if (!st)
		st = dg_memcpy_dtoh_async(dev, &tr->mbad[at], dg__gm_addr(m, m->id.bad), sizeof(int32_t));
	if (st) {
		tr->next_micro = 0; /* the step is lost: the next starts afresh */
		return st;
	}
	tr->micro_t = t;
	tr->next_micro = i + 1 < K ? i + 1 : 0;
	if (i + 1 < K)
		return DG_OK;
	tr->queued++;
	slot *sl = &tr->ring[k];
	st = dg_memcpy_dtoh_async(dev, &sl->ctl, tr->ctl, sizeof(sl->ctl));
	if (!st)
		st = dg_event_record(tr->ev[k]);
	tr->ring_step[k] = st ? -1 : t;
	return st;
}

dg_status dg_model_train_result(dg_model *m, int64_t t, double *loss, double *norm, bool *skipped,
				dg_loss_scaler *ls)
{
	if (!m || !loss || !norm)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg_model_train_result: NULL argument")
			 : DG_ERR_INVALID_ARG;
	dg__gm_train *tr = m->tr;
	int k = t >= 0 ? (int)(t % DG_MODEL_TRAIN_RING) : 0;
	if (!tr || t < 0 || tr->ring_step[k] != t)
		return dg__dev_fail(m->dev, DG_ERR_INVALID_ARG,
				    "dg_model_train_result: step %lld is not one of the last %d queued", (long long)t,
				    DG_MODEL_TRAIN_RING);
	dg_status st = dg_event_synchronize(tr->ev[k]);
	if (st)
		return st;
	const slot *sl = &tr->ring[k];
	double sum = 0;
	for (int i = 0; i < m->accum; i++) {
		const size_t at = (size_t)k * (size_t)m->accum + (size_t)i;
		if (tr->mbad[at])
			return dg__dev_fail(m->dev, DG_ERR_INTERNAL, "a token reached the GPU outside the vocabulary");
		sum += tr->mloss[at];
	}
	*loss = m->accum == 1 ? (double)tr->mloss[(size_t)k] : sum / m->accum;
	*norm = sl->ctl.norm;
	if (skipped)
		*skipped = sl->ctl.skip != 0;
	if (ls)
		*ls = (dg_loss_scaler){ .mode = tr->ls.mode, .growth_interval = tr->ls.growth_interval,
					.scale = sl->ctl.loss_scale, .good_steps = sl->ctl.good_steps };
	return DG_OK;
}

dg_status dg_model_optim_get(dg_model *m, dg_model_weights *w, float *const *m1, float *const *v1)
{
	if (!m)
		return DG_ERR_INVALID_ARG;
	dg_device *dev = m->dev;
	if (w && memcmp(&w->config, &m->c, sizeof(m->c)) != 0)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_model_optim_get: the weights' config is not the model's");
	if ((m1 || v1) && !m->tr)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_model_optim_get: no optimizer");
	dg_status st = DG_OK;
	for (int p = 0; p < DG_MODEL_N_PARAMS && !st; p++) {
		size_t b = param_bytes(m, p);
		if (w)
			st = dg_memcpy_dtoh(dev, w->params[p], dg__gm_addr(m, m->id.params[p]), b);
		if (!st && m1)
			st = dg_memcpy_dtoh(dev, m1[p], m->tr->m1[p], b);
		if (!st && v1)
			st = dg_memcpy_dtoh(dev, v1[p], m->tr->v1[p], b);
	}
	return st;
}

bool dg_model_graph_live(const dg_model *m)
{
	if (!m || !m->tr || !m->tr->use_graph || !m->tr->gr)
		return false;
	const gcap *c = &m->tr->gr[m->accum - 1];
	return c->graph && graph_current(m, m->accum - 1, c->seed, c->row0);
}

dg_status dg_model_optim_time(dg_model *m, int reps, double *ms)
{
	if (!m || !ms || reps < 1)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg_model_optim_time: NULL argument or reps < 1")
			 : DG_ERR_INVALID_ARG;
	if (!m->tr)
		return dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg_model_optim_time: no optimizer");
	dg_event *e0 = NULL, *e1 = NULL;
	dg_status st = dg_event_create(m->dev, &e0);
	if (!st)
		st = dg_event_create(m->dev, &e1);
	if (!st)
		st = tail(m); /* warm */
	if (!st)
		st = dg_event_record(e0);
	for (int i = 0; i < reps && !st; i++)
		st = tail(m);
	if (!st)
		st = dg_event_record(e1);
	if (!st)
		st = dg_event_synchronize(e1);
	float t = 0;
	if (!st)
		st = dg_event_elapsed_ms(e0, e1, &t);
	if (!st)
		*ms = t / reps;
	dg_event_destroy(e0);
	dg_event_destroy(e1);
	return st;
}
