/*
 * The hash of a set of files (base/embedded.h): what the template set's
 * hash is made of, the embedded copy's and a folder's alike.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/embedded.h"
#include "base/sha256.h"

/* name, then bytes: a total order, so the order of files[] never shows */
static int cmp_files(const void *a, const void *b)
{
	const dg__embedded_file *x = *(const dg__embedded_file *const *)a;
	const dg__embedded_file *y = *(const dg__embedded_file *const *)b;
	int c = strcmp(x->name, y->name);
	if (c)
		return c;
	size_t n = x->size < y->size ? x->size : y->size;
	c = n ? memcmp(x->bytes, y->bytes, n) : 0;
	if (c)
		return c;
	return (x->size > y->size) - (x->size < y->size);
}

static void put_len(dg__sha256 *h, uint64_t v)
{
	uint8_t le[8];
	for (int i = 0; i < 8; i++)
		le[i] = (uint8_t)(v >> (8 * i));
	dg__sha256_update(h, le, sizeof(le));
}

dg_status dg__embedded_hash(const dg__embedded_file *files, size_t n, char hex[65])
{
	const dg__embedded_file **by_name = malloc((n ? n : 1) * sizeof(*by_name));
	if (!by_name)
		return DG_ERR_NOMEM;
	for (size_t i = 0; i < n; i++)
		by_name[i] = &files[i];
	qsort(by_name, n, sizeof(*by_name), cmp_files);

	dg__sha256 h;
	uint8_t d[32];
	dg__sha256_init(&h);
	put_len(&h, n);
	for (size_t i = 0; i < n; i++) {
		size_t len = strlen(by_name[i]->name);
		put_len(&h, len);
		dg__sha256_update(&h, by_name[i]->name, len);
		put_len(&h, by_name[i]->size);
		dg__sha256_update(&h, by_name[i]->bytes, by_name[i]->size);
	}
	dg__sha256_final(&h, d);
	dg__sha256_hex(d, hex);
	free(by_name);
	return DG_OK;
}
