/*
 * The spec flags as dragon-gen's options (cli/dragon-gen/specset.h): their
 * --help text, derived from the op table and the format table, and the
 * line about what a product left out.
 */
#include <stdio.h>
#include <string.h>

#include "cli/common/cli.h"
#include "cli/dragon-gen/specset.h"
#include "dragon/jit.h"

bool dg__spec_flags_add(dg__spec_flags *f, int id, const char *value)
{
	int i = id - DG__SPEC_OPT_BASE;
	if (i < 0 || i >= DG__SF__COUNT)
		return false;
	if (!dg__spec_flags_put(f, (dg__spec_flag)i, value)) {
		dg__cli_err(DG__CLI_FAIL, DG_ERR_NOMEM, "out of memory reading flags");
		return false;
	}
	return true;
}

void dg__specset_note_dropped(const dg__specset *set)
{
	char line[1200];

	if (dg__specset_dropped_line(set, line, sizeof(line)))
		fprintf(stderr, "dragon-gen: %s\n", line);
}

/* ---- --help ------------------------------------------------------------------ */

/* What each non-format flag means. */
static const char *const flag_what[DG__SF__COUNT] = {
	[DG__SF_HEADS] = "output heads H",
	[DG__SF_IN_HEADS] = "input heads: 1 (shared by all heads) or H",
	[DG__SF_EMBD] = "model width D",
	[DG__SF_LATENT] = "neurons N a head",
	[DG__SF_VOCAB] = "vocabulary V (token ids 0..V-1)",
	[DG__SF_CHUNK] = "the chunked attention's chunk C: rows of T a state covers (a multiple of 64, 64 to 4096)",
	[DG__SF_RELU] = "none, or a threshold such as 0 or 0.25",
	[DG__SF_TILE] = "auto, t<threads> (t256; t<threads>/1: gate_quant's staged form) or BMxBNxBK/WMxWN/S",
	[DG__SF_ASCALE] = "the act's scale: tensor, or token (one a row)",
	[DG__SF_WSCALE] = "the weight's scale: tensor, or channel (one an output channel)",
	[DG__SF_ROPE] = "attention: load (RoPE on the GEMM's load), or pre (xs is RoPE(xs) already)",
	[DG__SF_EPI] = "attention_grad_xs: store (write grad_xs), or mask (dxs = (dxs + grad_xs)*[mask_xs > 0] in place); lowrank_fwd: store, or rope (qr = RoPE(out) too)",
};

/* Prints text's words wrapped at 78 columns under a 21-column hanging
 * indent; col is where the first one starts. */
static void wrap(FILE *to, const char *text, int col)
{
	bool first = true;
	for (const char *p = text; *p;) {
		while (*p == ' ')
			p++;
		size_t w = strcspn(p, " ");
		if (!w)
			break;
		if (!first && col + 1 + (int)w > 78) {
			fprintf(to, "\n%21s", "");
			col = 21;
		} else if (!first) {
			fputc(' ', to);
			col++;
		}
		fprintf(to, "%.*s", (int)w, p);
		col += (int)w;
		p += w;
		first = false;
	}
	fputc('\n', to);
}

void dg__specset_help(FILE *to, bool default_set)
{
	char line[1024], fl[128];
	unsigned fmts[DG__SF__COUNT] = { 0 };
	dg_spec d;
	int archs[64];
	int n_archs = dg_nvrtc_archs(archs, 64);

	for (int op = 0; op < DG_OP__COUNT; op++) {
		const dg_op_info *r = dg_op_info_of((dg_op)op);
		fmts[DG__SF_WEIGHT] |= r->weight_fmts;
		fmts[DG__SF_ACT] |= r->act_fmts;
		fmts[DG__SF_OUT] |= r->out_fmts;
		fmts[DG__SF_SRC] |= r->src_fmts;
	}
	dg_spec_init(&d, DG_OP_LOWRANK_FWD);
	fputs("Spec flags (each takes a comma-separated list; the specs are their product):\n", to);
	for (int f = 0; f < DG__SF__COUNT; f++) {
		size_t n = 0;
		line[0] = '\0';
		if (f == DG__SF_OP) {
			for (int op = 0; op < DG_OP__COUNT; op++)
				n += (size_t)snprintf(line + n, sizeof(line) - n, "%s%s", op ? ", " : "",
						      dg_op_name((dg_op)op));
		} else if (fmts[f]) {
			dg_fmt_list(fmts[f], fl, sizeof(fl));
			for (char *c = fl; *c; c++)
				if (*c == '|')
					*c = ',';
			for (char *c = fl; *c && n < sizeof(line) - 3; c++) {
				line[n++] = *c;
				if (*c == ',')
					line[n++] = ' ';
			}
			line[n] = '\0';
		} else if (f == DG__SF_ARCH) {
			if (n_archs > 0)
				snprintf(line, sizeof(line), "sm_XY or sm_XYa: NVRTC %s targets sm_%d to sm_%d",
					 dg_nvrtc_version(), archs[0], archs[n_archs - 1]);
			else
				snprintf(line, sizeof(line), "sm_XY or sm_XYa, e.g. sm_90");
		} else {
			snprintf(line, sizeof(line), "%s", flag_what[f] ? flag_what[f] : "");
		}
		char name[40];
		snprintf(name, sizeof(name), "  --%s LIST", dg__spec_flag_name((dg__spec_flag)f));
		fprintf(to, "%-21s", name);
		wrap(to, line, 21);
	}
	fputs("A flag applies to the ops that read it (`dragon-gen list` shows which);\n"
	      "fields without a flag keep the op's default, and combinations an op's\n"
	      "rules or its template refuse are left out of the product.\n",
	      to);
	if (default_set)
		fprintf(to,
			"With no spec flag: the default build set, %zu specs of every op of a\n"
			"BDH training step, forward and backward, at H=%d, D=%d, N=%d (the op\n"
			"table's build lists; `dragon-gen list` shows them).\n",
			dg__specset_default_size(), d.heads, d.embd, d.latent);
}
