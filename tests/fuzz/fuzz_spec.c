/*
 * libFuzzer target: the spec text parser (dg_spec_parse).
 *
 * Any bytes must parse or be refused with a message, never crash, hang or
 * leak; and what parses must print a canonical text that parses again to
 * the same canonical text (the identity every cache key hangs on).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char msg[512], text[DG_SPEC_TEXT_MAX], again[DG_SPEC_TEXT_MAX];
	dg_spec spec, back;

	/* The parser takes a C string: the input up to its first NUL. */
	char *s = malloc(size + 1);
	if (!s)
		return 0;
	memcpy(s, data, size);
	s[size] = '\0';
	dg_status st = dg_spec_parse(s, &spec, msg, sizeof(msg));
	free(s);
	if (st) {
		if (!memchr(msg, '\0', sizeof(msg)) || !msg[0])
			__builtin_trap(); /* a refusal always says why */
		return 0;
	}
	if (dg_spec_validate(&spec, msg, sizeof(msg)) != DG_OK)
		__builtin_trap(); /* parse validates */
	if (dg_spec_to_string(&spec, text, sizeof(text)) != DG_OK)
		__builtin_trap();
	if (dg_spec_parse(text, &back, msg, sizeof(msg)) != DG_OK)
		__builtin_trap(); /* the canonical text must read back */
	if (dg_spec_to_string(&back, again, sizeof(again)) != DG_OK ||
	    strcmp(text, again) != 0 || !dg_spec_equal(&spec, &back))
		__builtin_trap();
	return 0;
}
