/*
 * Work on every core: fn(arg) on n threads at once, this thread one of
 * them, returning when all have returned. The workers share arg and take
 * their work from it themselves (a counter under a lock or an atomic), so a
 * thread that cannot be made only leaves its share to the others: with
 * none made, this thread does it all. Private to the library and its CLIs.
 */
#ifndef DG_BASE_POOL_H
#define DG_BASE_POOL_H

/* The most threads dg__pool_run makes. */
#define DG_POOL_MAX 1024

/* The online CPUs, at least 1 and at most max. */
int dg__pool_cores(int max);

/* fn(arg) on n threads (1..DG_POOL_MAX), this one among them. */
void dg__pool_run(void *(*fn)(void *), void *arg, int n);

#endif
