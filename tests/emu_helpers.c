/*
 * Helpers of the CPU emulation suites; see tests/emu_helpers.h.
 */
#include <criterion/criterion.h>

#include <ctype.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emu_helpers.h"

/* The source with its shared memory made host memory: "extern __shared__
 * [__align__(n)] T name[];" becomes "T *name = (T *)dg_emu_dyn_smem;",
 * every other "__shared__" "static". malloc'd. */
static char *rewrite_shared(const char *text)
{
	size_t n = strlen(text);
	char *out = malloc(2 * n + 1);
	cr_assert_not_null(out);
	size_t o = 0;
	for (const char *p = text; *p;) {
		if (strncmp(p, "extern __shared__", 17) == 0) {
			const char *end = strchr(p, ';');
			cr_assert_not_null(end, "an extern __shared__ without ';'");
			char decl[256];
			size_t len = (size_t)(end - (p + 17));
			cr_assert_lt(len, sizeof(decl));
			memcpy(decl, p + 17, len);
			decl[len] = '\0';
			char *d = decl;
			while (*d == ' ')
				d++;
			if (strncmp(d, "__align__(", 10) == 0) /* drop the alignment */
				d = strchr(d, ')') + 1;
			/* "T name[]": the name the word before "[]", the type what precedes it */
			char *br = strstr(d, "[]");
			cr_assert_not_null(br, "'%s': not an array of unknown size", d);
			*br = '\0';
			char *nm = br;
			while (nm > d && (nm[-1] == '_' || isalnum((unsigned char)nm[-1])))
				nm--;
			char type[256], name[256];
			snprintf(name, sizeof(name), "%s", nm);
			*nm = '\0';
			snprintf(type, sizeof(type), "%s", d);
			cr_assert(name[0] && type[0], "'%s': no type or name", d);
			o += (size_t)sprintf(out + o, "%s *%s = (%s *)dg_emu_dyn_smem", type, name, type);
			p = end;
			continue;
		}
		if (strncmp(p, "__shared__", 10) == 0) {
			memcpy(out + o, "static", 6);
			o += 6;
			p += 10;
			continue;
		}
		out[o++] = *p++;
	}
	out[o] = '\0';
	return out;
}

void *eh_build(dg_codegen *cg, const dg_spec *spec, const char *glue, const char *entry)
{
	dg_source *src = NULL;
	char text[DG_SPEC_TEXT_MAX];
	dg_spec_to_string(spec, text, sizeof(text));
	cr_assert_eq(dg_codegen_render(cg, spec, &src), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
	char *body = rewrite_shared(src->text);
	dg_source_destroy(src);
	char dir[32] = "/tmp/dg-emu-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char cpp[64], so[64], log[64], cmd[1024];
	snprintf(cpp, sizeof(cpp), "%s/k.cpp", dir);
	snprintf(so, sizeof(so), "%s/k.so", dir);
	snprintf(log, sizeof(log), "%s/log", dir);
	FILE *f = fopen(cpp, "w");
	cr_assert_not_null(f);
	fprintf(f, "#include \"%s/tests/emu/cuda_emu.hpp\"\n%s\n%s\n", DG_SOURCE_DIR, body, glue);
	cr_assert_eq(fclose(f), 0);
	free(body);
	const char *cxx = getenv("CXX") ? getenv("CXX") : "c++";
	snprintf(cmd, sizeof(cmd), "%s -std=c++20 -O1 -ffp-contract=off -fno-fast-math -fPIC -shared -pthread -w -o %s %s > %s 2>&1",
		 cxx, so, cpp, log);
	if (system(cmd) != 0) {
		char out[4096] = "";
		FILE *l = fopen(log, "r");
		if (l) {
			size_t k = fread(out, 1, sizeof(out) - 1, l);
			out[k] = '\0';
			fclose(l);
		}
		cr_assert_fail("%s: the CPU build failed (%s):\n%s", text, cmd, out);
	}
	void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
	cr_assert_not_null(h, "%s: %s", so, dlerror());
	void *sym = dlsym(h, entry);
	cr_assert_not_null(sym, "%s: no %s", so, entry);
	if (!getenv("DG_EMU_KEEP")) /* DG_EMU_KEEP=1: the source and object stay, for a debugger */
		unlink(cpp), unlink(so), unlink(log), rmdir(dir);
	return sym;
}
