/*
 * A byte size as people write one: bytes, or a number with K, M, G or T
 * (powers of 1024; "G", "GiB" and "GB" alike, any case), e.g. 4G, 3.5GiB,
 * 512M, 1048576 — DRAGON_MEMORY's and `dragon train --memory`'s.
 */
#ifndef DG_BASE_SIZE_H
#define DG_BASE_SIZE_H

#include <stddef.h>

#include "dragon/status.h"

/* text's bytes into *bytes (rounded down); DG_ERR_INVALID_ARG for
 * anything else, a size under one byte or past size_t. */
dg_status dg__parse_size(const char *text, size_t *bytes);

#endif
