/*
 * Publishing a file whole: every file a reader must see complete or not
 * at all (a checkpoint, a weights file, a tuning record, a cache entry, a
 * bundle's manifest, a plot, a rewritten log) is written to a temp file
 * beside it, fsync'd, renamed over it, and the folder fsync'd, so after a
 * crash the name holds the old file or the new one, never a part, and a
 * published file survives a power loss. Private to the library and its
 * CLIs: libdragon does not export it, and the CLIs compile base/publish.c
 * (and base/msg.c) into their own binaries.
 *
 * The temp file is <name>.tmp.<pid>.<hex> (dg_safetensors_temp_of reads
 * the pid back), made with O_EXCL: two publishers of one path, threads or
 * processes, never share one, and the last rename wins whole. On any
 * failure the temp file is removed and the message reads
 *   "<path>: <step>: <strerror> (errno N); the file is as it was, and its
 *    temp file <tmp> is removed"
 * (a failed create has no temp file to speak of; a failed fsync of the
 * folder comes after the rename: the file is in place, but may not
 * survive a power loss).
 *
 * dg__publish_file does it all for bytes in memory; a writer that streams
 * (a log rewritten line by line, a program's stdout) opens a dg__publish,
 * writes through it (or its fd, or a stdio stream on it), and commits or
 * aborts.
 */
#ifndef DG_BASE_PUBLISH_H
#define DG_BASE_PUBLISH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#include "dragon/status.h"

/* The longest path a publish takes, its NUL included. */
#define DG__PUBLISH_PATH_MAX 4096

/* The steps of a publish, in order: the one that failed is p->failed. */
typedef enum dg__publish_step {
	DG__PUBLISH_NONE,     /* nothing failed */
	DG__PUBLISH_CREATE,   /* "create the temp file" */
	DG__PUBLISH_WRITE,    /* "write" */
	DG__PUBLISH_FSYNC,    /* "fsync" */
	DG__PUBLISH_CLOSE,    /* "close" */
	DG__PUBLISH_RENAME,   /* "rename the temp file over it" */
	DG__PUBLISH_SYNC_DIR, /* "fsync the folder" (the file is in place) */
} dg__publish_step;

/* "write", "fsync"...: what the step is called in messages. */
const char *dg__publish_step_str(dg__publish_step s);

/*
 * One publish in progress. Between dg__publish_begin and a commit or an
 * abort, fd is the temp file, open for writing; the caller may write to it
 * directly (or hand it to a child as its stdout), or through
 * dg__publish_write or dg__publish_stream, but never closes it.
 */
typedef struct dg__publish {
	int fd;               /* the temp file; -1 when none is open */
	FILE *stream;         /* a stdio stream on fd (dg__publish_stream), or NULL */
	int tmp_dir, dst_dir; /* the folders tmp and dst are in: descriptors, or AT_FDCWD */
	bool dir_given;       /* dst_dir is the caller's (dg__publish_begin_at) */
	char tmp[DG__PUBLISH_PATH_MAX + 48]; /* the temp file, relative to tmp_dir */
	char dst[DG__PUBLISH_PATH_MAX];      /* the final name, relative to dst_dir */
	dg__publish_step failed; /* the step that failed, or DG__PUBLISH_NONE */
	int err;                 /* its errno */
} dg__publish;

/*
 * Writes size bytes of data to path whole: temp file (mode 0644 less the
 * umask), write, fsync, rename, fsync of the folder. DG_ERR_INVALID_ARG
 * for a path too long, DG_ERR_IO for a step that failed (the message above).
 */
dg_status dg__publish_file(const char *path, const void *data, size_t size, char *msg,
			   size_t msg_size);

/*
 * Opens the temp file of path (mode, less the umask) into p. On failure
 * nothing is left to abort; p->failed says the step.
 */
dg_status dg__publish_begin(dg__publish *p, const char *path, mode_t mode, char *msg,
			    size_t msg_size);

/*
 * The same with the temp file in folder tmp_dir and the final name in
 * folder dst_dir (descriptors the caller keeps open until the commit or
 * abort; the two folders on one file system), for a writer that keeps its
 * own folders (the kernel cache). Messages name dst as it is given.
 */
dg_status dg__publish_begin_at(dg__publish *p, int tmp_dir, int dst_dir, const char *name,
			       mode_t mode, char *msg, size_t msg_size);

/* Writes all of data (short writes and EINTR go on); on failure the temp
 * file is removed (no abort needed). */
dg_status dg__publish_write(dg__publish *p, const void *data, size_t size, char *msg,
			    size_t msg_size);

/*
 * A stdio stream on the temp file, made once and owned by p (the commit
 * flushes and checks it, the abort closes it); NULL when out of memory.
 * Write either through it or through fd, not both; p must stay where it
 * is while the stream is open (the stream points to it). A failed write
 * shows at the commit, with its errno.
 */
FILE *dg__publish_stream(dg__publish *p);

/*
 * fsync, close, rename over the final name, fsync of its folder. On
 * failure before the rename the temp file is removed and the final name
 * is as it was. p holds no open file afterwards, either way.
 */
dg_status dg__publish_commit(dg__publish *p, char *msg, size_t msg_size);

/* Closes and removes the temp file; the final name is as it was. Nothing
 * when p holds none (after a commit, a failure, or twice). */
void dg__publish_abort(dg__publish *p);

/*
 * Whether the file name `name` (no folder) is a publish's temp file,
 * <target>.tmp.<pid>.<hex>: then its first *target_len characters are the
 * target's name and *pid the writer's process id (either may be NULL).
 * A target's own name may hold ".tmp." (the last one counts).
 */
bool dg__publish_temp_of(const char *name, size_t *target_len, long *pid);

/* Writes all of data to fd (short writes and EINTR go on). 0, or -1 with
 * errno (ENOSPC when a write makes no progress). */
int dg__publish_fd_write(int fd, const void *data, size_t size);

/*
 * fsync of the folder dir, so the renames into it survive a power loss.
 * DG_OK also when the folder cannot be opened to sync (no read permission)
 * or its file system cannot sync a folder (EINVAL); DG_ERR_IO otherwise,
 * "<dir>: fsync the folder: <strerror> (errno N)".
 */
dg_status dg__publish_sync_dir(const char *dir, char *msg, size_t msg_size);

#endif
