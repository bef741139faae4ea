/*
 * A training run (dragon/train.h): the loop over steps on the CPU model
 * or the GPU one, AdamW on the host masters (dragon/optim.h), the JSONL
 * log, checkpoints (dragon/checkpoint.h) and resuming from them. With the
 * loss scaler (the GPU only), the scaler's state is the device's, read
 * back with each step's result into the state a checkpoint saves.
 *
 * The GPU form here returns every gradient to the host and uploads the
 * updated masters each step: correct, and the baseline the fused device
 * update and the captured step replace.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/msg.h"
#include "base/sha256.h"
#include "dragon/checkpoint.h"
#include "dragon/dist.h"
#include "dragon/train.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/train/model_int.h"
#include "runtime/train/run_dir.h"

/* The validation batches' RNG seed: the same batches for every run. */
#define VAL_SEED 0x76616cULL

void dg_train_defaults(dg_train_opts *o, int64_t steps)
{
	memset(o, 0, sizeof(*o));
	char msg[128];
	dg_model_preset("bf16", &o->model, msg, sizeof(msg));
	o->batch = 8;
	o->time = 512;
	o->accum = 1;
	dg_adamw_defaults(&o->opt, steps);
	o->seed = 1337;
	o->eval_every = 100;
	o->eval_batches = 32;
	o->ckpt_every = 500;
	o->keep = 3;
	o->out_dir = "runs/latest";
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The run's step function: the CPU model or the GPU one. */
typedef struct stepper {
	dg_device *dev;
	dg_model *m;
} stepper;

static dg_status step_of(stepper *sp, const dg_model_weights *w, const dg_model_batch *b, double *loss,
			 dg_model_weights *grads, char *msg, size_t size)
{
	if (!sp->dev)
		return dg_model_cpu_step(w, b, loss, grads, msg, size);
	dg_status st = dg_model_step(sp->m, b, loss, grads);
	if (st)
		dg__msgf(st, msg, size, "%s", dg_device_errmsg(sp->dev));
	return st;
}

/* Micro-batches a step (0 reads 1). */
static int accum_of(const dg_train_opts *o)
{
	return o->accum > 1 ? o->accum : 1;
}

/* This process's rank and the world's size (1, 0 alone). */
static int world_of(const dg_train_opts *o)
{
	return o->world ? o->world->world : 1;
}

static int rank_of(const dg_train_opts *o)
{
	return o->world ? o->world->rank : 0;
}

/* The stop flag the CPU model looks at inside a step: a lone run's (the
 * ranks of a data-parallel one agree between steps, never inside one). */
static const volatile sig_atomic_t *inner_stop(const dg_train_opts *o)
{
	return world_of(o) == 1 ? o->stop : NULL;
}

/* The mean loss of n fixed validation batches (dropout off); data
 * parallel, each rank's share of each batch, the mean over the ranks.
 * DG_ERR_INTERRUPTED when the stop flag cut it short (the CPU model). */
static dg_status val_loss(stepper *sp, const dg_train_opts *o, const dg_corpus *c, const dg_model_weights *w,
			  int32_t *idx, int32_t *tgt, double *out, char *msg, size_t size)
{
	dg_rng r;
	dg_rng_seed(&r, VAL_SEED);
	const int lb = o->batch / world_of(o);
	const size_t off = (size_t)rank_of(o) * (size_t)lb * (size_t)o->time;
	double sum = 0;
	for (int k = 0; k < o->eval_batches; k++) {
		dg_corpus_batch(c, true, &r, o->batch, o->time, idx, tgt);
		dg_model_batch b = { .idx = idx + off, .targets = tgt + off, .b = lb, .t = o->time,
				     .stop = inner_stop(o) };
		double l;
		dg_status st = step_of(sp, w, &b, &l, NULL, msg, size);
		if (st)
			return st;
		sum += l;
	}
	*out = sum / o->eval_batches;
	return world_of(o) > 1 ? dg_rdzv_mean(o->world->rdzv, NULL, NULL, 0, out, msg, size) : DG_OK;
}

/* What a run's steps share: the options, the state, the files. */
typedef struct run_ctx {
	const dg_train_opts *o;
	const dg_corpus *c;
	dg_train_state *s;
	stepper *sp;
	int log;                /* log.jsonl, appended to; -1: not this rank's */
	const char *logp;
	char changed[1024];     /* a resume's changes (JSON members) for its first line; "" none */
	int32_t *idx, *tgt;
	size_t bt;              /* tokens a step (every micro-batch's) */
	dg_model_weights *micro; /* the CPU with accum > 1: one micro-batch's gradients */
	double t0, t_last;      /* the run's start; the last step's end */
	double t_run;           /* dg_train_run's start */
	size_t mem0;            /* the GPU: the bytes dragon held before the model was created */
	int64_t end;            /* the step the run stops after */
	int64_t saved;          /* the newest checkpoint's step, -1 none */
	dg_train_progress progress;
	void *user;
} run_ctx;

/* A loss or norm that is not finite stops the run at step t. */
static dg_status numeric(const run_ctx *r, int64_t t, double loss, double norm, char *msg, size_t size)
{
	if (isfinite(loss) && isfinite(norm))
		return DG_OK;
	return dg__msgf(DG_ERR_NUMERIC, msg, size,
			"step %" PRId64 ": the loss is %g and the gradient norm %g; stopped (%s)", t + 1, loss,
			norm, r->saved >= 0 ? "the last checkpoint is kept" : "no checkpoint was written yet");
}

static bool eval_due(const dg_train_opts *o, int64_t n)
{
	return (o->eval_every > 0 && n % o->eval_every == 0) || n == o->opt.steps;
}

static bool ckpt_due(const run_ctx *r, int64_t n)
{
	if (r->o->ckpt_every < 0) /* none at all */
		return false;
	return (r->o->ckpt_every > 0 && n % r->o->ckpt_every == 0) || n == r->end;
}

/* Data parallel: whether the ranks compare their weights after n steps. */
static bool digest_due(const run_ctx *r, int64_t n)
{
	const dg_train_world *w = r->o->world;
	return w && w->world > 1 && ((w->check_every > 0 && n % w->check_every == 0) || n == r->end);
}

/* Whether the step that makes n steps done reads the device's state
 * after it (a validation, a checkpoint, the weights' digest), or ends
 * the run. */
static bool reads_state(const run_ctx *r, int64_t n)
{
	return eval_due(r->o, n) || ckpt_due(r, n) || digest_due(r, n) || n >= r->end;
}

/* Data parallel: every rank's weights after n steps hashed (SHA-256 of
 * every master, in param order) and held to rank 0's. */
static dg_status same_weights(run_ctx *r, int64_t n, char *msg, size_t size)
{
	const dg_train_opts *o = r->o;
	dg_train_state *s = r->s;
	dg_status st = r->sp->m ? dg_model_optim_get(r->sp->m, s->weights, NULL, NULL) : DG_OK;
	if (st)
		return dg__msgf(st, msg, size, "%s", dg_device_errmsg(o->dev));
	dg__sha256 h;
	dg__sha256_init(&h);
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		int nd;
		int64_t sh[3];
		size_t k = (size_t)dg_model_param_shape(&s->weights->config, (dg_model_param)p, &nd, sh);
		dg__sha256_update(&h, s->weights->params[p], k * sizeof(float));
	}
	uint8_t d[32];
	dg__sha256_final(&h, d);
	char what[96], why[512];
	snprintf(what, sizeof(what), "weights (their SHA-256) after step %" PRId64, n);
	st = dg_rdzv_same(o->world->rdzv, d, sizeof(d), what, why, sizeof(why));
	return st ? dg__msgf(st, msg, size, "%s", why) : DG_OK;
}

/* Checkpoints the n steps done (the device's state read back first, on
 * the GPU) into its file (path) and prunes the folder to o->keep. A
 * failure names the step and the newest checkpoint left, which a failed
 * save does not touch. */
static dg_status checkpoint(run_ctx *r, int64_t n, char *path, size_t path_size, char *msg, size_t size)
{
	const dg_train_opts *o = r->o;
	dg_train_state *s = r->s;
	dg_checkpoint_path(o->out_dir, n, path, path_size);
	if (rank_of(o) != 0) { /* rank 0 writes it */
		r->saved = n;
		return DG_OK;
	}
	dg_status got = r->sp->m ? dg_model_optim_get(r->sp->m, s->weights, s->m, s->v) : DG_OK;
	if (got)
		return dg__msgf(got, msg, size, "%s", dg_device_errmsg(o->dev));
	char why[2048];
	dg_checkpoint_path(o->out_dir, n, path, path_size);
	dg_status st = dg_checkpoint_save(s, path, why, sizeof(why));
	if (!st)
		st = dg_checkpoint_prune(o->out_dir, o->keep, NULL, why, sizeof(why));
	if (!st) {
		r->saved = n;
		return DG_OK;
	}
	if (r->saved >= 0)
		return dg__msgf(st, msg, size,
				"step %" PRId64 ": checkpoint: %s; the newest checkpoint is step %" PRId64, n, why,
				r->saved);
	return dg__msgf(st, msg, size, "step %" PRId64 ": checkpoint: %s; no checkpoint was written yet", n, why);
}

/* A log line in the making (one write puts it in the file whole). */
typedef struct line {
	char b[2048];
	size_t n;
} line;

static void add(line *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void add(line *l, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(l->b + l->n, sizeof(l->b) - l->n, fmt, ap);
	va_end(ap);
	if (k > 0)
		l->n = l->n + (size_t)k < sizeof(l->b) ? l->n + (size_t)k : sizeof(l->b) - 1;
}

/* A JSON number in fmt, or null for one JSON has not (a skipped step's
 * norm, a rate over no time). */
static void add_num(line *l, const char *key, const char *fmt, double v)
{
	char t[64];
	if (isfinite(v))
		snprintf(t, sizeof(t), fmt, v);
	else
		snprintf(t, sizeof(t), "null");
	add(l, ", \"%s\": %s", key, t);
}

/* Step t done (s->step is past it): its log line, a validation and a
 * checkpoint when due, the caller's report. skipped: the loss scaler
 * skipped its update (the scaler's state is s->scaler, after the step).
 * A validation the stop flag cut short: the line without val_loss, no
 * checkpoint, DG_ERR_INTERRUPTED (the caller stops, checkpointing). */
static dg_status finish(run_ctx *r, int64_t t, float lr, double loss, double norm, bool skipped,
			char *msg, size_t size)
{
	const dg_train_opts *o = r->o;
	dg_train_state *s = r->s;
	const int64_t n = t + 1;
	double vl = NAN;
	bool cut = false;
	if (eval_due(o, n)) {
		dg_status st = val_loss(r->sp, o, r->c, s->weights, r->idx, r->tgt, &vl, msg, size);
		cut = st == DG_ERR_INTERRUPTED;
		if (cut)
			vl = NAN;
		else if (st)
			return st;
	}
	const double te = now_s();
	if (o->result && !o->result->first_step_s)
		o->result->first_step_s = te - r->t_run;
	if (o->result && o->dev) { /* the most held since the model's creation, so far */
		size_t high = dg__dev_mem_high(o->dev);
		o->result->peak_bytes = high > r->mem0 ? high - r->mem0 : 0;
	}
	dg_train_report rp = { .step = n, .steps = o->opt.steps, .train_loss = loss, .val_loss = vl,
			       .lr = lr, .grad_norm = norm, .tokens_per_s = (double)r->bt / (te - r->t_last),
			       .wall_s = te - r->t0, .flops_per_token = dg_model_flops_per_token(&o->model, o->time),
			       .skipped = skipped, .loss_scale = o->loss_scale ? s->scaler.scale : 0.0f };
	if (r->log >= 0) { /* data parallel: rank 0 writes the log */
		line l = { .n = 0 };
		add(&l, "{\"step\": %" PRId64, rp.step);
		add_num(&l, "train_loss", "%.9g", rp.train_loss);
		add_num(&l, "lr", "%.9g", (double)rp.lr);
		add_num(&l, "grad_norm", "%.9g", rp.grad_norm);
		if (o->loss_scale)
			add_num(&l, "loss_scale", "%.9g", (double)rp.loss_scale);
		if (skipped)
			add(&l, ", \"skipped\": true");
		if (!isnan(vl))
			add_num(&l, "val_loss", "%.9g", vl);
		if (r->changed[0])
			add(&l, ", \"changed\": {%s}", r->changed);
		add_num(&l, "tokens_per_s", "%.1f", rp.tokens_per_s);
		add_num(&l, "wall_s", "%.3f", rp.wall_s);
		add(&l, "}\n");
		if (l.b[l.n - 1] != '\n')
			return dg__msgf(DG_ERR_INTERNAL, msg, size, "step %" PRId64 ": its log line is too long", n);
		dg_status st = dg__rundir_log_write(r->log, r->logp, l.b, l.n, msg, size);
		if (st)
			return st;
		r->changed[0] = '\0';
	}
	if (o->result)
		o->result->step = n;
	if (cut)
		return DG_ERR_INTERRUPTED;
	if (ckpt_due(r, n)) {
		char path[4200];
		dg_status st = checkpoint(r, n, path, sizeof(path), msg, size);
		if (st)
			return st;
	}
	if (digest_due(r, n)) {
		dg_status st = same_weights(r, n, msg, size);
		if (st)
			return st;
	}
	if (r->progress)
		r->progress(&rp, r->user);
	r->t_last = now_s(); /* the next step's time starts after this one's save */
	return DG_OK;
}

/* finish of a queued GPU step: its loss and norm read back first. */
static dg_status finish_gpu(run_ctx *r, int64_t t, float lr, char *msg, size_t size)
{
	double loss, norm;
	bool skipped = false;
	dg_status st = dg_model_train_result(r->sp->m, t, &loss, &norm, &skipped, &r->s->scaler);
	if (st)
		return dg__msgf(st, msg, size, "%s", dg_device_errmsg(r->o->dev));
	/* with the scaler, an overflowed gradient is a skipped step (S halved
	 * on the device); a loss that is not finite still stops the run */
	const bool ok_skip = r->o->loss_scale && skipped && isfinite(loss);
	st = ok_skip ? DG_OK : numeric(r, t, loss, norm, msg, size);
	return st ? st : finish(r, t, lr, loss, norm, ok_skip, msg, size);
}

/* Asked to stop before the next step (or inside one on the CPU, which
 * dropped it): the queued GPU step, if any, is finished (logged) first;
 * then the steps done are checkpointed, unless the last one's checkpoint
 * is there already (none with ckpt_every < 0), and the run ends with
 * DG_ERR_INTERRUPTED naming the step and the checkpoint. */
static dg_status stop(run_ctx *r, int64_t pending, float pending_lr, char *msg, size_t size)
{
	dg_status st = pending >= 0 ? finish_gpu(r, pending, pending_lr, msg, size) : DG_OK;
	if (st)
		return st;
	char path[4200];
	const int64_t n = r->s->step;
	if (r->o->ckpt_every >= 0 && r->saved != n && (st = checkpoint(r, n, path, sizeof(path), msg, size)))
		return st;
	if (r->o->result)
		r->o->result->step = n;
	if (r->o->ckpt_every < 0)
		return dg__msgf(DG_ERR_INTERRUPTED, msg, size,
				"interrupted at step %" PRId64 " of %" PRId64 "; no checkpoint (none asked for)", n,
				r->o->opt.steps);
	dg_checkpoint_path(r->o->out_dir, n, path, sizeof(path));
	return dg__msgf(DG_ERR_INTERRUPTED, msg, size, "interrupted at step %" PRId64 " of %" PRId64 "; checkpoint %s",
			n, r->o->opt.steps, path);
}

/* Appends `"key": {"from": a, "to": b}` (a, b JSON values) to the JSON
 * members in buf. */
static void note_change(char *buf, size_t size, const char *key, const char *a, const char *b)
{
	size_t n = strlen(buf);
	snprintf(buf + n, size - n, "%s\"%s\": {\"from\": %s, \"to\": %s}", n ? ", " : "", key, a, b);
}

/*
 * A resume's flags against its checkpoint s (at path): the corpus (this
 * run's SHA-256, hex), B, T and the steps, the first that differs refused
 * naming it, the flag and both values; with o->allow_changed each is
 * noted in changed (JSON members) instead, and a change of the steps
 * takes the warmup along. *want: o->opt with a changed schedule put back
 * to the checkpoint's, for dg_checkpoint_match to hold the rest.
 */
static dg_status resume_check(const dg_train_opts *o, const dg_corpus *c, const dg_train_state *s,
			      const char *corpus, const char *path, dg_adamw_config *want, char *changed,
			      size_t csize, char *msg, size_t size)
{
	static const char again[] = "give --allow-changed to change it on purpose";
	char a[80], b[80];
	*want = o->opt;
	changed[0] = '\0';
	if (s->corpus_sha256[0] && strcmp(s->corpus_sha256, corpus) != 0) {
		if (!o->allow_changed)
			return dg__msgf(DG_ERR_INVALID_ARG, msg, size,
					"%s: cannot resume: data: the checkpoint's corpus has SHA-256 %.16s..., this "
					"run's (%s) %.16s... (--data); %s",
					path, s->corpus_sha256, c->path, corpus, again);
		snprintf(a, sizeof(a), "\"%s\"", s->corpus_sha256);
		snprintf(b, sizeof(b), "\"%s\"", corpus);
		note_change(changed, csize, "data", a, b);
	}
	const struct {
		const char *k, *flag;
		long long have, want; /* have 0: the checkpoint does not say */
	} v[] = { { "batch", "--batch", s->batch, o->batch },
		  { "time", "--time", s->time, o->time },
		  { "accum", "--accum", s->accum ? s->accum : (s->batch ? 1 : 0), accum_of(o) },
		  { "steps", "--steps", s->opt.steps, o->opt.steps } };
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		if (!v[i].have || v[i].have == v[i].want)
			continue;
		if (!o->allow_changed)
			return dg__msgf(DG_ERR_INVALID_ARG, msg, size,
					"%s: cannot resume: %s: the checkpoint's %lld, this run's %lld (%s); %s", path,
					v[i].k, v[i].have, v[i].want, v[i].flag, again);
		snprintf(a, sizeof(a), "%lld", v[i].have);
		snprintf(b, sizeof(b), "%lld", v[i].want);
		note_change(changed, csize, v[i].k, a, b);
	}
	if (s->opt.steps != o->opt.steps) { /* allowed: the schedule is this run's */
		want->steps = s->opt.steps;
		if (want->warmup != s->opt.warmup) {
			snprintf(a, sizeof(a), "%lld", (long long)s->opt.warmup);
			snprintf(b, sizeof(b), "%lld", (long long)o->opt.warmup);
			note_change(changed, csize, "warmup", a, b);
			want->warmup = s->opt.warmup;
		}
	}
	return DG_OK;
}

/* Checks o before anything is made or allocated. */
static dg_status check_opts(const dg_train_opts *o, const dg_corpus *c, char *msg, size_t msg_size)
{
	dg_status st = dg_model_config_check(&o->model, msg, msg_size);
	if (!st)
		st = dg_adamw_check(&o->opt, msg, msg_size);
	if (!st && (o->accum < 0 || o->accum > DG_TRAIN_MAX_ACCUM))
		st = dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
			      "accum %d: micro-batches a step must be 1..%d", o->accum, DG_TRAIN_MAX_ACCUM);
	if (!st && (o->batch < 1 || o->time < 1 || o->eval_batches < 1))
		st = dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
			      "batch %d, time %d, eval_batches %d: each must be at least 1", o->batch, o->time,
			      o->eval_batches);
	if (!st && !o->dev && o->loss_scale)
		st = dg__msgf(DG_ERR_UNSUPPORTED, msg, msg_size,
			      "--loss-scale dynamic: the loss scaler runs on the GPU model only; train on a GPU, "
			      "or drop it (--loss-scale off) on the CPU");
	if (!st && o->loss_scale && accum_of(o) > 1)
		st = dg__msgf(DG_ERR_UNSUPPORTED, msg, msg_size,
			      "--accum %d with --loss-scale dynamic: not supported (the loss's gradient would be "
			      "S, not S/K); accumulate without the scaler (--loss-scale off)",
			      o->accum);
	if (!st && !o->dev && !dg_model_cpu_runs(&o->model))
		st = dg__msgf(DG_ERR_UNSUPPORTED, msg, msg_size,
			      "preset %s: the CPU model runs f32, w8a8 and bitnet; train it on a GPU",
			      o->model.preset[0] ? o->model.preset : "(custom)");
	if (!st && o->world &&
	    (o->world->world < 1 || o->world->rank < 0 || o->world->rank >= o->world->world ||
	     (o->world->world > 1 && !o->world->rdzv) || (o->world->comm && !o->dev)))
		st = dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
			      "rank %d of world %d: ranks are 0..world-1, a world of several has a rendezvous, "
			      "and NCCL goes with the GPU model",
			      o->world->rank, o->world->world);
	if (!st && o->batch % world_of(o))
		st = dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
			      "batch %d: not a multiple of the %d ranks (each takes an equal share of every batch)",
			      o->batch, world_of(o));
	if (!st && c->vocab > o->model.vocab)
		st = dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
			      "vocab=%d: %s holds tokens up to %d (its vocabulary, checked when it was opened); the "
			      "model's vocabulary must take them",
			      o->model.vocab, c->path, c->vocab - 1);
	if (!st)
		st = dg_corpus_check(c, o->time, msg, msg_size);
	/* the CPU model's step, the masters, two moments, the gradients and
	 * the init (and a micro-batch's gradients with accum): held to the machine's memory before any is allocated */
	if (!st && !o->dev)
		st = dg_model_cpu_fits(&o->model, o->batch / world_of(o), o->time, accum_of(o) > 1 ? 6 : 5, NULL,
				       msg, msg_size);
	return st;
}

/* Micro-batch k of a step whose first micro-batch is b (this rank's rows
 * of the first B): the global batch's rows k·B .. k·B + B − 1, this
 * rank's share of them, their dropout masks the K·B-row batch's. */
static dg_model_batch micro_batch(const dg_train_opts *o, const dg_model_batch *b, int k)
{
	dg_model_batch mb = *b;
	const size_t off = (size_t)k * (size_t)o->batch * (size_t)o->time;
	mb.idx += off;
	mb.targets += off;
	mb.row0 += (uint32_t)(k * o->batch);
	return mb;
}

/* The CPU model's step of K micro-batches: each one's gradients into
 * r->micro, summed into grads; then grads and the loss times 1/K (the
 * mean over the K·B rows, as one batch of them gives it up to the sums'
 * order). K = 1: the step itself. */
static dg_status cpu_accum(run_ctx *r, const dg_model_batch *b, double *loss, dg_model_weights *grads,
			   char *msg, size_t size)
{
	const dg_train_opts *o = r->o;
	const int K = accum_of(o);
	if (K == 1)
		return step_of(r->sp, r->s->weights, b, loss, grads, msg, size);
	const dg_model_config *mc = &r->s->weights->config;
	double sum = 0;
	for (int k = 0; k < K; k++) {
		dg_model_batch mb = micro_batch(o, b, k);
		double l;
		dg_status st = step_of(r->sp, r->s->weights, &mb, &l, k ? r->micro : grads, msg, size);
		if (st)
			return st;
		sum += l;
		for (int p = 0; k && p < DG_MODEL_N_PARAMS; p++) {
			int nd;
			int64_t sh[3];
			size_t n = (size_t)dg_model_param_shape(mc, (dg_model_param)p, &nd, sh);
			float *g = grads->params[p];
			const float *m = r->micro->params[p];
			for (size_t i = 0; i < n; i++)
				g[i] += m[i];
		}
	}
	const float inv = (float)(1.0 / K);
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		int nd;
		int64_t sh[3];
		size_t n = (size_t)dg_model_param_shape(mc, (dg_model_param)p, &nd, sh);
		float *g = grads->params[p];
		for (size_t i = 0; i < n; i++)
			g[i] *= inv;
	}
	*loss = sum / K;
	return DG_OK;
}

dg_status dg_train_run(const dg_train_opts *o, const dg_corpus *c, dg_train_progress progress,
		       void *user, char *msg, size_t msg_size)
{
	if (!o || !c || !o->out_dir)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_train_run: NULL argument");
	const double t_run = now_s(); /* the first step's times count from here */
	if (o->result)
		*o->result = (dg_train_result){ 0 };
	dg_status st = check_opts(o, c, msg, msg_size);
	if (!st)
		st = dg__rundir_make(o->out_dir, msg, msg_size);
	if (st)
		return st;
	/* rank 0 writes the folder, under its lock (or its launcher's) */
	int lock = -1;
	if (rank_of(o) == 0) {
		long holder = 0;
		st = dg_train_lock(o->out_dir, &lock, &holder, msg, msg_size);
		if (st && holder > 0 && holder == (long)getppid())
			st = DG_OK; /* the launcher of the ranks holds it for them */
		if (st)
			return st;
	}
	const int lb = o->batch / world_of(o); /* this rank's rows of every batch */
	const size_t lb_off = (size_t)rank_of(o) * (size_t)lb * (size_t)o->time;
	/* the step's kernels compile on every core while the weights are
	 * drawn or loaded (at 1B, 1.8 s of the first step's 5.1 on the H200) */
	dg__gm_warm *pre = o->dev ? dg__gm_warm_start(o->dev, &o->model, lb, o->time) : NULL;
	char corpus[65];
	if ((st = dg_corpus_digest(c, corpus, msg, msg_size))) {
		dg__gm_warm_join(pre);
		dg_train_unlock(lock);
		return st;
	}

	char path[4200], logp[4200];
	snprintf(logp, sizeof(logp), "%s/log.jsonl", o->out_dir);
	int64_t latest = -1;
	dg_train_state *s = NULL;
	dg_model_weights *w0 = NULL, *grads = NULL, *micro = NULL;
	int32_t *idx = NULL, *tgt = NULL;
	stepper sp = { o->dev, NULL };
	int log = -1;
	bool no_val = false; /* the log's last line, the checkpoint's step, lacks its validation */
	char changed[1024] = "";
	if ((st = dg_checkpoint_prune(o->out_dir, 0, &latest, msg, msg_size)))
		goto out;
	if (o->resume) {
		if (latest < 0) {
			st = dg__msgf(DG_ERR_NOT_FOUND, msg, msg_size, "%s: no checkpoint to resume from", o->out_dir);
			goto out;
		}
		dg_checkpoint_path(o->out_dir, latest, path, sizeof(path));
		if ((st = dg_checkpoint_load(path, &s, msg, msg_size)))
			goto out;
		char why[512];
		dg_adamw_config want;
		const uint32_t mode = o->loss_scale ? DG_LOSS_SCALE_DYNAMIC : DG_LOSS_SCALE_OFF;
		st = resume_check(o, c, s, corpus, path, &want, changed, sizeof(changed), msg, msg_size);
		if (!st && (st = dg_checkpoint_match(s, &o->model, &want, mode, why, sizeof(why))))
			dg__msgf(st, msg, msg_size, "%s: cannot resume: %s", path, why);
		if (st) {
			if (o->result)
				o->result->resume_refused = true;
			goto out;
		}
		s->opt = o->opt;
		if (rank_of(o) == 0 &&
		    (st = dg__rundir_log_repair(logp, s->step, o->warn, o->warn_user, &no_val, msg, msg_size)))
			goto out;
	} else {
		if (latest >= 0) {
			st = dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
				      "%s holds checkpoints of another run (the newest step %" PRId64
				      "): resume it, or train into another folder",
				      o->out_dir, latest);
			goto out;
		}
		if ((st = dg_model_weights_create(&o->model, o->seed, &w0, msg, msg_size)) ||
		    (st = dg__train_state_adopt(&w0, o->seed, &o->opt, &s, msg, msg_size)))
			goto out;
		dg_loss_scaler_defaults(&s->scaler, o->loss_scale);
	}
	/* what the checkpoints record of the run's batches */
	s->time = o->time;
	s->batch = o->batch;
	s->accum = accum_of(o);
	memcpy(s->corpus_sha256, corpus, sizeof(corpus));
	if (o->result)
		o->result->first = o->result->step = s->step;
	if (!o->dev && (st = dg__model_weights_alloc(&o->model, &grads, msg, msg_size)))
		goto out;
	if (!o->dev && accum_of(o) > 1 && (st = dg__model_weights_alloc(&o->model, &micro, msg, msg_size)))
		goto out;
	size_t bt = (size_t)accum_of(o) * (size_t)o->batch * (size_t)o->time;
	idx = malloc(bt * sizeof(int32_t));
	tgt = malloc(bt * sizeof(int32_t));
	if (!idx || !tgt) {
		st = dg__msgf(DG_ERR_NOMEM, msg, msg_size, "out of memory");
		goto out;
	}
	const double t0 = now_s(); /* the first step's wall time: to the first step */
	/* what the run's memory is measured from (peak_bytes): the bytes
	 * held now, which become the high-water mark */
	const size_t mem0 = o->dev ? dg__dev_mem_mark(o->dev) : 0;
	double t_model = t0, t_optim = t0;
	if (o->result)
		o->result->weights_s = t0 - t_run;
	/* what the weights left of the kernels' compile to wait for: counted
	 * in model_s, as the compile it stands for */
	const bool warmed = pre != NULL;
	const double waited = dg__gm_warm_join(pre);
	pre = NULL;
	if (o->dev) {
		st = warmed ? dg__model_create_warmed(o->dev, s->weights, lb, o->time, accum_of(o), &sp.m)
			    : dg_model_create_accum(o->dev, s->weights, lb, o->time, accum_of(o), &sp.m);
		t_model = now_s();
		if (!st)
			st = dg_model_optim_init(sp.m, &o->opt, o->resume ? s->m : NULL, o->resume ? s->v : NULL,
						 !o->no_graph, &s->scaler);
		t_optim = now_s();
		if (!st && o->world && o->world->comm)
			st = dg_model_optim_comm(sp.m, o->world->comm);
		if (st) {
			/* the device's status as it is: out of memory, a kernel that
			 * does not compile, a launch that fails are told apart */
			st = dg__msgf(st, msg, msg_size, "%s", dg_device_errmsg(o->dev));
			goto out;
		}
	}
	if (o->result) {
		o->result->ready_s = now_s() - t_run;
		if (o->dev) {
			o->result->model_s = t_model - t0;
			o->result->optim_s = t_optim - t_model;
			dg__gm_create_times(sp.m, &o->result->model_compile_s, &o->result->model_plan_s,
					    &o->result->model_alloc_s, &o->result->model_upload_s);
			o->result->model_compile_s += waited;
			dg__gm_plan_modes(sp.m, &o->result->keep_qr, &o->result->stack_pgrads,
					  &o->result->recompute, &o->result->recompute_ys, &o->result->attn_chunk);
		}
		dg_device_stats ds;
		if (o->dev && !dg_device_stats_get(o->dev, &ds)) {
			o->result->kernels_compiled = ds.compiled;
			o->result->kernels_cached = ds.cached;
			o->result->kernels_bundled = ds.bundled;
		}
	}
	const int64_t end = o->stop_at > 0 && o->stop_at < o->opt.steps ? o->stop_at : o->opt.steps;
	const dg_model_config *mc = &s->weights->config;
	run_ctx rc = { .o = o, .c = c, .s = s, .sp = &sp, .log = -1, .logp = logp, .idx = idx, .tgt = tgt,
		       .bt = bt, .micro = micro, .t0 = t0, .t_run = t_run, .mem0 = mem0, .t_last = t0, .end = end,
		       .saved = o->resume ? s->step : -1,
		       .progress = progress, .user = user };
	snprintf(rc.changed, sizeof(rc.changed), "%s", changed);
	/* a validation a stop cut short: computed now, into its line */
	if (no_val && eval_due(o, s->step) && world_of(o) == 1) {
		double vl;
		st = val_loss(&sp, o, c, s->weights, idx, tgt, &vl, msg, msg_size);
		if (st == DG_ERR_INTERRUPTED)
			st = stop(&rc, -1, 0, msg, msg_size);
		if (st || (st = dg__rundir_log_set_val(logp, s->step, vl, msg, msg_size)))
			goto out;
	}
	if (rank_of(o) == 0 && (st = dg__rundir_log_open(logp, o->resume, &log, msg, msg_size)))
		goto out;
	rc.log = log;

	/* the GPU: step t is queued before step t − 1 is read (pending); a
	 * step that validates or checkpoints is read before the next is
	 * queued, since both read the device's state after it */
	int64_t pending = -1;
	float pending_lr = 0;
	while (s->step < end) {
		int stopping = o->stop && *o->stop;
		if (world_of(o) > 1 && (st = dg_rdzv_any(o->world->rdzv, stopping, &stopping, msg, msg_size)))
			goto out; /* every rank stops before the same step */
		if (stopping) {
			st = stop(&rc, pending, pending_lr, msg, msg_size);
			goto out;
		}
		const int64_t t = s->step;
		const float lr = dg_adamw_lr(&o->opt, t);
		const dg_rng rng0 = s->data_rng; /* a step the stop drops draws its batch again */
		dg_corpus_batch(c, false, &s->data_rng, accum_of(o) * o->batch, o->time, idx, tgt);
		s->data_pos++;
		dg_model_batch b = { .idx = idx + lb_off, .targets = tgt + lb_off, .b = lb, .t = o->time,
				     .seed = s->seed, .step = (uint32_t)t, .train = true,
				     .row0 = (uint32_t)(rank_of(o) * lb), /* the global batch's masks */
				     .stop = inner_stop(o) };
		if (!sp.m) {
			double loss;
			if ((st = cpu_accum(&rc, &b, &loss, grads, msg, msg_size))) {
				if (st == DG_ERR_INTERRUPTED) {
					s->data_rng = rng0;
					s->data_pos--;
					st = stop(&rc, -1, 0, msg, msg_size);
				}
				goto out;
			}
			if (world_of(o) > 1) { /* the mean over the ranks: every rank the same bytes */
				size_t n[DG_MODEL_N_PARAMS];
				for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
					int nd;
					int64_t sh[3];
					n[p] = (size_t)dg_model_param_shape(mc, (dg_model_param)p, &nd, sh);
				}
				if ((st = dg_rdzv_mean(o->world->rdzv, grads->params, n, DG_MODEL_N_PARAMS, &loss, msg,
						       msg_size)))
					goto out;
			}
			double sq = 0;
			for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
				int nd;
				int64_t sh[3];
				sq += dg_adamw_sq_sum(grads->params[p],
						      (size_t)dg_model_param_shape(mc, (dg_model_param)p, &nd, sh));
			}
			const double norm = sqrt(sq);
			if ((st = numeric(&rc, t, loss, norm, msg, msg_size)))
				goto out;
			const float scale = dg_adamw_clip_scale(&o->opt, norm);
			for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
				int nd;
				int64_t sh[3];
				size_t n = (size_t)dg_model_param_shape(mc, (dg_model_param)p, &nd, sh);
				dg_adamw_step(&o->opt, t, lr, scale, true, s->weights->params[p], grads->params[p],
					      s->m[p], s->v[p], n);
			}
			s->step = t + 1;
			if ((st = finish(&rc, t, lr, loss, norm, false, msg, msg_size))) {
				if (st == DG_ERR_INTERRUPTED) /* its validation: the step is logged, then kept */
					st = stop(&rc, -1, 0, msg, msg_size);
				goto out;
			}
			continue;
		}
		for (int k = 0; k < accum_of(o) && !st; k++) {
			dg_model_batch mb = micro_batch(o, &b, k);
			mb.micro = k;
			st = dg_model_train_step(sp.m, &mb, t, lr);
		}
		if (st) {
			st = dg__msgf(st, msg, msg_size, "%s", dg_device_errmsg(o->dev));
			goto out;
		}
		s->step = t + 1;
		if (pending >= 0 && (st = finish_gpu(&rc, pending, pending_lr, msg, msg_size)))
			goto out;
		pending = t;
		pending_lr = lr;
		if (reads_state(&rc, t + 1)) {
			pending = -1;
			if ((st = finish_gpu(&rc, t, lr, msg, msg_size)))
				goto out;
		}
	}
	if (pending >= 0)
		st = finish_gpu(&rc, pending, pending_lr, msg, msg_size);
out:
	dg__gm_warm_join(pre);
	if (log >= 0 && close(log) && !st)
		st = dg__msgf(DG_ERR_IO, msg, msg_size, "%s: close: %s", logp, strerror(errno));
	dg_train_unlock(lock);
	dg_model_destroy(sp.m);
	free(idx);
	free(tgt);
	dg_model_weights_destroy(micro);
	dg_model_weights_destroy(grads);
	dg_model_weights_destroy(w0);
	dg_train_state_destroy(s);
	return st;
}
