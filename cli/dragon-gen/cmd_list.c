/*
 * dragon-gen list: what can be asked for. Every op, the spec keys it reads
 * with their defaults and allowed values, the formats, the arches NVRTC
 * targets, and the built-in default set.
 *
 * Allowed formats are not restated here: they are found by asking the spec
 * validator about each format, so this list cannot drift from spec.c.
 */
#include <stdio.h>
#include <string.h>

#include "cli/dragon-gen/gen.h"
#include "cli/dragon-gen/specset.h"
#include "cli/dragon-gen/util.h"
#include "dragon/jit.h"
#include "dragon/spec.h"

#define MAX_ARCHS 64

enum { OPT_HELP = 1, OPT_JSON };

static const dg__gen_opt opts[] = {
	{ "help", 'h', false, OPT_HELP },
	{ "json", 0, false, OPT_JSON },
	{ NULL, 0, false, 0 },
};

static void help(void)
{
	printf("usage: dragon-gen list [--json]\n\n"
	       "Lists the ops, the spec keys each takes (flag, default, allowed\n"
	       "values), the data formats, the arches NVRTC can target and the\n"
	       "built-in default set that `dragon-gen build` uses without spec flags.\n\n"
	       "  --json      machine-readable output on stdout\n"
	       "  -h, --help  this text\n");
}

/* Non-format keys: what a value looks like. */
static const char *describe(dg__spec_flag f)
{
	switch (f) {
	case DG__SF_HEADS:
		return "positive integer";
	case DG__SF_IN_HEADS:
		return "1 (input shared by all heads) or heads";
	case DG__SF_EMBD:
		return "multiple of 4 (of 16/32 for ternary/sign1 weights)";
	case DG__SF_LATENT:
		return "positive integer (multiple of 4 for lowrank_fwd)";
	case DG__SF_RELU:
		return "none, or a finite threshold such as 0 or 0.25";
	case DG__SF_TILE:
		return "auto, t<threads> or BMxBNxBK/WMxWN/S";
	case DG__SF_ARCH:
		return "sm_XY or sm_XYa";
	default:
		return NULL;
	}
}

static bool is_format_key(dg__spec_flag f)
{
	return f == DG__SF_WEIGHT || f == DG__SF_ACT || f == DG__SF_OUT ||
	       f == DG__SF_SRC;
}

/* The value of `key` in a canonical text ("act=int8;arch=sm_90;..."). */
static void value_of(const char *canon, const char *key, char *out, size_t size)
{
	size_t kl = strlen(key);
	out[0] = '\0';
	for (const char *p = canon; *p;) {
		const char *end = strchr(p, ';');
		if (!end)
			break;
		if (strncmp(p, key, kl) == 0 && p[kl] == '=') {
			snprintf(out, size, "%.*s", (int)(end - p - kl - 1),
				 p + kl + 1);
			return;
		}
		p = end + 1;
	}
}

/* Formats the validator accepts for key on op, as an array of names. */
static cJSON *allowed_formats(dg_op op, const char *key)
{
	cJSON *a = cJSON_CreateArray();
	for (int f = 0; a && f < DG_FMT__COUNT; f++) {
		dg_spec s;
		dg_spec_init(&s, op);
		/* relu on, so out=uint8pos is judged on its own merits */
		dg_spec_set(&s, "relu", "0", NULL, 0);
		if (dg_spec_set(&s, key, dg_fmt_name((dg_fmt)f), NULL, 0) == DG_OK &&
		    dg_spec_validate(&s, NULL, 0) == DG_OK)
			cJSON_AddItemToArray(a, cJSON_CreateString(
							dg_fmt_name((dg_fmt)f)));
	}
	return a;
}

static cJSON *op_json(dg_op op)
{
	char canon[DG_SPEC_TEXT_MAX], def[64];
	dg_spec s;
	cJSON *o = cJSON_CreateObject(), *keys = cJSON_CreateArray();

	dg_spec_init(&s, op);
	dg_spec_to_string(&s, canon, sizeof(canon));
	cJSON_AddStringToObject(o, "name", dg_op_name(op));
	cJSON_AddItemToObject(o, "keys", keys);
	for (int f = 1; f < DG__SF__COUNT; f++) {
		if (!(dg_spec_uses(op) & dg__spec_flag_field((dg__spec_flag)f)))
			continue;
		const char *key = dg__spec_flag_key((dg__spec_flag)f);
		char flag[32];
		cJSON *k = cJSON_CreateObject();
		snprintf(flag, sizeof(flag), "--%s",
			 dg__spec_flag_name((dg__spec_flag)f));
		value_of(canon, key, def, sizeof(def));
		cJSON_AddStringToObject(k, "key", key);
		cJSON_AddStringToObject(k, "flag", flag);
		cJSON_AddStringToObject(k, "default", def);
		if (is_format_key((dg__spec_flag)f))
			cJSON_AddItemToObject(k, "allowed", allowed_formats(op, key));
		else
			cJSON_AddStringToObject(k, "allowed",
						describe((dg__spec_flag)f));
		cJSON_AddItemToArray(keys, k);
	}
	return o;
}

static cJSON *build_json(const dg__specset *set)
{
	cJSON *root = cJSON_CreateObject(), *ops = cJSON_CreateArray();
	cJSON *fmts = cJSON_CreateArray(), *ds = cJSON_CreateObject();
	cJSON *per_op = cJSON_CreateObject(), *specs = cJSON_CreateArray();
	cJSON *nv = cJSON_CreateObject(), *archs = cJSON_CreateArray();
	int arch[MAX_ARCHS];
	int n_arch = dg_nvrtc_archs(arch, MAX_ARCHS);

	cJSON_AddItemToObject(root, "ops", ops);
	for (int op = 0; op < DG_OP__COUNT; op++)
		cJSON_AddItemToArray(ops, op_json((dg_op)op));
	cJSON_AddItemToObject(root, "formats", fmts);
	for (int f = 0; f < DG_FMT__COUNT; f++)
		cJSON_AddItemToArray(fmts, cJSON_CreateString(dg_fmt_name((dg_fmt)f)));
	cJSON_AddItemToObject(root, "nvrtc", nv);
	cJSON_AddStringToObject(nv, "version", dg_nvrtc_version());
	cJSON_AddItemToObject(nv, "archs", archs);
	for (int i = 0; i < n_arch && i < MAX_ARCHS; i++)
		cJSON_AddItemToArray(archs, cJSON_CreateNumber(arch[i]));
	cJSON_AddItemToObject(root, "default_set", ds);
	cJSON_AddNumberToObject(ds, "size", (double)set->n);
	cJSON_AddItemToObject(ds, "per_op", per_op);
	for (int op = 0; op < DG_OP__COUNT; op++) {
		size_t n = 0;
		for (size_t i = 0; i < set->n; i++)
			n += set->specs[i].op == (dg_op)op;
		cJSON_AddNumberToObject(per_op, dg_op_name((dg_op)op), (double)n);
	}
	cJSON_AddItemToObject(ds, "specs", specs);
	for (size_t i = 0; i < set->n; i++)
		cJSON_AddItemToArray(specs, cJSON_CreateString(set->canonical[i]));
	return root;
}

/* The text form is printed from the same JSON tree, so both agree. */
static void print_text(const cJSON *root)
{
	const cJSON *op, *k, *v;

	printf("ops (spec keys: flag, default, allowed):\n");
	cJSON_ArrayForEach(op, cJSON_GetObjectItem(root, "ops")) {
		printf("  %s\n", cJSON_GetObjectItem(op, "name")->valuestring);
		cJSON_ArrayForEach(k, cJSON_GetObjectItem(op, "keys")) {
			const cJSON *al = cJSON_GetObjectItem(k, "allowed");
			printf("    %-13s default %-16s ",
			       cJSON_GetObjectItem(k, "flag")->valuestring,
			       cJSON_GetObjectItem(k, "default")->valuestring);
			if (cJSON_IsString(al)) {
				printf("%s\n", al->valuestring);
				continue;
			}
			int i = 0;
			cJSON_ArrayForEach(v, al)
				printf("%s%s", i++ ? ", " : "one of ", v->valuestring);
			printf("\n");
		}
	}
	printf("formats:");
	cJSON_ArrayForEach(v, cJSON_GetObjectItem(root, "formats"))
		printf(" %s", v->valuestring);
	const cJSON *nv = cJSON_GetObjectItem(root, "nvrtc");
	printf("\nNVRTC %s targets:", cJSON_GetObjectItem(nv, "version")->valuestring);
	cJSON_ArrayForEach(v, cJSON_GetObjectItem(nv, "archs"))
		printf(" sm_%d", v->valueint);
	const cJSON *ds = cJSON_GetObjectItem(root, "default_set");
	printf("\ndefault set (`dragon-gen build` without spec flags): %d specs (",
	       cJSON_GetObjectItem(ds, "size")->valueint);
	int i = 0;
	cJSON_ArrayForEach(v, cJSON_GetObjectItem(ds, "per_op"))
		printf("%s%s %d", i++ ? ", " : "", v->string, v->valueint);
	printf(")\n");
}

int dg__gen_cmd_list(int argc, char **argv)
{
	dg__gen_scan_state sc;
	dg__spec_flags none = { { 0 } };
	dg__specset set;
	const char *arg;
	bool json = false;
	char msg[1024];
	int id;

	dg__gen_scan_init(&sc, argc, argv, "list");
	while ((id = dg__gen_scan(&sc, opts, &arg)) != DG__GEN_SCAN_END) {
		if (id == OPT_HELP) {
			help();
			return DG__GEN_OK;
		}
		if (id == OPT_JSON)
			json = true;
		else if (id == DG__GEN_SCAN_ARG)
			return dg__gen_err(DG__GEN_USAGE,
					   "list takes no arguments, got '%s'", arg);
		else
			return DG__GEN_USAGE;
	}
	dg_status st = dg__specset_expand(&none, &set, msg, sizeof(msg));
	if (st)
		return dg__gen_err(DG__GEN_FAIL, "default set: %s", msg);
	cJSON *root = build_json(&set);
	dg__specset_free(&set);
	if (json)
		return dg__gen_json_print(root);
	if (!root)
		return dg__gen_err(DG__GEN_FAIL, "out of memory listing");
	print_text(root);
	cJSON_Delete(root);
	return DG__GEN_OK;
}
