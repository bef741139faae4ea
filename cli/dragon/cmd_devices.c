/*
 * dragon devices — the CUDA devices dragon can use, each opened as train,
 * eval and sample open GPU 0 (the driver loaded, a context made), so a
 * script can ask "will training run on a GPU here?" and get the answer
 * those commands would act on. None is exit 1 with the reason (no driver
 * library, no device), which the other commands meet as "the CPU model".
 */
#include <stdio.h>
#include <string.h>

#include "cli/common/cli.h"
#include "cli/common/scan.h"
#include "cli/dragon/cmd.h"
#include "dragon/runtime.h"

static const char help_text[] =
	"usage: dragon devices [--json]\n\n"
	"Lists the CUDA devices dragon can use, one a line: ordinal, name, SM\n"
	"architecture, multiprocessors and memory. eval, sample and train run on\n"
	"device 0 (train --gpus N on devices 0 to N-1).\n\n"
	"  --json   one object: count, devices[{ordinal, name, sm, sm_count,\n"
	"           memory_bytes}]\n\n"
	"Exit status: 0 one or more devices, 1 none (the reason on stderr: no driver,\n"
	"no device) or a device that would not open, 2 usage.\n";

enum { O_JSON = 1, O_HELP };

static const dg__cli_opt opts[] = {
	{ "json", 0, false, O_JSON },
	{ "help", 'h', false, O_HELP },
	{ NULL, 0, false, 0 },
};

int dg__cli_cmd_devices(int argc, char **argv)
{
	dg__cli_scan_state s;
	const char *v;
	int id;
	bool json = false;
	dg__cli_scan_init(&s, argc, argv, "devices");
	while ((id = dg__cli_scan(&s, opts, &v)) != DG__CLI_SCAN_END) {
		if (id == DG__CLI_SCAN_ERROR)
			return DG__CLI_USAGE;
		if (id == DG__CLI_SCAN_ARG)
			return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
					   "devices takes no argument '%s'; see `dragon devices --help`", v);
		if (id == O_HELP) {
			fputs(help_text, stdout);
			return DG__CLI_OK;
		}
		json = true;
	}
	char why[512] = "";
	int n = 0;
	dg_status st = dg_device_count(&n, why, sizeof(why));
	if (st)
		return dg__cli_err(DG__CLI_FAIL, st, "counting CUDA devices: %s", why);
	if (n == 0)
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_NO_DEVICE,
				   "no CUDA device (%s); train, eval and sample run the CPU model",
				   why[0] ? why : "the driver finds none");
	cJSON *j = json ? cJSON_CreateObject() : NULL, *list = json ? cJSON_CreateArray() : NULL;
	if (json && (!j || !list)) {
		cJSON_Delete(j);
		cJSON_Delete(list);
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_NOMEM, "out of memory");
	}
	int code = DG__CLI_OK;
	for (int i = 0; i < n && !code; i++) {
		dg_device *dev = NULL;
		dg_device_opts o = { .ordinal = i, .jit = NULL };
		dg_device_info info;
		st = dg_device_open(&dev, &o);
		if (!st)
			st = dg_device_info_get(dev, &info);
		if (st)
			code = dg__cli_err(DG__CLI_FAIL, st, "opening GPU %d: %s", i,
					   dev ? dg_device_errmsg(dev) : dg_status_str(st));
		else if (json) {
			cJSON *d = cJSON_CreateObject();
			cJSON_AddNumberToObject(d, "ordinal", i);
			cJSON_AddStringToObject(d, "name", info.name);
			cJSON_AddNumberToObject(d, "sm", info.sm);
			cJSON_AddNumberToObject(d, "sm_count", info.sm_count);
			cJSON_AddNumberToObject(d, "memory_bytes", (double)info.total_mem);
			cJSON_AddItemToArray(list, d);
		} else {
			printf("%d: %s (sm_%d, %d SMs, %.1f GiB)\n", i, info.name, info.sm, info.sm_count,
			       (double)info.total_mem / (1024.0 * 1024.0 * 1024.0));
		}
		dg_device_close(dev);
	}
	if (!json)
		return code;
	if (code) {
		cJSON_Delete(j);
		cJSON_Delete(list);
		return code;
	}
	cJSON_AddNumberToObject(j, "count", n);
	cJSON_AddItemToObject(j, "devices", list);
	return dg__cli_json_print(j);
}
