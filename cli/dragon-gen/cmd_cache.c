/*
 * dragon-gen cache: the on-disk kernel cache seen from the shell. Each
 * action maps onto one dg_cache_* call; the policy (where the root is,
 * what is bad, what gc removes) stays in runtime/store/cache.c. No action
 * creates a cache: a folder that does not exist is reported as none
 * (dg_cache_opts.no_create).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli/common/cli.h"
#include "cli/common/scan.h"
#include "cli/dragon-gen/gen.h"
#include "dragon/cache.h"

enum { OPT_HELP = 1, OPT_JSON, OPT_DIR, OPT_MAX_BYTES };

static const dg__cli_opt opts[] = {
	{ "help", 'h', false, OPT_HELP },
	{ "json", 0, false, OPT_JSON },
	{ "cache-dir", 0, true, OPT_DIR },
	{ "max-bytes", 0, true, OPT_MAX_BYTES },
	{ NULL, 0, false, 0 },
};

static void help(void)
{
	printf("usage: dragon-gen cache stat|verify|gc|clear [--cache-dir DIR] [--json]\n"
	       "       dragon-gen cache gc --max-bytes N\n\n"
	       "  stat    entries, bytes, the size cap, quarantined and temp files\n"
	       "  verify  read every entry and check its checksum; bad entries are\n"
	       "          moved to quarantine/ (exit 1 if any were found)\n"
	       "  gc      remove stale temp files and the quarantine, then evict least\n"
	       "          recently used entries down to the cap (or --max-bytes N)\n"
	       "  clear   remove every entry\n\n"
	       "  --cache-dir DIR  the cache root (default: $DRAGON_CACHE_DIR, else\n"
	       "                   $XDG_CACHE_HOME/dragon, else ~/.cache/dragon)\n"
	       "  --max-bytes N    gc only: evict down to N bytes\n"
	       "  --json           machine-readable output on stdout\n"
	       "  -h, --help       this text\n");
}

typedef enum action { A_STAT, A_VERIFY, A_GC, A_CLEAR, A__NONE } action;
static const char *const action_names[] = { "stat", "verify", "gc", "clear" };

/* dg_cache_errmsg(NULL) holds why the last open failed. */
static int fail(dg_cache *c, dg_status st, const char *what)
{
	const char *why = dg_cache_errmsg(c);
	return dg__cli_err(DG__CLI_FAIL, st, "cache %s: %s", what,
			   why[0] ? why : dg_status_str(st));
}

/* There is no cache: nothing to count, check or remove, and nothing made. */
static int no_cache(action a, bool json)
{
	const char *why = dg_cache_errmsg(NULL);
	if (json) {
		cJSON *j = cJSON_CreateObject();
		cJSON_AddBoolToObject(j, "exists", false);
		cJSON_AddStringToObject(j, "reason", why);
		if (a == A_STAT) {
			cJSON_AddNumberToObject(j, "entries", 0);
			cJSON_AddNumberToObject(j, "bytes", 0);
		} else if (a == A_VERIFY) {
			cJSON_AddNumberToObject(j, "checked", 0);
			cJSON_AddNumberToObject(j, "bad", 0);
		} else {
			cJSON_AddNumberToObject(j, "removed", 0);
		}
		return dg__cli_json_print(j);
	}
	printf("no kernel cache yet (nothing was cached there; it is made at the first build): %s\n",
	       why);
	return DG__CLI_OK;
}

static int do_stat(dg_cache *c, bool json)
{
	dg_cache_stats s;
	dg_status st = dg_cache_stat(c, &s);
	if (st)
		return fail(c, st, "stat");
	if (json) {
		cJSON *j = cJSON_CreateObject();
		cJSON_AddBoolToObject(j, "exists", true);
		cJSON_AddStringToObject(j, "root", dg_cache_root(c));
		cJSON_AddNumberToObject(j, "entries", (double)s.entries);
		cJSON_AddNumberToObject(j, "bytes", (double)s.bytes);
		cJSON_AddNumberToObject(j, "max_bytes", (double)s.max_bytes);
		cJSON_AddNumberToObject(j, "quarantined", (double)s.quarantined);
		cJSON_AddNumberToObject(j, "temp_files", (double)s.temp_files);
		return dg__cli_json_print(j);
	}
	printf("cache:       %s\n"
	       "entries:     %" PRIu64 "\n"
	       "bytes:       %" PRIu64 " (%.1f MiB of a %.1f MiB cap)\n"
	       "quarantined: %" PRIu64 "\n"
	       "temp files:  %" PRIu64 "\n",
	       dg_cache_root(c), s.entries, s.bytes, (double)s.bytes / 1048576.0,
	       (double)s.max_bytes / 1048576.0, s.quarantined, s.temp_files);
	return DG__CLI_OK;
}

/* Collects each bad entry for the report: JSON array, or lines on stdout. */
typedef struct bad_list {
	cJSON *arr; /* NULL without --json */
} bad_list;

static void note_bad(void *user, const char *key, const char *reason)
{
	bad_list *b = user;
	if (b->arr) {
		cJSON *e = cJSON_CreateObject();
		cJSON_AddStringToObject(e, "key", key);
		cJSON_AddStringToObject(e, "reason", reason);
		cJSON_AddItemToArray(b->arr, e);
	} else {
		printf("bad %s: %s\n", key, reason);
	}
}

static int do_verify(dg_cache *c, bool json)
{
	dg_cache_verify_report r;
	bad_list bad = { json ? cJSON_CreateArray() : NULL };
	dg_status st = dg_cache_verify_each(c, note_bad, &bad, &r);
	if (st) {
		cJSON_Delete(bad.arr);
		return fail(c, st, "verify");
	}
	if (json) {
		cJSON *j = cJSON_CreateObject();
		cJSON_AddStringToObject(j, "root", dg_cache_root(c));
		cJSON_AddNumberToObject(j, "checked", (double)r.checked);
		cJSON_AddNumberToObject(j, "ok", (double)r.ok);
		cJSON_AddNumberToObject(j, "bad", (double)r.bad);
		cJSON_AddItemToObject(j, "bad_entries", bad.arr);
		int code = dg__cli_json_print(j);
		if (code)
			return code;
	} else {
		printf("checked %" PRIu64 " entries: %" PRIu64 " ok, %" PRIu64
		       " bad\n",
		       r.checked, r.ok, r.bad);
	}
	if (r.bad)
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_CORRUPT,
				   "cache verify: %" PRIu64
				   " bad entries moved to %s/quarantine/ (they are rebuilt on next use; `dragon-gen cache gc` deletes them)",
				   r.bad, dg_cache_root(c));
	return DG__CLI_OK;
}

static int do_remove(dg_cache *c, action a, uint64_t max_bytes, bool json)
{
	uint64_t removed = 0;
	dg_status st = a == A_GC ? dg_cache_gc(c, max_bytes, &removed)
				 : dg_cache_clear(c, &removed);
	if (st)
		return fail(c, st, action_names[a]);
	if (json) {
		cJSON *j = cJSON_CreateObject();
		cJSON_AddStringToObject(j, "root", dg_cache_root(c));
		cJSON_AddNumberToObject(j, "removed", (double)removed);
		return dg__cli_json_print(j);
	}
	printf("removed %" PRIu64 " files from %s\n", removed, dg_cache_root(c));
	return DG__CLI_OK;
}

int dg__gen_cmd_cache(int argc, char **argv)
{
	dg__cli_scan_state sc;
	const char *arg, *dir = NULL;
	action a = A__NONE;
	bool json = false, have_max = false;
	uint64_t max_bytes = 0;
	int id;

	dg__cli_scan_init(&sc, argc, argv, "cache");
	while ((id = dg__cli_scan(&sc, opts, &arg)) != DG__CLI_SCAN_END) {
		switch (id) {
		case OPT_HELP:
			help();
			return DG__CLI_OK;
		case OPT_JSON:
			json = true;
			break;
		case OPT_DIR:
			dir = arg;
			break;
		case OPT_MAX_BYTES:
			if (!dg__cli_parse_u64("--max-bytes", arg, 1, UINT64_MAX,
					       &max_bytes))
				return DG__CLI_USAGE;
			have_max = true;
			break;
		case DG__CLI_SCAN_ARG:
			if (a != A__NONE)
				return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
						   "cache takes one action, got '%s' after '%s'",
						   arg, action_names[a]);
			for (int i = 0; i < A__NONE; i++)
				if (strcmp(arg, action_names[i]) == 0)
					a = (action)i;
			if (a == A__NONE)
				return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
						   "cache: unknown action '%s'; actions are stat, verify, gc, clear",
						   arg);
			break;
		default:
			return DG__CLI_USAGE;
		}
	}
	if (a == A__NONE)
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "cache needs an action: stat, verify, gc or clear (see `dragon-gen cache --help`)");
	if (have_max && a != A_GC)
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "cache %s: --max-bytes applies to gc only",
				   action_names[a]);

	dg_cache *c = NULL;
	dg_cache_opts co = { .dir = dir, .no_create = true };
	dg_status st = dg_cache_open(&c, &co);
	int code;
	if (st == DG_ERR_NOT_FOUND)
		code = no_cache(a, json);
	else if (st)
		code = fail(c, st, "open");
	else if (a == A_STAT)
		code = do_stat(c, json);
	else if (a == A_VERIFY)
		code = do_verify(c, json);
	else
		code = do_remove(c, a, max_bytes, json);
	dg_cache_close(c);
	return code;
}
