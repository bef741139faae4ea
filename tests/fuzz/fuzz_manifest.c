/*
 * libFuzzer target: the bundle manifest reader (dg_manifest_parse).
 *
 * Format 2 (template hash, device, SM, entries with their launch info).
 * Any bytes must parse or be refused with DG_ERR_PARSE and a message,
 * never crash, hang or leak; and a manifest that parses must write JSON
 * that reads back to the same model, field for field (a lossy writer that
 * is merely idempotent would pass a text-only comparison), and writes the
 * identical text again.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool same_kernel(const dg_manifest_kernel *a, const dg_manifest_kernel *b)
{
	if (strcmp(a->spec, b->spec) || strcmp(a->key, b->key) ||
	    strcmp(a->file, b->file) || a->n_entries != b->n_entries ||
	    a->arch != b->arch || a->ptx != b->ptx ||
	    memcmp(&a->compile_ms, &b->compile_ms, sizeof(double)) ||
	    a->cache_hit != b->cache_hit || a->size != b->size ||
	    strcmp(a->sha256, b->sha256))
		return false;
	for (int e = 0; e < a->n_entries; e++)
		if (strcmp(a->entries[e], b->entries[e]) || a->threads[e] != b->threads[e] ||
		    a->smem[e] != b->smem[e])
			return false;
	return true;
}

static bool same(const dg_manifest *a, const dg_manifest *b)
{
	if (a->format != b->format || a->n_kernels != b->n_kernels ||
	    strcmp(a->generator_version, b->generator_version) ||
	    strcmp(a->template_hash, b->template_hash) ||
	    strcmp(a->nvrtc_version, b->nvrtc_version) ||
	    strcmp(a->created, b->created) || strcmp(a->device, b->device) ||
	    a->sm != b->sm)
		return false;
	for (size_t i = 0; i < a->n_kernels; i++)
		if (!same_kernel(&a->kernels[i], &b->kernels[i]))
			return false;
	return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char msg[512];
	dg_manifest *m = NULL, *back = NULL;
	char *json = NULL, *again = NULL;

	/* An exact-size copy, so ASan sees a read past the end. */
	char *copy = malloc(size ? size : 1);
	if (!copy)
		return 0;
	memcpy(copy, data, size);
	dg_status st = dg_manifest_parse(copy, size, &m, msg, sizeof(msg));
	free(copy);
	if (st) {
		if (m || (st != DG_ERR_PARSE && st != DG_ERR_NOMEM) ||
		    !memchr(msg, '\0', sizeof(msg)) || !msg[0])
			__builtin_trap();
		return 0;
	}
	if (dg_manifest_to_json(m, &json, msg, sizeof(msg)) != DG_OK)
		__builtin_trap(); /* what was read must write */
	if (dg_manifest_parse(json, strlen(json), &back, msg, sizeof(msg)) != DG_OK)
		__builtin_trap(); /* ... and read back */
	if (!same(m, back))
		__builtin_trap(); /* ... to the same model */
	if (dg_manifest_to_json(back, &again, msg, sizeof(msg)) != DG_OK ||
	    strcmp(json, again) != 0)
		__builtin_trap(); /* ... and the same text */
	free(json);
	free(again);
	dg_manifest_destroy(m);
	dg_manifest_destroy(back);
	return 0;
}
