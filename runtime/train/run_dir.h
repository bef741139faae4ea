/*
 * A training run's folder (dragon/train.h): made as mkdir -p, locked by
 * the one process that writes it (dg_train_lock, public), and its log,
 * log.jsonl — a JSON object a line, each line written whole by one write
 * on an O_APPEND file, and repaired by a resume to its checkpoint.
 * Private to runtime/train/.
 */
#ifndef DG_RUNTIME_TRAIN_RUN_DIR_H
#define DG_RUNTIME_TRAIN_RUN_DIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dragon/status.h"
#include "dragon/train.h"

/* mkdir -p of dir. DG_ERR_IO naming the part that failed. */
dg_status dg__rundir_make(const char *dir, char *msg, size_t size);

/*
 * The log at path made to end at step `ckpt` (a resume's checkpoint):
 * kept, in order, the lines that are whole (a newline at the end) JSON
 * objects with an integer "step" >= 1 that follows the one before and is
 * at most ckpt. The lines past ckpt (an interrupted run's) go silently;
 * warn (may be NULL) is told, a line each, of a missing log, of the lines
 * dropped otherwise (not a whole log line; a step that repeats or goes
 * back) with the first one's line number, of the first run of steps
 * missing between two lines kept (and whether there are more), and of
 * the steps missing between the last line kept and ckpt. Every resume
 * says so again while the gap is there. The file is rewritten whole
 * (base/publish.h: temp file, fsync, rename, fsync of the folder) only
 * when a line goes. *last_no_val: the last line kept is step ckpt and
 * has no "val_loss".
 */
dg_status dg__rundir_log_repair(const char *path, int64_t ckpt, dg_train_warn warn, void *user,
				bool *last_no_val, char *msg, size_t size);

/* The last line of the log at path, step `step`, given its "val_loss": v
 * (%.9g) before its timing fields; the file rewritten as above. */
dg_status dg__rundir_log_set_val(const char *path, int64_t step, double v, char *msg, size_t size);

/* The log at path opened to append (truncated first unless append): *fd. */
dg_status dg__rundir_log_open(const char *path, bool append, int *fd, char *msg, size_t size);

/* line (n bytes, its newline included) appended by one write; one that
 * falls short (a full disk) is cut off again, so the log holds whole lines
 * only. DG_ERR_IO naming path and errno. */
dg_status dg__rundir_log_write(int fd, const char *path, const char *line, size_t n, char *msg,
			       size_t size);

#endif
