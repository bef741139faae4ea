/*
 * Opening a file a user names for reading (a corpus, eval's data): only a
 * regular file is read, and asking never blocks, so a directory, a FIFO,
 * a socket or a device is refused by name before a byte is read (a FIFO
 * opened plainly waits for a writer forever; a directory reads as an
 * error after a size of LONG_MAX). And the folder work of a writer that
 * stages files before it publishes them (the bundle builder): a whole
 * file read or written, a folder made with its parents (and unmade), a
 * tree removed. Messages read "<path>: <strerror>". Private to the
 * library and its CLIs.
 */
#ifndef DG_BASE_FILE_H
#define DG_BASE_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dragon/status.h"

/*
 * Opens path for reading into *out (the caller fcloses it) and its size
 * into *size. DG_ERR_NOT_FOUND when it does not exist, DG_ERR_IO when it
 * cannot be opened or is not a regular file: "<path>: a directory, not a
 * regular file" (a FIFO, a socket, a character or block device alike).
 */
dg_status dg__file_open_regular(const char *path, FILE **out, uint64_t *size, char *msg,
				size_t msg_size);

/* "dir/name" into buf; false (buf truncated) if it does not fit. */
bool dg__file_join(char *buf, size_t size, const char *dir, const char *name);

/* Writes size bytes to path (created or truncated, 0644) and fsyncs it: a
 * file of a private staging folder, published later by a rename. On
 * failure removes the file. */
dg_status dg__file_write(const char *path, const void *data, size_t size, char *msg,
			 size_t msg_size);

/* Reads a whole regular file (at most max bytes) into *out (malloc'd,
 * NUL-terminated past *size). DG_ERR_NOT_FOUND if it does not exist. */
dg_status dg__file_read(const char *path, size_t max, uint8_t **out, size_t *size, char *msg,
			size_t msg_size);

/* Removes path and everything under it (does not follow symlinks). */
void dg__file_remove_tree(const char *path);

/* mkdir -p. top (size bytes) gets the outermost folder it made, "" if
 * path existed, so dg__file_rmdirs can undo exactly that. */
dg_status dg__file_mkdirs(const char *path, char *top, size_t size, char *msg, size_t msg_size);

/* Removes the empty folder path and its parents up to and including top
 * (as set by dg__file_mkdirs); nothing when top is "". */
void dg__file_rmdirs(const char *path, const char *top);

#endif
