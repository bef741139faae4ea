/*
 * What dragon and dragon-gen publish reaches the disk in order: a spy
 * (tests/fsync_spy.c) preloaded into the program notes each fsync and
 * rename it makes.
 *  - dragon plot: the PNG is synced, renamed over --out, and --out's
 *    folder synced after the rename (so the plot survives a power loss);
 *  - dragon-gen build --tuned: the kernels and the records are renamed
 *    into the bundle, the bundle's folder and its tune/ folder synced,
 *    and only then manifest.json renamed in (the commit), the folder
 *    synced again after it: after a crash the manifest never lists a file
 *    that is not there.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <criterion/criterion.h>

#include "cli_helpers.h"
#include "helpers.h"

/* The spy in the programs this test runs, noting into root/spy.log. */
static void spy_on(const sandbox *sb)
{
	const char *lib = getenv("DG_FSYNC_SPY_LIB");
	cr_assert(lib && *lib, "DG_FSYNC_SPY_LIB is not set (run through ctest)");
	char log[700], asan[1024];
	snprintf(log, sizeof(log), "%s/spy.log", sb->root);
	setenv("DG_FSYNC_SPY", log, 1);
	setenv("LD_PRELOAD", lib, 1);
	/* a sanitized program wants its runtime first; the spy is not one */
	const char *was = getenv("ASAN_OPTIONS");
	snprintf(asan, sizeof(asan), "%s%sverify_asan_link_order=0", was ? was : "", was && *was ? ":" : "");
	setenv("ASAN_OPTIONS", asan, 1);
}

typedef struct spy_log {
	char *text;
	char *line[4096];
	int n;
} spy_log;

static void spy_read(const sandbox *sb, spy_log *l)
{
	char path[700];
	snprintf(path, sizeof(path), "%s/spy.log", sb->root);
	unsetenv("LD_PRELOAD");
	l->text = slurp(path, NULL);
	l->n = 0;
	for (char *s = strtok(l->text, "\n"); s && l->n < 4096; s = strtok(NULL, "\n"))
		l->line[l->n++] = s;
}

/* "fsync <dev>:<ino>" of what is now at path */
static void fsync_line(const char *path, char *buf, size_t size)
{
	struct stat sb;
	cr_assert_eq(stat(path, &sb), 0, "%s", path);
	snprintf(buf, size, "fsync %llu:%llu", (unsigned long long)sb.st_dev, (unsigned long long)sb.st_ino);
}

/* The first line at or after `from` equal to want, else -1. */
static int find(const spy_log *l, int from, const char *want)
{
	for (int i = from < 0 ? 0 : from; i < l->n; i++)
		if (strcmp(l->line[i], want) == 0)
			return i;
	return -1;
}

/* The last line that renames onto a path starting with prefix (and, with
 * no_slash, has no '/' after it), else -1. */
static int last_rename_into(const spy_log *l, const char *prefix, bool no_slash)
{
	int at = -1;
	size_t k = strlen(prefix);
	for (int i = 0; i < l->n; i++) {
		const char *to = strncmp(l->line[i], "rename ", 7) == 0 ? strrchr(l->line[i], ' ') + 1 : NULL;
		if (to && strncmp(to, prefix, k) == 0 && (!no_slash || !strchr(to + k, '/')))
			at = i;
	}
	return at;
}

static void spy_dump(const spy_log *l)
{
	for (int i = 0; i < l->n; i++)
		cr_log_info("%3d %s", i, l->line[i]);
}

Test(cli_publish, plot_syncs_the_png_and_then_its_folder)
{
	sandbox sb;
	char log[700], dir[700], out[800], want[128];
	cli_use_program("DRAGON", "dragon: ");
	if (!gnuplot_or_skip())
		return;
	sandbox_init(&sb);
	snprintf(log, sizeof(log), "%s/log.jsonl", sb.root);
	FILE *f = fopen(log, "w");
	cr_assert_not_null(f);
	for (int s = 1; s <= 4; s++)
		fprintf(f, "{\"step\": %d, \"train_loss\": %.3f, \"val_loss\": %.3f}\n", s, 5.0 - 0.1 * s,
			5.1 - 0.1 * s);
	fclose(f);
	snprintf(dir, sizeof(dir), "%s/plots", sb.root);
	cr_assert_eq(mkdir(dir, 0755), 0);
	snprintf(out, sizeof(out), "%s/loss.png", dir);
	spy_on(&sb);
	gen_ok(&sb, "plot", log, "--out", out, NULL);

	spy_log l;
	spy_read(&sb, &l);
	int ren = last_rename_into(&l, out, false);
	fsync_line(out, want, sizeof(want));
	int png = find(&l, 0, want);
	fsync_line(dir, want, sizeof(want));
	int folder = find(&l, ren, want);
	if (ren < 0 || png < 0 || png > ren || folder < 0)
		spy_dump(&l);
	cr_expect_geq(ren, 0, "the PNG was not renamed onto --out");
	cr_expect(png >= 0 && png < ren, "the PNG was not fsync'd before its rename");
	cr_expect_gt(folder, ren, "--out's folder was not fsync'd after the rename");
	free(l.text);
	sandbox_fini(&sb);
}

Test(cli_publish, build_syncs_what_the_manifest_lists_before_the_manifest)
{
	sandbox sb;
	char path[800], tune[800], bundle[128], records[128];
	cli_use_program("DRAGON_GEN", "dragon-gen: ");
	sandbox_init(&sb);
	unsetenv("DRAGON_TUNE_DB");
	spy_on(&sb);
	/* pack_i8x4 at the BDH shape has a built-in record: --tuned bundles it */
	gen_ok(&sb, "build", "--tuned", "--op", "pack_i8x4,unpack_i8x4", "--out", sb.out, "-q", NULL);

	spy_log l;
	spy_read(&sb, &l);
	snprintf(path, sizeof(path), "%s/manifest.json", sb.out);
	int commit = last_rename_into(&l, path, false);
	snprintf(path, sizeof(path), "%s/", sb.out);
	snprintf(tune, sizeof(tune), "%s/tune/", sb.out);
	int kernels = -1; /* the last kernel file renamed in, the manifest aside */
	size_t k = strlen(path);
	for (int i = 0; i < l.n; i++) {
		const char *to = strncmp(l.line[i], "rename ", 7) == 0 ? strrchr(l.line[i], ' ') + 1 : NULL;
		if (to && strncmp(to, path, k) == 0 && !strchr(to + k, '/') && strcmp(to + k, "manifest.json") != 0)
			kernels = i;
	}
	int recs = last_rename_into(&l, tune, true);
	fsync_line(sb.out, bundle, sizeof(bundle));
	tune[strlen(tune) - 1] = '\0';
	fsync_line(tune, records, sizeof(records));
	int bundle_synced = find(&l, recs > kernels ? recs : kernels, bundle);
	int tune_synced = find(&l, recs, records);
	int after = find(&l, commit, bundle);
	bool ok = kernels >= 0 && recs >= 0 && commit > kernels && commit > recs && bundle_synced >= 0 &&
		  bundle_synced < commit && tune_synced >= 0 && tune_synced < commit && after > commit;
	if (!ok)
		spy_dump(&l);
	cr_expect_geq(kernels, 0, "no kernel file was renamed into the bundle");
	cr_expect_geq(recs, 0, "no record was renamed into tune/");
	cr_expect(commit > kernels && commit > recs, "manifest.json was renamed in before what it lists");
	cr_expect(bundle_synced >= 0 && bundle_synced < commit,
		  "the bundle's folder was not fsync'd between the kernels' renames and the manifest's");
	cr_expect(tune_synced >= 0 && tune_synced < commit,
		  "tune/ was not fsync'd between the records' renames and the manifest's");
	cr_expect_gt(after, commit, "the bundle's folder was not fsync'd after the manifest's rename");
	free(l.text);
	sandbox_fini(&sb);
}
