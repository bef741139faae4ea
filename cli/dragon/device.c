/*
 * The device a command of dragon runs a model on (cli/dragon/device.h).
 */
#include <stdio.h>

#include "cli/common/cli.h"
#include "cli/dragon/device.h"

/* The device: opened (*dev) unless --cpu or there is none; a recipe the
 * CPU model cannot run without one is refused. Returns the exit code. */
int dg__cli_device_of(bool cpu, const dg_model_config *c, int ordinal, dg_device **dev, char *name,
		      size_t size, const char *next)
{
	char why[512] = "";
	int n = 0;
	*dev = NULL;
	snprintf(name, size, "cpu");
	if (cpu) {
		if (!dg_model_cpu_runs(c))
			return dg__cli_err(DG__CLI_USAGE, DG_ERR_UNSUPPORTED,
					   "--preset %s --cpu: the CPU model runs f32 and the integer recipes (w8a8, bitnet, fake-quantized); %s needs an NVIDIA GPU",
					   c->preset, c->preset);
		return DG__CLI_OK;
	}
	dg_status st = dg_device_count(&n, why, sizeof(why));
	if (st)
		return dg__cli_err(DG__CLI_FAIL, st, "counting CUDA devices: %s", why);
	if (n == 0) {
		if (!dg_model_cpu_runs(c))
			return dg__cli_err(DG__CLI_FAIL, DG_ERR_NO_DEVICE,
					   "preset %s needs an NVIDIA GPU, and there is none (%s); %s", c->preset,
					   why[0] ? why : "no device",
					   next ? next : "the CPU model runs f32, w8a8 and bitnet");
		if (next)
			fprintf(stderr, "dragon: note: no NVIDIA GPU here (%s); running on the CPU model\n",
				why[0] ? why : "no device");
		return DG__CLI_OK;
	}
	if (ordinal >= n)
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_NO_DEVICE, "GPU %d: this machine has %d", ordinal, n);
	dg_device_opts o = { .ordinal = ordinal, .jit = NULL };
	st = dg_device_open(dev, &o);
	if (st) {
		int code = dg__cli_err(DG__CLI_FAIL, st, "opening GPU %d: %s", ordinal,
				       *dev ? dg_device_errmsg(*dev) : dg_status_str(st));
		dg_device_close(*dev);
		*dev = NULL;
		return code;
	}
	dg_device_info info;
	if (dg_device_info_get(*dev, &info) == DG_OK)
		snprintf(name, size, "%s (sm_%d)", info.name, info.sm);
	else
		snprintf(name, size, "GPU %d", ordinal);
	return DG__CLI_OK;
}
