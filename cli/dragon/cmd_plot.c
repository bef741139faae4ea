/*
 * dragon plot — the loss curves of one or more training logs (dragon
 * train's log.jsonl) as one PNG, drawn by gnuplot (Debian's gnuplot-nox,
 * which scripts/deps.sh installs): for each log its training loss (thin)
 * and its validation loss (points and line), against the step, labelled by
 * the log's folder name (or --label).
 *
 * Nothing the user typed or named is run. gnuplot is started by
 * posix_spawnp (no shell) on a script of ours whose only user text, the
 * title and the labels, is in single quotes with quotes doubled and control
 * characters made spaces: gnuplot does no backquote substitution, no @
 * macro expansion and no backslash processing inside single quotes, and
 * the terminal is noenhanced, so they show as typed. The PNG goes to
 * gnuplot's stdout, a temporary file beside --out that is published onto
 * it whole (base/publish.h: fsync, rename, fsync of the folder), so
 * gnuplot never sees --out (one starting with '|' is a file, not a pipe).
 * An --out that is one of the logs is refused: the output never
 * overwrites an input.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/publish.h"
#include "cli/common/cli.h"
#include "cli/common/scan.h"
#include "cli/dragon/cmd.h"

extern char **environ;

static const char help_text[] =
	"usage: dragon plot LOG.jsonl [LOG.jsonl ...] [--out loss.png] [--title T]\n"
	"                   [--label NAME]... [--width W --height H]\n\n"
	"Draws the loss curves of `dragon train` logs into one PNG with gnuplot:\n"
	"each log's training loss (a thin line) and validation loss (points joined),\n"
	"against the step.\n\n"
	"  --out FILE      the PNG (default loss.png), replaced whole once gnuplot is\n"
	"                  done; never one of the logs\n"
	"  --title T       the plot's title (default \"BDH training\")\n"
	"  --label NAME    a log's name in the key, in the order of the logs (default:\n"
	"                  its folder's name); title and labels show as typed (a\n"
	"                  control character as a space), never run\n"
	"  --width W, --height H\n"
	"                  pixels (default 1200 x 700)\n\n"
	"Needs gnuplot on PATH (Debian: gnuplot-nox). Exit status: 0 ok, 1 failure (a\n"
	"log without a step, gnuplot missing or failing), 2 usage (also an --out that\n"
	"is a folder or one of the logs).\n";

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

/* The log's default label: its folder's name ("" for a log at "/"). */
static void label_of(const char *path, char *out, size_t size)
{
	const char *slash = strrchr(path, '/');
	if (!slash) {
		snprintf(out, size, "%s", path);
		return;
	}
	const char *start = slash;
	while (start > path && start[-1] != '/')
		start--;
	snprintf(out, size, "%.*s", (int)(slash - start), start);
}

/* The bytes of s inside a single-quoted gnuplot string: each quote
 * doubled, each control character (a newline would end the command) a
 * space. */
static void gp_quoted(FILE *g, const char *s)
{
	for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
		if (*c == '\'')
			fputs("''", g);
		else
			fputc(*c < 0x20 || *c == 0x7f ? ' ' : *c, g);
	}
}

/* s then suffix as one single-quoted gnuplot string. Inside single quotes
 * gnuplot substitutes no backquotes, expands no @ macros and reads
 * backslashes as themselves. */
static void gp_str(FILE *g, const char *s, const char *suffix)
{
	fputc('\'', g);
	gp_quoted(g, s);
	gp_quoted(g, suffix);
	fputc('\'', g);
}

/* Whether a and b name one existing file (symlinks and hard links too). */
static bool same_file(const char *a, const char *b)
{
	struct stat sa, sb;
	return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* The last non-empty line of the file at path into why ("" if none). */
static void last_line(const char *path, char *why, size_t size)
{
	char line[512];
	why[0] = '\0';
	FILE *e = fopen(path, "r");
	if (!e)
		return;
	while (fgets(line, sizeof(line), e)) {
		line[strcspn(line, "\r\n")] = '\0';
		if (line[strspn(line, " \t")])
			snprintf(why, size, "%s", line);
	}
	fclose(e);
}

/* Runs `gnuplot script` (found on PATH, no shell) with stdout to out_fd
 * and stderr to err_path. Returns 0 when it exited 0, ENOENT when there is
 * no gnuplot, -1 when it failed (its reason in err_path), else an errno. */
static int run_gnuplot(const char *script, int out_fd, const char *err_path)
{
	posix_spawn_file_actions_t fa;
	char *argv[] = { "gnuplot", (char *)script, NULL };
	pid_t pid;
	int rc = posix_spawn_file_actions_init(&fa);
	if (rc)
		return rc;
	if (!(rc = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0)) &&
	    !(rc = posix_spawn_file_actions_adddup2(&fa, out_fd, 1)) &&
	    !(rc = posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600)))
		rc = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (rc)
		return rc;
	int ws;
	while (waitpid(pid, &ws, 0) < 0)
		if (errno != EINTR)
			return errno;
	return WIFEXITED(ws) && WEXITSTATUS(ws) == 0 ? 0 : -1;
}

/* The script: the logs' data files, their labels and the title; the PNG
 * on stdout. Returns 0, or an errno. */
static int write_script(const char *path, uint64_t width, uint64_t height, const char *title, int nlogs,
			char data[][64], const char *const *lab)
{
	FILE *g = fopen(path, "w");
	if (!g)
		return errno;
	fprintf(g, "set terminal pngcairo noenhanced size %llu,%llu font 'sans,11'\n", (unsigned long long)width,
		(unsigned long long)height);
	fputs("set output\nset title ", g); /* no file: stdout */
	gp_str(g, title, "");
	fputs("\nset xlabel 'step'\nset ylabel 'loss (nats a byte)'\n", g);
	fputs("set grid\nset key top right\nset datafile missing NaN\nplot ", g);
	for (int i = 0; i < nlogs; i++) {
		fputs(i ? ", " : "", g);
		gp_str(g, data[i], "");
		fprintf(g, " using 1:2 with lines lw 1 lc %d title ", i + 1);
		gp_str(g, lab[i], " train");
		fputs(", ", g);
		gp_str(g, data[i], "");
		fprintf(g, " using 1:3 with linespoints lw 2 pt 7 ps 0.8 lc %d title ", i + 1);
		gp_str(g, lab[i], " val");
	}
	fputc('\n', g);
	int e = ferror(g) ? EIO : 0;
	if (fclose(g) != 0 && !e)
		e = errno;
	return e;
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
	if (!*out)
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG, "--out: an empty path; name the PNG to write");
	struct stat st;
	if (stat(out, &st) == 0 && S_ISDIR(st.st_mode))
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "--out %s is a folder; name the PNG to write (e.g. %s/loss.png)", out, out);
	for (int i = 0; i < nlogs; i++)
		if (same_file(out, logs[i]))
			return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
					   "--out %s is the log %s: a plot never overwrites its input; name another --out",
					   out, logs[i]);

	char dir[] = "/tmp/dragon-plot-XXXXXX";
	if (!mkdtemp(dir))
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_IO, "a temporary folder: %s", strerror(errno));
	/* a default label is one path component: NAME_MAX (255) bytes at most */
	char data[MAX_LOGS][64] = { { 0 } }, script[64], errp[64], folder[MAX_LOGS][256];
	const char *lab[MAX_LOGS];
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
			lab[i] = labels[i];
		} else {
			label_of(logs[i], folder[i], sizeof(folder[i]));
			lab[i] = folder[i];
		}
	}
	snprintf(script, sizeof(script), "%s/plot.gp", dir);
	snprintf(errp, sizeof(errp), "%s/gnuplot.err", dir);
	int e = code ? 0 : write_script(script, width, height, title, nlogs, data, lab);
	if (e)
		code = dg__cli_err(DG__CLI_FAIL, DG_ERR_IO, "%s: %s", script, strerror(e));

	/* the PNG: gnuplot's stdout, a temp file beside --out published onto
	 * it whole (base/publish.h) */
	dg__publish pub = { .fd = -1 };
	if (!code && dg__publish_begin(&pub, out, 0666, NULL, 0))
		code = dg__cli_err(DG__CLI_FAIL, pub.err == ENOENT ? DG_ERR_NOT_FOUND : DG_ERR_IO, "--out %s: %s",
				   out, strerror(pub.failed ? pub.err : ENAMETOOLONG));
	if (!code) {
		e = run_gnuplot(script, pub.fd, errp);
		if (e == ENOENT) {
			code = dg__cli_err(DG__CLI_FAIL, DG_ERR_NOT_FOUND,
					   "gnuplot is not on PATH (Debian: apt-get install gnuplot-nox)");
		} else if (e) {
			char why[512] = "";
			if (e < 0)
				last_line(errp, why, sizeof(why));
			else
				snprintf(why, sizeof(why), "%s", strerror(e));
			code = dg__cli_err(DG__CLI_FAIL, DG_ERR_IO, "gnuplot failed on %s: %s", out, why);
		} else if (dg__publish_commit(&pub, NULL, 0)) {
			code = dg__cli_err(DG__CLI_FAIL, DG_ERR_IO, "--out %s: %s", out, strerror(pub.err));
		} else {
			printf("plot: %s (%d log%s)\n", out, nlogs, nlogs == 1 ? "" : "s");
		}
	}
	dg__publish_abort(&pub); /* nothing after a commit */
	/* the temporary files */
	for (int i = 0; i < nlogs; i++)
		if (data[i][0])
			unlink(data[i]);
	unlink(errp);
	unlink(script);
	rmdir(dir);
	return code;
}
