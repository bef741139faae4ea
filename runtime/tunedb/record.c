/*
 * Tuning records: one JSON document a sweep (format in tune.h), written
 * and read with cJSON.
 *
 *   { "format": 1,
 *     "spec": "act=int8;arch=sm_90;...;tile=auto;weight=ternary;",
 *     "device": { "name": "NVIDIA H200", "sm": 90, "sm_count": 132,
 *                 "driver_version": 13000, "nvrtc_version": "13.0" },
 *     "generator_version": "0.1.0", "date": "2026-12-01T10:00:00Z",
 *     "rows": 4096, "check_rows": 64, "warmup": 3, "reps": 25,
 *     "tie_band": 0.02, "budget_s": 60, "elapsed_s": 41.5,
 *     "budget_exhausted": false,
 *     "candidates": [
 *       { "tile": "128x128x64/2x4/4", "arch": "sm_90", "state": "timed",
 *         "median_us": 281.3, "p10_us": 279.9, "p90_us": 284.0,
 *         "reps": 25, "threads": 256, "smem": 98304, "regs": 128,
 *         "local_bytes": 0 },
 *       { "tile": "256x128x128/4x4/4", "arch": "sm_90a",
 *         "state": "rejected", "reason": "..." } ],
 *     "winner": { "tile": "128x128x64/2x4/4", "arch": "sm_90",
 *                 "median_us": 281.3 } }
 *
 * The reader is strict about what it knows (every field above is
 * required and typed, except a candidate's threads/smem/regs/local_bytes;
 * the spec must be canonical with tile=auto; states are timed, rejected,
 * wrong or skipped; the winner must name a timed candidate or be null) and
 * ignores fields it does not know, so a later addition still reads. Every
 * refusal is one line: "<file>: <field>: <what is wrong>".
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "dragon/tune.h"
#include "base/fnv.h"
#include "base/publish.h"

#define RECORD_MAX_BYTES ((size_t)16 << 20)

static const char *const state_names[] = {
	[DG_TUNE_TIMED] = "timed",
	[DG_TUNE_REJECTED] = "rejected",
	[DG_TUNE_WRONG] = "wrong",
	[DG_TUNE_SKIPPED] = "skipped",
};

void dg_tune_record_destroy(dg_tune_record *r)
{
	if (!r)
		return;
	free(r->cands);
	free(r->path);
	free(r);
}

/* ---- writing ---------------------------------------------------------------- */

static void arch_text(const dg_spec *spec, bool specific, char *buf, size_t size)
{
	snprintf(buf, size, "sm_%d%s", spec->arch, specific ? "a" : "");
}

static bool finite_nonneg(double v)
{
	return isfinite(v) && v >= 0;
}

dg_status dg_tune_record_to_json(const dg_tune_record *r, char **out, char *msg,
				 size_t msg_size)
{
	char buf[DG_SPEC_TEXT_MAX];

	if (!msg)
		msg_size = 0; /* snprintf(NULL, 0, ...) writes nothing */
	if (out)
		*out = NULL;
	if (!r || !out) {
		snprintf(msg, msg_size, "dg_tune_record_to_json: record and out must not be NULL");
		return DG_ERR_INVALID_ARG;
	}
	if (r->winner >= (int)r->n_cands || r->winner < -1 ||
	    (r->n_cands && !r->cands)) {
		snprintf(msg, msg_size, "winner %d: not a candidate (%zu of them)", r->winner,
			 r->n_cands);
		return DG_ERR_INVALID_ARG;
	}
	if (!finite_nonneg(r->budget_s) || !finite_nonneg(r->elapsed_s) ||
	    !finite_nonneg(r->tie_band)) {
		snprintf(msg, msg_size, "budget_s, elapsed_s and tie_band must be finite and >= 0");
		return DG_ERR_INVALID_ARG;
	}
	cJSON *j = cJSON_CreateObject();
	cJSON *dev = cJSON_CreateObject();
	cJSON *cands = cJSON_CreateArray();
	if (!j || !dev || !cands) {
		cJSON_Delete(j);
		cJSON_Delete(dev);
		cJSON_Delete(cands);
		snprintf(msg, msg_size, "out of memory writing a record");
		return DG_ERR_NOMEM;
	}
	dg_spec s = r->spec;
	memset(&s.tile, 0, sizeof(s.tile));
	dg_spec_to_string(&s, buf, sizeof(buf));
	cJSON_AddNumberToObject(j, "format", DG_TUNE_RECORD_FORMAT);
	cJSON_AddStringToObject(j, "spec", buf);
	cJSON_AddStringToObject(dev, "name", r->device.name);
	cJSON_AddNumberToObject(dev, "sm", r->device.sm);
	cJSON_AddNumberToObject(dev, "sm_count", r->device.sm_count);
	cJSON_AddNumberToObject(dev, "driver_version", r->device.driver_version);
	cJSON_AddStringToObject(dev, "nvrtc_version", r->device.nvrtc_version);
	cJSON_AddItemToObject(j, "device", dev);
	cJSON_AddStringToObject(j, "generator_version", r->generator_version);
	cJSON_AddStringToObject(j, "date", r->date);
	cJSON_AddNumberToObject(j, "rows", r->rows);
	cJSON_AddNumberToObject(j, "check_rows", r->check_rows);
	cJSON_AddNumberToObject(j, "warmup", r->warmup);
	cJSON_AddNumberToObject(j, "reps", r->reps);
	cJSON_AddNumberToObject(j, "tie_band", r->tie_band);
	cJSON_AddNumberToObject(j, "budget_s", r->budget_s);
	cJSON_AddNumberToObject(j, "elapsed_s", r->elapsed_s);
	cJSON_AddBoolToObject(j, "budget_exhausted", r->budget_exhausted);
	for (size_t i = 0; i < r->n_cands; i++) {
		const dg_tune_cand *c = &r->cands[i];
		cJSON *o = cJSON_CreateObject();
		char tile[64], arch[16];
		if (!o)
			continue;
		dg_tile_to_string(&c->tile, tile, sizeof(tile));
		arch_text(&r->spec, c->arch_specific, arch, sizeof(arch));
		cJSON_AddStringToObject(o, "tile", tile);
		cJSON_AddStringToObject(o, "arch", arch);
		cJSON_AddStringToObject(o, "state",
					(unsigned)c->state <= DG_TUNE_SKIPPED ? state_names[c->state]
									      : "rejected");
		if (c->state == DG_TUNE_TIMED) {
			cJSON_AddNumberToObject(o, "median_us", c->median_us);
			cJSON_AddNumberToObject(o, "p10_us", c->p10_us);
			cJSON_AddNumberToObject(o, "p90_us", c->p90_us);
			cJSON_AddNumberToObject(o, "reps", c->reps);
		} else {
			cJSON_AddStringToObject(o, "reason", c->reason);
		}
		if (c->threads)
			cJSON_AddNumberToObject(o, "threads", c->threads);
		if (c->smem)
			cJSON_AddNumberToObject(o, "smem", c->smem);
		if (c->regs)
			cJSON_AddNumberToObject(o, "regs", c->regs);
		if (c->regs || c->local_bytes)
			cJSON_AddNumberToObject(o, "local_bytes", c->local_bytes);
		cJSON_AddItemToArray(cands, o);
	}
	cJSON_AddItemToObject(j, "candidates", cands);
	if (r->winner >= 0) {
		const dg_tune_cand *w = &r->cands[r->winner];
		cJSON *o = cJSON_CreateObject();
		char tile[64], arch[16];
		dg_tile_to_string(&w->tile, tile, sizeof(tile));
		arch_text(&r->spec, w->arch_specific, arch, sizeof(arch));
		cJSON_AddStringToObject(o, "tile", tile);
		cJSON_AddStringToObject(o, "arch", arch);
		cJSON_AddNumberToObject(o, "median_us", w->median_us);
		cJSON_AddItemToObject(j, "winner", o);
	} else {
		cJSON_AddNullToObject(j, "winner");
	}
	char *text = cJSON_Print(j);
	cJSON_Delete(j);
	size_t len = text ? strlen(text) : 0;
	char *t2 = text ? realloc(text, len + 2) : NULL;
	if (!t2) {
		free(text);
		snprintf(msg, msg_size, "out of memory writing a record");
		return DG_ERR_NOMEM;
	}
	t2[len] = '\n';
	t2[len + 1] = '\0';
	*out = t2;
	return DG_OK;
}

/* ---- reading ---------------------------------------------------------------- */

typedef struct reader {
	const char *name; /* the input, for messages */
	char *msg;
	size_t msg_size;
} reader;

static dg_status bad(reader *rd, const char *field, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static dg_status bad(reader *rd, const char *field, const char *fmt, ...)
{
	char what[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (rd->msg && rd->msg_size)
		snprintf(rd->msg, rd->msg_size, "%s: %s%s%s", rd->name, field,
			 field[0] ? ": " : "", what);
	return DG_ERR_PARSE;
}

static dg_status get_string(reader *rd, const cJSON *o, const char *key,
			    const char *field, size_t max, const char **out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!v)
		return bad(rd, field, "missing (a string)");
	if (!cJSON_IsString(v) || !v->valuestring)
		return bad(rd, field, "expected a string");
	if (strlen(v->valuestring) >= max)
		return bad(rd, field, "longer than %zu characters", max - 1);
	*out = v->valuestring;
	return DG_OK;
}

static dg_status get_number(reader *rd, const cJSON *o, const char *key,
			    const char *field, bool required, double *out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!v) {
		if (!required)
			return DG_OK;
		return bad(rd, field, "missing (a number)");
	}
	if (!cJSON_IsNumber(v))
		return bad(rd, field, "expected a number");
	if (!isfinite(v->valuedouble) || v->valuedouble < 0)
		return bad(rd, field, "%g: expected a finite number >= 0", v->valuedouble);
	*out = v->valuedouble;
	return DG_OK;
}

static dg_status get_int(reader *rd, const cJSON *o, const char *key,
			 const char *field, bool required, int lo, int hi, int *out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!v) {
		if (!required)
			return DG_OK;
		return bad(rd, field, "missing (an integer)");
	}
	if (!cJSON_IsNumber(v))
		return bad(rd, field, "expected an integer");
	double d = v->valuedouble;
	if (!(d >= lo && d <= hi) || d != floor(d))
		return bad(rd, field, "%g: expected an integer from %d to %d", d, lo, hi);
	*out = (int)d;
	return DG_OK;
}

/* "YYYY-MM-DDTHH:MM:SSZ": compared as text, so the newest sorts last. */
static bool iso_date(const char *s)
{
	static const char pat[] = "dddd-dd-ddTdd:dd:ddZ";
	if (strlen(s) != sizeof(pat) - 1)
		return false;
	for (size_t i = 0; s[i]; i++) {
		if (pat[i] == 'd' ? (s[i] < '0' || s[i] > '9') : s[i] != pat[i])
			return false;
	}
	return true;
}

/* A candidate's tile and arch against the record's spec. */
static dg_status read_tile_arch(reader *rd, const cJSON *o, const char *field,
				const dg_spec *spec, dg_tile *tile, bool *specific)
{
	char f[96], why[512];
	const char *t = NULL, *a = NULL;
	dg_spec s = *spec;
	dg_status st;

	snprintf(f, sizeof(f), "%s.tile", field);
	st = get_string(rd, o, "tile", f, 64, &t);
	if (st)
		return st;
	if (strcmp(t, "auto") == 0 || dg_spec_set(&s, "tile", t, why, sizeof(why)) != DG_OK ||
	    dg_tile_is_auto(&s.tile))
		return bad(rd, f, "'%s' is not a tile of op %s (%s)", t, dg_op_name(spec->op),
			   strcmp(t, "auto") == 0 ? "a candidate names its tile" : why);
	bool threads = dg_op_info_of(spec->op)->tile == DG_TILE_THREADS;
	if (threads != (s.tile.threads != 0))
		return bad(rd, f, "'%s': op %s takes %s", t, dg_op_name(spec->op),
			   threads ? "a thread count (t256)" : "a block tile (BMxBNxBK/WMxWN/S)");
	snprintf(f, sizeof(f), "%s.arch", field);
	st = get_string(rd, o, "arch", f, 16, &a);
	if (st)
		return st;
	dg_spec as = *spec;
	if (dg_spec_set(&as, "arch", a, why, sizeof(why)) != DG_OK)
		return bad(rd, f, "%s", why);
	if (as.arch != spec->arch || (spec->arch_specific && !as.arch_specific))
		return bad(rd, f, "%s: the spec is for sm_%d%s", a, spec->arch,
			   spec->arch_specific ? "a" : "");
	*tile = s.tile;
	*specific = as.arch_specific;
	return DG_OK;
}

static dg_status read_cand(reader *rd, const cJSON *o, size_t i,
			   const dg_spec *spec, dg_tune_cand *c)
{
	char field[64], f[96];
	const char *state, *reason;
	dg_status st;

	snprintf(field, sizeof(field), "candidates[%zu]", i);
	if (!cJSON_IsObject(o))
		return bad(rd, field, "expected an object");
	st = read_tile_arch(rd, o, field, spec, &c->tile, &c->arch_specific);
	if (st)
		return st;
	snprintf(f, sizeof(f), "%s.state", field);
	st = get_string(rd, o, "state", f, 16, &state);
	if (st)
		return st;
	int k = -1;
	for (int s = 0; s <= DG_TUNE_SKIPPED; s++)
		if (strcmp(state, state_names[s]) == 0)
			k = s;
	if (k < 0)
		return bad(rd, f, "'%s': expected timed, rejected, wrong or skipped", state);
	c->state = (dg_tune_state)k;
	if (c->state == DG_TUNE_TIMED) {
		static const char *const keys[3] = { "median_us", "p10_us", "p90_us" };
		double *vals[3] = { &c->median_us, &c->p10_us, &c->p90_us };
		for (int q = 0; q < 3; q++) {
			snprintf(f, sizeof(f), "%s.%s", field, keys[q]);
			st = get_number(rd, o, keys[q], f, true, vals[q]);
			if (st)
				return st;
		}
		snprintf(f, sizeof(f), "%s.reps", field);
		st = get_int(rd, o, "reps", f, true, 1, 1000000, &c->reps);
		if (st)
			return st;
	} else {
		snprintf(f, sizeof(f), "%s.reason", field);
		st = get_string(rd, o, "reason", f, sizeof(c->reason), &reason);
		if (st)
			return st;
		snprintf(c->reason, sizeof(c->reason), "%s", reason);
	}
	static const char *const opt[4] = { "threads", "smem", "regs", "local_bytes" };
	int *ov[4] = { &c->threads, &c->smem, &c->regs, &c->local_bytes };
	for (int q = 0; q < 4; q++) {
		snprintf(f, sizeof(f), "%s.%s", field, opt[q]);
		st = get_int(rd, o, opt[q], f, false, 0, 1 << 30, ov[q]);
		if (st)
			return st;
	}
	return DG_OK;
}

static dg_status read_spec(reader *rd, const cJSON *j, dg_tune_record *r)
{
	char why[512], back[DG_SPEC_TEXT_MAX];
	const char *text = NULL;
	dg_status st = get_string(rd, j, "spec", "spec", DG_SPEC_TEXT_MAX, &text);

	if (st)
		return st;
	if (dg_spec_parse(text, &r->spec, why, sizeof(why)) != DG_OK)
		return bad(rd, "spec", "%s", why);
	if (!(dg_spec_uses(r->spec.op) & DG_FIELD_TILE))
		return bad(rd, "spec", "op %s takes no tile", dg_op_name(r->spec.op));
	if (!dg_tile_is_auto(&r->spec.tile))
		return bad(rd, "spec", "names a tile; a record's spec has tile=auto");
	dg_spec_to_string(&r->spec, back, sizeof(back));
	if (strcmp(back, text) != 0)
		return bad(rd, "spec", "not in canonical form (expected '%s')", back);
	snprintf(r->spec_text, sizeof(r->spec_text), "%s", back);
	return DG_OK;
}

static dg_status read_device(reader *rd, const cJSON *j, dg_tune_device *d)
{
	const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "device");
	const char *s = NULL;
	dg_status st;

	if (!o)
		return bad(rd, "device", "missing (an object)");
	if (!cJSON_IsObject(o))
		return bad(rd, "device", "expected an object");
	st = get_string(rd, o, "name", "device.name", sizeof(d->name), &s);
	if (st)
		return st;
	if (!s[0])
		return bad(rd, "device.name", "empty");
	snprintf(d->name, sizeof(d->name), "%s", s);
	st = get_int(rd, o, "sm", "device.sm", true, 10, 999, &d->sm);
	if (!st)
		st = get_int(rd, o, "sm_count", "device.sm_count", true, 0, 1 << 20, &d->sm_count);
	if (!st)
		st = get_int(rd, o, "driver_version", "device.driver_version", true, 0, 1 << 30,
			     &d->driver_version);
	if (!st)
		st = get_string(rd, o, "nvrtc_version", "device.nvrtc_version",
				sizeof(d->nvrtc_version), &s);
	if (st)
		return st;
	snprintf(d->nvrtc_version, sizeof(d->nvrtc_version), "%s", s);
	return DG_OK;
}

static dg_status read_winner(reader *rd, const cJSON *j, dg_tune_record *r)
{
	const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "winner");
	dg_tile tile;
	bool specific;
	dg_status st;

	r->winner = -1;
	if (!o)
		return bad(rd, "winner", "missing (an object, or null when no candidate passed)");
	if (cJSON_IsNull(o))
		return DG_OK;
	if (!cJSON_IsObject(o))
		return bad(rd, "winner", "expected an object or null");
	st = read_tile_arch(rd, o, "winner", &r->spec, &tile, &specific);
	if (st)
		return st;
	for (size_t i = 0; i < r->n_cands; i++) {
		const dg_tune_cand *c = &r->cands[i];
		if (c->state == DG_TUNE_TIMED && c->arch_specific == specific &&
		    memcmp(&c->tile, &tile, sizeof(tile)) == 0) {
			r->winner = (int)i;
			return DG_OK;
		}
	}
	char t[64];
	dg_tile_to_string(&tile, t, sizeof(t));
	return bad(rd, "winner", "%s (%s) names no timed candidate", t,
		   specific ? "arch-specific" : "portable");
}

static dg_status read_record(reader *rd, const cJSON *j, dg_tune_record *r)
{
	const char *s = NULL;
	int format = 0;
	dg_status st;

	if (!cJSON_IsObject(j))
		return bad(rd, "", "expected a JSON object (a tuning record)");
	st = get_int(rd, j, "format", "format", true, 0, 1 << 30, &format);
	if (st)
		return st;
	if (format != DG_TUNE_RECORD_FORMAT)
		return bad(rd, "format", "%d: this dragon reads format %d", format,
			   DG_TUNE_RECORD_FORMAT);
	st = read_spec(rd, j, r);
	if (!st)
		st = read_device(rd, j, &r->device);
	if (!st)
		st = get_string(rd, j, "generator_version", "generator_version",
				sizeof(r->generator_version), &s);
	if (st)
		return st;
	snprintf(r->generator_version, sizeof(r->generator_version), "%s", s);
	st = get_string(rd, j, "date", "date", sizeof(r->date), &s);
	if (st)
		return st;
	if (!iso_date(s))
		return bad(rd, "date", "'%s': expected YYYY-MM-DDTHH:MM:SSZ (UTC)", s);
	snprintf(r->date, sizeof(r->date), "%s", s);
	st = get_int(rd, j, "rows", "rows", true, 0, 1 << 30, &r->rows);
	if (!st)
		st = get_int(rd, j, "check_rows", "check_rows", true, 0, 1 << 30, &r->check_rows);
	if (!st)
		st = get_int(rd, j, "warmup", "warmup", true, 0, 1 << 20, &r->warmup);
	if (!st)
		st = get_int(rd, j, "reps", "reps", true, 0, 1 << 20, &r->reps);
	if (!st)
		st = get_number(rd, j, "tie_band", "tie_band", true, &r->tie_band);
	if (!st)
		st = get_number(rd, j, "budget_s", "budget_s", true, &r->budget_s);
	if (!st)
		st = get_number(rd, j, "elapsed_s", "elapsed_s", true, &r->elapsed_s);
	if (st)
		return st;
	const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "budget_exhausted");
	if (!b)
		return bad(rd, "budget_exhausted", "missing (true or false)");
	if (!cJSON_IsBool(b))
		return bad(rd, "budget_exhausted", "expected true or false");
	r->budget_exhausted = cJSON_IsTrue(b);

	const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "candidates");
	if (!a)
		return bad(rd, "candidates", "missing (an array)");
	if (!cJSON_IsArray(a))
		return bad(rd, "candidates", "expected an array");
	int n = cJSON_GetArraySize(a);
	if (n > 100000)
		return bad(rd, "candidates", "%d of them; at most 100000", n);
	r->cands = calloc(n > 0 ? (size_t)n : 1, sizeof(*r->cands));
	if (!r->cands)
		return DG_ERR_NOMEM;
	r->n_cands = (size_t)n;
	size_t i = 0;
	for (const cJSON *c = a->child; c; c = c->next, i++) {
		st = read_cand(rd, c, i, &r->spec, &r->cands[i]);
		if (st)
			return st;
	}
	return read_winner(rd, j, r);
}

dg_status dg_tune_record_parse(const char *json, size_t len, const char *name,
			       dg_tune_record **out, char *msg, size_t msg_size)
{
	reader rd = { name ? name : "tuning record", msg, msg_size };
	dg_status st;

	if (out)
		*out = NULL;
	if (!out || (!json && len))
		return bad(&rd, "", "no input");
	if (len == 0)
		return bad(&rd, "", "empty (a tuning record is a JSON object)");
	if (len > RECORD_MAX_BYTES)
		return bad(&rd, "", "%zu bytes; a record is at most %zu", len, RECORD_MAX_BYTES);
	if (memchr(json, '\0', len))
		return bad(&rd, "", "contains a NUL byte: not JSON text");
	cJSON *j = cJSON_ParseWithLength(json, len);
	if (!j) {
		const char *at = cJSON_GetErrorPtr();
		long off = at && at >= json && at <= json + len ? (long)(at - json) : -1;
		/* an error at the last non-blank byte or past it: the text ends early */
		size_t end = len;
		while (end > 0 && (json[end - 1] == ' ' || json[end - 1] == '\n' ||
				   json[end - 1] == '\t' || json[end - 1] == '\r'))
			end--;
		if (off >= 0)
			return bad(&rd, "", "not valid JSON (near byte %ld of %zu%s)", off, len,
				   (size_t)off + 1 >= end ? ": truncated?" : "");
		return bad(&rd, "", "not valid JSON");
	}
	dg_tune_record *r = calloc(1, sizeof(*r));
	if (!r) {
		cJSON_Delete(j);
		if (msg && msg_size)
			snprintf(msg, msg_size, "out of memory reading %s", rd.name);
		return DG_ERR_NOMEM;
	}
	st = read_record(&rd, j, r);
	cJSON_Delete(j);
	if (st == DG_ERR_NOMEM && msg && msg_size)
		snprintf(msg, msg_size, "out of memory reading %s", rd.name);
	if (st) {
		dg_tune_record_destroy(r);
		return st;
	}
	*out = r;
	return DG_OK;
}

dg_status dg_tune_record_load(const char *path, dg_tune_record **out, char *msg,
			      size_t msg_size)
{
	struct stat sb;
	dg_status st;

	if (!msg)
		msg_size = 0; /* snprintf(NULL, 0, ...) writes nothing */
	if (out)
		*out = NULL;
	if (!path || !out) {
		snprintf(msg, msg_size, "dg_tune_record_load: path and out must not be NULL");
		return DG_ERR_INVALID_ARG;
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		snprintf(msg, msg_size, "%s: %s", path, strerror(e));
		return e == ENOENT ? DG_ERR_NOT_FOUND : DG_ERR_IO;
	}
	if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
		close(fd);
		snprintf(msg, msg_size, "%s: not a regular file", path);
		return DG_ERR_IO;
	}
	if ((uint64_t)sb.st_size > RECORD_MAX_BYTES) {
		close(fd);
		snprintf(msg, msg_size, "%s: %lld bytes; a record is at most %zu", path,
			 (long long)sb.st_size, RECORD_MAX_BYTES);
		return DG_ERR_PARSE;
	}
	size_t size = (size_t)sb.st_size, got = 0;
	char *buf = malloc(size + 1);
	if (!buf) {
		close(fd);
		snprintf(msg, msg_size, "out of memory reading %s", path);
		return DG_ERR_NOMEM;
	}
	while (got < size) {
		ssize_t k = read(fd, buf + got, size - got);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		got += (size_t)k;
	}
	close(fd);
	if (got != size) {
		free(buf);
		snprintf(msg, msg_size, "%s: short read (%zu of %zu bytes)", path, got, size);
		return DG_ERR_IO;
	}
	buf[size] = '\0';
	st = dg_tune_record_parse(buf, size, path, out, msg, msg_size);
	free(buf);
	if (st)
		return st;
	(*out)->path = strdup(path);
	if (!(*out)->path) {
		dg_tune_record_destroy(*out);
		*out = NULL;
		snprintf(msg, msg_size, "out of memory reading %s", path);
		return DG_ERR_NOMEM;
	}
	return DG_OK;
}

dg_status dg_tune_record_save(const dg_tune_record *r, const char *path, char *msg,
			      size_t msg_size)
{
	char *text = NULL;

	if (!msg)
		msg_size = 0; /* snprintf(NULL, 0, ...) writes nothing */
	if (!path) {
		snprintf(msg, msg_size, "dg_tune_record_save: path is NULL");
		return DG_ERR_INVALID_ARG;
	}
	dg_status st = dg_tune_record_to_json(r, &text, msg, msg_size);
	if (st)
		return st;
	st = dg__publish_file(path, text, strlen(text), msg, msg_size);
	free(text);
	return st;
}

void dg_tune_record_file_name(const dg_tune_record *r, char *buf, size_t size)
{
	char dev[64];
	size_t k = 0;
	bool dash = true; /* no leading dash */

	for (const char *p = r->device.name; *p && k < sizeof(dev) - 1; p++) {
		char c = *p;
		if (c >= 'A' && c <= 'Z')
			c = (char)(c - 'A' + 'a');
		if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
			dev[k++] = c;
			dash = false;
		} else if (!dash) {
			dev[k++] = '-';
			dash = true;
		}
	}
	while (k && dev[k - 1] == '-')
		k--;
	dev[k] = '\0';
	snprintf(buf, size, "%s-%016llx-%s-sm%d.json", dg_op_name(r->spec.op),
		 (unsigned long long)dg__fnv1a(r->spec_text), k ? dev : "gpu", r->device.sm);
}
