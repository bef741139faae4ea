/*
 * Helpers of the NVRTC suites; see tests/nvrtc_helpers.h.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

#include "nvrtc_helpers.h"
#include "runtime/store/nvrtc.h"

dg_codegen *nh_codegen(void)
{
	dg_codegen *cg = NULL;
	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK, "%s", cg ? dg_codegen_errmsg(cg) : "no memory");
	return cg;
}

void nh_compile(dg_codegen *cg, const dg_spec *spec, const char *path, int sm)
{
	char e[8192], text[DG_SPEC_TEXT_MAX], entry[64];
	dg__nvrtc_target t;
	dg__nvrtc_result res;
	dg_source *src = NULL;

	dg_spec_to_string(spec, text, sizeof(text));
	snprintf(entry, sizeof(entry), "dg_%s", dg_op_name(spec->op));
	cr_assert_eq(dg__nvrtc_target_for(sm, spec->arch_specific, &t, e, sizeof(e)), DG_OK, "%s", e);
	cr_assert_eq(dg_codegen_render(cg, spec, &src), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
	cr_assert_eq(src->n_entries, 1, "%s", text);
	cr_assert_str_eq(src->entries[0], entry, "%s", text);
	if (path)
		cr_assert(strstr(src->text, path), "%s: expected '%s' in the banner", text, path);
	cr_assert(strstr(src->text, "do not edit"), "%s: no generated-code banner", text);
	dg_status st = dg__nvrtc_compile(src, &t, &res, e, sizeof(e));
	cr_assert_eq(st, DG_OK, "%s: %s", text, e);
	cr_assert(res.size > 64 && memcmp(res.image, "\177ELF", 4) == 0, "%s: not an ELF cubin", text);
	dg__nvrtc_result_free(&res);
	dg_source_destroy(src);
}

void nh_expect_refused(dg_codegen *cg, const dg_spec *spec, const char *field)
{
	char msg[512] = "";
	dg_plan p;
	dg_status st = dg_spec_validate(spec, msg, sizeof(msg));
	if (st == DG_OK) {
		st = dg_codegen_plan(cg, spec, &p);
		snprintf(msg, sizeof(msg), "%s", dg_codegen_errmsg(cg));
	}
	cr_assert_eq(st, DG_ERR_INVALID_SPEC, "%s: accepted", field);
	cr_assert(strstr(msg, field), "'%s' does not name %s", msg, field);
}

void nh_expect_named(dg_status st, const char *msg, const char *name, const char *also)
{
	char head[64];
	snprintf(head, sizeof(head), "%s: ", name);
	cr_assert_eq(st, DG_ERR_INVALID_ARG, "accepted (%s): %s", name, msg);
	cr_assert(strncmp(msg, head, strlen(head)) == 0, "'%s' does not name %s", msg, name);
	cr_assert(!also || strstr(msg, also), "'%s' does not say %s", msg, also);
}
