/*
 * A byte size as people write one (base/size.c: DRAGON_MEMORY's and
 * `dragon train --memory`'s) and DRAGON_MEMORY read by the model
 * (dg__memory_budget): units in powers of 1024, any case, "i" and "B"
 * optional; anything else refused, naming the variable.
 */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "base/size.h"
#include "runtime/train/model_int.h"

Test(size, units_and_refusals)
{
	static const struct {
		const char *text;
		size_t bytes;
	} good[] = {
		{ "1", 1 },
		{ "4096", 4096 },
		{ "512B", 512 },
		{ "4K", 4096 },
		{ "4k", 4096 },
		{ "1M", 1 << 20 },
		{ "4G", (size_t)4 << 30 },
		{ "4GB", (size_t)4 << 30 },
		{ "4GiB", (size_t)4 << 30 },
		{ "3.5g", (size_t)7 << 29 },
		{ "2T", (size_t)2 << 40 },
		{ "0.5KiB", 512 },
	};
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		size_t b = 0;
		cr_expect_eq(dg__parse_size(good[i].text, &b), DG_OK, "%s", good[i].text);
		cr_expect_eq(b, good[i].bytes, "%s: %zu, not %zu", good[i].text, b, good[i].bytes);
	}
	static const char *const bad[] = { "", "G", "0", "-4G", "4X", "4GiBs", "4 G", "4iB", "nan", "inf",
					   "0.1", "4GG", "1e30T" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		size_t b = 7;
		cr_expect_eq(dg__parse_size(bad[i], &b), DG_ERR_INVALID_ARG, "\"%s\" taken as %zu", bad[i], b);
		cr_expect_eq(b, 7, "\"%s\": the output written", bad[i]);
	}
}

Test(size, dragon_memory)
{
	char why[200];
	size_t b = 1;
	unsetenv("DRAGON_MEMORY");
	cr_expect_eq(dg__memory_budget(&b, why, sizeof(why)), DG_OK);
	cr_expect_eq(b, 0, "unset: no budget");
	setenv("DRAGON_MEMORY", "", 1);
	cr_expect_eq(dg__memory_budget(&b, why, sizeof(why)), DG_OK);
	cr_expect_eq(b, 0, "empty: no budget");
	setenv("DRAGON_MEMORY", "4G", 1);
	cr_expect_eq(dg__memory_budget(&b, why, sizeof(why)), DG_OK);
	cr_expect_eq(b, (size_t)4 << 30);
	setenv("DRAGON_MEMORY", "four", 1);
	cr_expect_eq(dg__memory_budget(&b, why, sizeof(why)), DG_ERR_INVALID_ARG);
	cr_expect(strstr(why, "DRAGON_MEMORY=four") != NULL, "%s", why);
	cr_expect_eq(b, 0);
	unsetenv("DRAGON_MEMORY");
}
