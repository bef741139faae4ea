/*
 * Bundles into the kernel map: a `dragon-gen build` folder's manifest and
 * cubins, checked and loaded, so a process whose kernels are all in it
 * compiles nothing (dg_device_load_bundle, $DRAGON_KERNELS).
 *
 * A kernel of the manifest enters the map under its canonical spec — the
 * spec as it runs, tile and target resolved — with the launch info of
 * every entry, as a build would have put it there. A request with an auto
 * tile resolves its tile as always (the tuning DB, else the template's
 * default: dg_tune_resolve) and finds the bundled kernel when the bundle
 * was built for this device. The manifest must come from this generator
 * and these templates, or the kernels would not be what this library
 * plans; files are verified (size, SHA-256, the cubin's SM) before the
 * driver sees them.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dragon/codegen.h"
#include "dragon/manifest.h"
#include "runtime/gpu/device_int.h"
#include "runtime/gpu/gpu_int.h"

#define MAX_KERNEL_FILE ((size_t)256 << 20)

/* The bytes of dir/name (malloc'd, NUL-terminated past *size). */
static dg_status read_file(const char *dir, const char *name, unsigned char **out,
			   size_t *size, char *err, size_t esz)
{
	char path[4096];
	struct stat sb;

	*out = NULL;
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "rb");
	if (!f) {
		snprintf(err, esz, "%s: %s", path, strerror(errno));
		return DG_ERR_IO;
	}
	dg_status st = DG_OK;
	if (fstat(fileno(f), &sb) || !S_ISREG(sb.st_mode) || (size_t)sb.st_size > MAX_KERNEL_FILE) {
		snprintf(err, esz, "%s: not a regular file of at most %zu bytes", path,
			 MAX_KERNEL_FILE);
		st = DG_ERR_IO;
	}
	unsigned char *buf = st ? NULL : malloc((size_t)sb.st_size + 1);
	if (!st && !buf) {
		snprintf(err, esz, "out of memory reading %s", path);
		st = DG_ERR_NOMEM;
	}
	if (!st && fread(buf, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size) {
		snprintf(err, esz, "%s: read error", path);
		st = DG_ERR_IO;
	}
	fclose(f);
	if (st) {
		free(buf);
		return st;
	}
	buf[sb.st_size] = '\0';
	*out = buf;
	*size = (size_t)sb.st_size;
	return DG_OK;
}

dg_status dg_device_load_bundle(dg_device *dev, const char *dir, size_t *loaded)
{
	char err[DG__MSG_SIZE];
	dg_manifest *m = NULL;

	if (loaded)
		*loaded = 0;
	dg_status st = dg__dev_enter(dev);
	if (st)
		return st;
	if (!dir)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_device_load_bundle: dir is NULL");
	st = dg_manifest_load(dir, &m, err, sizeof(err));
	if (st)
		return dg__dev_fail(dev, st, "%s", err);
	const char *hash = dg_codegen_template_hash(dg_ctx_codegen(dev->jit));
	if (strcmp(m->generator_version, DG_GENERATOR_VERSION) != 0 ||
	    strcmp(m->template_hash, hash) != 0) {
		st = dg__dev_fail(dev, DG_ERR_UNSUPPORTED,
				  "%s: built by dragon %s from templates %.12s..., but this library is %s with templates %.12s...; rebuild it with this dragon-gen",
				  dir, m->generator_version, m->template_hash, DG_GENERATOR_VERSION,
				  hash);
		dg_manifest_destroy(m);
		return st;
	}
	size_t added_n = 0;
	for (size_t i = 0; i < m->n_kernels && !st; i++) {
		const dg_manifest_kernel *k = &m->kernels[i];
		if (k->arch != dev->info.sm || k->ptx)
			continue; /* another SM's kernel, or PTX: not this device's */
		unsigned char *bytes = NULL;
		size_t size = 0;
		char why[1024];
		dg_spec spec;
		st = read_file(dir, k->file, &bytes, &size, err, sizeof(err));
		if (!st && dg_manifest_kernel_verify(k, bytes, size, why, sizeof(why))) {
			snprintf(err, sizeof(err), "%s/%s: %s", dir, k->file, why);
			st = DG_ERR_CORRUPT;
		}
		if (!st && dg_spec_parse(k->spec, &spec, why, sizeof(why))) {
			snprintf(err, sizeof(err), "%s: kernels[%zu].spec: %s", dir, i, why);
			st = DG_ERR_CORRUPT;
		}
		bool added = false;
		if (!st)
			st = dg__dev_module_add(dev, &spec, bytes, k->entries, k->threads, k->smem,
						k->n_entries, DG_KERNEL_BUNDLED, &added, err,
						sizeof(err));
		added_n += added;
		free(bytes);
	}
	dg_manifest_destroy(m);
	if (loaded)
		*loaded = added_n;
	return st ? dg__dev_fail(dev, st, "%s", err) : DG_OK;
}
