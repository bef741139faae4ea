/* Work on every core (base/pool.h). */
#include "base/pool.h"

#include <pthread.h>
#include <unistd.h>

int dg__pool_cores(int max)
{
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	if (cores < 1)
		cores = 1;
	return (int)(cores < max ? cores : max);
}

void dg__pool_run(void *(*fn)(void *), void *arg, int n)
{
	pthread_t th[DG_POOL_MAX];
	int made = 0;
	if (n > DG_POOL_MAX)
		n = DG_POOL_MAX;
	for (int i = 1; i < n; i++)
		if (pthread_create(&th[made], NULL, fn, arg) == 0)
			made++;
	fn(arg);
	for (int i = 0; i < made; i++)
		pthread_join(th[i], NULL);
}
