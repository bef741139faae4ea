/*
 * dragon-gen list: what can be asked for, read off the op table and the
 * format table: every op with its family, what it computes, the spec
 * fields it reads (flag, default, the formats a format field takes), its
 * tile kind and its build lists; the formats; the arches NVRTC targets;
 * and the default build set, expanded as `dragon-gen build` expands it.
 *
 * The text form is printed from the JSON tree, so the two agree.
 */
#include <stdio.h>
#include <string.h>

#include "cli/common/cli.h"
#include "cli/common/scan.h"
#include "cli/dragon-gen/gen.h"
#include "cli/dragon-gen/specset.h"
#include "dragon/jit.h"
#include "dragon/spec.h"

#define MAX_ARCHS 64

enum { OPT_HELP = 1, OPT_JSON };

static const dg__cli_opt opts[] = {
	{ "help", 'h', false, OPT_HELP },
	{ "json", 0, false, OPT_JSON },
	{ NULL, 0, false, 0 },
};

static void help(void)
{
	printf("usage: dragon-gen list [--json]\n\n"
	       "Lists the ops (family, what each computes, the spec fields it reads\n"
	       "with their flags, defaults and the formats each takes, the tile kind),\n"
	       "the data formats, the arches NVRTC can target and the default build\n"
	       "set that `dragon-gen build` uses without spec flags.\n\n"
	       "  --json      the same, machine-readable, on stdout\n"
	       "  -h, --help  this text\n");
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
			snprintf(out, size, "%.*s", (int)(end - p - kl - 1), p + kl + 1);
			return;
		}
		p = end + 1;
	}
}

/* The formats a field of row takes (0: not a format field). */
static unsigned formats_of(const dg_op_info *row, unsigned field)
{
	switch (field) {
	case DG_FIELD_WEIGHT: return row->weight_fmts;
	case DG_FIELD_ACT: return row->act_fmts;
	case DG_FIELD_OUT: return row->out_fmts;
	case DG_FIELD_SRC: return row->src_fmts;
	default: return 0;
	}
}

static cJSON *fmt_array(unsigned mask)
{
	cJSON *a = cJSON_CreateArray();
	for (int f = 0; a && f < DG_FMT__COUNT; f++)
		if (mask & DG_FMT_BIT(f))
			cJSON_AddItemToArray(a, cJSON_CreateString(dg_fmt_name((dg_fmt)f)));
	return a;
}

static cJSON *op_json(dg_op op)
{
	const dg_op_info *row = dg_op_info_of(op);
	char canon[DG_SPEC_TEXT_MAX], def[64];
	dg_spec s;
	cJSON *o = cJSON_CreateObject(), *fields = cJSON_CreateArray();

	dg_spec_init(&s, op);
	dg_spec_to_string(&s, canon, sizeof(canon));
	cJSON_AddStringToObject(o, "name", dg_op_name(op));
	cJSON_AddStringToObject(o, "family", row->family);
	cJSON_AddStringToObject(o, "about", row->about);
	cJSON_AddStringToObject(o, "template", row->module);
	cJSON_AddStringToObject(o, "tile", row->tile == DG_TILE_GEMM ? "gemm" : "threads");
	cJSON_AddStringToObject(o, "tile_form",
				row->tile == DG_TILE_GEMM ? "BMxBNxBK/WMxWN/S" : "t<threads>");
	cJSON_AddItemToObject(o, "fields", fields);
	for (int f = 1; f < DG__SF__COUNT; f++) {
		unsigned field = dg__spec_flag_field((dg__spec_flag)f);
		if (!(row->fields & field))
			continue;
		const char *key = dg__spec_flag_key((dg__spec_flag)f);
		char flag[32];
		cJSON *k = cJSON_CreateObject();
		snprintf(flag, sizeof(flag), "--%s", dg__spec_flag_name((dg__spec_flag)f));
		value_of(canon, key, def, sizeof(def));
		cJSON_AddStringToObject(k, "key", key);
		cJSON_AddStringToObject(k, "flag", flag);
		cJSON_AddStringToObject(k, "default", def);
		unsigned fm = formats_of(row, field);
		if (fm)
			cJSON_AddItemToObject(k, "formats", fmt_array(fm));
		if (row->weight_axis == field)
			cJSON_AddStringToObject(k, "packs", "weight");
		if (field == DG_FIELD_EMBD && row->pack_fmt != DG_FMT__COUNT)
			cJSON_AddStringToObject(k, "packs", dg_fmt_name(row->pack_fmt));
		cJSON_AddItemToArray(fields, k);
	}
	cJSON_AddStringToObject(o, "build", row->build ? row->build : "");
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
	for (int f = 0; f < DG_FMT__COUNT; f++) {
		const dg_fmt_info *fi = dg_fmt_info_of((dg_fmt)f);
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "name", fi->name);
		cJSON_AddBoolToObject(o, "codes", fi->code);
		cJSON_AddNumberToObject(o, "bits", fi->bits);
		cJSON_AddNumberToObject(o, "per_word", fi->per_word);
		cJSON_AddItemToArray(fmts, o);
	}
	cJSON_AddItemToObject(root, "nvrtc", nv);
	cJSON_AddStringToObject(nv, "version", dg_nvrtc_version());
	cJSON_AddItemToObject(nv, "archs", archs);
	for (int i = 0; i < n_arch && i < MAX_ARCHS; i++)
		cJSON_AddItemToArray(archs, cJSON_CreateNumber(arch[i]));
	cJSON_AddItemToObject(root, "default_set", ds);
	cJSON_AddNumberToObject(ds, "size", (double)set->n);
	cJSON_AddNumberToObject(ds, "dropped", (double)set->dropped);
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

static const char *str(const cJSON *o, const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
	return cJSON_IsString(v) ? v->valuestring : "";
}

static void print_text(const cJSON *root)
{
	const cJSON *op, *k, *v;

	printf("ops (family; tile; spec fields: flag, default, formats):\n");
	cJSON_ArrayForEach(op, cJSON_GetObjectItem(root, "ops")) {
		printf("  %s (%s; tile %s)\n    %s\n", str(op, "name"), str(op, "family"),
		       str(op, "tile_form"), str(op, "about"));
		cJSON_ArrayForEach(k, cJSON_GetObjectItem(op, "fields")) {
			printf("    %-13s default %s", str(k, "flag"), str(k, "default"));
			int i = 0;
			cJSON_ArrayForEach(v, cJSON_GetObjectItem(k, "formats"))
				printf("%s%s", i++ ? ", " : "; one of ", v->valuestring);
			if (str(k, "packs")[0])
				printf("; %s codes are packed along it", str(k, "packs"));
			printf("\n");
		}
		printf("    build: %s\n", str(op, "build")[0] ? str(op, "build") : "the defaults");
	}
	printf("formats:");
	cJSON_ArrayForEach(v, cJSON_GetObjectItem(root, "formats"))
		printf(" %s", str(v, "name"));
	const cJSON *nv = cJSON_GetObjectItem(root, "nvrtc");
	printf("\nNVRTC %s targets:", str(nv, "version"));
	cJSON_ArrayForEach(v, cJSON_GetObjectItem(nv, "archs"))
		printf(" sm_%d", v->valueint);
	const cJSON *ds = cJSON_GetObjectItem(root, "default_set");
	int size = cJSON_GetObjectItem(ds, "size")->valueint;
	printf("\ndefault build set (`dragon-gen build` without spec flags): %d spec%s (", size,
	       size == 1 ? "" : "s");
	int i = 0;
	cJSON_ArrayForEach(v, cJSON_GetObjectItem(ds, "per_op"))
		printf("%s%s %d", i++ ? ", " : "", v->string, v->valueint);
	printf(")\n");
	cJSON_ArrayForEach(v, cJSON_GetObjectItem(ds, "specs"))
		printf("  %s\n", v->valuestring);
}

int dg__gen_cmd_list(int argc, char **argv)
{
	dg__cli_scan_state sc;
	dg__spec_flags none = { { 0 } };
	dg__specset set;
	dg_codegen *cg = NULL;
	const char *arg;
	bool json = false;
	char msg[1024];
	int id;

	dg__cli_scan_init(&sc, argc, argv, "list");
	while ((id = dg__cli_scan(&sc, opts, &arg)) != DG__CLI_SCAN_END) {
		if (id == OPT_HELP) {
			help();
			return DG__CLI_OK;
		}
		if (id == OPT_JSON)
			json = true;
		else if (id == DG__CLI_SCAN_ARG)
			return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG, "list takes no arguments, got '%s'", arg);
		else
			return DG__CLI_USAGE;
	}
	dg_status st = dg_codegen_create(&cg, NULL);
	if (!st)
		st = dg__specset_expand(cg, &none, &set, msg, sizeof(msg));
	else
		snprintf(msg, sizeof(msg), "%s", cg ? dg_codegen_errmsg(cg) : dg_status_str(st));
	dg_codegen_destroy(cg);
	if (st)
		return dg__cli_err(DG__CLI_FAIL, st, "list: the default build set: %s", msg);
	dg__specset_note_dropped(&set);
	cJSON *root = build_json(&set);
	dg__specset_free(&set);
	if (json)
		return dg__cli_json_print(root);
	if (!root)
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_NOMEM, "out of memory listing");
	print_text(root);
	cJSON_Delete(root);
	return DG__CLI_OK;
}
