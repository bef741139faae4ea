/*
 * dragon train — a training run (dragon/train.h) from flags: the preset
 * and shapes, the batch, the optimizer and its schedule, the corpus (the
 * built-in one, or --data FILE), the output folder; on GPU 0 when there is
 * one (else, or with --cpu, the CPU model, which runs f32, w8a8 and
 * bitnet). A progress line on stderr when it is a terminal (with the MFU
 * on a GPU whose peak peak.h knows); always the JSONL log in the output
 * folder; --json prints one summary object.
 *
 * SIGINT and SIGTERM ask the run to stop: the handler sets a flag, which
 * the trainer reads between steps (and the CPU model between the ops of
 * a lone run's step, dropping that step), and says so on stderr at once;
 * the trainer checkpoints the steps done and returns, and the command
 * exits 128 + the signal (130 for ^C). A
 * second signal kills the process at once (a second ^C), which is safe,
 * since every checkpoint is published atomically; but not a repeat from
 * the same process within a second, which is the same request sent twice:
 * timeout(1) signals its child and then its whole process group, so the
 * child of `timeout 3600 dragon train` gets each SIGTERM twice.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/size.h"
#include "cli/common/cli.h"
#include "cli/common/progress.h"
#include "cli/common/scan.h"
#include "cli/dragon/cmd.h"
#include "cli/dragon/device.h"
#include "cli/dragon/peak.h"
#include "dragon/comm.h"
#include "dragon/data.h"
#include "dragon/dist.h"
#include "dragon/train.h"

static const char help_text[] =
	"usage: dragon train [--preset P] [--steps N] [--batch B] [--time T] [--accum K]\n"
	"                    [--lr X] [--warmup N] [--wd X] [--clip X] [--seed S]\n"
	"                    [--data D] [--vocab V]\n"
	"                    [--out DIR] [--eval-every N] [--eval-batches K]\n"
	"                    [--ckpt-every N] [--keep K] [--resume] [--allow-changed]\n"
	"                    [--stop-at N] [--cpu]\n"
	"                    [--no-graph] [--loss-scale dynamic|off] [--gpus N]\n"
	"                    [--layers L --embd D --heads H --neurons N]\n"
	"                    [--dropout P] [--memory SIZE] [--json]\n\n"
	"Trains a BDH model with AdamW on a corpus: a file whose bytes are tokens (its\n"
	"first 90% to train, its last 10% to validate), llm.c's token shards or raw\n"
	"uint16 tokens (nanoGPT's train.bin and val.bin).\n\n"
	"  --preset P        f32, bf16, w8a8, bitnet (default bf16)\n"
	"  --layers L, --embd D, --heads H, --neurons N\n"
	"                    the model's shape (default the 25M one: 6, 256, 4, 8192)\n"
	"  --dropout P       the drop probability of xs·ys in training (0.1; 0 none)\n"
	"  --steps N         optimizer steps (default 1500)\n"
	"  --batch B, --time T\n"
	"                    rows of T tokens a micro-batch (default 8 x 512)\n"
	"  --accum K         gradient accumulation: K micro-batches of B rows a step,\n"
	"                    their gradients summed before one update (1..1024,\n"
	"                    default 1): the step of a batch of K*B rows up to the\n"
	"                    sums' order, in the memory of B rows; not with\n"
	"                    --loss-scale dynamic\n"
	"  --memory SIZE     the memory the model may plan for, AdamW's moments\n"
	"                    included (4G, 3.5GiB, 512M, or bytes; default the\n"
	"                    device's free memory; DRAGON_MEMORY likewise, on the CPU\n"
	"                    DRAGON_CPU_MEMORY): on a GPU the step trades time for\n"
	"                    memory under it (plan.recompute_ys, plan.recompute);\n"
	"                    a step that does not fit it is refused before anything\n"
	"                    is allocated\n"
	"  --lr X            peak learning rate (1e-3), after --warmup N linear steps\n"
	"                    (min(100, steps/10)); a cosine to lr/10 at the last step\n"
	"  --wd X            decoupled weight decay (0.1); --clip X: the global\n"
	"                    gradient-norm clip (1.0; 0 none)\n"
	"  --seed S          the weights' init, the batches and dropout (1337)\n"
	"  --data D          train on D (default the built-in corpus: Shakespeare,\n"
	"                    which scripts/corpus.sh sets up; read from $DRAGON_CORPUS,\n"
	"                    else the install's share/dragon/, else ./data/). D is a\n"
	"                    file of bytes; llm.c's token\n"
	"                    shards: a shard, a glob ('dir/fineweb_*.bin') or a comma\n"
	"                    list, the *_val_* shards beside *_train_* ones validating;\n"
	"                    a folder holding train.bin and val.bin (uint16 tokens);\n"
	"                    or, with --vocab, a file of uint16 tokens. Without val\n"
	"                    files the last 10% of the tokens validates. A file cut\n"
	"                    short, a shard header that is not llm.c's or a token not\n"
	"                    below the vocabulary is refused, naming the file and the\n"
	"                    byte offset, before the run starts (docs/data.md)\n"
	"  --vocab V         the model's vocabulary, 2 to 65536: token ids are below V\n"
	"                    (default: 256 for bytes, 50304 for llm.c's shards: GPT-2's\n"
	"                    50257 padded as llm.c pads it); any V but 256 reads a\n"
	"                    plain file as uint16 tokens\n"
	"  --out DIR         log.jsonl and ckpt-<step>.safetensors (default runs/latest);\n"
	"                    one run at a time: another on DIR is refused, naming its\n"
	"                    pid (DIR/lock)\n"
	"  --eval-every N    validation loss every N steps (100) over --eval-batches K\n"
	"                    fixed batches (32), and at the last step\n"
	"  --ckpt-every N    a checkpoint every N steps (500), and at the end; --keep K\n"
	"                    the newest K kept (3); never: none at all, not at the end\n"
	"                    nor when stopped (a run to measure, not to resume)\n"
	"  --resume          continue from DIR's newest checkpoint (the same config,\n"
	"                    corpus, --batch, --time, --accum and --steps, else refused\n"
	"                    naming the one that differs); the log then reads as if the run\n"
	"                    had never stopped (a damaged one is repaired, with a\n"
	"                    warning saying what was found)\n"
	"  --allow-changed   with --resume: another corpus, --batch, --time, --accum or\n"
	"                    --steps on purpose; the log's next line records the change\n"
	"  --stop-at N       stop after step N (a checkpoint first); resume later\n"
	"  --cpu             the CPU model even with a GPU (f32, w8a8, bitnet; small\n"
	"                    shapes: a shape whose step needs more memory than the\n"
	"                    machine has is refused before it starts, naming both)\n"
	"  --no-graph        on a GPU, run each step eagerly instead of replaying the\n"
	"                    step captured into one CUDA graph\n"
	"  --loss-scale M    on a GPU, dynamic: scale the loss's gradient by S (2^16,\n"
	"                    halved on a step whose gradient overflows, which is then\n"
	"                    skipped and logged \"skipped\": true; doubled after 2000\n"
	"                    finite steps); off (the default): none. --resume needs\n"
	"                    the checkpoint's setting; the CPU model refuses dynamic\n"
	"  --gpus N          data parallel over N GPUs (N processes, one a GPU; with\n"
	"                    --cpu, N processes of the CPU model): each takes B/N rows\n"
	"                    of every batch (B a multiple of N), the gradients are\n"
	"                    averaged (NCCL) so the run is the one-GPU run at batch B;\n"
	"                    rank 0 writes the log and the checkpoints, and at every\n"
	"                    validation the ranks compare their weights' SHA-256. Under\n"
	"                    another launcher (torchrun's RANK, WORLD_SIZE, LOCAL_RANK,\n"
	"                    MASTER_ADDR, MASTER_PORT set) each process is one rank.\n"
	"  --json            one JSON object on stdout at the end: steps (run by this\n"
	"                    command), step (the run's, reached), total_steps, wall_s;\n"
	"                    on a GPU also first_step_s and ready_s (seconds from\n"
	"                    the command's start to the first step's loss, and to\n"
	"                    the model ready), startup (weights_s: the initial\n"
	"                    weights drawn or read; on a GPU model_s: the model\n"
	"                    created, its kernels compiled, and its parts in\n"
	"                    model: compile_s, plan_s, alloc_s, upload_s; optim_s:\n"
	"                    its optimizer set up), kernels (how many were compiled,\n"
	"                    read from the cache, loaded from bundles) and\n"
	"                    peak_bytes (the most device memory the run held at\n"
	"                    once: arenas, weights, optimizer state, workspaces,\n"
	"                    as PyTorch's max_memory_allocated) and plan (the\n"
	"                    step's memory-for-time choices, each where it fits:\n"
	"                    keep_qr, the attention's RoPE'd queries kept for its\n"
	"                    backward; stack_pgrads, the encoders' weight gradients\n"
	"                    as one GEMM over every layer; recompute, the\n"
	"                    projections' outputs made again by the backward, taken\n"
	"                    when the step does not fit with them saved;\n"
	"                    recompute_ys, the encoder_v's output alone made again,\n"
	"                    taken first, where it fits; attn_chunk,\n"
	"                    the attention's chunked form's chunk, 0 the quadratic\n"
	"                    form)\n\n"
	"On a terminal a progress line shows the step, the loss, tokens a second,\n"
	"the MFU (the model's FLOPs a second over the GPU's dense bf16 peak, for the\n"
	"GPUs of a known peak: H200, H100, A100) and the time left.\n\n"
	"^C (SIGINT) or SIGTERM stops the run between two steps (on the CPU, inside\n"
	"one, which is dropped) with a checkpoint of the steps done, and says so on\n"
	"stderr at once; --resume continues it. A second ^C stops at once: the last\n"
	"complete checkpoint is still there (checkpoints are written atomically, so\n"
	"even kill -9 leaves them whole).\n\n"
	"Exit status: 0 ok, 1 failure (the data, a file, a full disk, the device, a\n"
	"loss that is not finite), 2 usage, 130 stopped by SIGINT (143 SIGTERM).\n";

/* What to run without a GPU: the tiny model on the CPU (README's), or this
 * command where there is one. */
static const char no_gpu_next[] =
	"on the CPU, a tiny model: `dragon train --cpu --preset f32 --layers 2 --embd 32 --heads 2 "
	"--neurons 64 --batch 4 --time 32 --steps 30 --eval-every 10 --eval-batches 4 --out runs/tiny`, "
	"then `dragon sample runs/tiny`; or this command, as it is, on a machine with an NVIDIA GPU "
	"(`dragon devices` lists the ones dragon can use)";

enum {
	O_PRESET = 1, O_STEPS, O_BATCH, O_TIME, O_LR, O_WARMUP, O_WD, O_CLIP, O_SEED, O_DATA, O_OUT,
	O_EVAL_EVERY, O_EVAL_BATCHES, O_CKPT_EVERY, O_KEEP, O_RESUME, O_STOP_AT, O_CPU, O_JSON,
	O_LAYERS, O_EMBD, O_HEADS, O_NEURONS, O_NO_GRAPH, O_DROPOUT, O_LOSS_SCALE, O_GPUS, O_HELP,
	O_ALLOW_CHANGED, O_VOCAB, O_ACCUM, O_MEMORY,
};

static const dg__cli_opt opts[] = {
	{ "preset", 'p', true, O_PRESET },	   { "steps", 'n', true, O_STEPS },
	{ "batch", 'b', true, O_BATCH },	   { "time", 't', true, O_TIME },
	{ "lr", 0, true, O_LR },		   { "warmup", 0, true, O_WARMUP },
	{ "wd", 0, true, O_WD },		   { "clip", 0, true, O_CLIP },
	{ "seed", 's', true, O_SEED },		   { "data", 'd', true, O_DATA },
	{ "out", 'o', true, O_OUT },		   { "eval-every", 0, true, O_EVAL_EVERY },
	{ "eval-batches", 0, true, O_EVAL_BATCHES }, { "ckpt-every", 0, true, O_CKPT_EVERY },
	{ "keep", 0, true, O_KEEP },		   { "resume", 0, false, O_RESUME },
	{ "stop-at", 0, true, O_STOP_AT },	   { "cpu", 0, false, O_CPU },
	{ "json", 0, false, O_JSON },		   { "layers", 0, true, O_LAYERS },
	{ "embd", 0, true, O_EMBD },		   { "heads", 0, true, O_HEADS },
	{ "neurons", 0, true, O_NEURONS },	   { "no-graph", 0, false, O_NO_GRAPH },
	{ "dropout", 0, true, O_DROPOUT },	   { "loss-scale", 0, true, O_LOSS_SCALE },
	{ "gpus", 0, true, O_GPUS },		   { "help", 'h', false, O_HELP },
	{ "allow-changed", 0, false, O_ALLOW_CHANGED }, { "vocab", 0, true, O_VOCAB },
	{ "accum", 0, true, O_ACCUM },		   { "memory", 0, true, O_MEMORY },
	{ NULL, 0, false, 0 },
};

typedef struct train_args {
	dg_train_opts o;
	const char *preset, *data;
	uint64_t shape[4];
	bool cpu, json, warmup_given, dropout_given, preset_given;
	float lr, wd, clip, dropout;
	uint64_t steps, warmup;
	uint64_t gpus; /* --gpus N; 0 not given */
	uint64_t vocab; /* --vocab V; 0 not given: the corpus's */
} train_args;

static bool parse_f(const char *flag, const char *v, float lo, float *out)
{
	char *end;
	errno = 0;
	float x = strtof(v, &end);
	if (errno || end == v || *end || !isfinite(x) || x < lo) {
		dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG, "%s %s: not a number >= %g", flag, v, (double)lo);
		return false;
	}
	*out = x;
	return true;
}

static bool parse_u(const char *flag, const char *v, uint64_t lo, uint64_t hi, uint64_t *out)
{
	return dg__cli_parse_u64(flag, v, lo, hi, out);
}

/* 0 parsed, -1 --help printed, else the exit code (reported). */
static int parse(int argc, char **argv, train_args *a)
{
	static const char *const shape_flags[4] = { "--layers", "--embd", "--heads", "--neurons" };
	dg__cli_scan_state s;
	const char *v;
	int id;
	uint64_t u;

	memset(a, 0, sizeof(*a));
	dg_train_defaults(&a->o, 1500);
	a->preset = "bf16";
	a->steps = 1500;
	a->lr = a->o.opt.lr;
	a->wd = a->o.opt.weight_decay;
	a->clip = a->o.opt.clip;
	dg__cli_scan_init(&s, argc, argv, "train");
	while ((id = dg__cli_scan(&s, opts, &v)) != DG__CLI_SCAN_END) {
		bool ok = true;
		switch (id) {
		case DG__CLI_SCAN_ERROR:
			return DG__CLI_USAGE;
		case DG__CLI_SCAN_ARG:
			return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
					   "train takes no argument '%s'; see `dragon train --help`", v);
		case O_HELP:
			fputs(help_text, stdout);
			return -1;
		case O_PRESET: a->preset = v, a->preset_given = true; break;
		case O_DATA: a->data = v; break;
		case O_OUT: a->o.out_dir = v; break;
		case O_RESUME: a->o.resume = true; break;
		case O_ALLOW_CHANGED: a->o.allow_changed = true; break;
		case O_CPU: a->cpu = true; break;
		case O_NO_GRAPH: a->o.no_graph = true; break;
		case O_LOSS_SCALE:
			if (strcmp(v, "dynamic") && strcmp(v, "off"))
				return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
						   "--loss-scale %s: want dynamic or off", v);
			a->o.loss_scale = strcmp(v, "dynamic") == 0;
			break;
		case O_JSON: a->json = true; break;
		case O_STEPS: ok = parse_u("--steps", v, 1, 1ull << 40, &a->steps); break;
		case O_WARMUP:
			ok = parse_u("--warmup", v, 0, 1ull << 40, &a->warmup);
			a->warmup_given = true;
			break;
		case O_BATCH: ok = parse_u("--batch", v, 1, 1 << 16, &u), a->o.batch = (int)u; break;
		case O_TIME: ok = parse_u("--time", v, 1, 1 << 20, &u), a->o.time = (int)u; break;
		case O_ACCUM: ok = parse_u("--accum", v, 1, DG_TRAIN_MAX_ACCUM, &u), a->o.accum = (int)u; break;
		case O_MEMORY: {
			/* the GPU's model reads it as DRAGON_MEMORY, the CPU's as
			 * DRAGON_CPU_MEMORY (data parallel: every rank's, the
			 * launcher's children inheriting both) */
			size_t bytes = 0;
			char num[32];
			if (dg__parse_size(v, &bytes))
				return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
						   "--memory %s: not a size (bytes, or a number with K, M, G or T: 4G, "
						   "3.5GiB)",
						   v);
			snprintf(num, sizeof(num), "%zu", bytes);
			setenv("DRAGON_MEMORY", v, 1);
			setenv("DRAGON_CPU_MEMORY", num, 1);
			break;
		}
		case O_SEED: ok = parse_u("--seed", v, 0, UINT64_MAX, &a->o.seed); break;
		case O_EVAL_EVERY: ok = parse_u("--eval-every", v, 0, 1ull << 40, &u), a->o.eval_every = (int64_t)u; break;
		case O_EVAL_BATCHES: ok = parse_u("--eval-batches", v, 1, 1 << 20, &u), a->o.eval_batches = (int)u; break;
		case O_CKPT_EVERY:
			if (strcmp(v, "never") == 0)
				a->o.ckpt_every = -1;
			else if (v[0] < '0' || v[0] > '9')
				return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
						   "--ckpt-every %s: a whole number of steps, or never", v);
			else
				ok = parse_u("--ckpt-every", v, 0, 1ull << 40, &u), a->o.ckpt_every = (int64_t)u;
			break;
		case O_KEEP: ok = parse_u("--keep", v, 0, 1 << 20, &u), a->o.keep = (int)u; break;
		case O_STOP_AT: ok = parse_u("--stop-at", v, 1, 1ull << 40, &u), a->o.stop_at = (int64_t)u; break;
		case O_GPUS: ok = parse_u("--gpus", v, 1, 1024, &a->gpus); break;
		case O_VOCAB: ok = parse_u("--vocab", v, 2, DG_CORPUS_MAX_VOCAB, &a->vocab); break;
		case O_LR: ok = parse_f("--lr", v, 0.0f, &a->lr); break;
		case O_WD: ok = parse_f("--wd", v, 0.0f, &a->wd); break;
		case O_CLIP: ok = parse_f("--clip", v, 0.0f, &a->clip); break;
		case O_DROPOUT: ok = parse_f("--dropout", v, 0.0f, &a->dropout), a->dropout_given = true; break;
		case O_LAYERS: case O_EMBD: case O_HEADS: case O_NEURONS:
			ok = parse_u(shape_flags[id - O_LAYERS], v, 1, 1 << 20, &a->shape[id - O_LAYERS]);
			break;
		}
		if (!ok)
			return DG__CLI_USAGE;
	}
	if (!a->data && a->vocab && a->vocab != 256)
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "--vocab %d: the built-in corpus is bytes (vocab 256); give a token corpus with --data",
				   (int)a->vocab);
	if (a->o.allow_changed && !a->o.resume)
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "--allow-changed goes with --resume (what may differ from the checkpoint)");
	char msg[512];
	dg_model_config c;
	if (dg_model_preset(a->preset, &c, msg, sizeof(msg)))
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG, "--preset: %s", msg);
	int *dst[4] = { &c.layers, &c.embd, &c.heads, &c.neurons };
	for (int i = 0; i < 4; i++)
		if (a->shape[i])
			*dst[i] = (int)a->shape[i];
	if (a->dropout_given)
		c.dropout = a->dropout;
	if (a->vocab)
		c.vocab = (int)a->vocab;
	if (dg_model_config_check(&c, msg, sizeof(msg)))
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG, "config: %s", msg);
	a->o.model = c;
	dg_adamw_defaults(&a->o.opt, (int64_t)a->steps);
	a->o.opt.lr = a->lr;
	a->o.opt.lr_floor = a->lr / 10;
	a->o.opt.weight_decay = a->wd;
	a->o.opt.clip = a->clip;
	if (a->warmup_given)
		a->o.opt.warmup = (int64_t)a->warmup;
	if (dg_adamw_check(&a->o.opt, msg, sizeof(msg)))
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG, "%s", msg);
	return 0;
}

typedef struct progress_state {
	bool tty;
	double peak; /* the GPU's dense bf16 FLOP/s (peak.h); 0: no MFU shown */
} progress_state;

/* A resume's repairs of the log, on stderr. */
static void warn(const char *m, void *user)
{
	(void)user;
	fprintf(stderr, "dragon: warning: %s\n", m);
}

static void progress(const dg_train_report *r, void *user)
{
	progress_state *p = user;
	if (!p->tty)
		return;
	double eta = r->step ? r->wall_s / (double)r->step * (double)(r->steps - r->step) : 0;
	char mfu[32] = "";
	if (p->peak > 0 && r->flops_per_token > 0)
		snprintf(mfu, sizeof(mfu), "  mfu %.1f%%", 100 * r->flops_per_token * r->tokens_per_s / p->peak);
	/* a line that stays for each validation, one rewritten in place between */
	if (isnan(r->val_loss))
		fprintf(stderr, "\rstep %lld/%lld  loss %.4f  %.0f tok/s%s  eta %.0f s   ", (long long)r->step,
			(long long)r->steps, r->train_loss, r->tokens_per_s, mfu, eta);
	else
		fprintf(stderr, "\rstep %lld/%lld  loss %.4f  val %.4f  %.0f tok/s%s  eta %.0f s   \n",
			(long long)r->step, (long long)r->steps, r->train_loss, r->val_loss, r->tokens_per_s, mfu,
			eta);
}

/* The signal that asked the run to stop (SIGINT, SIGTERM), 0 none: what
 * the trainer reads; the handler also says it on stderr (rank 0). The
 * sender of that first signal (0: the kernel, a terminal's ^C) and its
 * time tell a repeat of the same request from a second one. */
static volatile sig_atomic_t stop_signal;
static pid_t stop_from;
static struct timespec stop_at;
static dg_train_result run_at;     /* the trainer's: the steps done, for the handler's line */
static volatile sig_atomic_t say;  /* 1: the handler speaks (rank 0); 2: after a progress line */
static volatile sig_atomic_t no_ckpt; /* --ckpt-every never: a stop writes no checkpoint */

/* s copied to p (no NUL): its length. Async-signal-safe, as put_u. */
static size_t put_s(char *p, const char *s)
{
	size_t n = 0;
	while (s[n]) {
		p[n] = s[n];
		n++;
	}
	return n;
}

static size_t put_u(char *p, long long v)
{
	char t[24];
	size_t n = 0, k = 0;
	do
		t[n++] = (char)('0' + (v < 0 ? 0 : v % 10));
	while ((v /= 10) > 0);
	while (n)
		p[k++] = t[--n];
	return k;
}

/* The handler's line on stderr: the first request, or (again) the one
 * that stops at once. */
static void say_stop(int sig, bool again)
{
	if (!say)
		return;
	char b[256];
	size_t n = 0;
	const char *name = sig == SIGINT ? "SIGINT" : "SIGTERM";
	if (say == 2)
		b[n++] = '\n';
	n += put_s(b + n, "dragon: ");
	n += put_s(b + n, name);
	if (again) {
		n += put_s(b + n, no_ckpt ? " again: stopping at once\n"
				  : " again: stopping at once (the newest checkpoint is whole; resume with --resume)\n");
	} else {
		n += put_s(b + n, no_ckpt ? ": stopping, without a checkpoint (" : ": stopping with a checkpoint (");
		n += put_u(b + n, (long long)run_at.step);
		n += put_s(b + n, run_at.step == 1 ? " step done); " : " steps done); ");
		n += put_s(b + n, sig == SIGINT ? "^C" : "SIGTERM");
		n += put_s(b + n, " again stops at once\n");
	}
	ssize_t w = write(2, b, n);
	(void)w; /* nothing to do about a stderr that takes no line */
}

static void on_stop(int sig, siginfo_t *si, void *ctx)
{
	(void)ctx;
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	const pid_t from = si && si->si_code == SI_USER ? si->si_pid : 0;
	if (!stop_signal) {
		stop_from = from;
		stop_at = now;
		stop_signal = sig;
		say_stop(sig, false);
		return;
	}
	const double dt = (double)(now.tv_sec - stop_at.tv_sec) + 1e-9 * (double)(now.tv_nsec - stop_at.tv_nsec);
	if (from && from == stop_from && dt < 1.0)
		return; /* the same request again (timeout(1): the child, then its group) */
	say_stop(sig, true);
	signal(sig, SIG_DFL); /* a second request: the default action, once this handler returns */
	raise(sig);
}

/* Installs on_stop for SIGINT and SIGTERM (each blocking both while it
 * runs), keeping the old actions in old[2]. */
static void catch_stop(struct sigaction old[2])
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_stop;
	sigemptyset(&sa.sa_mask);
	sigaddset(&sa.sa_mask, SIGINT);
	sigaddset(&sa.sa_mask, SIGTERM);
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	stop_signal = 0;
	sigaction(SIGINT, &sa, &old[0]);
	sigaction(SIGTERM, &sa, &old[1]);
}

static void release_stop(const struct sigaction old[2])
{
	sigaction(SIGINT, &old[0], NULL);
	sigaction(SIGTERM, &old[1], NULL);
}

/* This process's rank joins the others: the rendezvous (every rank has
 * 300 s to come), then on a GPU NCCL over them, rank 0's id handed out
 * through it. Returns the exit code (reported). */
static int join(const dg_dist *d, dg_device *dev, dg_train_world *w)
{
	char msg[1024];
	if (d->world > 1 && dg_rdzv_open(d, 300.0, &w->rdzv, msg, sizeof(msg)))
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_IO, "rank %d: %s", d->rank, msg);
	if (!dev)
		return DG__CLI_OK;
	uint8_t id[DG_COMM_ID_BYTES] = { 0 };
	dg_status st = d->rank == 0 ? dg_comm_unique_id(id, msg, sizeof(msg)) : DG_OK;
	if (!st && d->world > 1)
		st = dg_rdzv_bcast(w->rdzv, id, sizeof(id), msg, sizeof(msg));
	if (!st && (st = dg_comm_create(dev, id, d->world, d->rank, &w->comm)))
		snprintf(msg, sizeof(msg), "%s", dg_device_errmsg(dev));
	if (st) {
		dg_rdzv_close(w->rdzv);
		w->rdzv = NULL;
		return dg__cli_err(DG__CLI_FAIL, st, "rank %d: %s", d->rank, msg);
	}
	return DG__CLI_OK;
}

static void leave(dg_train_world *w, bool failed)
{
	dg_comm_destroy(w->comm, failed);
	dg_rdzv_close(w->rdzv);
	w->comm = NULL;
	w->rdzv = NULL;
}

int dg__cli_cmd_train(int argc, char **argv)
{
	const double t_cmd = dg__cli_now_s(); /* the first step counts from here */
	train_args a;
	int code = parse(argc, argv, &a);
	if (code)
		return code < 0 ? DG__CLI_OK : code;
	char msg[1024], dev_name[256];
	dg_device *dev = NULL;
	const char *ws = getenv("WORLD_SIZE");
	const bool ranked = ws && *ws; /* a rank, under this launcher or another */
	if (a.gpus > 1 && !ranked) {
		if (a.o.batch % (int)a.gpus)
			return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
					   "--batch %d --gpus %d: the batch must be a multiple of the GPUs (each takes a share)",
					   a.o.batch, (int)a.gpus);
		/* the launcher holds the folder for its ranks (rank 0 sees its
		 * parent holds it) */
		int lock = -1;
		if (dg_train_lock(a.o.out_dir, &lock, NULL, msg, sizeof(msg)))
			return dg__cli_err(DG__CLI_FAIL, DG_ERR_IO, "%s", msg);
		code = dg__cli_launch(argc, argv, (int)a.gpus, a.o.out_dir);
		dg_train_unlock(lock);
		return code;
	}
	dg_dist d = { .rank = 0, .world = 1 };
	if (ranked && dg_dist_from_env(&d, msg, sizeof(msg)))
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG, "%s", msg);
	if (ranked && a.gpus && (int)a.gpus != d.world)
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG, "--gpus %d, but WORLD_SIZE=%d", (int)a.gpus,
				   d.world);
	if (a.cpu && !a.preset_given && !dg_model_cpu_runs(&a.o.model))
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_UNSUPPORTED,
				   "--cpu: the default preset, %s, runs on an NVIDIA GPU only; add --preset f32 (or "
				   "w8a8, bitnet) to train on the CPU",
				   a.o.model.preset);
	if ((code = dg__cli_device_of(a.cpu, &a.o.model, d.local_rank, &dev, dev_name, sizeof(dev_name),
				      ranked ? NULL : no_gpu_next)))
		return code;
	a.o.dev = dev;
	dg_train_world world = { .rank = d.rank, .world = d.world, .check_every = a.o.eval_every };
	if (ranked || a.gpus) { /* the data-parallel path (a world of one with --gpus 1) */
		if ((code = join(&d, dev, &world))) {
			dg_device_close(dev);
			return code;
		}
		a.o.world = &world;
	}
	dg_corpus *c = NULL;
	dg_corpus_opts co = { .vocab = (int)a.vocab };
	dg_status st = a.data ? dg_corpus_open_with(a.data, &co, &c, msg, sizeof(msg))
			      : dg_corpus_builtin(&c, msg, sizeof(msg));
	if (st) {
		leave(&world, true);
		dg_device_close(dev);
		dg_corpus_close(c);
		return dg__cli_err(st == DG_ERR_INVALID_ARG ? DG__CLI_USAGE : DG__CLI_FAIL, st, "%s%s",
				   a.data ? "--data " : "", msg);
	}
	a.o.model.vocab = c->vocab; /* --vocab's, or the corpus's own */
	progress_state ps = { .tty = isatty(2) != 0 && d.rank == 0, .peak = dev ? dg__cli_peak_bf16(dev_name) : 0 };
	struct sigaction old[2];
	run_at = (dg_train_result){ 0 };
	say = d.rank != 0 ? 0 : ps.tty ? 2 : 1;
	no_ckpt = a.o.ckpt_every < 0;
	catch_stop(old);
	a.o.stop = &stop_signal;
	a.o.result = &run_at;
	a.o.warn = warn;
	double t0 = dg__cli_now_s();
	st = dg_train_run(&a.o, c, d.rank == 0 ? progress : NULL, &ps, msg, sizeof(msg));
	double secs = dg__cli_now_s() - t0;
	if (run_at.first_step_s > 0) { /* from the command's start: opening the device and the data too */
		run_at.first_step_s += t0 - t_cmd;
		run_at.ready_s += t0 - t_cmd;
	}
	release_stop(old);
	if (ps.tty)
		fputc('\n', stderr);
	char who[32] = ""; /* data parallel: which rank says it */
	if (world.world > 1)
		snprintf(who, sizeof(who), "rank %d: ", d.rank);
	const long long done = (long long)(run_at.step - run_at.first), total = (long long)a.o.opt.steps;
	if (dev && run_at.recompute && (world.world <= 1 || d.rank == 0))
		/* a plan that had to trade time for memory says so */
		fprintf(stderr, "dragon: the step saves no projection outputs (not enough device memory, "
				"--memory, or DRAGON_RECOMPUTE=1): its backward makes them again, two projections "
				"a layer\n");
	else if (dev && run_at.recompute_ys && (world.world <= 1 || d.rank == 0))
		fprintf(stderr, "dragon: the step saves no encoder_v output (not enough device memory, --memory, "
				"or DRAGON_RECOMPUTE=ys): its backward makes it again, a projection a layer\n");
	if (st && run_at.resume_refused) {
		code = dg__cli_err(DG__CLI_USAGE, st, "%s%s", who, msg);
	} else if (st == DG_ERR_INTERRUPTED) {
		/* a rank may stop because another got the signal (they agree) */
		code = dg__cli_err(128 + (stop_signal ? stop_signal : SIGTERM), st, "%s%s%s", who, msg,
				   a.o.ckpt_every < 0 ? "" : "; resume with --resume");
	} else if (st) {
		code = dg__cli_err(DG__CLI_FAIL, st, "%s%s", who, msg);
	} else if (d.rank != 0) {
		code = DG__CLI_OK; /* rank 0 reports */
	} else if (a.json) {
		cJSON *j = cJSON_CreateObject();
		cJSON_AddStringToObject(j, "preset", a.o.model.preset);
		cJSON_AddStringToObject(j, "device", dev ? "gpu" : "cpu");
		cJSON_AddStringToObject(j, "device_name", dev_name);
		cJSON_AddStringToObject(j, "data", a.data ? a.data : "builtin");
		cJSON_AddNumberToObject(j, "vocab", a.o.model.vocab);
		cJSON_AddStringToObject(j, "out", a.o.out_dir);
		cJSON_AddNumberToObject(j, "steps", (double)done);
		cJSON_AddNumberToObject(j, "step", (double)run_at.step);
		cJSON_AddNumberToObject(j, "total_steps", (double)total);
		cJSON_AddNumberToObject(j, "wall_s", secs);
		if (run_at.first_step_s > 0) {
			cJSON_AddNumberToObject(j, "ready_s", run_at.ready_s);
			cJSON_AddNumberToObject(j, "first_step_s", run_at.first_step_s);
			cJSON *su = cJSON_AddObjectToObject(j, "startup");
			cJSON_AddNumberToObject(su, "weights_s", run_at.weights_s);
			if (dev) {
				cJSON_AddNumberToObject(su, "model_s", run_at.model_s);
				cJSON *mp = cJSON_AddObjectToObject(su, "model");
				cJSON_AddNumberToObject(mp, "compile_s", run_at.model_compile_s);
				cJSON_AddNumberToObject(mp, "plan_s", run_at.model_plan_s);
				cJSON_AddNumberToObject(mp, "alloc_s", run_at.model_alloc_s);
				cJSON_AddNumberToObject(mp, "upload_s", run_at.model_upload_s);
				cJSON_AddNumberToObject(su, "optim_s", run_at.optim_s);
			}
		}
		if (dev) {
			cJSON *k = cJSON_AddObjectToObject(j, "kernels");
			cJSON_AddNumberToObject(k, "compiled", (double)run_at.kernels_compiled);
			cJSON_AddNumberToObject(k, "cached", (double)run_at.kernels_cached);
			cJSON_AddNumberToObject(k, "bundled", (double)run_at.kernels_bundled);
			if (run_at.peak_bytes)
				cJSON_AddNumberToObject(j, "peak_bytes", (double)run_at.peak_bytes);
			if (run_at.first_step_s > 0) {
				cJSON *pl = cJSON_AddObjectToObject(j, "plan");
				cJSON_AddBoolToObject(pl, "keep_qr", run_at.keep_qr);
				cJSON_AddBoolToObject(pl, "stack_pgrads", run_at.stack_pgrads);
				cJSON_AddBoolToObject(pl, "recompute", run_at.recompute);
				cJSON_AddBoolToObject(pl, "recompute_ys", run_at.recompute_ys);
				cJSON_AddNumberToObject(pl, "attn_chunk", run_at.attn_chunk);
			}
		}
		code = dg__cli_json_print(j);
	} else {
		char where[300];
		if (world.world > 1)
			snprintf(where, sizeof(where), "%d ranks (%s)", world.world, dev ? dev_name : "the CPU");
		else
			snprintf(where, sizeof(where), "%s", dev ? dev_name : "the CPU");
		char span[128] = ""; /* which of the run's steps, unless all of them */
		if (done == 0)
			snprintf(span, sizeof(span), " (the run was at step %lld of %lld)", (long long)run_at.step,
				 total);
		else if ((run_at.first != 0 || run_at.step != total) && done == 1)
			snprintf(span, sizeof(span), " (step %lld of %lld)", (long long)run_at.step, total);
		else if (run_at.first != 0 || run_at.step != total)
			snprintf(span, sizeof(span), " (steps %lld-%lld of %lld)", (long long)run_at.first + 1,
				 (long long)run_at.step, total);
		char first[200] = ""; /* the GPU: what the first step waited for */
		if (dev && run_at.first_step_s > 0)
			snprintf(first, sizeof(first),
				 " (the first step after %.2f s: the model ready after %.2f s, its kernels %zu "
				 "compiled, %zu from the cache, %zu from bundles)",
				 run_at.first_step_s, run_at.ready_s, run_at.kernels_compiled, run_at.kernels_cached,
				 run_at.kernels_bundled);
		char acc[32] = "";
		if (a.o.accum > 1)
			snprintf(acc, sizeof(acc), " (%d micro-batches)", a.o.accum);
		printf("trained: %s on %s, %lld step%s of %dx%d%s%s, in %.1f s%s; %s in %s\n",
		       a.o.model.preset, where, done, done == 1 ? "" : "s",
		       a.o.accum > 1 ? a.o.accum * a.o.batch : a.o.batch, a.o.time, acc, span, secs, first,
		       a.o.ckpt_every < 0 ? "log" : "log and checkpoints", a.o.out_dir);
	}
	leave(&world, st != DG_OK && st != DG_ERR_INTERRUPTED);
	dg_corpus_close(c);
	dg_device_close(dev);
	return code;
}
