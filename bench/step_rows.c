/*
 * The step bench's rows from other programs (bench/step.c): a shell
 * command's JSON lines with the reason it failed, the floor of each node
 * kind (bench/step_floor.py) attached to a preset's breakdown, the PyTorch
 * anchor's training-step row, and their lines on stderr. Names start with
 * bs_. The GPU plays no part here: tests/test_step_floor.c runs it all on
 * the CPU.
 */
#include "bench/step_rows.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* The file at path copied to stderr; its last non-empty line into buf ("" if
 * none). */
static void copy_stderr(const char *path, char *buf, size_t size)
{
	buf[0] = '\0';
	FILE *f = fopen(path, "r");
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;
	while (f && (n = getline(&line, &cap, f)) >= 0) {
		fputs(line, stderr);
		while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' '))
			line[--n] = '\0';
		if (n > 0)
			snprintf(buf, size, "%s", line);
	}
	free(line);
	if (f)
		fclose(f);
}

/* The command in braces, its stderr to a file named by mkstemp (in
 * $TMPDIR unless that holds a quote, which the shell line cannot carry). */
bool bs_run_json(const char *cmd, cJSON *out, char *why, size_t size)
{
	const char *dir = getenv("TMPDIR");
	if (!dir || !*dir || strchr(dir, '\''))
		dir = "/tmp";
	char path[512];
	snprintf(path, sizeof(path), "%s/dg-step-XXXXXX", dir);
	int fd = mkstemp(path);
	if (fd < 0) {
		snprintf(why, size, "cannot make a temporary file in %s", dir);
		return false;
	}
	close(fd);
	size_t len = strlen(cmd) + strlen(path) + 16;
	char *full = malloc(len), *line = NULL, jerr[512] = "", tail[512] = "";
	size_t cap = 0;
	int objects = 0, st = -1;
	FILE *p = NULL;
	if (full) {
		snprintf(full, len, "{ %s ; } 2>'%s'", cmd, path);
		fflush(stdout);
		fflush(stderr);
		p = popen(full, "r");
	}
	while (p && getline(&line, &cap, p) >= 0) {
		cJSON *o = cJSON_Parse(line);
		if (!cJSON_IsObject(o)) {
			cJSON_Delete(o);
			continue;
		}
		const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
		if (cJSON_IsString(e))
			snprintf(jerr, sizeof(jerr), "%s", e->valuestring);
		cJSON_AddItemToArray(out, o);
		objects++;
	}
	if (p)
		st = pclose(p);
	copy_stderr(path, tail, sizeof(tail));
	unlink(path);
	free(line);
	free(full);
	if (st == 0 && objects > 0 && !jerr[0])
		return true;
	if (!p)
		snprintf(why, size, "cannot run %s", cmd);
	else if (jerr[0])
		snprintf(why, size, "%s", jerr);
	else if (st == 0)
		snprintf(why, size, "no JSON object on its output%s%s", tail[0] ? ": " : "", tail);
	else if (st != -1 && WIFEXITED(st))
		snprintf(why, size, "%s (exit %d)", tail[0] ? tail : "failed", WEXITSTATUS(st));
	else
		snprintf(why, size, "%s (killed by signal %d)", tail[0] ? tail : "killed",
			 st != -1 && WIFSIGNALED(st) ? WTERMSIG(st) : 0);
	return false;
}

/* The last object of arr that has member key, or NULL. */
static cJSON *last_with(cJSON *arr, const char *key)
{
	cJSON *it, *found = NULL;
	cJSON_ArrayForEach(it, arr)
		if (cJSON_GetObjectItemCaseSensitive(it, key))
			found = it;
	return found;
}

/* cmd followed by the model's shape (c) and B, T as --layers ... --time
 * arguments (vocab: with_vocab), then tail; malloc'd (the caller frees), NULL
 * when out of memory. */
static char *with_shape(const char *cmd, const dg_model_config *c, bool with_vocab, int B, int T,
			const char *tail)
{
	size_t len = strlen(cmd) + strlen(tail) + 160;
	char *s = malloc(len);
	if (!s)
		return NULL;
	int n = snprintf(s, len, "%s --layers %d --embd %d --heads %d --neurons %d", cmd, c->layers, c->embd,
			 c->heads, c->neurons);
	if (with_vocab)
		n += snprintf(s + n, len - (size_t)n, " --vocab %d", c->vocab);
	snprintf(s + n, len - (size_t)n, " --batch %d --time %d%s", B, T, tail);
	return s;
}

cJSON *bs_run_floor(const char *cmd, const dg_model_config *c, int B, int T, char *why, size_t size)
{
	char *full = with_shape(cmd, c, true, B, T, "");
	cJSON *lines = cJSON_CreateArray(), *doc = NULL;
	fprintf(stderr, "step: the floor: %s\n", full ? full : cmd);
	if (!full || !lines)
		snprintf(why, size, "out of memory");
	else if (bs_run_json(full, lines, why, size)) {
		cJSON *last = last_with(lines, "presets");
		if (last && cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(last, "presets")))
			doc = cJSON_DetachItemViaPointer(lines, last);
		else
			snprintf(why, size, "no \"presets\" in its output");
	}
	cJSON_Delete(lines);
	free(full);
	return doc;
}

void bs_attach_floor(cJSON *row, const cJSON *floor_doc, const char *floor_why)
{
	cJSON *br = cJSON_GetObjectItemCaseSensitive(row, "breakdown"), *b;
	const cJSON *pr = cJSON_GetObjectItemCaseSensitive(row, "preset");
	if (!cJSON_IsArray(br) || !cJSON_IsString(pr))
		return;
	if (!floor_doc) {
		if (floor_why)
			cJSON_AddStringToObject(row, "floor_error", floor_why);
		return;
	}
	const char *preset = pr->valuestring;
	const cJSON *kinds = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(floor_doc, "presets"),
							      preset);
	char missing[512] = "";
	size_t ml = 0;
	double sum = 0;
	cJSON_ArrayForEach(b, br) {
		const cJSON *w = cJSON_GetObjectItemCaseSensitive(b, "what"), *c = cJSON_GetObjectItemCaseSensitive(b, "count"),
			    *ms = cJSON_GetObjectItemCaseSensitive(b, "ms");
		const char *what = cJSON_IsString(w) ? w->valuestring : "?";
		const cJSON *k = cJSON_GetObjectItemCaseSensitive(kinds, what);
		const cJSON *fc = cJSON_GetObjectItemCaseSensitive(k, "count"), *fm = cJSON_GetObjectItemCaseSensitive(k, "floor_ms"),
			    *fh = cJSON_GetObjectItemCaseSensitive(k, "how");
		int count = cJSON_IsNumber(c) ? c->valueint : -1;
		char how[256];
		if (!k)
			snprintf(how, sizeof(how), "no floor: the floor has no %s node for preset %s", what, preset);
		else if (!cJSON_IsNumber(fc) || fc->valueint != count)
			snprintf(how, sizeof(how), "no floor: the step ran %d %s nodes, the floor counts %d", count, what,
				 cJSON_IsNumber(fc) ? fc->valueint : -1);
		else if (!cJSON_IsNumber(fm) || !(fm->valuedouble > 0))
			snprintf(how, sizeof(how), "no floor: none measured for %s", what);
		else {
			cJSON_AddNumberToObject(b, "floor_ms", fm->valuedouble);
			cJSON_AddStringToObject(b, "floor_how", cJSON_IsString(fh) ? fh->valuestring : "");
			if (cJSON_IsNumber(ms))
				cJSON_AddNumberToObject(b, "ratio", ms->valuedouble / fm->valuedouble);
			sum += fm->valuedouble;
			continue;
		}
		cJSON_AddStringToObject(b, "floor_how", how);
		int n = snprintf(missing + ml, sizeof(missing) - ml, "%s%s", ml ? ", " : "", what);
		if (n > 0 && ml + (size_t)n < sizeof(missing))
			ml += (size_t)n;
	}
	if (!ml)
		cJSON_AddNumberToObject(row, "floor_ms", sum);
	else {
		char e[600];
		snprintf(e, sizeof(e), "no floor for: %s", missing);
		cJSON_AddStringToObject(row, "floor_error", e);
	}
}

static double num(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

void bs_print_breakdown(const cJSON *row)
{
	const cJSON *br = cJSON_GetObjectItemCaseSensitive(row, "breakdown"), *b,
		    *pr = cJSON_GetObjectItemCaseSensitive(row, "preset");
	if (!cJSON_IsArray(br))
		return;
	double sum = 0;
	cJSON_ArrayForEach(b, br)
		sum += num(b, "ms");
	fprintf(stderr, "step: %s, each node alone (sum %.2f ms", cJSON_IsString(pr) ? pr->valuestring : "?", sum);
	if (cJSON_GetObjectItemCaseSensitive(row, "floor_ms"))
		fprintf(stderr, "; floor %.2f ms, %.2fx", num(row, "floor_ms"),
			num(row, "floor_ms") > 0 ? sum / num(row, "floor_ms") : 0);
	bool floors = false;
	cJSON_ArrayForEach(b, br)
		floors |= cJSON_GetObjectItemCaseSensitive(b, "floor_how") != NULL;
	fprintf(stderr, "):\n  %-30s %5s  %11s  %6s", "what", "count", "time", "share");
	if (floors)
		fprintf(stderr, "  %11s  %7s  %s", "floor", "ratio", "floor: how");
	fputc('\n', stderr);
	cJSON_ArrayForEach(b, br) {
		const cJSON *w = cJSON_GetObjectItemCaseSensitive(b, "what"), *h = cJSON_GetObjectItemCaseSensitive(b, "floor_how");
		fprintf(stderr, "  %-30s %5d  %8.3f ms  %5.1f%%", cJSON_IsString(w) ? w->valuestring : "?",
			(int)num(b, "count"), num(b, "ms"), 100.0 * num(b, "ms") / (sum > 0 ? sum : 1));
		if (cJSON_GetObjectItemCaseSensitive(b, "floor_ms"))
			fprintf(stderr, "  %8.3f ms  %6.2fx", num(b, "floor_ms"), num(b, "ratio"));
		else if (h)
			fprintf(stderr, "  %11s  %7s", "-", "-");
		fprintf(stderr, "%s%s\n", cJSON_IsString(h) ? "  " : "", cJSON_IsString(h) ? h->valuestring : "");
	}
}

cJSON *bs_run_anchor(const char *cmd, const dg_model_config *c, int B, int T, int reps)
{
	char tail[32], why[512] = "out of memory";
	snprintf(tail, sizeof(tail), " --steps %d", reps);
	char *full = with_shape(cmd, c, false, B, T, tail);
	cJSON *lines = cJSON_CreateArray(), *r = cJSON_CreateObject();
	cJSON_AddStringToObject(r, "impl", "torch.compile");
	cJSON_AddStringToObject(r, "preset", "bf16");
	cJSON_AddStringToObject(r, "mode", "train");
	cJSON_AddNumberToObject(r, "B", B);
	cJSON_AddNumberToObject(r, "T", T);
	fprintf(stderr, "step: the PyTorch anchor: %s\n", full ? full : cmd);
	bool ok = full && lines && bs_run_json(full, lines, why, sizeof(why));
	const cJSON *o = ok ? last_with(lines, "step_ms") : NULL;
	if (ok && !o)
		snprintf(why, sizeof(why), "no \"step_ms\" in its output");
	if (o && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "step_ms"))) {
		const cJSON *tv = cJSON_GetObjectItemCaseSensitive(o, "torch");
		cJSON_AddNumberToObject(r, "step_ms", num(o, "step_ms"));
		cJSON_AddNumberToObject(r, "peak_bytes", num(o, "peak_bytes"));
		if (cJSON_IsString(tv))
			cJSON_AddStringToObject(r, "torch", tv->valuestring);
	} else {
		if (o)
			snprintf(why, sizeof(why), "\"step_ms\" is not a number");
		cJSON_AddStringToObject(r, "error", why);
		fprintf(stderr, "step: the PyTorch anchor: %s\n", why);
	}
	cJSON_Delete(lines);
	free(full);
	return r;
}

/* The ratio: above 1, dragon is faster. */
void bs_print_anchor(const cJSON *rows, const cJSON *anchor)
{
	const cJSON *r;
	int n = 0;
	if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(anchor, "step_ms")))
		return;
	double x = num(anchor, "step_ms");
	cJSON_ArrayForEach(r, rows) {
		const cJSON *m = cJSON_GetObjectItemCaseSensitive(r, "mode"), *p = cJSON_GetObjectItemCaseSensitive(r, "preset");
		if (!cJSON_IsString(m) || strcmp(m->valuestring, "train_graph") || !cJSON_IsString(p) ||
		    !(num(r, "step_ms") > 0))
			continue;
		fprintf(stderr, "step: torch.compile train step %.2f ms; dragon %s train step %.2f ms: ratio %.2f "
			"(torch.compile / dragon)\n", x,
			p->valuestring, num(r, "step_ms"), x / num(r, "step_ms"));
		n++;
	}
	if (!n)
		fprintf(stderr, "step: torch.compile train step %.2f ms (dragon's train steps: --train)\n", x);
}
