/*
 * The safetensors writer (runtime/store/safetensors.h): tensors in the order
 * added, a header of the reference's form, and a save that is atomic
 * (base/publish.h: temp file, fsync, rename, directory fsync), so a crash
 * leaves the old file or the new one, never a torn one; a sealed file
 * carries its own SHA-256 in its metadata (runtime/store/safetensors.h).
 */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/msg.h"
#include "base/publish.h"
#include "base/sha256.h"
#include "runtime/store/safetensors.h"
#include "runtime/store/safetensors_int.h"

/* ---- writing ------------------------------------------------------------------ */

#define SEAL_ZEROS "0000000000000000000000000000000000000000000000000000000000000000"

typedef struct wtensor {
	char *name;
	dg_st_dtype dtype;
	int ndim;
	int64_t shape[DG_SAFETENSORS_MAX_DIMS];
	uint64_t bytes;
	unsigned char *data;
} wtensor;

struct dg_safetensors_writer {
	wtensor *t;
	size_t n, cap;
	dg__st_meta *meta;
	size_t n_meta, cap_meta;
	char seal[64]; /* the seal's metadata key, "" for none */
};

dg_status dg_safetensors_writer_create(dg_safetensors_writer **out)
{
	if (!out)
		return DG_ERR_INVALID_ARG;
	*out = calloc(1, sizeof(**out));
	return *out ? DG_OK : DG_ERR_NOMEM;
}

void dg_safetensors_writer_destroy(dg_safetensors_writer *w)
{
	if (!w)
		return;
	for (size_t i = 0; i < w->n; i++) {
		free(w->t[i].name);
		free(w->t[i].data);
	}
	for (size_t i = 0; i < w->n_meta; i++) {
		free(w->meta[i].key);
		free(w->meta[i].value);
	}
	free(w->t);
	free(w->meta);
	free(w);
}

dg_status dg_safetensors_writer_add(dg_safetensors_writer *w, const char *name,
				    dg_st_dtype dtype, int ndim, const int64_t *shape,
				    const void *data, char *msg, size_t msg_size)
{
	uint64_t bytes;

	if (!w || !name)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "safetensors writer: %s is NULL",
				!w ? "writer" : "name");
	if (!name[0] || strcmp(name, "__metadata__") == 0)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
				"safetensors writer: '%s' cannot name a tensor", name);
	if ((unsigned)dtype >= DG_ST__COUNT || ndim < 0 || ndim > DG_SAFETENSORS_MAX_DIMS ||
	    (ndim && !shape))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
				"%s: a dtype of the list and 0 to %d dimensions", name,
				DG_SAFETENSORS_MAX_DIMS);
	for (int i = 0; i < ndim; i++)
		if (shape[i] < 0)
			return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "%s: shape[%d]=%lld is negative",
					name, i, (long long)shape[i]);
	if (!dg__st_tensor_bytes(dtype, ndim, shape, &bytes))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "%s: its size overflows", name);
	if (bytes && !data)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "%s: data is NULL", name);
	for (size_t i = 0; i < w->n; i++)
		if (strcmp(w->t[i].name, name) == 0)
			return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "%s: added twice", name);
	if (w->n == w->cap) {
		size_t cap = w->cap ? 2 * w->cap : 16;
		wtensor *t = realloc(w->t, cap * sizeof(*t));
		if (!t)
			return DG_ERR_NOMEM;
		w->t = t;
		w->cap = cap;
	}
	wtensor *t = &w->t[w->n];
	memset(t, 0, sizeof(*t));
	t->name = strdup(name);
	t->data = malloc(bytes ? (size_t)bytes : 1);
	if (!t->name || !t->data) {
		free(t->name);
		free(t->data);
		return dg__msgf(DG_ERR_NOMEM, msg, msg_size, "out of memory adding %s", name);
	}
	if (bytes)
		memcpy(t->data, data, (size_t)bytes);
	t->dtype = dtype;
	t->ndim = ndim;
	for (int i = 0; i < ndim; i++)
		t->shape[i] = shape[i];
	t->bytes = bytes;
	w->n++;
	return DG_OK;
}

dg_status dg_safetensors_writer_meta(dg_safetensors_writer *w, const char *key,
				     const char *value, char *msg, size_t msg_size)
{
	if (!w || !key || !value)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "safetensors writer: NULL argument");
	char *v = strdup(value);
	if (!v)
		return DG_ERR_NOMEM;
	for (size_t i = 0; i < w->n_meta; i++) {
		if (strcmp(w->meta[i].key, key) == 0) {
			free(w->meta[i].value);
			w->meta[i].value = v;
			return DG_OK;
		}
	}
	if (w->n_meta == w->cap_meta) {
		size_t cap = w->cap_meta ? 2 * w->cap_meta : 8;
		dg__st_meta *m = realloc(w->meta, cap * sizeof(*m));
		if (!m) {
			free(v);
			return DG_ERR_NOMEM;
		}
		w->meta = m;
		w->cap_meta = cap;
	}
	w->meta[w->n_meta].key = strdup(key);
	if (!w->meta[w->n_meta].key) {
		free(v);
		return DG_ERR_NOMEM;
	}
	w->meta[w->n_meta++].value = v;
	return DG_OK;
}

dg_status dg_safetensors_writer_seal(dg_safetensors_writer *w, const char *key, char *msg,
				     size_t msg_size)
{
	if (!w || !key)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "safetensors writer: NULL argument");
	size_t n = strlen(key);
	bool ok = n > 0 && n < sizeof(w->seal);
	for (size_t i = 0; ok && i < n; i++)
		ok = (key[i] >= 'a' && key[i] <= 'z') || (key[i] >= 'A' && key[i] <= 'Z') ||
		     (key[i] >= '0' && key[i] <= '9') || key[i] == '_' || key[i] == '.';
	if (!ok)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
				"safetensors writer: seal key '%s': 1 to %zu letters, digits, '_' or '.'", key,
				sizeof(w->seal) - 1);
	memcpy(w->seal, key, n + 1);
	return DG_OK;
}

/* Exact integers: cJSON would print large ones in exponent form. */
static bool add_u64(cJSON *arr, uint64_t v)
{
	char buf[32];
	snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
	cJSON *n = cJSON_CreateRaw(buf);
	if (!n)
		return false;
	if (!cJSON_AddItemToArray(arr, n)) {
		cJSON_Delete(n);
		return false;
	}
	return true;
}

static char *header_json(const dg_safetensors_writer *w)
{
	cJSON *root = cJSON_CreateObject();
	bool ok = root != NULL;
	if (ok && (w->n_meta || w->seal[0])) {
		cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
		ok = m != NULL;
		for (size_t i = 0; ok && i < w->n_meta; i++)
			if (!w->seal[0] || strcmp(w->meta[i].key, w->seal) != 0)
				ok = cJSON_AddStringToObject(m, w->meta[i].key, w->meta[i].value) != NULL;
		/* the seal's place: its digits are written once the file is whole */
		if (ok && w->seal[0])
			ok = cJSON_AddStringToObject(m, w->seal, SEAL_ZEROS) != NULL;
	}
	uint64_t at = 0;
	for (size_t i = 0; ok && i < w->n; i++) {
		const wtensor *t = &w->t[i];
		cJSON *o = cJSON_AddObjectToObject(root, t->name);
		cJSON *sh = o ? cJSON_AddArrayToObject(o, "shape") : NULL;
		ok = o && cJSON_AddStringToObject(o, "dtype", dg_st_dtype_name(t->dtype)) && sh;
		for (int d = 0; ok && d < t->ndim; d++)
			ok = add_u64(sh, (uint64_t)t->shape[d]);
		cJSON *off = ok ? cJSON_AddArrayToObject(o, "data_offsets") : NULL;
		ok = off && add_u64(off, at) && add_u64(off, at + t->bytes);
		at += t->bytes;
	}
	char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
	cJSON_Delete(root);
	return text;
}

dg_status dg_safetensors_writer_bytes(const dg_safetensors_writer *w, void **out, size_t *size,
				      char *msg, size_t msg_size)
{
	if (!w || !out || !size)
		return DG_ERR_INVALID_ARG;
	*out = NULL;
	*size = 0;
	char *h = header_json(w);
	if (!h)
		return dg__msgf(DG_ERR_NOMEM, msg, msg_size, "out of memory writing the header");
	size_t hn = strlen(h), padded = (hn + 7) / 8 * 8;
	uint64_t total = 8 + padded;
	for (size_t i = 0; i < w->n; i++)
		total += w->t[i].bytes;
	unsigned char *buf = total <= SIZE_MAX ? malloc((size_t)total) : NULL;
	if (!buf) {
		cJSON_free(h);
		return dg__msgf(DG_ERR_NOMEM, msg, msg_size, "out of memory: %llu bytes",
				(unsigned long long)total);
	}
	for (int i = 0; i < 8; i++)
		buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
	memcpy(buf + 8, h, hn);
	memset(buf + 8 + hn, ' ', padded - hn);
	cJSON_free(h);
	size_t at = 8 + padded;
	for (size_t i = 0; i < w->n; i++) {
		memcpy(buf + at, w->t[i].data, (size_t)w->t[i].bytes);
		at += (size_t)w->t[i].bytes;
	}
	if (w->seal[0]) {
		/* the SHA-256 of the file with the seal's digits '0', into them */
		size_t s;
		if (!dg__st_seal_at((const char *)buf + 8, hn, w->seal, &s)) {
			free(buf);
			return dg__msgf(DG_ERR_INTERNAL, msg, msg_size, "safetensors writer: seal %s not in the header",
					w->seal);
		}
		uint8_t d[32];
		char hex[65];
		dg__sha256_digest(buf, (size_t)total, d);
		dg__sha256_hex(d, hex);
		memcpy(buf + 8 + s, hex, 64);
	}
	*out = buf;
	*size = (size_t)total;
	return DG_OK;
}

bool dg_safetensors_temp_of(const char *name, size_t *target_len, long *pid)
{
	return dg__publish_temp_of(name, target_len, pid);
}

dg_status dg_safetensors_writer_save(const dg_safetensors_writer *w, const char *path,
				     char *msg, size_t msg_size)
{
	void *bytes = NULL;
	size_t size = 0;

	if (!w || !path)
		return DG_ERR_INVALID_ARG;
	dg_status st = dg_safetensors_writer_bytes(w, &bytes, &size, msg, msg_size);
	if (!st)
		st = dg__publish_file(path, bytes, size, msg, msg_size);
	free(bytes);
	return st;
}
