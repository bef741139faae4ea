/*
 * `dragon train` on a GPU says how long its first step waited and where
 * the step's kernels came from: with an empty kernel cache they are
 * compiled, the same run again reads every one from the cache; the times
 * are ordered (the model ready before the first step's loss, both within
 * the run's wall time), and the device memory it took is reported. Without a GPU each test prints "skipped: no CUDA
 * device".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "cli_helpers.h"
#include "dragon/dragon.h"

#define SMALL "--preset", "bf16", "--layers", "1", "--embd", "64", "--heads", "2", "--neurons", \
	      "256", "--batch", "2", "--time", "32", "--eval-every", "0", "--seed", "3",       \
	      "--steps", "3"

/* Two layers: the encoders' weight gradients stacked (B·T 64). */
#define SMALL2 "--preset", "bf16", "--layers", "2", "--embd", "64", "--heads", "2", "--neurons", \
	       "256", "--batch", "2", "--time", "32", "--eval-every", "0", "--seed", "3",       \
	       "--steps", "3"

typedef struct first_step {
	double wall, ready, first, compiled, cached, bundled, peak;
	int keep_qr, stack_pgrads, recompute; /* plan's, -1 when missing */
	char err[2048];                       /* the run's stderr */
} first_step;

/* plan.<key> of the JSON: 1 true, 0 false, -1 missing or not a boolean. */
static int plan_bool(const cJSON *j, const char *key) /* j may be NULL */
{
	const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "plan");
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(p, key);
	return cJSON_IsBool(v) ? cJSON_IsTrue(v) : -1;
}

static first_step train_json_of(const sandbox *sb, const char *data, const char *out, bool two)
{
	run r;
	if (two)
		gen(sb, &r, "train", SMALL2, "--data", data, "--out", out, "--json", NULL);
	else
		gen(sb, &r, "train", SMALL, "--data", data, "--out", out, "--json", NULL);
	cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
	cJSON *j = parse_json(r.out);
	cr_assert(j, "not JSON: %s", r.out);
	const cJSON *k = cJSON_GetObjectItemCaseSensitive(j, "kernels");
	cr_assert(cJSON_IsObject(k), "no kernels: %s", r.out);
	first_step f = { num(j, "wall_s"), num(j, "ready_s"), num(j, "first_step_s"),
			 num(k, "compiled"), num(k, "cached"), num(k, "bundled"), num(j, "peak_bytes"),
			 plan_bool(j, "keep_qr"), plan_bool(j, "stack_pgrads"), plan_bool(j, "recompute"), "" };
	snprintf(f.err, sizeof(f.err), "%s", r.err);
	printf("plan: keep_qr %d, stack_pgrads %d, recompute %d\n", f.keep_qr, f.stack_pgrads, f.recompute);
	cr_expect(f.keep_qr >= 0 && f.stack_pgrads >= 0 && f.recompute >= 0, "no plan's choices: %s", r.out);
	printf("ready %.3f s, first step %.3f s, wall %.3f s; kernels %g compiled, %g cached, %g bundled; "
	       "%.0f bytes\n",
	       f.ready, f.first, f.wall, f.compiled, f.cached, f.bundled, f.peak);
	cr_expect(f.ready > 0 && f.ready <= f.first, "ready_s %g, first_step_s %g", f.ready, f.first);
	/* ready_s's parts: the weights, the model, its optimizer */
	const cJSON *su = cJSON_GetObjectItemCaseSensitive(j, "startup");
	cr_assert(cJSON_IsObject(su), "no startup: %s", r.out);
	double ws = num(su, "weights_s"), ms = num(su, "model_s"), os = num(su, "optim_s");
	printf("startup: weights %.3f s, model %.3f s, optimizer %.3f s\n", ws, ms, os);
	cr_expect(ws >= 0 && ms > 0 && os >= 0 && ws + ms + os <= f.ready, "startup %g + %g + %g, ready_s %g", ws,
		  ms, os, f.ready);
	/* model_s's parts: compile, plan, alloc, upload, each within it */
	const cJSON *mp = cJSON_GetObjectItemCaseSensitive(su, "model");
	cr_assert(cJSON_IsObject(mp), "no startup.model: %s", r.out);
	double mc = num(mp, "compile_s"), mpl = num(mp, "plan_s"), ma = num(mp, "alloc_s"), mu = num(mp, "upload_s");
	printf("model: compile %.3f s, plan %.3f s, alloc %.3f s, upload %.3f s\n", mc, mpl, ma, mu);
	cr_expect(mc >= 0 && mpl >= 0 && ma >= 0 && mu >= 0 && mc + mpl + ma + mu <= ms + 1e-3,
		  "model parts %g + %g + %g + %g, model_s %g", mc, mpl, ma, mu, ms);
	/* the weights alone (f32 masters, two moments) are more than 1 MB at this shape */
	cr_expect(f.peak > 1e6, "peak_bytes %g: the run's device memory", f.peak);
	cJSON_Delete(j);
	run_free(&r);
	return f;
}

static first_step train_json(const sandbox *sb, const char *data, const char *out)
{
	return train_json_of(sb, data, out, false);
}

Test(cli_train_gpu, the_first_step_says_what_it_waited_for)
{
	if (!gpu_or_skip())
		cr_skip_test("skipped: no CUDA device");
	sandbox sb;
	char data[600], out[600], out2[600];
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(&sb); /* its own, empty, kernel cache */
	text_file(&sb, data, sizeof(data), 20000);
	snprintf(out, sizeof(out), "%s/run", sb.root);
	snprintf(out2, sizeof(out2), "%s/again", sb.root);
	first_step a = train_json(&sb, data, out);
	cr_expect(a.compiled > 0, "an empty cache: the kernels are compiled (%g)", a.compiled);
	first_step b = train_json(&sb, data, out2);
	cr_expect(b.compiled == 0 && b.cached >= a.compiled,
		  "the same run again: every kernel from the cache (%g compiled, %g cached; %g the first time)",
		  b.compiled, b.cached, a.compiled);
	/* the line a person reads says the same */
	run r;
	char out3[600];
	snprintf(out3, sizeof(out3), "%s/text", sb.root);
	gen(&sb, &r, "train", SMALL, "--data", data, "--out", out3, NULL);
	cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
	cr_expect(strstr(r.out, "(the first step after ") && strstr(r.out, " compiled, ") &&
			  strstr(r.out, " from the cache, "),
		  "%s", r.out);
	run_free(&r);
	sandbox_fini(&sb);
}

/* DRAGON_RECOMPUTE=1: the step saves no projection outputs and its
 * backward makes them again — the same losses, byte for byte in the log
 * (two layers, dropout on: the bf16 preset's); the JSON's plan says
 * recompute (false by default: this step fits), and stderr says what it
 * traded. The default plan of two layers at B·T 64 stacks the encoders'
 * weight gradients. */
Test(cli_train_gpu, recompute_trains_the_same_steps)
{
	if (!gpu_or_skip())
		cr_skip_test("skipped: no CUDA device");
	sandbox sb;
	char data[600], out[600], out2[600];
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(&sb);
	text_file(&sb, data, sizeof(data), 20000);
	snprintf(out, sizeof(out), "%s/saved", sb.root);
	snprintf(out2, sizeof(out2), "%s/recomputed", sb.root);
	first_step a = train_json_of(&sb, data, out, true);
	cr_expect_eq(a.recompute, 0, "recompute by default where the step fits");
	cr_expect_eq(a.stack_pgrads, 1, "two layers at B·T 64: stacked weight gradients");
	cr_expect(strstr(a.err, "makes them again") == NULL, "%s", a.err);
	setenv("DRAGON_RECOMPUTE", "1", 1);
	first_step b = train_json_of(&sb, data, out2, true);
	unsetenv("DRAGON_RECOMPUTE");
	cr_expect_eq(b.recompute, 1, "DRAGON_RECOMPUTE=1: not recomputing");
	cr_expect(strstr(b.err, "makes them again"), "stderr: %s", b.err);
	expect_same_log(out2, "recomputing", out, "saving xs and ys");
	sandbox_fini(&sb);
}

/* --memory at the 25M model (w8a8, B 8, T 512): the plan that saves xs
 * and ys (5.2 GB, 6.7 with keep_qr) does not fit 4 GiB, the one that
 * makes ys again does (3.8 GB, AdamW's moments 0.2 more): plan.
 * recompute_ys and not recompute or keep_qr, the run's peak under the
 * budget, stderr says what it traded, and the losses are the default
 * plan's byte for byte (keep_qr and recompute_ys change no bit). 1G fits
 * no plan: refused before a step, naming the budget. */
Test(cli_train_gpu, memory_budget_trades_time_for_memory, .timeout = 600)
{
	if (!gpu_or_skip())
		cr_skip_test("skipped: no CUDA device");
	sandbox sb;
	char data[600], out[3][600];
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(&sb);
	text_file(&sb, data, sizeof(data), 40000);
	static const char *const names[3] = { "default", "budget", "small" };
	static const char *const budgets[3] = { NULL, "4G", "1G" };
	struct {
		int code, keep_qr, recompute, recompute_ys;
		double peak;
		char err[2048];
	} got[3];
	for (int i = 0; i < 3; i++) {
		snprintf(out[i], sizeof(out[i]), "%s/%s", sb.root, names[i]);
		run r;
		if (budgets[i])
			gen(&sb, &r, "train", "--preset", "w8a8", "--batch", "8", "--time", "512", "--steps", "3",
			    "--eval-every", "0", "--seed", "3", "--memory", budgets[i], "--data", data, "--out", out[i],
			    "--json", NULL);
		else
			gen(&sb, &r, "train", "--preset", "w8a8", "--batch", "8", "--time", "512", "--steps", "3",
			    "--eval-every", "0", "--seed", "3", "--data", data, "--out", out[i], "--json", NULL);
		got[i].code = r.code;
		snprintf(got[i].err, sizeof(got[i].err), "%s", r.err);
		cJSON *j = r.code == 0 ? parse_json(r.out) : NULL;
		got[i].keep_qr = plan_bool(j, "keep_qr");
		got[i].recompute = plan_bool(j, "recompute");
		got[i].recompute_ys = plan_bool(j, "recompute_ys");
		got[i].peak = j ? num(j, "peak_bytes") : 0;
		printf("memory %s: exit %d, keep_qr %d, recompute %d, recompute_ys %d, peak %.0f bytes\n",
		       budgets[i] ? budgets[i] : "(free)", r.code, got[i].keep_qr, got[i].recompute,
		       got[i].recompute_ys, got[i].peak);
		cJSON_Delete(j);
		run_free(&r);
	}
	cr_assert_eq(got[0].code, 0, "%s", got[0].err);
	cr_expect_eq(got[0].recompute_ys, 0, "the whole device: nothing recomputed");
	cr_assert_eq(got[1].code, 0, "%s", got[1].err);
	cr_expect(got[1].recompute_ys == 1 && got[1].recompute == 0 && got[1].keep_qr == 0,
		  "4G: keep_qr %d, recompute %d, recompute_ys %d", got[1].keep_qr, got[1].recompute,
		  got[1].recompute_ys);
	cr_expect(got[1].peak > 1e9 && got[1].peak <= 4.0 * (1 << 30), "4G: peak %.0f bytes", got[1].peak);
	cr_expect(got[0].peak > got[1].peak, "peak %.0f with the whole device, %.0f under 4G", got[0].peak,
		  got[1].peak);
	cr_expect(strstr(got[1].err, "saves no encoder_v output"), "stderr: %s", got[1].err);
	expect_same_log(out[1], "under --memory 4G", out[0], "the default plan");
	cr_expect_eq(got[2].code, 1, "1G: exit %d", got[2].code);
	cr_expect(strstr(got[2].err, "DRAGON_MEMORY=1G"), "1G: %s", got[2].err);
	sandbox_fini(&sb);
}
