/*
 * File helpers of the programs: paths, a whole file read or written, a
 * folder made or removed, whether two paths name one file. A file a
 * reader must see whole is published with base/publish.h; these write the
 * files of a private staging folder that a later rename publishes. All
 * but the last are base/file.h's, which the library's writers use too.
 * Private to cli/.
 */
#ifndef DG_CLI_COMMON_FILES_H
#define DG_CLI_COMMON_FILES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dragon/status.h"

/* "dir/name" into buf; false (buf truncated) if it does not fit. */
bool dg__cli_join(char *buf, size_t size, const char *dir, const char *name);

/* Writes size bytes to path (created or truncated, 0644), fsyncs it: a
 * file of a staging folder, published later by a rename. On failure
 * removes the file and writes "<path>: <reason>" into err. */
dg_status dg__cli_write_file(const char *path, const void *data, size_t size, char *err, size_t esz);

/* Reads a whole regular file (at most max bytes) into *out (malloc'd,
 * NUL-terminated past *size). DG_ERR_NOT_FOUND if it does not exist. */
dg_status dg__cli_read_file(const char *path, size_t max, uint8_t **out, size_t *size, char *err,
			    size_t esz);

/* Removes path and everything under it (does not follow symlinks). */
void dg__cli_remove_tree(const char *path);

/* mkdir -p. top (size bytes) gets the outermost folder it made, "" if
 * path existed, so dg__cli_rmdirs can undo exactly that. */
dg_status dg__cli_mkdirs(const char *path, char *top, size_t size, char *err, size_t esz);

/* Removes the empty folder path and its parents up to and including top
 * (as set by dg__cli_mkdirs); nothing when top is "". */
void dg__cli_rmdirs(const char *path, const char *top);

/* Whether paths a and b name one file: the same device and inode when
 * both exist; else the same canonical path (the file's real path when it
 * exists, else its folder's real path and its name), so an output not
 * made yet is matched too. For "outputs never overwrite inputs". */
bool dg__cli_same_file(const char *a, const char *b);

#endif
