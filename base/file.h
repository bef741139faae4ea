/*
 * Opening a file a user names for reading (a corpus, eval's data): only a
 * regular file is read, and asking never blocks, so a directory, a FIFO,
 * a socket or a device is refused by name before a byte is read (a FIFO
 * opened plainly waits for a writer forever; a directory reads as an
 * error after a size of LONG_MAX). Private to the library and its CLIs.
 */
#ifndef DG_BASE_FILE_H
#define DG_BASE_FILE_H

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

#endif
