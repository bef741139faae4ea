/*
 * What the benches' JSON documents share (bench/bench_json.c): the header
 * that says where and when they were measured, and the document written to
 * --out. Names start with bj_. No CUDA header: the benches that link only
 * libdragon use it as well.
 */
#ifndef DG_BENCH_BENCH_JSON_H
#define DG_BENCH_BENCH_JSON_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "dragon/dragon.h"

/* A new document (the caller owns it): {bench, device, sm, sm_count,
 * driver, date (UTC, YYYY-MM-DD)} from info. */
cJSON *bj_doc(const char *bench, const dg_device_info *info);

/* doc as text: on stdout when echo, into path when not NULL (a line on
 * stderr says so). 0, or 1 with "<prog>: cannot write <path>" on stderr. */
int bj_write(const char *prog, const cJSON *doc, const char *path, bool echo);

#endif
