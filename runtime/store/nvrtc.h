/*
 * NVRTC: CUDA source → cubin (or PTX past what NVRTC emits SASS for).
 * Private to the runtime.
 */
#ifndef DG_RUNTIME_NVRTC_H
#define DG_RUNTIME_NVRTC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dragon/codegen.h"

#define DG__NVRTC_MAX_OPTS 8

/* What NVRTC will be asked for a requested arch: the target it can emit and
 * the option list, built in this one place (they are part of the cache key). */
typedef struct dg__nvrtc_target {
	int arch;           /* the arch the image targets */
	bool arch_specific; /* sm_XXa */
	bool ptx;           /* PTX for the driver to finish, not a cubin */
	int n_opts;
	char opts[DG__NVRTC_MAX_OPTS][48];
} dg__nvrtc_target;

typedef struct dg__nvrtc_result {
	uint8_t *image; /* malloc'd; cubin, or PTX text with its NUL */
	size_t size;
	char *log;      /* malloc'd, "" if NVRTC said nothing */
	double ms;      /* wall time of nvrtcCompileProgram */
} dg__nvrtc_result;

/* Picks the target for sm_<arch>[a]: that arch if NVRTC emits it; else the
 * newest older arch of the same major (cubins run on later minors); else
 * PTX for the newest arch NVRTC knows. Fails, with a message, for an arch
 * older than NVRTC supports or an arch-specific target it lacks. */
dg_status dg__nvrtc_target_for(int arch, bool arch_specific,
			       dg__nvrtc_target *t, char *err, size_t esz);

/* The options joined by spaces, for keys and metadata. */
void dg__nvrtc_opts_string(const dg__nvrtc_target *t, char *buf, size_t size);

/* Compiles src for t. On a compile error returns DG_ERR_COMPILE with err
 * holding the first NVRTC error, the generated lines around it and the
 * spec; res->log gets the whole log either way (free with _result_free). */
dg_status dg__nvrtc_compile(const dg_source *src, const dg__nvrtc_target *t,
			    dg__nvrtc_result *res, char *err, size_t esz);
void dg__nvrtc_result_free(dg__nvrtc_result *res);

/*
 * Asks the kernel to read NVRTC's libraries (libnvrtc, which holds the
 * compiler, about 110 MB in CUDA 13, and libnvrtc-builtins, from the
 * folder libnvrtc was loaded from) into the page cache, on a thread of
 * its own, once a process: a device open calls it, so the reads overlap
 * the driver's start and the first compile finds the compiler's pages in
 * memory instead of faulting them in from the disk a few at a time on
 * every compiling thread (a fresh machine's first `dragon train` spent up
 * to a second more compiling than its later ones). Failure is silent:
 * the compile reads the pages as it always does.
 */
void dg__nvrtc_prefetch(void);

/* The same, now, on the caller's thread: the number of NVRTC's library
 * files it found and asked to be read (for the tests). */
int dg__nvrtc_prefetch_now(void);

#endif
