/*
 * dragon — tuning records and the tuning DB: the tile an auto spec runs
 * with (dg_tune_resolve). The sweeps that make the records are
 * dragon/autotune.h's (autotune/); these are runtime/tunedb/'s.
 *
 * A spec with an auto tile (tile=auto) is run with the tile a tuning
 * record names for it on this device, else with its template's default
 * for the device (dg_codegen_plan_for; dg_tune_resolve says which and
 * why). A sweep (dg_tune_sweep) makes such a record:
 *
 *   1. the candidate space: a small grid of tiles per op
 *      family — GEMM ops BMxBNxBK/WMxWN/S, element-wise ops t64..t1024 —
 *      for the spec's arch and, on a device of exactly that arch from
 *      sm_90 on, for its arch-specific target too (sm_90a), each kept only
 *      if its template plans it (the plan is the one judge of a tile);
 *   2. every candidate is compiled (in parallel) and loaded; one whose
 *      cubin cannot run (registers, shared memory, threads a block, read
 *      back from the driver) is rejected with the reason;
 *   3. every candidate is run on the same random inputs at a small shape
 *      (check_rows rows B·T) and compared with the CPU reference
 *      (dragon/ref.h): integer outputs bit for bit, float outputs within a
 *      tolerance; a wrong one is rejected;
 *   4. the rest are timed at the real shape (rows, default 4096) with CUDA
 *      events: warm-up calls, then reps calls each after a write of a
 *      buffer larger than the L2 (so every rep starts cold), median, p10
 *      and p90;
 *   5. the winner: among the candidates within the tie
 *      band (2%) of the fastest median, the simplest tile (fewer threads,
 *      then fewer stages, then less shared memory, then the portable
 *      target, then the tile text), so repeated sweeps agree
 *      (steps 1-5: dragon/autotune.h).
 *
 * The record (one JSON document a sweep, dg_tune_record_to_json) holds the
 * canonical spec without its tile, the device, every candidate with its
 * figures or rejection reason, the winner, the generator version, the
 * date and the budget. The tuning DB is every record under
 * $DRAGON_TUNE_DB (a record file or a folder of them; several joined with
 * ':'; "none" turns the DB off), else <cache root>/tune/. It is keyed by
 * (canonical spec without tile, device name, device SM); when several
 * records name one key (records merged from several machines or sweeps)
 * the newest date wins.
 *
 * Without a GPU: records and the DB work; only dg_tune_sweep needs a
 * device.
 */
#ifndef DRAGON_TUNE_H
#define DRAGON_TUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codegen.h"
#include "export.h"
#include "runtime.h"
#include "spec.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- candidates, figures, the winner ------------------------------------------ */

typedef enum dg_tune_state {
	DG_TUNE_TIMED,    /* compiled, correct, timed */
	DG_TUNE_REJECTED, /* did not compile or cannot run (reason) */
	DG_TUNE_WRONG,    /* ran, but differs from the reference (reason) */
	DG_TUNE_SKIPPED,  /* the budget ran out first (reason) */
} dg_tune_state;

typedef struct dg_tune_cand {
	dg_tile tile;
	bool arch_specific; /* compiled for sm_XXa */
	dg_tune_state state;
	double median_us, p10_us, p90_us; /* TIMED */
	int reps;                         /* TIMED */
	int threads;     /* a block (0: unknown) */
	int smem;        /* static + dynamic shared memory a block, bytes */
	int regs;        /* registers a thread, most of any entry */
	int local_bytes; /* spills a thread, most of any entry */
	char reason[512]; /* not TIMED: why */
} dg_tune_cand;

/* Default tie band: candidates within 2% of the fastest median tie. */
#define DG_TUNE_TIE_BAND 0.02

/* ---- records ---------------------------------------------------------------------- */

#define DG_TUNE_RECORD_FORMAT 1

typedef struct dg_tune_device {
	char name[128];
	int sm;             /* 90 */
	int sm_count;
	int driver_version; /* 13000 */
	char nvrtc_version[32];
} dg_tune_device;

/* One sweep. Every pointer is malloc'd and owned by the record
 * (dg_tune_record_destroy frees them). */
typedef struct dg_tune_record {
	dg_spec spec;                /* tile auto, normalized */
	char spec_text[DG_SPEC_TEXT_MAX]; /* its canonical text */
	dg_tune_device device;
	char generator_version[32];
	char date[32];   /* ISO-8601 UTC, "2026-12-01T10:00:00Z" */
	int rows;        /* B·T timed at */
	int check_rows;  /* B·T checked against the reference at */
	int warmup, reps;
	double tie_band;
	double budget_s, elapsed_s;
	bool budget_exhausted; /* the budget ran out: some were SKIPPED */
	dg_tune_cand *cands;
	size_t n_cands;
	int winner;      /* index into cands, or -1 when none was timed */
	char *path;      /* the file it was read from, or NULL */
} dg_tune_record;

DG_API void dg_tune_record_destroy(dg_tune_record *r); /* NULL is fine */

/* Indented JSON text (trailing newline) into *out, malloc'd (free).
 * DG_ERR_INVALID_ARG when a field would not read back. */
DG_API dg_status dg_tune_record_to_json(const dg_tune_record *r, char **out,
					char *msg, size_t msg_size);

/*
 * Parses len bytes of JSON. name (may be NULL) is how messages call the
 * input, usually its path. Malformed or inconsistent input (not JSON, a
 * missing or mistyped field, an unknown op, a spec not in canonical form,
 * a tile the op does not take, a winner that names no timed candidate)
 * gives DG_ERR_PARSE and one line naming the input and the field, e.g.
 * "/db/x.json: candidates[2].median_us: expected a number". *out is NULL
 * on failure; on success a new record (dg_tune_record_destroy).
 */
DG_API dg_status dg_tune_record_parse(const char *json, size_t len, const char *name,
				      dg_tune_record **out, char *msg,
				      size_t msg_size);

/* Reads and parses a file (r->path set). DG_ERR_NOT_FOUND, DG_ERR_IO. */
DG_API dg_status dg_tune_record_load(const char *path, dg_tune_record **out,
				     char *msg, size_t msg_size);

/* Writes r to path atomically (temp file, fsync, rename, fsync of the
 * folder); the folder must exist. DG_ERR_IO names the file, the step that
 * failed and errno; the file at path is then as it was. */
DG_API dg_status dg_tune_record_save(const dg_tune_record *r, const char *path,
				     char *msg, size_t msg_size);

/* The file name a record gets in a DB folder:
 * "<op>-<16 hex digits of the spec's hash>-<device>-sm<N>.json", the
 * device name reduced to [a-z0-9-]; one file per (spec, device), so a new
 * sweep replaces the old one. */
DG_API void dg_tune_record_file_name(const dg_tune_record *r, char *buf,
				     size_t size);

/* ---- the tuning DB ----------------------------------------------------------------- */

typedef struct dg_tune_db dg_tune_db;

typedef struct dg_tune_db_opts {
	/* Records to read, above the built-in ones: a file, a folder (every
	 * *.json in it), or several joined with ':'. NULL: $DRAGON_TUNE_DB if
	 * set and not empty, else <cache_root>/tune. "builtin": the built-in
	 * records alone; "none": no records at all. */
	const char *path;
	/* The cache root whose tune/ folder is the default (NULL: the
	 * cache's own default, $DRAGON_CACHE_DIR, ...). */
	const char *cache_root;
	/* Keep only records of this device (name and SM); NULL / 0: keep
	 * every device's. A record of another device is not an error; it is
	 * counted in n_other_device. */
	const char *device;
	int sm;
} dg_tune_db_opts;

/*
 * Loads the records. A record that cannot be read or is malformed is
 * skipped and its message kept (dg_tune_db_problem): one bad file never
 * hides the others, and a missing folder is an empty DB. Fails only with
 * DG_ERR_NOMEM (then *out is NULL). opts may be NULL.
 */
DG_API dg_status dg_tune_db_open(dg_tune_db **out, const dg_tune_db_opts *opts);
DG_API void dg_tune_db_close(dg_tune_db *db); /* NULL is fine */

/* What was read: the paths, ':'-joined ("none" when off). */
DG_API const char *dg_tune_db_where(const dg_tune_db *db);
/* Records kept (one a key, after newest-wins merging). */
DG_API size_t dg_tune_db_size(const dg_tune_db *db);
/* Kept records that are built into the library (the devices dragon was
 * tuned on, runtime/tunedb/records/); a user's record of a key wins over one. */
DG_API size_t dg_tune_db_n_builtin(const dg_tune_db *db);
/* Records skipped because they name another device. */
DG_API size_t dg_tune_db_n_other_device(const dg_tune_db *db);
/* Records skipped as unreadable or malformed, and why (one line each,
 * naming the file and the field). */
DG_API size_t dg_tune_db_n_problems(const dg_tune_db *db);
DG_API const char *dg_tune_db_problem(const dg_tune_db *db, size_t i);
/* The distinct devices (name, SM) the kept records name; writes up to
 * max into out (may be NULL), returns how many there are. */
DG_API size_t dg_tune_db_devices(const dg_tune_db *db, dg_tune_device *out,
				 size_t max);

/* The record the DB keeps for spec's key (its canonical text with tile
 * auto, device name, sm; sm 0: the spec's arch), or NULL: what
 * dg_tune_resolve looks up, for a tool that copies records (dragon-gen
 * build --tuned). Owned by db. */
DG_API const dg_tune_record *dg_tune_db_record(const dg_tune_db *db, const dg_spec *spec,
					       const char *device, int sm);

/* How a spec's tile was chosen. */
typedef struct dg_tune_choice {
	dg_spec spec;       /* what runs: tile and arch_specific resolved */
	dg_plan plan;       /* its template's plan (plan.spec == spec) */
	bool tuned;         /* from a record */
	char record[1024];  /* tuned: the record's file ("" if not a file) */
	char date[32];      /* tuned: the record's date */
	char why[512];      /* not tuned: why the heuristic default */
} dg_tune_choice;

/*
 * The tile spec runs with on device (name, sm), as the runtime resolves it:
 * a spec with an explicit tile keeps it; an auto tile gets the DB's winner
 * for (spec, device) if its template still plans it, else the template's
 * default on that device (dg_codegen_plan_for). db may be NULL (no DB); sm
 * 0: the spec's arch. Fails (the message on cg) only when the spec itself
 * cannot be planned: DG_ERR_INVALID_SPEC, or the codegen's failure.
 */
DG_API dg_status dg_tune_resolve(dg_codegen *cg, const dg_tune_db *db, const dg_spec *spec,
				 const char *device, int sm, dg_tune_choice *out);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_TUNE_H */
