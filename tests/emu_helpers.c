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

/* ---- the source's inline PTX as calls of the emulation ------------------- */

typedef struct buf {
	char *p;
	size_t n, cap;
} buf;

static void put(buf *b, const char *s, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		b->cap = 2 * (b->n + n + 1);
		b->p = realloc(b->p, b->cap);
		cr_assert_not_null(b->p);
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = '\0';
}

static void puts_(buf *b, const char *s)
{
	put(b, s, strlen(s));
}

/* An asm statement: its template (the string literals joined, escapes
 * undone) and its operands' expressions, outputs first (%0 ..). */
typedef struct asm_stmt {
	buf tmpl;
	char *ops[160];
	int n_out, n_in;
} asm_stmt;

/* p at the first string literal after "asm ... ("; returns past the ')'. */
static const char *parse_asm(const char *p, asm_stmt *a)
{
	memset(a, 0, sizeof(*a));
	int section = 0; /* 0 template, 1 outputs, 2 inputs, 3 clobbers */
	for (;;) {
		while (isspace((unsigned char)*p))
			p++;
		if (*p == ')')
			return p + 1;
		if (*p == ':') {
			section++;
			p++;
			continue;
		}
		if (*p == ',') {
			p++;
			continue;
		}
		if (*p == '"' && section == 0) { /* a piece of the template */
			for (p++; *p != '"'; p++) {
				cr_assert(*p, "asm: an unterminated string");
				if (*p == '\\') {
					p++;
					char c = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p;
					put(&a->tmpl, &c, 1);
				} else
					put(&a->tmpl, p, 1);
			}
			p++;
			continue;
		}
		if (*p == '"') { /* an operand: "constraint"(expr), or a clobber */
			const char *q = strchr(p + 1, '"');
			cr_assert_not_null(q);
			p = q + 1;
			while (isspace((unsigned char)*p))
				p++;
			if (section == 3 || *p != '(')
				continue;
			const char *e = ++p;
			int depth = 1;
			for (; depth; p++) {
				cr_assert(*p, "asm: an unbalanced operand");
				depth += *p == '(' ? 1 : *p == ')' ? -1 : 0;
			}
			size_t len = (size_t)(p - 1 - e);
			int i = a->n_out + a->n_in;
			cr_assert_lt(i, 160);
			a->ops[i] = strndup(e, len);
			if (section == 1)
				a->n_out++;
			else
				a->n_in++;
			continue;
		}
		cr_assert_fail("asm: unexpected '%.20s'", p);
	}
}

static const char *op(const asm_stmt *a, int i)
{
	cr_assert_lt(i, a->n_out + a->n_in, "asm operand %%%d of %d: '%s'", i, a->n_out + a->n_in, a->tmpl.p);
	return a->ops[i];
}

/* The emulation of one asm statement into out; false: none known. */
static bool emulate_asm(const asm_stmt *a, buf *out)
{
	const char *t = a->tmpl.p ? a->tmpl.p : "";
	char s[4096];
	const char *w = strstr(t, "wgmma.mma_async");
	if (w) {
		int n = 0, k = 0;
		char dt[8], at[8], bt[8];
		cr_assert_eq(sscanf(w, "wgmma.mma_async.sync.aligned.m64n%dk%d.%7[a-z0-9].%7[a-z0-9].%7[a-z0-9]", &n, &k, dt, at,
				    bt),
			     5, "%s", w);
		const int kind = strcmp(at, "bf16") == 0 ? 0 : strcmp(at, "u8") == 0 ? 2 : 1;
		int ta = 0, tb = 0;
		if (kind == 0) { /* "..., p, 1, 1, TA, TB;" */
			const char *pp = strstr(w, "p, ");
			cr_assert_not_null(pp, "%s", w);
			cr_assert_eq(sscanf(pp, "p, %*d, %*d, %d, %d", &ta, &tb), 2, "%s", w);
		}
		cr_assert_eq(a->n_out, n / 2, "%s: %d accumulators", w, a->n_out);
		puts_(out, "{ void *dg_o_[] = {");
		for (int i = 0; i < a->n_out; i++) {
			snprintf(s, sizeof(s), "%s(void *)&(%s)", i ? ", " : "", a->ops[i]);
			puts_(out, s);
		}
		snprintf(s, sizeof(s), "}; dg_emu_wgmma(dg_o_, %d, %d, %s, %s, %s, %d, %d); }", n, kind, op(a, a->n_out),
			 op(a, a->n_out + 1), op(a, a->n_out + 2), ta, tb);
		puts_(out, s);
		return true;
	}
	if (strstr(t, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") ||
	    strstr(t, "mma.sync.aligned.m16n8k32.row.col.s32")) {
		/* {d0..d3}, {a0..a3}, {b0, b1}, {d0..d3}: d in place */
		cr_assert(a->n_out == 4 && a->n_in == 6, "%s: %d outputs, %d inputs", t, a->n_out, a->n_in);
		const int kind = strstr(t, "f32.bf16") ? 0 : strstr(t, ".s32.u8.") ? 2 : 1;
		snprintf(s, sizeof(s),
			 "{ void *dg_o_[] = { (void *)&(%s), (void *)&(%s), (void *)&(%s), (void *)&(%s) }; "
			 "dg_emu_mma_sync(dg_o_, %s, %s, %s, %s, %s, %s, %d); }",
			 op(a, 0), op(a, 1), op(a, 2), op(a, 3), op(a, 4), op(a, 5), op(a, 6), op(a, 7), op(a, 8), op(a, 9), kind);
		puts_(out, s);
		return true;
	}
	if (strstr(t, "ldmatrix.sync.aligned.m8n8.x4")) {
		cr_assert(a->n_out == 4 && a->n_in == 1, "%s", t);
		snprintf(s, sizeof(s), "dg_emu_ldmatrix(&(%s), &(%s), &(%s), &(%s), %s, %d)", op(a, 0), op(a, 1), op(a, 2),
			 op(a, 3), op(a, 4), strstr(t, ".trans") != NULL);
		puts_(out, s);
		return true;
	}
	static const char *const nops[] = { "cp.async.commit_group", "cp.async.wait_group", "cp.async.bulk.commit_group",
					    "cp.async.bulk.wait_group", "wgmma.fence",
					    "wgmma.commit_group", "wgmma.wait_group", "fence.proxy.async",
					    "fence.mbarrier_init", "setmaxnreg" };
	bool blank = true;
	for (const char *c = t; *c; c++)
		blank = blank && isspace((unsigned char)*c);
	if (blank) { /* an empty asm: a compiler barrier */
		puts_(out, "((void)0)");
		return true;
	}
	for (size_t i = 0; i < sizeof(nops) / sizeof(nops[0]); i++)
		if (strstr(t, nops[i])) { /* ordering and register hints: nothing at issue */
			puts_(out, "((void)0)");
			return true;
		}
	if (strstr(t, "mbarrier.try_wait.parity"))
		snprintf(s, sizeof(s), "dg_emu_mbar_wait(%s, %s)", op(a, 0), op(a, 1));
	else if (strstr(t, "mbarrier.init"))
		snprintf(s, sizeof(s), "dg_emu_mbar_init(%s, %s)", op(a, 0), op(a, 1));
	else if (strstr(t, "mbarrier.arrive.expect_tx.shared::cta"))
		snprintf(s, sizeof(s), "dg_emu_mbar_expect_tx(%s, %s)", op(a, 0), op(a, 1));
	else if (strstr(t, "mbarrier.arrive.shared::cta"))
		snprintf(s, sizeof(s), "dg_emu_mbar_arrive(%s)", op(a, 0));
	else if (strstr(t, "cp.async.bulk.tensor.3d.global.shared::cta")) /* [map, {c}], [src] */
		snprintf(s, sizeof(s), "dg_emu_tma_store3(%s, %s, %s, %s, %s)", op(a, 0), op(a, 1), op(a, 2), op(a, 3),
			 op(a, 4));
	else if (strstr(t, "cp.async.bulk.tensor.3d") && !strstr(t, "multicast"))
		snprintf(s, sizeof(s), "dg_emu_tma_load3(%s, %s, %s, %s, %s, %s)", op(a, 0), op(a, 1), op(a, 2), op(a, 3),
			 op(a, 4), op(a, 5));
	else if (strstr(t, "cp.async.bulk.tensor.5d") && !strstr(t, "multicast"))
		snprintf(s, sizeof(s), "dg_emu_tma_load5(%s, %s, %s, %s, %s, %s, %s, %s)", op(a, 0), op(a, 1), op(a, 2),
			 op(a, 3), op(a, 4), op(a, 5), op(a, 6), op(a, 7));
	else if (strstr(t, "cp.async.cg.shared.global") || strstr(t, "cp.async.ca.shared.global")) {
		int n = 0;
		const char *sz = strstr(t, "[%1], ");
		cr_assert(sz && sscanf(sz, "[%%1], %d", &n) == 1, "%s", t);
		snprintf(s, sizeof(s), "dg_emu_cp_async(%s, (unsigned long long)(%s), %d, %s)", op(a, 0), op(a, 1), n,
			 a->n_in > 2 ? op(a, 2) : "16");
	} else if (strstr(t, "st.shared.v4.b32"))
		snprintf(s, sizeof(s), "dg_emu_st_shared_v4(%s, %s, %s, %s, %s)", op(a, 0), op(a, 1), op(a, 2), op(a, 3),
			 op(a, 4));
	else if (strstr(t, "bar.sync")) {
		unsigned id = 0;
		cr_assert_eq(sscanf(strstr(t, "bar.sync"), "bar.sync %u", &id), 1, "%s", t);
		snprintf(s, sizeof(s), "dg_emu_bar_sync(%u, %s)", id, op(a, 0));
	} else if (strstr(t, "bar.arrive")) {
		unsigned id = 0;
		cr_assert_eq(sscanf(strstr(t, "bar.arrive"), "bar.arrive %u", &id), 1, "%s", t);
		snprintf(s, sizeof(s), "dg_emu_bar_arrive(%u, %s)", id, op(a, 0));
	} else if (strstr(t, "%dynamic_smem_size"))
		snprintf(s, sizeof(s), "(%s) = (unsigned)dg_emu_dyn_size", op(a, 0));
	else if (strstr(t, "cvt.rn.bf16x2.f32"))
		snprintf(s, sizeof(s), "(%s) = dg_emu_cvt_bf16x2(%s, %s)", op(a, 0), op(a, 1), op(a, 2));
	else if (strstr(t, "max.bf16x2"))
		snprintf(s, sizeof(s), "(%s) = dg_emu_max_bf16x2(%s, %s)", op(a, 0), op(a, 1), op(a, 2));
	else if (strstr(t, "fma.rn.sat.f32"))
		snprintf(s, sizeof(s), "(%s) = dg_emu_fma_sat(%s, %s, %s)", op(a, 0), op(a, 1), op(a, 2), op(a, 3));
	else if (strstr(t, "dp4a.u32.s32") || strstr(t, "dp4a.s32.s32"))
		snprintf(s, sizeof(s), "(%s) = dg_emu_dp4a(%s, %s, %s, %d)", op(a, 0), op(a, 1), op(a, 2), op(a, 3),
			 strstr(t, "dp4a.u32") != NULL);
	else
		return false;
	puts_(out, s);
	return true;
}

/* The source with its shared memory made host memory ("extern __shared__
 * [__align__(n)] T name[];" becomes "T *name = (T *)dg_emu_dyn_smem;",
 * every other "__shared__" "static") and its inline PTX made calls of the
 * emulation; malloc'd. An asm the emulation does not know becomes a call
 * that stops the process naming it, if it is ever reached. */
static char *rewrite_source(const char *text)
{
	buf out = { 0 };
	puts_(&out, "");
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
			char type[256], name[256], s[800];
			snprintf(name, sizeof(name), "%s", nm);
			*nm = '\0';
			snprintf(type, sizeof(type), "%s", d);
			cr_assert(name[0] && type[0], "'%s': no type or name", d);
			snprintf(s, sizeof(s), "%s *%s = (%s *)dg_emu_dyn_smem", type, name, type);
			puts_(&out, s);
			p = end;
			continue;
		}
		if (strncmp(p, "__shared__", 10) == 0) {
			puts_(&out, "static");
			p += 10;
			continue;
		}
		const bool word = p == text || !(isalnum((unsigned char)p[-1]) || p[-1] == '_');
		if (word && strncmp(p, "asm", 3) == 0 && !(isalnum((unsigned char)p[3]) || p[3] == '_')) {
			const char *q = p + 3;
			while (isspace((unsigned char)*q))
				q++;
			if (strncmp(q, "volatile", 8) == 0)
				q += 8;
			while (isspace((unsigned char)*q))
				q++;
			if (*q == '(') {
				asm_stmt a;
				const char *after = parse_asm(q + 1, &a);
				if (!emulate_asm(&a, &out)) { /* run only if reached: a helper may go unused */
					puts_(&out, "dg_emu_unknown(\"");
					for (const char *c = a.tmpl.p ? a.tmpl.p : ""; *c; c++) {
						char e[3] = { '\\', *c, 0 };
						if (*c == '"' || *c == '\\')
							puts_(&out, e);
						else if (*c == '\n')
							puts_(&out, "\\n");
						else
							put(&out, c, 1);
					}
					puts_(&out, "\")");
				}
				for (int i = 0; i < a.n_out + a.n_in; i++)
					free(a.ops[i]);
				free(a.tmpl.p);
				p = after;
				continue;
			}
		}
		put(&out, p, 1);
		p++;
	}
	return out.p;
}

void *eh_build(dg_codegen *cg, const dg_spec *spec, const char *glue, const char *entry)
{
	dg_source *src = NULL;
	char text[DG_SPEC_TEXT_MAX];
	dg_spec_to_string(spec, text, sizeof(text));
	cr_assert_eq(dg_codegen_render(cg, spec, &src), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
	char *body = rewrite_source(src->text);
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
