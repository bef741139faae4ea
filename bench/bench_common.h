/*
 * What the benches share beyond the device (bench/bench_common.c): their
 * list options ("512,1024"), the JSON header that says where and when
 * they measured, and the document written to --out. Names start with
 * bc_. No CUDA header: the benches that link only libdragon use it too.
 */
#ifndef DG_BENCH_BENCH_COMMON_H
#define DG_BENCH_BENCH_COMMON_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "dragon/dragon.h"
#include "dragon/model.h"

/* "512,1024": at most max ints, each lo..hi, into v; the count, or -1
 * (empty, not a number, out of range, too many). */
int bc_parse_ints(const char *s, int *v, int max, long lo, long hi);

/* A new document (the caller owns it): {bench, device, sm, sm_count,
 * driver, date (UTC, YYYY-MM-DD)} from info. */
cJSON *bc_doc(const char *bench, const dg_device_info *info);

/* doc as text: on stdout when echo, into path when not NULL (a line on
 * stderr says so). 0, or 1 with "<prog>: cannot write <path>" on stderr. */
int bc_write(const char *prog, const cJSON *doc, const char *path, bool echo);
/* text and a newline published whole at path (base/publish.h: a reader
 * sees the old file or the new one): 0, or 1 with "<prog>: cannot write
 * <why>" on stderr. */
int bc_write_text(const char *prog, const char *text, const char *path);

/* A model's dg_model_profile rows as a JSON array [{what, count, ms}]. */
cJSON *bc_breakdown(const dg_model_time *tm, int n);

#endif
