/*
 * A training run's checkpoints (dragon/checkpoint.h, runtime/train/
 * checkpoint.c), with no device:
 *   - save then load gives back every tensor byte for byte and every
 *     counter and hyper-parameter exactly (floats through %.9g);
 *   - file_sha256 is the hash of the whole file with its own 64 digits
 *     written as '0' (sha256sum);
 *   - refused with the path and what is wrong: a missing file, a
 *     truncated one, one bit flipped in a tensor (DG_ERR_CORRUPT, by the
 *     seal), a weights file that is not a checkpoint, a missing moment
 *     (named), a counter that is not a number (step, time); an unsealed
 *     dragon-checkpoint-1 saved before "time" and "data_sha256" were
 *     written loads (time 0); a failed save (no such folder) leaves
 *     nothing behind;
 *   - resuming: a config or optimizer that differs is named field by
 *     field; the same one matches;
 *   - pruning keeps the newest k by step, leaves other files alone,
 *     reports the latest; it removes the temp files of saves whose
 *     process died (never counting them), not a live writer's;
 *   - where python3 can import torch, safetensors.torch.load_file reads
 *     the weights under the reference's names, the same bytes.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dragon/checkpoint.h"
#include "runtime/store/safetensors.h"
#include "helpers.h"

/* A state some steps in: random weights, moments and counters. */
static dg_train_state *made(const dg_model_config *c)
{
	dg_adamw_config o;
	dg_adamw_defaults(&o, 300);
	o.lr = 3e-4f;
	o.clip = 0.7f;
	dg_train_state *s = dg_test_train_state(c, &o);
	s->step = 123;
	s->data_pos = 124;
	s->time = 64;
	for (int i = 0; i < 7; i++)
		dg_rng_u64(&s->data_rng);
	return s;
}

static void same_state(const dg_train_state *a, const dg_train_state *b)
{
	const dg_model_config *c = &a->weights->config;
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		size_t n = dg_test_numel(c, p) * 4;
		cr_assert_eq(memcmp(a->weights->params[p], b->weights->params[p], n), 0, "param %d", p);
		cr_assert_eq(memcmp(a->m[p], b->m[p], n), 0, "m %d", p);
		cr_assert_eq(memcmp(a->v[p], b->v[p], n), 0, "v %d", p);
	}
	cr_assert_eq(a->step, b->step);
	cr_assert_eq(a->seed, b->seed);
	cr_assert_eq(a->data_pos, b->data_pos);
	cr_assert_eq(a->time, b->time);
	cr_assert_eq(a->data_rng.state, b->data_rng.state);
	cr_assert_eq(a->scaler.mode, b->scaler.mode);
	cr_assert_eq(a->scaler.scale, b->scaler.scale);
	cr_assert_eq(a->scaler.good_steps, b->scaler.good_steps);
	cr_assert_eq(a->scaler.growth_interval, b->scaler.growth_interval);
	const dg_adamw_config *x = &a->opt, *y = &b->opt;
	cr_assert(x->lr == y->lr && x->beta1 == y->beta1 && x->beta2 == y->beta2 && x->eps == y->eps &&
		  x->weight_decay == y->weight_decay && x->clip == y->clip && x->warmup == y->warmup &&
		  x->steps == y->steps && x->lr_floor == y->lr_floor, "the optimizer's config");
	cr_assert_eq(b->weights->config.dropout, c->dropout);
	cr_assert_eq(b->weights->config.heads, c->heads);
}

/* The metadata of edit *u of save_load_roundtrip_exact: k 1 step "x",
 * k 2 time "x", k 3 the dragon-checkpoint-1 form (no time, seal or kind). */
static const char *edit_k(void *u, const char *key, const char *val)
{
	static const char *const bad_key[4] = { NULL, "step", "time", NULL };
	int k = *(const int *)u;
	if (k == 3 && (!strcmp(key, "time") || !strcmp(key, "file_sha256") || !strcmp(key, "kind")))
		return NULL;
	if (k == 3 && !strcmp(key, "format"))
		return "dragon-checkpoint-1";
	return bad_key[k] && !strcmp(key, bad_key[k]) ? "x" : val;
}

Test(checkpoint, save_load_roundtrip_exact)
{
	dg_model_config c = dg_test_tiny_model("f32");
	dg_train_state *s = made(&c), *b = NULL;
	char *dir = dg_test_tmpdir(), path[512], msg[512];
	dg_checkpoint_path(dir, s->step, path, sizeof(path));
	cr_assert(strstr(path, "/ckpt-00000123.safetensors"), "%s", path);
	cr_assert_eq(dg_checkpoint_save(s, path, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_checkpoint_load(path, &b, msg, sizeof(msg)), DG_OK, "%s", msg);
	same_state(s, b);
	dg_train_state_destroy(b);
	/* file_sha256 is the SHA-256 of the whole file with its 64 digits
	 * written as '0', as sha256sum sees it */
	if (system("command -v sha256sum >/dev/null 2>&1") == 0) {
		dg_safetensors *f;
		cr_assert_eq(dg_safetensors_load(path, &f, msg, sizeof(msg)), DG_OK, "%s", msg);
		const char *want = dg_safetensors_meta(f, "file_sha256");
		cr_assert(want && strlen(want) == 64, "%s", want ? want : "(no file_sha256)");
		cr_assert_null(dg_safetensors_meta(f, "data_sha256"));
		cr_assert_str_eq(dg_safetensors_meta(f, "kind"), "checkpoint");
		cr_assert_str_eq(dg_safetensors_meta(f, "format"), "dragon-checkpoint-2");
		size_t n;
		char *bytes = dg_test_read_bytes(path, &n), *at = NULL;
		for (size_t i = 0; i + 15 <= n && !at; i++)
			if (memcmp(bytes + i, "\"file_sha256\":\"", 15) == 0)
				at = bytes + i + 15;
		cr_assert(at && memcmp(at, want, 64) == 0, "the seal is not in the header as written");
		memset(at, '0', 64);
		char zeroed[600], cmd[1400], got[65] = "";
		snprintf(zeroed, sizeof(zeroed), "%s.zeroed", path);
		dg_test_write_bytes(zeroed, bytes, n);
		free(bytes);
		snprintf(cmd, sizeof(cmd), "sha256sum '%s'", zeroed);
		FILE *pp = popen(cmd, "r");
		cr_assert_not_null(pp);
		cr_assert_eq(fscanf(pp, "%64s", got), 1);
		pclose(pp);
		cr_assert_str_eq(got, want);
		unlink(zeroed);
		dg_safetensors_destroy(f);
	}
	/* saved again over itself: the same file loads the same */
	cr_assert_eq(dg_checkpoint_save(s, path, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_checkpoint_load(path, &b, msg, sizeof(msg)), DG_OK, "%s", msg);
	same_state(s, b);
	dg_train_state_destroy(b);
	dg_train_state_destroy(s);
}

Test(checkpoint, bad_files_are_refused_by_name)
{
	dg_model_config c = dg_test_tiny_model("f32");
	dg_train_state *s = made(&c), *b = (dg_train_state *)1;
	char *dir = dg_test_tmpdir(), path[512], other[512], msg[512];
	snprintf(path, sizeof(path), "%s/good.safetensors", dir);
	cr_assert_eq(dg_checkpoint_save(s, path, msg, sizeof(msg)), DG_OK, "%s", msg);

	snprintf(other, sizeof(other), "%s/none.safetensors", dir);
	cr_assert_eq(dg_checkpoint_load(other, &b, msg, sizeof(msg)), DG_ERR_NOT_FOUND, "%s", msg);
	cr_assert_null(b);

	size_t n;
	unsigned char *bytes = dg_test_read_bytes(path, &n);
	snprintf(other, sizeof(other), "%s/cut.safetensors", dir);
	dg_test_write_bytes(other, bytes, n / 2);
	cr_assert_neq(dg_checkpoint_load(other, &b, msg, sizeof(msg)), DG_OK, "a truncated file loaded");
	cr_assert(strstr(msg, "cut.safetensors"), "%s", msg);

	/* one flipped bit in a tensor: it parses, the hash refuses it */
	unsigned char *flip = malloc(n);
	memcpy(flip, bytes, n);
	flip[n - 5] ^= 0x10; /* in adamw.v.lm_head, the last tensor */
	snprintf(other, sizeof(other), "%s/flip.safetensors", dir);
	dg_test_write_bytes(other, flip, n);
	free(flip);
	cr_assert_eq(dg_checkpoint_load(other, &b, msg, sizeof(msg)), DG_ERR_CORRUPT, "%s", msg);
	cr_assert(strstr(msg, "flip.safetensors: damaged: its bytes hash to "), "%s", msg);
	cr_assert_null(b);

	/* a weights file is not a checkpoint */
	snprintf(other, sizeof(other), "%s/weights.safetensors", dir);
	cr_assert_eq(dg_model_weights_save(s->weights, other, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_checkpoint_load(other, &b, msg, sizeof(msg)), DG_ERR_PARSE);
	cr_assert(strstr(msg, "not a checkpoint"), "%s", msg);

	/* a missing moment, a counter that is not a number: rewrite the file
	 * (sealed again) without adamw.v.decoder, with step "x", with time
	 * "x"; and as a dragon-checkpoint-1 without time and data_sha256 (a
	 * file saved before they were written: no seal, no kind), which
	 * loads, with time 0 */
	dg_safetensors *f;
	cr_assert_eq(dg_safetensors_load(path, &f, msg, sizeof(msg)), DG_OK, "%s", msg);
	for (int k = 0; k < 4; k++) {
		dg_safetensors_writer *w = dg_test_rewrite(f, k == 0 ? "adamw.v.decoder" : NULL, edit_k, &k);
		if (k < 3)
			cr_assert_eq(dg_safetensors_writer_seal(w, "file_sha256", msg, sizeof(msg)), DG_OK, "%s", msg);
		snprintf(other, sizeof(other), "%s/edit%d.safetensors", dir, k);
		cr_assert_eq(dg_safetensors_writer_save(w, other, msg, sizeof(msg)), DG_OK, "%s", msg);
		dg_safetensors_writer_destroy(w);
		if (k == 3) {
			cr_assert_eq(dg_checkpoint_load(other, &b, msg, sizeof(msg)), DG_OK, "%s", msg);
			cr_assert_eq(b->time, 0);
			cr_assert_eq(b->step, s->step);
			dg_train_state_destroy(b);
			b = NULL;
			continue;
		}
		cr_assert_eq(dg_checkpoint_load(other, &b, msg, sizeof(msg)), DG_ERR_PARSE, "edit %d loaded", k);
		cr_assert(strstr(msg, k == 0 ? "adamw.v.decoder" : k == 1 ? "step='x'" : "time='x'"), "%s", msg);
		cr_assert_null(b);
	}
	dg_safetensors_destroy(f);

	/* a save into a folder that is not there: an error, nothing written */
	snprintf(other, sizeof(other), "%s/no/such/ckpt.safetensors", dir);
	cr_assert_eq(dg_checkpoint_save(s, other, msg, sizeof(msg)), DG_ERR_IO);
	struct stat st;
	cr_assert_neq(stat(other, &st), 0);
	/* the good file is as it was */
	size_t n2;
	unsigned char *again = dg_test_read_bytes(path, &n2);
	cr_assert(n2 == n && memcmp(again, bytes, n) == 0);
	free(bytes);
	free(again);
	dg_train_state_destroy(s);
}

Test(checkpoint, resume_names_what_differs)
{
	dg_model_config c = dg_test_tiny_model("f32");
	dg_train_state *s = made(&c);
	char msg[256];
	dg_adamw_config o = s->opt;
	cr_assert_eq(dg_checkpoint_match(s, &c, &o, DG_LOSS_SCALE_OFF, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_model_config h = c;
	h.heads = 4;
	cr_assert_eq(dg_checkpoint_match(s, &h, &o, DG_LOSS_SCALE_OFF, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert_str_eq(msg, "heads: the checkpoint's 2, this run's 4");
	h = c;
	snprintf(h.preset, sizeof(h.preset), "bf16");
	cr_assert_eq(dg_checkpoint_match(s, &h, &o, DG_LOSS_SCALE_OFF, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "preset: the checkpoint's 'f32', this run's 'bf16'"), "%s", msg);
	dg_adamw_config p = o;
	p.lr = 1e-3f;
	cr_assert_eq(dg_checkpoint_match(s, &c, &p, DG_LOSS_SCALE_OFF, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "lr: the checkpoint's 0.000300000014, this run's 0.00100000005") == msg, "%s", msg);
	p = o;
	p.steps = 1500;
	cr_assert_eq(dg_checkpoint_match(s, &c, &p, DG_LOSS_SCALE_OFF, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "steps:") == msg, "%s", msg);
	dg_train_state_destroy(s);
}

/* The loss scaler's state round-trips exactly (S, the count, the
 * interval); a resume with the other --loss-scale setting is refused by
 * name; a file without the scaler's keys (saved before they were
 * written: here the key renamed in place, which the seal refuses, then
 * the file made an unsealed dragon-checkpoint-1 in place too) loads as
 * off. */
Test(checkpoint, loss_scaler_state_roundtrips)
{
	dg_model_config c = dg_test_tiny_model("f32");
	dg_train_state *s = made(&c), *b = NULL;
	char *dir = dg_test_tmpdir(), path[512], msg[512];
	snprintf(path, sizeof(path), "%s/ls.safetensors", dir);
	s->scaler = (dg_loss_scaler){ .mode = DG_LOSS_SCALE_DYNAMIC, .growth_interval = 2000,
				      .scale = 8192.0f, .good_steps = 17 };
	cr_assert_eq(dg_checkpoint_save(s, path, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_checkpoint_load(path, &b, msg, sizeof(msg)), DG_OK, "%s", msg);
	same_state(s, b);
	cr_assert_eq(b->scaler.scale, 8192.0f);
	cr_assert_eq(b->scaler.good_steps, 17u);
	cr_assert_eq(dg_checkpoint_match(b, &c, &b->opt, DG_LOSS_SCALE_DYNAMIC, msg, sizeof(msg)), DG_OK, "%s",
		     msg);
	cr_assert_eq(dg_checkpoint_match(b, &c, &b->opt, DG_LOSS_SCALE_OFF, msg, sizeof(msg)),
		     DG_ERR_INVALID_ARG);
	cr_assert_str_eq(msg, "loss_scale: the checkpoint's dynamic, this run's off (--loss-scale)");
	dg_train_state_destroy(b);
	/* off, and an older file without the key */
	dg_loss_scaler_defaults(&s->scaler, false);
	cr_assert_eq(dg_checkpoint_match(s, &c, &s->opt, DG_LOSS_SCALE_DYNAMIC, msg, sizeof(msg)),
		     DG_ERR_INVALID_ARG);
	cr_assert_str_eq(msg, "loss_scale: the checkpoint's off, this run's dynamic (--loss-scale)");
	cr_assert_eq(dg_checkpoint_save(s, path, msg, sizeof(msg)), DG_OK, "%s", msg);
	size_t n;
	char *bytes = dg_test_read_bytes(path, &n);
	/* the key renamed: "loss_scalX", a key nothing reads */
	static const char *const texts[4] = { "\"loss_scale\"", "\"kind\"", "\"file_sha256\"",
					      "\"dragon-checkpoint-2\"" };
	for (int k = 0; k < 4; k++) {
		size_t len = strlen(texts[k]);
		int found = 0;
		for (size_t i = 0; i + len <= n; i++)
			if (memcmp(bytes + i, texts[k], len) == 0) {
				bytes[i + len - 2] = k == 3 ? '1' : 'X';
				found++;
			}
		cr_assert_eq(found, 1, "%s should be in the header once", texts[k]);
		dg_test_write_bytes(path, bytes, n);
		if (k == 0) {
			cr_assert_eq(dg_checkpoint_load(path, &b, msg, sizeof(msg)), DG_ERR_CORRUPT, "%s", msg);
			cr_assert(strstr(msg, "ls.safetensors: damaged: "), "%s", msg);
		}
	}
	free(bytes);
	cr_assert_eq(dg_checkpoint_load(path, &b, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(b->scaler.mode, DG_LOSS_SCALE_OFF);
	cr_assert_eq(b->scaler.scale, 1.0f);
	dg_train_state_destroy(b);
	dg_train_state_destroy(s);
}

Test(checkpoint, prune_keeps_the_newest)
{
	char *dir = dg_test_tmpdir(), path[512], msg[256];
	const int steps[] = { 1, 2, 3, 4, 5 };
	for (int i = 0; i < 5; i++) {
		dg_checkpoint_path(dir, steps[i], path, sizeof(path));
		dg_test_write_bytes(path, "x", 1);
	}
	snprintf(path, sizeof(path), "%s/ckpt-0007.safetensors", dir); /* another width */
	dg_test_write_bytes(path, "x", 1);
	snprintf(path, sizeof(path), "%s/notes.txt", dir);
	dg_test_write_bytes(path, "x", 1);
	snprintf(path, sizeof(path), "%s/ckpt-12x.safetensors", dir);
	dg_test_write_bytes(path, "x", 1);
	int64_t latest = 0;
	cr_assert_eq(dg_checkpoint_prune(dir, 2, &latest, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(latest, 7);
	static const char *const left[] = { "ckpt-0007.safetensors", "ckpt-00000005.safetensors", "notes.txt",
					    "ckpt-12x.safetensors" };
	static const char *const gone[] = { "ckpt-00000001.safetensors", "ckpt-00000004.safetensors" };
	struct stat st;
	for (int i = 0; i < 4; i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, left[i]);
		cr_assert_eq(stat(path, &st), 0, "%s removed", left[i]);
	}
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, gone[i]);
		cr_assert_neq(stat(path, &st), 0, "%s kept", gone[i]);
	}
	cr_assert_eq(dg_checkpoint_prune(dir, 0, &latest, msg, sizeof(msg)), DG_OK);
	snprintf(path, sizeof(path), "%s/missing", dir);
	cr_assert_eq(dg_checkpoint_prune(path, 2, &latest, msg, sizeof(msg)), DG_ERR_NOT_FOUND);
	cr_assert_eq(latest, -1);
}

/* The temp files of saves that died (a kill -9 mid-write): never a
 * checkpoint to prune's count, removed when their writer is gone or is
 * this process; a live writer's and other files stay. */
Test(checkpoint, prune_removes_dead_saves_temp_files)
{
	size_t n;
	long pid;
	cr_assert(dg_safetensors_temp_of("ckpt-00000012.safetensors.tmp.4242.1f0a", &n, &pid));
	cr_assert_eq(n, strlen("ckpt-00000012.safetensors"));
	cr_assert_eq(pid, 4242);
	cr_assert(dg_safetensors_temp_of("a.tmp.b.tmp.7.ff", &n, &pid) && n == 7 && pid == 7);
	static const char *const not_temps[] = { "ckpt-00000012.safetensors", "log.jsonl.tmp", ".tmp.1.a",
						 "x.tmp.12", "x.tmp.12.", "x.tmp..ab", "x.tmp.1x.ab", "x.tmp.1.xy" };
	for (size_t i = 0; i < sizeof(not_temps) / sizeof(not_temps[0]); i++)
		cr_assert_not(dg_safetensors_temp_of(not_temps[i], NULL, NULL), "%s", not_temps[i]);

	/* a pid that is surely gone: a child's, reaped */
	pid_t dead = fork();
	cr_assert_neq(dead, -1);
	if (dead == 0)
		_exit(0);
	cr_assert_eq(waitpid(dead, NULL, 0), dead);
	char *dir = dg_test_tmpdir(), path[512], name[256], msg[256];
	for (int i = 1; i <= 3; i++) {
		dg_checkpoint_path(dir, i, path, sizeof(path));
		dg_test_write_bytes(path, "x", 1);
	}
	const struct {
		long pid;
		int step;
		bool gone;
	} temps[] = { { (long)dead, 9, true }, { (long)getpid(), 4, true }, { 1, 8, false } };
	for (int i = 0; i < 3; i++) {
		snprintf(path, sizeof(path), "%s/ckpt-%08d.safetensors.tmp.%ld.abc", dir, temps[i].step, temps[i].pid);
		dg_test_write_bytes(path, "x", 1);
	}
	snprintf(path, sizeof(path), "%s/weights.safetensors.tmp.%ld.abc", dir, (long)dead);
	dg_test_write_bytes(path, "x", 1);
	snprintf(path, sizeof(path), "%s/log.jsonl.tmp", dir);
	dg_test_write_bytes(path, "x", 1);
	int64_t latest = 0;
	cr_assert_eq(dg_checkpoint_prune(dir, 2, &latest, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(latest, 3, "a temp file counted as a checkpoint (latest %lld)", (long long)latest);
	struct stat st;
	for (int i = 0; i < 3; i++) {
		snprintf(path, sizeof(path), "%s/ckpt-%08d.safetensors.tmp.%ld.abc", dir, temps[i].step, temps[i].pid);
		cr_assert_eq(stat(path, &st) != 0, temps[i].gone, "%s: %s", path, temps[i].gone ? "kept" : "removed");
	}
	snprintf(name, sizeof(name), "weights.safetensors.tmp.%ld.abc", (long)dead);
	const char *left[] = { "ckpt-00000003.safetensors", "ckpt-00000002.safetensors", "log.jsonl.tmp", name };
	for (int i = 0; i < 4; i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, left[i]);
		cr_assert_eq(stat(path, &st), 0, "%s removed", left[i]);
	}
	dg_checkpoint_path(dir, 1, path, sizeof(path));
	cr_assert_neq(stat(path, &st), 0, "step 1 kept past keep = 2");
	/* keep < 1 keeps every checkpoint, still not the dead temps */
	snprintf(path, sizeof(path), "%s/ckpt-%08d.safetensors.tmp.%ld.abc", dir, 5, (long)dead);
	dg_test_write_bytes(path, "x", 1);
	cr_assert_eq(dg_checkpoint_prune(dir, 0, &latest, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(latest, 3);
	cr_assert_neq(stat(path, &st), 0, "%s kept", path);
	dg_test_rmtree(dir);
}

Test(checkpoint, pytorch_reads_the_weights)
{
	if (!dg_test_need(system("python3 -c 'import torch, safetensors' >/dev/null 2>&1") == 0, "no torch",
			  "python3 cannot import torch, safetensors: scripts/test.sh installs them into .venv"))
		return;
	dg_model_config c = dg_test_tiny_model("f32");
	dg_train_state *s = made(&c);
	char *dir = dg_test_tmpdir(), path[512], out[512], cmd[2048], msg[256];
	snprintf(path, sizeof(path), "%s/c.safetensors", dir);
	snprintf(out, sizeof(out), "%s/enc.bin", dir);
	cr_assert_eq(dg_checkpoint_save(s, path, msg, sizeof(msg)), DG_OK, "%s", msg);
	snprintf(cmd, sizeof(cmd),
		 "python3 -c \"import sys; from safetensors.torch import load_file; d = load_file(sys.argv[1]); "
		 "assert [tuple(d[k].shape) for k in ('embed.weight', 'encoder', 'encoder_v', 'decoder', 'lm_head')] == "
		 "[(256, 32), (2, 32, 64), (2, 32, 64), (128, 32), (32, 256)], 'shapes'; "
		 "open(sys.argv[2], 'wb').write(bytes(d['encoder'].contiguous().untyped_storage()))\" %s %s",
		 path, out);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	size_t n;
	void *enc = dg_test_read_bytes(out, &n);
	cr_assert_eq(n, dg_test_numel(&c, DG_PARAM_ENCODER) * 4);
	cr_assert_eq(memcmp(enc, s->weights->params[DG_PARAM_ENCODER], n), 0);
	free(enc);
	dg_train_state_destroy(s);
}
