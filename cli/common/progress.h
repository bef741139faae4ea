/*
 * Progress on stderr for work that takes more than a second, and the
 * monotonic clock it and the programs' timings read. Private to cli/.
 */
#ifndef DG_CLI_COMMON_PROGRESS_H
#define DG_CLI_COMMON_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>

/* The monotonic clock, in milliseconds and in seconds. */
double dg__cli_now_ms(void);
double dg__cli_now_s(void);

/* One status line on stderr, redrawn in place, shown only when enabled
 * (stderr is a TTY, or --progress) and only once the work has run for a
 * second, so quick runs and pipes stay quiet. Not thread-safe: callers
 * hold their own lock around tick. */
typedef struct dg__cli_progress {
	bool enabled;
	bool tty;      /* redraw with \r; else print a line every update */
	bool shown;
	double t0_ms;
	double last_ms;
	size_t total;
} dg__cli_progress;

void dg__cli_progress_init(dg__cli_progress *p, bool force, size_t total);
void dg__cli_progress_tick(dg__cli_progress *p, size_t done, const char *what);
void dg__cli_progress_end(dg__cli_progress *p);

#endif
