/*
 * dragon — the peak dense bf16 tensor-core FLOP/s of the GPUs whose
 * datasheets we know, by name: the denominator of the MFU that `dragon
 * train` shows. Private to cli/dragon/.
 */
#ifndef DG_CLI_PEAK_H
#define DG_CLI_PEAK_H

/* The peak of the device called name (as the driver names it, "NVIDIA
 * H200", with or without a suffix such as " (sm_90)"), or 0 when the
 * device is not in the table (then no MFU is shown). */
double dg__cli_peak_bf16(const char *name);

#endif
