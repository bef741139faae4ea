/* The attention's form as a tuned choice (runtime/tunedb/form.h). */
#include "runtime/tunedb/form.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#define FORM_PREFIX "attention_form"
#define CHUNK_MAX 4096

bool dg__attn_form_file(const char *path)
{
	const char *base = strrchr(path, '/');
	base = base ? base + 1 : path;
	if (strncmp(base, "built-in:", 9) == 0)
		base += 9;
	return strncmp(base, FORM_PREFIX, strlen(FORM_PREFIX)) == 0;
}

/* An integer field of o in [lo, hi], else a message naming it. */
static bool int_field(const cJSON *o, const char *key, int lo, int hi, int *out, const char *name,
		      const char *where, char *msg, size_t msg_size)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int)v->valuedouble || v->valuedouble < lo ||
	    v->valuedouble > hi) {
		snprintf(msg, msg_size, "%s: %s%s: must be an integer from %d to %d", name, where, key, lo, hi);
		return false;
	}
	*out = (int)v->valuedouble;
	return true;
}

static bool str_field(const cJSON *o, const char *key, char *out, size_t size, const char *name,
		      const char *where, char *msg, size_t msg_size)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!cJSON_IsString(v) || !v->valuestring[0] || strlen(v->valuestring) >= size) {
		snprintf(msg, msg_size, "%s: %s%s: must be a string of 1 to %zu bytes", name, where, key, size - 1);
		return false;
	}
	snprintf(out, size, "%s", v->valuestring);
	return true;
}

static bool parse_into(const cJSON *j, const char *name, dg__attn_form *f, char *msg, size_t msg_size)
{
	int format = 0;
	char kind[32], act[16];
	if (!cJSON_IsObject(j)) {
		snprintf(msg, msg_size, "%s: not a JSON object", name);
		return false;
	}
	if (!int_field(j, "format", 1, 1, &format, name, "", msg, msg_size) ||
	    !str_field(j, "kind", kind, sizeof(kind), name, "", msg, msg_size))
		return false;
	if (strcmp(kind, "attention_form") != 0) {
		snprintf(msg, msg_size, "%s: kind: \"%s\", not \"attention_form\"", name, kind);
		return false;
	}
	const cJSON *dev = cJSON_GetObjectItemCaseSensitive(j, "device");
	if (!int_field(j, "heads", 1, 1 << 16, &f->heads, name, "", msg, msg_size) ||
	    !int_field(j, "latent", 1, 1 << 24, &f->latent, name, "", msg, msg_size) ||
	    !int_field(j, "embd", 1, 1 << 20, &f->embd, name, "", msg, msg_size) ||
	    !str_field(j, "act", act, sizeof(act), name, "", msg, msg_size) ||
	    !str_field(j, "date", f->date, sizeof(f->date), name, "", msg, msg_size))
		return false;
	if (!dg_fmt_from_name(act, &f->act)) {
		snprintf(msg, msg_size, "%s: act: \"%s\" is not a format", name, act);
		return false;
	}
	if (!cJSON_IsObject(dev)) {
		snprintf(msg, msg_size, "%s: device: must be an object", name);
		return false;
	}
	if (!str_field(dev, "name", f->device, sizeof(f->device), name, "device.", msg, msg_size) ||
	    !int_field(dev, "sm", 10, 1000, &f->sm, name, "device.", msg, msg_size))
		return false;
	const cJSON *forms = cJSON_GetObjectItemCaseSensitive(j, "forms");
	if (!cJSON_IsArray(forms) || cJSON_GetArraySize(forms) > DG__FORM_MAX) {
		snprintf(msg, msg_size, "%s: forms: must be an array of at most %d {from_t, chunk}", name, DG__FORM_MAX);
		return false;
	}
	f->n = 0;
	const cJSON *e;
	cJSON_ArrayForEach(e, forms)
	{
		char where[48];
		snprintf(where, sizeof(where), "forms[%d].", f->n);
		int t = 0, c = 0;
		if (!int_field(e, "from_t", 1, 1 << 30, &t, name, where, msg, msg_size) ||
		    !int_field(e, "chunk", 0, CHUNK_MAX, &c, name, where, msg, msg_size))
			return false;
		if (c % 64 || (f->n && t <= f->from_t[f->n - 1])) {
			snprintf(msg, msg_size, "%s: %s%s", name, where,
				 c % 64 ? "chunk: must be 0 (the quadratic form) or a multiple of 64"
					: "from_t: must be larger than the form's before it");
			return false;
		}
		f->from_t[f->n] = t;
		f->chunk[f->n] = c;
		f->n++;
	}
	return true;
}

dg_status dg__attn_form_parse(const char *text, size_t len, const char *name, dg__attn_form *out, char *msg,
			      size_t msg_size)
{
	memset(out, 0, sizeof(*out));
	cJSON *j = cJSON_ParseWithLength(text, len);
	if (!j) {
		snprintf(msg, msg_size, "%s: not valid JSON", name);
		return DG_ERR_PARSE;
	}
	bool ok = parse_into(j, name, out, msg, msg_size);
	cJSON_Delete(j);
	if (!ok)
		return DG_ERR_PARSE;
	out->path = strdup(name);
	return out->path ? DG_OK : DG_ERR_NOMEM;
}

/* The row's faster form: chunked where it ran and the quadratic one did
 * not, or where it took less time. */
static bool chunk_wins(const dg__attn_form_row *r)
{
	return r->chunked_ms > 0 && (r->quadratic_ms <= 0 || r->chunked_ms < r->quadratic_ms);
}

static int cmp_row(const void *a, const void *b)
{
	const dg__attn_form_row *x = a, *y = b;
	return (x->t > y->t) - (x->t < y->t);
}

char *dg__attn_form_make(const char *device, int sm, int heads, int latent, int embd, dg_fmt act,
			 const char *date, const dg__attn_form_row *rows, int n)
{
	dg__attn_form_row *r = malloc((size_t)(n > 0 ? n : 1) * sizeof(*r));
	cJSON *j = cJSON_CreateObject(), *dev = cJSON_CreateObject(), *forms = cJSON_CreateArray(),
	      *meas = cJSON_CreateArray();
	char *text = NULL;
	if (!r || !j || !dev || !forms || !meas) {
		cJSON_Delete(dev);
		cJSON_Delete(forms);
		cJSON_Delete(meas);
		goto out;
	}
	memcpy(r, rows, (size_t)n * sizeof(*r));
	qsort(r, (size_t)n, sizeof(*r), cmp_row);
	/* the first row from which the chunked form wins at every T */
	int from = n;
	while (from > 0 && chunk_wins(&r[from - 1]))
		from--;
	int last = 0;
	for (int i = from; i < n && cJSON_GetArraySize(forms) < DG__FORM_MAX; i++)
		if (r[i].chunk != last) {
			cJSON *e = cJSON_CreateObject();
			cJSON_AddNumberToObject(e, "from_t", r[i].t);
			cJSON_AddNumberToObject(e, "chunk", r[i].chunk);
			cJSON_AddItemToArray(forms, e);
			last = r[i].chunk;
		}
	for (int i = 0; i < n; i++) {
		cJSON *e = cJSON_CreateObject();
		cJSON_AddNumberToObject(e, "B", r[i].b);
		cJSON_AddNumberToObject(e, "T", r[i].t);
		cJSON_AddNumberToObject(e, "C", r[i].chunk);
		if (r[i].quadratic_ms > 0)
			cJSON_AddNumberToObject(e, "quadratic_ms", r[i].quadratic_ms);
		if (r[i].chunked_ms > 0)
			cJSON_AddNumberToObject(e, "chunked_ms", r[i].chunked_ms);
		cJSON_AddItemToArray(meas, e);
	}
	cJSON_AddNumberToObject(j, "format", 1);
	cJSON_AddStringToObject(j, "kind", "attention_form");
	cJSON_AddNumberToObject(j, "heads", heads);
	cJSON_AddNumberToObject(j, "latent", latent);
	cJSON_AddNumberToObject(j, "embd", embd);
	cJSON_AddStringToObject(j, "act", dg_fmt_name(act));
	cJSON_AddStringToObject(dev, "name", device);
	cJSON_AddNumberToObject(dev, "sm", sm);
	cJSON_AddItemToObject(j, "device", dev);
	cJSON_AddStringToObject(j, "date", date);
	cJSON_AddItemToObject(j, "forms", forms);
	cJSON_AddItemToObject(j, "rows", meas);
	text = cJSON_Print(j);
out:
	cJSON_Delete(j);
	free(r);
	return text;
}
