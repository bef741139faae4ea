/*
 * Each kind of device failure, driven through `dragon train` on a GPU (the
 * binary at $DRAGON) by $DRAGON_FAULT (runtime/gpu/cu_loader.c), ends the
 * run with exit 1 and one message that names the true cause — the driver
 * call and its error — never a relabelled "CUDA driver error" in its
 * place:
 *   - alloc:  the model's buffers cannot be allocated (out of memory);
 *   - load:   a kernel's module does not load (an invalid image);
 *   - launch: a kernel does not launch (too many resources requested);
 *   - sync:   a kernel faults, which the next synchronization reports (an
 *             illegal address).
 * Without a GPU each prints "skipped: no CUDA device".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "cli_helpers.h"
#include "dragon/dragon.h"

#define SMALL "--preset", "bf16", "--layers", "1", "--embd", "64", "--heads", "2", "--neurons", \
	      "256", "--batch", "2", "--time", "32", "--eval-every", "0", "--seed", "3",       \
	      "--steps", "3"

/* `dragon train` with fault; its stderr must hold each of want (NULL-ended). */
static void train_with(const char *fault, const char *const *want)
{
	if (!gpu_or_skip())
		cr_skip_test("skipped: no CUDA device");
	sandbox sb;
	run r;
	char data[600], out[600];
	train_sandbox(&sb, data, sizeof(data), 20000);
	snprintf(out, sizeof(out), "%s/run", sb.root);
	setenv("DRAGON_FAULT", fault, 1);
	gen(&sb, &r, "train", SMALL, "--data", data, "--out", out, NULL);
	unsetenv("DRAGON_FAULT");
	printf("DRAGON_FAULT=%s: exit %d: %s", fault, r.code, r.err);
	cr_assert_eq(r.code, 1, "DRAGON_FAULT=%s: exit %d, want 1: %s", fault, r.code, r.err);
	for (int i = 0; want[i]; i++)
		cr_expect(strstr(r.err, want[i]), "DRAGON_FAULT=%s: stderr does not name %s: %s", fault,
			  want[i], r.err);
	cr_expect(!strstr(r.err, "CUDA driver error"),
		  "DRAGON_FAULT=%s: the status was relabelled: %s", fault, r.err);
	run_free(&r);
	sandbox_fini(&sb);
}

Test(cli_train_faults, out_of_device_memory)
{
	const char *want[] = { "cuMemAlloc", "CUDA_ERROR_OUT_OF_MEMORY", NULL };
	train_with("alloc", want);
}

Test(cli_train_faults, a_module_that_does_not_load)
{
	const char *want[] = { "cuModuleLoadData", "CUDA_ERROR_INVALID_IMAGE", NULL };
	train_with("load", want);
}

Test(cli_train_faults, a_launch_that_fails)
{
	const char *want[] = { "cuLaunchKernel", "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", NULL };
	train_with("launch", want);
}

Test(cli_train_faults, a_kernel_that_faults)
{
	const char *want[] = { "CUDA_ERROR_ILLEGAL_ADDRESS", NULL };
	train_with("sync", want);
}
