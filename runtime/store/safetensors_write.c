/*
 * The safetensors writer (dragon/safetensors.h): tensors in the order
 * added, a header of the reference's form, and a save that is atomic
 * (temp file, fsync, rename, directory fsync), so a crash leaves the old
 * file or the new one, never a torn one; a sealed file carries its own
 * SHA-256 in its metadata (dragon/safetensors.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/msg.h"
#include "base/sha256.h"
#include "dragon/safetensors.h"
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

/* A failed step of a save, named with the file and errno's text. */
static dg_status io_fail(char *msg, size_t size, const char *step, const char *path)
{
	int e = errno;
	return dg__msgf(DG_ERR_IO, msg, size, "%s: %s: %s (errno %d)", path, step, strerror(e), e);
}

bool dg_safetensors_temp_of(const char *name, size_t *target_len, long *pid)
{
	const char *t = NULL;
	for (const char *q = strstr(name, ".tmp."); q; q = strstr(q + 1, ".tmp."))
		t = q; /* the last ".tmp.": a target's own name may hold one */
	if (!t || t == name)
		return false;
	const char *p = t + 5, *dot = strchr(p, '.');
	if (!dot || dot == p || !dot[1])
		return false;
	long v = 0;
	for (const char *c = p; c < dot; c++) {
		if (*c < '0' || *c > '9' || v > LONG_MAX / 10 - 9)
			return false;
		v = v * 10 + (*c - '0');
	}
	for (const char *c = dot + 1; *c; c++)
		if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')))
			return false;
	if (target_len)
		*target_len = (size_t)(t - name);
	if (pid)
		*pid = v;
	return true;
}

dg_status dg_safetensors_writer_save(const dg_safetensors_writer *w, const char *path,
				     char *msg, size_t msg_size)
{
	void *bytes = NULL;
	size_t size = 0;
	char tmp[4096], dir[4096];

	if (!w || !path)
		return DG_ERR_INVALID_ARG;
	if (strlen(path) + 40 > sizeof(tmp))
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "%s: path too long", path);
	dg_status st = dg_safetensors_writer_bytes(w, &bytes, &size, msg, msg_size);
	if (st)
		return st;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	snprintf(tmp, sizeof(tmp), "%s.tmp.%ld.%lx", path, (long)getpid(),
		 (unsigned long)(ts.tv_nsec ^ (ts.tv_sec << 20)));
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0) {
		free(bytes);
		return io_fail(msg, msg_size, "create the temp file", tmp);
	}
	/* write() may take less than asked (a signal, a disk filling up): the
	 * loop goes on until all is written or it fails; a write of nothing
	 * sets no errno, so it is read as a full disk */
	const char *failed = NULL;
	int err = 0;
	const unsigned char *p = bytes;
	size_t left = size;
	while (left && !failed) {
		ssize_t k = write(fd, p, left);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			failed = "write";
			err = k == 0 ? ENOSPC : errno;
		} else {
			p += k;
			left -= (size_t)k;
		}
	}
	free(bytes);
	/* a delayed write error (a full disk, NFS) shows at fsync or close */
	if (!failed && fsync(fd)) {
		failed = "fsync";
		err = errno;
	}
	if (close(fd) && !failed) {
		failed = "close";
		err = errno;
	}
	if (!failed && rename(tmp, path)) {
		failed = "rename the temp file over it";
		err = errno;
	}
	if (failed) {
		bool left_behind = unlink(tmp) != 0 && errno != ENOENT;
		return dg__msgf(DG_ERR_IO, msg, msg_size,
				"%s: %s: %s (errno %d); the file is as it was, and its temp file %s %s", path,
				failed, strerror(err), err, tmp, left_behind ? "could not be removed" : "is removed");
	}
	/* the rename itself is durable once the folder is synced */
	snprintf(dir, sizeof(dir), "%s", path);
	char *slash = strrchr(dir, '/');
	if (slash)
		*(slash == dir ? slash + 1 : slash) = '\0';
	else
		snprintf(dir, sizeof(dir), ".");
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		if (fsync(dfd) && errno != EINVAL)
			st = io_fail(msg, msg_size, "fsync the folder", dir);
		close(dfd);
	}
	return st;
}
