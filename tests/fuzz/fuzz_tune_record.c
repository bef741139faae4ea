/*
 * libFuzzer target: the tuning record reader (dg_tune_record_parse).
 *
 * Any bytes must parse or be refused with DG_ERR_PARSE and a message, never
 * crash, hang or leak; a record that parses must write JSON
 * (dg_tune_record_to_json) that parses again to the same record and writes
 * the identical text again, so what the DB reads is what a sweep wrote.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/tune.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool same_cand(const dg_tune_cand *a, const dg_tune_cand *b)
{
	return memcmp(&a->tile, &b->tile, sizeof(a->tile)) == 0 &&
	       a->arch_specific == b->arch_specific && a->state == b->state &&
	       strcmp(a->reason, b->reason) == 0;
}

static bool same(const dg_tune_record *a, const dg_tune_record *b)
{
	if (strcmp(a->spec_text, b->spec_text) || strcmp(a->device.name, b->device.name) ||
	    a->device.sm != b->device.sm || strcmp(a->date, b->date) ||
	    strcmp(a->generator_version, b->generator_version) || a->n_cands != b->n_cands ||
	    a->winner != b->winner || a->rows != b->rows || a->reps != b->reps)
		return false;
	for (size_t i = 0; i < a->n_cands; i++)
		if (!same_cand(&a->cands[i], &b->cands[i]))
			return false;
	return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char msg[512];
	dg_tune_record *r = NULL, *back = NULL;
	char *json = NULL, *again = NULL;

	/* An exact-size copy, so ASan sees a read past the end. */
	char *copy = malloc(size ? size : 1);
	if (!copy)
		return 0;
	memcpy(copy, data, size);
	msg[0] = '\0';
	dg_status st = dg_tune_record_parse(copy, size, "fuzz", &r, msg, sizeof(msg));
	free(copy);
	if (st != DG_OK) {
		if (r || (st != DG_ERR_PARSE && st != DG_ERR_NOMEM) || !msg[0])
			abort(); /* refused: no record, DG_ERR_PARSE, a message */
		return 0;
	}
	if (dg_tune_record_to_json(r, &json, msg, sizeof(msg)) != DG_OK)
		abort(); /* what parsed must write */
	if (dg_tune_record_parse(json, strlen(json), "fuzz-again", &back, msg, sizeof(msg)) != DG_OK)
		abort();
	if (!same(r, back))
		abort();
	if (dg_tune_record_to_json(back, &again, msg, sizeof(msg)) != DG_OK || strcmp(json, again))
		abort();
	free(json);
	free(again);
	dg_tune_record_destroy(r);
	dg_tune_record_destroy(back);
	return 0;
}
