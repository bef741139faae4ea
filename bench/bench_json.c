/*
 * The benches' JSON header and the writing of their document
 * (bench/bench_json.h).
 */
#include "bench/bench_json.h"

#include <stdio.h>
#include <time.h>

cJSON *bj_doc(const char *bench, const dg_device_info *info)
{
	char date[16];
	time_t now = time(NULL);
	strftime(date, sizeof(date), "%Y-%m-%d", gmtime(&now));
	cJSON *doc = cJSON_CreateObject();
	cJSON_AddStringToObject(doc, "bench", bench);
	cJSON_AddStringToObject(doc, "device", info->name);
	cJSON_AddNumberToObject(doc, "sm", info->sm);
	cJSON_AddNumberToObject(doc, "sm_count", info->sm_count);
	cJSON_AddNumberToObject(doc, "driver", info->driver_version);
	cJSON_AddStringToObject(doc, "date", date);
	return doc;
}

int bj_write(const char *prog, const cJSON *doc, const char *path, bool echo)
{
	char *text = cJSON_Print(doc);
	if (!text) {
		fprintf(stderr, "%s: out of memory printing the JSON\n", prog);
		return 1;
	}
	int rc = 0;
	if (echo)
		printf("%s\n", text);
	if (path) {
		FILE *f = fopen(path, "w");
		bool ok = f && fprintf(f, "%s\n", text) >= 0;
		if (f && fclose(f))
			ok = false;
		if (!ok) {
			fprintf(stderr, "%s: cannot write %s\n", prog, path);
			rc = 1;
		} else {
			fprintf(stderr, "%s: wrote %s\n", prog, path);
		}
	}
	cJSON_free(text);
	return rc;
}
