/*
 * dragon plot — the loss curves of one or more training logs (dragon
 * train's log.jsonl) as one PNG, drawn by gnuplot (Debian's gnuplot-nox,
 * which scripts/deps.sh installs): for each log its training loss (thin)
 * and its validation loss (points and line), against the step, labelled by
 * the log's folder name (or --label).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/dragon/cmd.h"
#include "cli/dragon/util.h"

static const char help_text[] =
	"usage: dragon plot LOG.jsonl [LOG.jsonl ...] [--out loss.png] [--title T]\n"
	"                   [--label NAME]... [--width W --height H]\n\n"
	"Draws the loss curves of `dragon train` logs into one PNG with gnuplot:\n"
	"each log's training loss (a thin line) and validation loss (points joined),\n"
	"against the step.\n\n"
	"  --out FILE      the PNG (default loss.png)\n"
	"  --title T       the plot's title (default \"BDH training\")\n"
	"  --label NAME    a log's name in the key, in the order of the logs (default:\n"
	"                  its folder's name)\n"
	"  --width W, --height H\n"
	"                  pixels (default 1200 x 700)\n\n"
	"Needs gnuplot on PATH (Debian: gnuplot-nox). Exit status: 0 ok, 1 failure (a\n"
	"log without a step, gnuplot missing or failing), 2 usage.\n";

enum { O_OUT = 1, O_TITLE, O_LABEL, O_WIDTH, O_HEIGHT, O_HELP };

static const dg__cli_opt opts[] = {
	{ "out", 'o', true, O_OUT },	   { "title", 0, true, O_TITLE }, { "label", 0, true, O_LABEL },
	{ "width", 0, true, O_WIDTH }, { "height", 0, true, O_HEIGHT }, { "help", 'h', false, O_HELP },
	{ NULL, 0, false, 0 },
};

#define MAX_LOGS 16

/* Writes the (step, train_loss, val_loss) rows of log `path` to data
 * (val "NaN" where not evaluated). Returns the rows, -1 on a read error. */
static long rows_of(const char *path, FILE *data, long *vals)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	char line[4096];
	long n = 0;
	*vals = 0;
	while (fgets(line, sizeof(line), f)) {
		long long step;
		double tl;
		if (sscanf(line, "{\"step\": %lld, \"train_loss\": %lf", &step, &tl) != 2)
			continue;
		const char *v = strstr(line, "\"val_loss\": ");
		double vl = v ? strtod(v + 12, NULL) : NAN;
		if (!isnan(vl))
			(*vals)++;
		fprintf(data, "%lld %.9g %.9g\n", step, tl, vl);
		n++;
	}
	fclose(f);
	return n;
}

/* The log's default label: its folder's name. */
static void label_of(const char *path, char *out, size_t size)
{
	char buf[4096];
	snprintf(buf, sizeof(buf), "%s", path);
	char *slash = strrchr(buf, '/');
	if (slash) {
		*slash = '\0';
		char *prev = strrchr(buf, '/');
		snprintf(out, size, "%.200s", prev ? prev + 1 : buf);
	} else {
		snprintf(out, size, "%.200s", path);
	}
	/* gnuplot strings are quoted: no quote or backslash in a label */
	for (char *c = out; *c; c++)
		if (*c == '"' || *c == '\\')
			*c = '_';
}

int dg__cli_cmd_plot(int argc, char **argv)
{
	dg__cli_scan_state s;
	const char *v, *out = "loss.png", *title = "BDH training";
	const char *logs[MAX_LOGS], *labels[MAX_LOGS];
	int nlogs = 0, nlabels = 0, id;
	uint64_t width = 1200, height = 700;

	dg__cli_scan_init(&s, argc, argv, "plot");
	while ((id = dg__cli_scan(&s, opts, &v)) != DG__CLI_SCAN_END) {
		bool ok = true;
		switch (id) {
		case DG__CLI_SCAN_ERROR:
			return DG__CLI_USAGE;
		case DG__CLI_SCAN_ARG:
			if (nlogs == MAX_LOGS)
				return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG, "at most %d logs a plot", MAX_LOGS);
			logs[nlogs++] = v;
			break;
		case O_HELP:
			fputs(help_text, stdout);
			return DG__CLI_OK;
		case O_OUT: out = v; break;
		case O_TITLE: title = v; break;
		case O_LABEL:
			if (nlabels == MAX_LOGS)
				return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG, "at most %d labels", MAX_LOGS);
			labels[nlabels++] = v;
			break;
		case O_WIDTH: ok = dg__cli_parse_u64("--width", v, 100, 10000, &width); break;
		case O_HEIGHT: ok = dg__cli_parse_u64("--height", v, 100, 10000, &height); break;
		}
		if (!ok)
			return DG__CLI_USAGE;
	}
	if (!nlogs)
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "plot: name one or more logs (dragon train's log.jsonl); see `dragon plot --help`");
	if (nlabels > nlogs)
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG, "%d labels for %d logs", nlabels, nlogs);
	if (strpbrk(out, "\"\\\n"))
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG, "--out %s: a quote, backslash or newline in the path", out);
	if (system("command -v gnuplot >/dev/null 2>&1") != 0)
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_NOT_FOUND,
				   "gnuplot is not on PATH (Debian: apt-get install gnuplot-nox)");

	char dir[] = "/tmp/dragon-plot-XXXXXX";
	if (!mkdtemp(dir))
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_IO, "a temporary folder: %s", strerror(errno));
	char data[MAX_LOGS][64] = { { 0 } }, script[64], lab[MAX_LOGS][256];
	int code = DG__CLI_OK;
	for (int i = 0; i < nlogs && !code; i++) {
		snprintf(data[i], sizeof(data[i]), "%s/%d.dat", dir, i);
		FILE *d = fopen(data[i], "w");
		long vals = 0, n = d ? rows_of(logs[i], d, &vals) : -1;
		if (d)
			fclose(d);
		if (n < 0)
			code = dg__cli_err(DG__CLI_FAIL, errno == ENOENT ? DG_ERR_NOT_FOUND : DG_ERR_IO, "%s: %s",
					   logs[i], strerror(errno));
		else if (n == 0)
			code = dg__cli_err(DG__CLI_FAIL, DG_ERR_PARSE, "%s: no step lines (dragon train's log.jsonl)",
					   logs[i]);
		if (i < nlabels) {
			snprintf(lab[i], sizeof(lab[i]), "%.200s", labels[i]);
			for (char *c = lab[i]; *c; c++)
				if (*c == '"' || *c == '\\')
					*c = '_';
		} else {
			label_of(logs[i], lab[i], sizeof(lab[i]));
		}
	}
	snprintf(script, sizeof(script), "%s/plot.gp", dir);
	FILE *g = code ? NULL : fopen(script, "w");
	if (!code && !g)
		code = dg__cli_err(DG__CLI_FAIL, DG_ERR_IO, "%s: %s", script, strerror(errno));
	if (g) {
		char t[512];
		snprintf(t, sizeof(t), "%.400s", title);
		for (char *c = t; *c; c++)
			if (*c == '"' || *c == '\\')
				*c = '_';
		fprintf(g, "set terminal pngcairo size %llu,%llu font \"sans,11\"\n", (unsigned long long)width,
			(unsigned long long)height);
		fprintf(g, "set output \"%s\"\n", out);
		fprintf(g, "set title \"%s\"\nset xlabel \"step\"\nset ylabel \"loss (nats a byte)\"\n", t);
		fprintf(g, "set grid\nset key top right\nset datafile missing NaN\n");
		fprintf(g, "plot ");
		for (int i = 0; i < nlogs; i++)
			fprintf(g,
				"%s\"%s\" using 1:2 with lines lw 1 lc %d title \"%s train\", "
				"\"%s\" using 1:3 with linespoints lw 2 pt 7 ps 0.8 lc %d title \"%s val\"",
				i ? ", " : "", data[i], i + 1, lab[i], data[i], i + 1, lab[i]);
		fprintf(g, "\n");
		fclose(g);
		char cmd[256];
		snprintf(cmd, sizeof(cmd), "gnuplot %s 2>%s/gnuplot.err", script, dir);
		if (system(cmd) != 0) {
			char ep[80], why[512] = "";
			snprintf(ep, sizeof(ep), "%s/gnuplot.err", dir);
			FILE *e = fopen(ep, "r");
			if (e) {
				if (!fgets(why, sizeof(why), e))
					why[0] = '\0';
				fclose(e);
				why[strcspn(why, "\n")] = '\0';
			}
			code = dg__cli_err(DG__CLI_FAIL, DG_ERR_IO, "gnuplot failed on %s: %s", out, why);
		} else {
			printf("plot: %s (%d log%s)\n", out, nlogs, nlogs == 1 ? "" : "s");
		}
	}
	/* the temporary files */
	for (int i = 0; i < nlogs; i++)
		if (data[i][0])
			unlink(data[i]);
	char p[96];
	snprintf(p, sizeof(p), "%s/gnuplot.err", dir);
	unlink(p);
	unlink(script);
	rmdir(dir);
	return code;
}
