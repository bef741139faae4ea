/*
 * libFuzzer target: the safetensors reader (dg_safetensors_parse).
 *
 * Any bytes must parse or be refused with DG_ERR_PARSE (or DG_ERR_NOMEM)
 * and a message, never crash, hang or leak; a tensor that parses lies
 * inside the input and holds numel · dtype size bytes; and a file that
 * parses, written again through the writer, reads back to the same
 * tensors (name, dtype, shape, bytes) and metadata.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/store/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool same_tensor(const dg_st_tensor *a, const dg_st_tensor *b)
{
	if (strcmp(a->name, b->name) || a->dtype != b->dtype || a->ndim != b->ndim ||
	    a->bytes != b->bytes)
		return false;
	for (int d = 0; d < a->ndim; d++)
		if (a->shape[d] != b->shape[d])
			return false;
	return a->bytes == 0 || memcmp(a->data, b->data, (size_t)a->bytes) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char msg[512];
	dg_safetensors *f = NULL;
	dg_status st = dg_safetensors_parse(data, size, "fuzz", &f, msg, sizeof(msg));
	if (st) {
		if (f || (st != DG_ERR_PARSE && st != DG_ERR_NOMEM) || !msg[0])
			abort();
		return 0;
	}
	size_t n = dg_safetensors_count(f);
	dg_safetensors_writer *w = NULL;
	if (dg_safetensors_writer_create(&w))
		abort();
	for (size_t i = 0; i < n; i++) {
		const dg_st_tensor *t = dg_safetensors_at(f, i);
		uint64_t numel = 1;
		for (int d = 0; d < t->ndim; d++)
			numel *= (uint64_t)t->shape[d];
		if (t->bytes != numel * dg_st_dtype_size(t->dtype) || t->bytes > size)
			abort();
		if (dg_safetensors_find(f, t->name) != t)
			abort();
		if (dg_safetensors_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, msg,
					      sizeof(msg)))
			abort();
	}
	for (size_t i = 0; i < dg_safetensors_meta_count(f); i++) {
		const char *k, *v;
		if (!dg_safetensors_meta_at(f, i, &k, &v) ||
		    dg_safetensors_writer_meta(w, k, v, msg, sizeof(msg)))
			abort();
	}
	void *bytes = NULL;
	size_t nb = 0;
	if (dg_safetensors_writer_bytes(w, &bytes, &nb, msg, sizeof(msg)))
		abort();
	dg_safetensors *g = NULL;
	if (dg_safetensors_parse(bytes, nb, "rewritten", &g, msg, sizeof(msg)))
		abort();
	if (dg_safetensors_count(g) != n || dg_safetensors_meta_count(g) != dg_safetensors_meta_count(f))
		abort();
	for (size_t i = 0; i < n; i++) {
		const dg_st_tensor *a = dg_safetensors_at(f, i);
		const dg_st_tensor *b = dg_safetensors_find(g, a->name);
		if (!b || !same_tensor(a, b))
			abort();
	}
	for (size_t i = 0; i < dg_safetensors_meta_count(f); i++) {
		const char *k, *v;
		dg_safetensors_meta_at(f, i, &k, &v);
		const char *v2 = dg_safetensors_meta(g, k);
		if (!v2 || strcmp(v, v2))
			abort();
	}
	dg_safetensors_destroy(g);
	free(bytes);
	dg_safetensors_writer_destroy(w);
	dg_safetensors_destroy(f);
	return 0;
}
