/*
 * The benches' list options, JSON header and the writing of their
 * document (bench/bench_common.h).
 */
#include "bench/bench_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/publish.h"

int bc_parse_ints(const char *s, int *v, int max, long lo, long hi)
{
	int n = 0;
	while (*s) {
		char *end;
		long x = strtol(s, &end, 10);
		if (end == s || x < lo || x > hi || n == max || (*end && *end != ','))
			return -1;
		v[n++] = (int)x;
		s = *end ? end + 1 : end;
	}
	return n ? n : -1;
}

cJSON *bc_doc(const char *bench, const dg_device_info *info)
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

int bc_write_text(const char *prog, const char *text, const char *path)
{
	size_t n = strlen(text);
	char *line = malloc(n + 2), msg[1024];
	if (!line) {
		fprintf(stderr, "%s: cannot write %s: out of memory\n", prog, path);
		return 1;
	}
	memcpy(line, text, n);
	line[n] = '\n';
	dg_status st = dg__publish_file(path, line, n + 1, msg, sizeof(msg));
	free(line);
	if (st) {
		fprintf(stderr, "%s: cannot write %s\n", prog, msg);
		return 1;
	}
	fprintf(stderr, "%s: wrote %s\n", prog, path);
	return 0;
}

int bc_write(const char *prog, const cJSON *doc, const char *path, bool echo)
{
	char *text = cJSON_Print(doc);
	if (!text) {
		fprintf(stderr, "%s: out of memory printing the JSON\n", prog);
		return 1;
	}
	int rc = 0;
	if (echo)
		printf("%s\n", text);
	if (path)
		rc = bc_write_text(prog, text, path);
	cJSON_free(text);
	return rc;
}

cJSON *bc_breakdown(const dg_model_time *tm, int n)
{
	cJSON *a = cJSON_CreateArray();
	for (int i = 0; a && i < n; i++) {
		cJSON *e = cJSON_CreateObject();
		cJSON_AddStringToObject(e, "what", tm[i].what);
		cJSON_AddNumberToObject(e, "count", tm[i].count);
		cJSON_AddNumberToObject(e, "ms", tm[i].ms);
		cJSON_AddItemToArray(a, e);
	}
	return a;
}
