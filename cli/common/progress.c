/*
 * Progress and clocks (cli/common/progress.h).
 */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/common/progress.h"

double dg__cli_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

double dg__cli_now_s(void)
{
	return dg__cli_now_ms() / 1e3;
}

void dg__cli_progress_init(dg__cli_progress *p, bool force, size_t total)
{
	memset(p, 0, sizeof(*p));
	p->tty = isatty(STDERR_FILENO) == 1;
	p->enabled = force || p->tty;
	p->t0_ms = dg__cli_now_ms();
	p->total = total;
}

void dg__cli_progress_tick(dg__cli_progress *p, size_t done, const char *what)
{
	if (!p->enabled)
		return;
	double now = dg__cli_now_ms();
	if (now - p->t0_ms < 1000.0)
		return;
	/* A terminal redraws cheaply; a log gets a line a second at most. */
	if (!p->tty && p->shown && now - p->last_ms < 1000.0)
		return;
	p->last_ms = now;
	p->shown = true;
	fprintf(stderr, "%s[%zu/%zu] %.1fs %.60s%s", p->tty ? "\r\033[K" : "",
		done, p->total, (now - p->t0_ms) / 1e3, what ? what : "",
		p->tty ? "" : "\n");
	fflush(stderr);
}

void dg__cli_progress_end(dg__cli_progress *p)
{
	if (p->enabled && p->shown && p->tty) {
		fputs("\r\033[K", stderr);
		fflush(stderr);
	}
	p->shown = false;
}
