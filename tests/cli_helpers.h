/*
 * Helpers of the CLI tests: run the binary at $DRAGON_GEN (or $DRAGON) with
 * posix_spawn in a sandbox (own cache and output folders), capture its
 * output and exit status, and read what it wrote.
 */
#ifndef DG_TESTS_CLI_HELPERS_H
#define DG_TESTS_CLI_HELPERS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

typedef struct run {
	int code;   /* exit status, or 128 + signal */
	char *out;  /* stdout, NUL-terminated */
	size_t out_len; /* stdout's bytes (raw output may hold NULs) */
	char *err;  /* stderr */
} run;

typedef struct sandbox {
	char *root;      /* temp folder, removed at the end */
	char cache[600]; /* root/cache: DRAGON_CACHE_DIR */
	char out[600];   /* root/out: the bundle folder (not created) */
	const char *template_dir; /* DRAGON_TEMPLATE_DIR, or NULL for none */
} sandbox;

/* Run the program at $env_var (default DRAGON_GEN) whose errors start
 * with prefix (default "dragon-gen: "); call first in each test. */
void cli_use_program(const char *env_var, const char *prefix);
void sandbox_init(sandbox *sb);
void sandbox_fini(sandbox *sb);
char *slurp(const char *path, size_t *size);
pid_t spawn_gen(const sandbox *sb, const char *const *args);
void collect(const sandbox *sb, pid_t pid, run *r);
void run_free(run *r);
void gen(const sandbox *sb, run *r, ...);
/* gen, then exit 0 asserted (stderr in the message) and the run freed:
 * gen_ok(&sb, "train", ..., NULL). */
void gen_ok(const sandbox *sb, ...);
int count_lines(const char *s);
void expect_one_line_error(const run *r, int code, const char *want);
bool exists(const char *path);
char *listing(const char *dir);
cJSON *parse_json(const char *text);
double num(const cJSON *obj, const char *name);

/* Whether an executable `name` is in a folder of $PATH. */
bool on_path(const char *name);
/* Whether a test that draws may run: gnuplot on PATH. Without it the test
 * says "skipped: ..." and returns false, or fails where the suite must have
 * its dependencies (DRAGON_REQUIRE_DEPS=1: scripts/test.sh, so CI and a
 * fresh machine, where scripts/deps.sh installs gnuplot-nox). */
bool gnuplot_or_skip(void);
/* Whether a CUDA device is here; without one prints "skipped: no CUDA
 * device (why)" (a failure with DRAGON_REQUIRE_GPU=1) and says false. */
bool gpu_or_skip(void);

/* ---- dragon train's tests --------------------------------------------- */
/* sb.root/text.txt: n bytes of a repeated sentence (its path into path). */
void text_file(const sandbox *sb, char *path, size_t size, size_t n);
/* The dragon program (cli_use_program("DRAGON", "dragon: ")) in a fresh
 * sandbox with text_file's n bytes of text (its path into data). */
void train_sandbox(sandbox *sb, char *data, size_t size, size_t n);
/* dir's log.jsonl without its timing fields (tokens_per_s, wall_s). */
char *log_text(const char *dir);
/* dir's log_text is straight's, byte for byte; a mismatch fails naming
 * both runs (what, straight_what) with the two logs. */
void expect_same_log(const char *dir, const char *what, const char *straight, const char *straight_what);
/* The step of the checkpoint at path, loaded (which checks it whole). */
long long ckpt_step(const char *path);
/* Lines of dir/log.jsonl, 0 while there is none. */
int log_lines(const char *dir);
/* Waits (polling every 0.2 ms, at most 120 s) until dir's log has n
 * lines; fails if the child pid ends first. */
void wait_for_lines(const char *dir, int n, pid_t pid);
/* A run that a signal stopped: exit 128 + sig, and stderr two lines, the
 * handler's at once ("dragon: SIGINT: stopping with a checkpoint (N
 * steps done); ...") and the error naming want. */
void expect_stopped(const run *r, int sig, const char *want);
/* A loopback TCP port nobody listens on now. */
int free_port(void);
/* As gen with argv args (NULL-terminated), but a run still going after
 * secs is killed and fails the test (a read that blocks, say). */
void gen_within(const sandbox *sb, run *r, double secs, const char *const *args);
/* As gen with argv args, the program given a file-size limit of `limit`
 * bytes (RLIMIT_FSIZE, what `ulimit -f` sets) and SIGXFSZ at its default
 * action, as a shell's child has them: a write past the limit kills it by
 * SIGXFSZ unless it ignores the signal. */
void gen_fsize(const sandbox *sb, run *r, unsigned long long limit, const char *const *args);

#endif
