/*
 * A program outside the tree, built only through `pkg-config dragon` against
 * an installed dragon: parses a spec, JIT-compiles it (no cache), and checks
 * the cubin. Proves the installed headers, library and dragon.pc suffice.
 */
#include <stdio.h>
#include <string.h>

#include <dragon/dragon.h>

int main(void)
{
	dg_spec spec;
	char msg[256];
	dg_ctx_opts opts = { .no_cache = true };
	dg_ctx *ctx = NULL;
	dg_binary *bin = NULL;
	int rc = 1;

	if (dg_spec_parse("op=lowrank_fwd;weight=sign1;act=uint8pos;out=uint8pos;relu=0;latent=256",
			  &spec, msg, sizeof(msg))) {
		fprintf(stderr, "consumer: %s\n", msg);
		return 1;
	}
	if (dg_ctx_create(&ctx, &opts) || dg_jit_compile(ctx, &spec, &bin)) {
		fprintf(stderr, "consumer: %s\n", dg_ctx_errmsg(ctx));
		goto out;
	}
	if (dg_cubin_check(bin->image, bin->image_size, 90, msg, sizeof(msg))) {
		fprintf(stderr, "consumer: %s\n", msg);
		goto out;
	}
	printf("consumer: %s -> %s, %zu bytes\n", bin->canonical, bin->entries[0],
	       bin->image_size);
	rc = 0;
out:
	dg_binary_destroy(bin);
	dg_ctx_destroy(ctx);
	return rc;
}
