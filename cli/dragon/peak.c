/*
 * The peak dense bf16 tensor-core FLOP/s of a GPU by name (peak.h).
 *
 * Source: NVIDIA's datasheets and product pages (H200, H100, A100), which
 * give bf16 tensor throughput "with sparsity"; the dense peak is half of
 * it (H100 SXM: 1,979 → 989.4 TFLOP/s, the dense figure of the H100
 * whitepaper). The same chip in another form factor runs at other clocks
 * and power, so each form factor has its own row, the more specific name
 * first.
 */
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "cli/dragon/peak.h"

static const struct {
	const char *model; /* a word of the driver's name */
	double flops;
} peaks[] = {
	{ "H200 NVL", 835.5e12 },  /* 1,671 sparse */
	{ "GH200", 989.4e12 },     /* the H100 of Grace Hopper: as H100 SXM */
	{ "H200", 989.4e12 },      /* SXM: 1,979 sparse */
	{ "H100 NVL", 835.5e12 },  /* 1,671 sparse */
	{ "H100 PCIe", 756.5e12 }, /* 1,513 sparse */
	{ "H100", 989.4e12 },      /* SXM ("NVIDIA H100 80GB HBM3"): 1,979 sparse */
	{ "A100", 312e12 },        /* SXM4 and PCIe: 624 sparse */
};

/* Whether c bounds a word: the name's end, a space, a dash or a bracket. */
static bool boundary(char c)
{
	return c == '\0' || c == ' ' || c == '-' || c == '(' || c == ')';
}

double dg__cli_peak_bf16(const char *name)
{
	if (!name)
		return 0;
	for (size_t i = 0; i < sizeof(peaks) / sizeof(peaks[0]); i++) {
		size_t n = strlen(peaks[i].model);
		for (const char *at = strstr(name, peaks[i].model); at; at = strstr(at + 1, peaks[i].model))
			if ((at == name || boundary(at[-1])) && boundary(at[n]))
				return peaks[i].flops;
	}
	return 0;
}
