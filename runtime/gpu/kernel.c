/*
 * Kernels: spec → loaded module → dg_kernel, and the launch.
 *
 * The device keeps a hash map canonical spec (tile resolved) → module, in
 * front of the JIT and its disk cache. A miss inserts a BUILDING module
 * and builds it outside the lock (render, NVRTC or cache, load, read the
 * attributes of every entry); other threads asking for the same spec wait
 * on dev->cv and share the result, so a spec is compiled once however many
 * threads want it. A failed build wakes its waiters with the builder's
 * message and leaves the map, so a later call tries again.
 *
 * An auto tile is resolved first: the device's tuning DB (dragon/tune.h,
 * read once per device at the first auto tile), else the heuristic
 * default; the map key is the resolved spec, so a hit costs a hash lookup.
 *
 * dg_ctx handles are single-threaded: a build takes an idle one from the
 * device's pool (making a new one when all are busy) and gives it back,
 * so builds of different specs run in parallel.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dragon/tune.h"
#include "runtime/gpu/device_int.h"
#include "base/fnv.h"
#include "runtime/gpu/gpu_int.h"

#define SMEM_DEFAULT_LIMIT 49152

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- the JIT context pool ------------------------------------------------ */

dg_status dg__dev_jit_take(dg_device *dev, dg_ctx **out, char *err, size_t err_size)
{
	dg_ctx *c = NULL;
	dg_status st;

	pthread_mutex_lock(&dev->mu);
	if (dev->n_jit_idle)
		c = dev->jit_idle[--dev->n_jit_idle];
	pthread_mutex_unlock(&dev->mu);
	if (c) {
		*out = c;
		return DG_OK;
	}
	st = dg_ctx_create(&c, &dev->jit_opts);
	if (st) {
		snprintf(err, err_size, "JIT context: %s",
			 c ? dg_ctx_errmsg(c) : dg_status_str(st));
		dg_ctx_destroy(c);
		return st;
	}
	pthread_mutex_lock(&dev->mu);
	if (dev->n_jit_all == dev->jit_cap) {
		size_t cap = dev->jit_cap * 2;
		dg_ctx **all = realloc(dev->jit_all, cap * sizeof(*all));
		if (all)
			dev->jit_all = all;
		dg_ctx **idle = realloc(dev->jit_idle, cap * sizeof(*idle));
		if (idle)
			dev->jit_idle = idle;
		if (!all || !idle) {
			pthread_mutex_unlock(&dev->mu);
			dg_ctx_destroy(c);
			snprintf(err, err_size, "out of memory growing the JIT context pool");
			return DG_ERR_NOMEM;
		}
		dev->jit_cap = cap;
	}
	dev->jit_all[dev->n_jit_all++] = c;
	pthread_mutex_unlock(&dev->mu);
	*out = c;
	return DG_OK;
}

void dg__dev_jit_give(dg_device *dev, dg_ctx *ctx)
{
	pthread_mutex_lock(&dev->mu);
	/* jit_idle has room for every context in jit_all. */
	dev->jit_idle[dev->n_jit_idle++] = ctx;
	pthread_mutex_unlock(&dev->mu);
}

size_t dg__dev_build_count(dg_device *dev)
{
	pthread_mutex_lock(&dev->mu);
	size_t n = dev->n_builds;
	pthread_mutex_unlock(&dev->mu);
	return n;
}

/* ---- the map (dev->mu held) ---------------------------------------------- */

static dg__module *map_find(dg_device *dev, uint64_t h, const char *key)
{
	for (dg__module *m = dev->buckets[h & (dev->n_buckets - 1)]; m; m = m->next)
		if (m->hash == h && strcmp(m->key, key) == 0)
			return m;
	return NULL;
}

static void map_insert(dg_device *dev, dg__module *m)
{
	if (dev->n_modules + 1 > 2 * dev->n_buckets) {
		size_t nb = dev->n_buckets * 2;
		dg__module **b = calloc(nb, sizeof(*b));
		if (b) { /* else keep the old table: only chains get longer */
			for (size_t i = 0; i < dev->n_buckets; i++) {
				for (dg__module *x = dev->buckets[i], *next; x; x = next) {
					next = x->next;
					x->next = b[x->hash & (nb - 1)];
					b[x->hash & (nb - 1)] = x;
				}
			}
			free(dev->buckets);
			dev->buckets = b;
			dev->n_buckets = nb;
		}
	}
	dg__module **head = &dev->buckets[m->hash & (dev->n_buckets - 1)];
	m->next = *head;
	*head = m;
	dev->n_modules++;
}

static void map_remove(dg_device *dev, dg__module *m)
{
	for (dg__module **p = &dev->buckets[m->hash & (dev->n_buckets - 1)]; *p;
	     p = &(*p)->next) {
		if (*p == m) {
			*p = m->next;
			m->next = NULL;
			dev->n_modules--;
			return;
		}
	}
}

/* Frees the module's host memory and unloads its image (context current). */
static void module_free(dg_device *dev, dg__module *m)
{
	if (!m)
		return;
	if (m->lib)
		(void)dev->cu->LibraryUnload(m->lib);
	if (m->cumod)
		(void)dev->cu->ModuleUnload(m->cumod);
	for (int i = 0; m->kernels && i < m->n_kernels; i++)
		free(m->kernels[i].entry);
	free(m->kernels);
	free(m->err);
	free(m);
}

void dg__dev_kernels_destroy(dg_device *dev)
{
	for (size_t i = 0; dev->buckets && i < dev->n_buckets; i++) {
		for (dg__module *m = dev->buckets[i], *next; m; m = next) {
			next = m->next;
			module_free(dev, m);
		}
		dev->buckets[i] = NULL;
	}
	dev->n_modules = 0;
	dev->n_kernels = 0;
}

/* ---- build ---------------------------------------------------------------- */

static dg_status cu_err(dg_device *dev, CUresult rc, const char *what,
			char *err, size_t esz)
{
	return dg__cu_error(dev->cu, rc, what, err, esz);
}

/* One entry's function and attributes, and its shared memory opt-in. */
static dg_status load_entry(dg_device *dev, dg__module *m, dg_kernel *k,
			    char *err, size_t esz)
{
	const dg__cu *cu = dev->cu;
	char what[256];
	CUresult rc;

	if (m->lib) {
		CUkernel ck;
		snprintf(what, sizeof(what), "cuLibraryGetKernel(%s)", k->entry);
		rc = cu->LibraryGetKernel(&ck, m->lib, k->entry);
		if (rc == CUDA_SUCCESS) {
			snprintf(what, sizeof(what), "cuKernelGetFunction(%s)", k->entry);
			rc = cu->KernelGetFunction(&k->fn, ck);
		}
	} else {
		snprintf(what, sizeof(what), "cuModuleGetFunction(%s)", k->entry);
		rc = cu->ModuleGetFunction(&k->fn, m->cumod, k->entry);
	}
	if (rc != CUDA_SUCCESS)
		return cu_err(dev, rc, what, err, esz);

	static const struct {
		CUfunction_attribute a;
		size_t off;
		const char *name;
	} attrs[] = {
		{ CU_FUNC_ATTRIBUTE_NUM_REGS, offsetof(dg_kernel, regs), "NUM_REGS" },
		{ CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, offsetof(dg_kernel, local_bytes),
		  "LOCAL_SIZE_BYTES" },
		{ CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, offsetof(dg_kernel, static_smem),
		  "SHARED_SIZE_BYTES" },
		{ CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, offsetof(dg_kernel, max_threads),
		  "MAX_THREADS_PER_BLOCK" },
	};
	for (size_t i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++) {
		int v = 0;
		rc = cu->FuncGetAttribute(&v, attrs[i].a, k->fn);
		if (rc != CUDA_SUCCESS) {
			snprintf(what, sizeof(what), "cuFuncGetAttribute(%s, %s)",
				 k->entry, attrs[i].name);
			return cu_err(dev, rc, what, err, esz);
		}
		memcpy((char *)k + attrs[i].off, &v, sizeof(v));
	}

	int optin = dev->info.smem_optin;
	if (k->block_threads > k->max_threads) {
		snprintf(err, esz,
			 "%s: the template asks for %d threads a block, but the compiled kernel allows at most %d (registers: %d a thread)",
			 k->entry, k->block_threads, k->max_threads, k->regs);
		return DG_ERR_UNSUPPORTED;
	}
	if ((long)k->static_smem + k->dyn_smem > optin) {
		snprintf(err, esz,
			 "%s: needs %d bytes of dynamic + %d of static shared memory, more than the %d a block may opt in to on %s (sm_%d); use a smaller tile",
			 k->entry, k->dyn_smem, k->static_smem, optin, dev->info.name,
			 dev->info.sm);
		return DG_ERR_UNSUPPORTED;
	}
	if (k->static_smem + k->dyn_smem > SMEM_DEFAULT_LIMIT) {
		rc = cu->FuncSetAttribute(k->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
					  k->dyn_smem);
		if (rc != CUDA_SUCCESS) {
			snprintf(what, sizeof(what),
				 "cuFuncSetAttribute(%s, MAX_DYNAMIC_SHARED_SIZE_BYTES=%d)",
				 k->entry, k->dyn_smem);
			return cu_err(dev, rc, what, err, esz);
		}
		k->smem_opted = k->dyn_smem;
	}
	return DG_OK;
}

/* Renders/compiles (or reads from the cache) and loads spec s into m,
 * whose key is s's canonical text. Runs without dev->mu. */
static dg_status build(dg_device *dev, const dg_spec *s, dg__module *m,
		       char *err, size_t esz)
{
	const dg__cu *cu = dev->cu;
	dg_binary *bin = NULL;
	dg_ctx *jit = NULL;
	dg_status st;
	double t0 = now_ms();

	st = dg__dev_jit_take(dev, &jit, err, esz);
	if (st)
		return st;
	st = dg_jit_compile(jit, s, &bin);
	if (st)
		snprintf(err, esz, "%s", dg_ctx_errmsg(jit));
	dg__dev_jit_give(dev, jit);
	if (st)
		return st;

	CUresult rc = cu->CtxSetCurrent(dev->ctx);
	if (rc != CUDA_SUCCESS) {
		st = cu_err(dev, rc, "cuCtxSetCurrent", err, esz);
		goto out;
	}
	if (cu->has_library)
		rc = cu->LibraryLoadData(&m->lib, bin->image, NULL, NULL, 0, NULL,
					 NULL, 0);
	else
		rc = cu->ModuleLoadData(&m->cumod, bin->image);
	if (rc != CUDA_SUCCESS) {
		char what[DG_SPEC_TEXT_MAX + 128];
		snprintf(what, sizeof(what), "%s of %s (a %s for %s_%d%s; the device is sm_%d)",
			 cu->has_library ? "cuLibraryLoadData" : "cuModuleLoadData",
			 m->key, bin->is_ptx ? "PTX image" : "cubin",
			 bin->is_ptx ? "compute" : "sm", bin->arch,
			 bin->arch_specific ? "a" : "", dev->info.sm);
		st = cu_err(dev, rc, what, err, esz);
		m->lib = NULL;
		m->cumod = NULL;
		goto out;
	}
	m->kernels = calloc((size_t)bin->n_entries, sizeof(dg_kernel));
	if (!m->kernels) {
		st = DG_ERR_NOMEM;
		snprintf(err, esz, "out of memory loading %s", m->key);
		goto out;
	}
	m->n_kernels = bin->n_entries;
	for (int i = 0; i < bin->n_entries; i++) {
		dg_kernel *k = &m->kernels[i];
		k->mod = m;
		k->entry = strdup(bin->entries[i]);
		if (!k->entry) {
			st = DG_ERR_NOMEM;
			snprintf(err, esz, "out of memory loading %s", m->key);
			goto out;
		}
		k->block_threads = bin->block_threads ? bin->block_threads[i] : 0;
		k->dyn_smem = bin->dyn_smem ? bin->dyn_smem[i] : 0;
		st = load_entry(dev, m, k, err, esz);
		if (st)
			goto out;
	}
	m->cache_hit = bin->cache_hit;
	m->load_ms = now_ms() - t0;
out:
	dg_binary_destroy(bin);
	return st;
}

/* ---- the tile of an auto spec: tuning DB, else the heuristic --------------- */

/* The device's tuning DB, read at the first call (records of this device
 * only) and kept until close; NULL when there is none. Once loaded it is
 * never changed, so lookups need no lock. A device without a disk cache
 * (no_cache) reads only $DRAGON_TUNE_DB. */
static const dg_tune_db *tune_db(dg_device *dev)
{
	pthread_mutex_lock(&dev->tune_mu);
	if (!dev->tune_loaded) {
		dg_tune_db_opts o;
		const char *env = getenv("DRAGON_TUNE_DB");
		dg_cache *c = dev->jit ? dg_ctx_cache(dev->jit) : NULL;

		memset(&o, 0, sizeof(o));
		if (c)
			o.cache_root = dg_cache_root(c);
		else if (!env || !env[0])
			o.path = "none";
		o.device = dev->info.name;
		o.sm = dev->info.sm;
		if (dg_tune_db_open(&dev->tune_db, &o) != DG_OK)
			dev->tune_db = NULL; /* out of memory: the heuristic */
		dev->tune_loaded = true;
	}
	const dg_tune_db *db = dev->tune_db;
	pthread_mutex_unlock(&dev->tune_mu);
	return db;
}

void dg__dev_tune_destroy(dg_device *dev)
{
	dg_tune_db_destroy(dev->tune_db);
	dev->tune_db = NULL;
	dev->tune_loaded = false;
}

/* Resolves s (valid, normalized) in place: an auto tile from the DB, else
 * the heuristic default; why (may be NULL) says which. */
static void resolve_tile(dg_device *dev, dg_spec *s, dg_tune_choice *why)
{
	dg_tune_choice local;
	dg_tune_choice *ch = why ? why : &local;

	if ((dg_spec_uses(s->op) & DG_FIELD_TILE) && dg_tile_is_auto(&s->tile)) {
		dg_tune_resolve(tune_db(dev), s, dev->info.name, dev->info.sm, ch);
		*s = ch->spec;
		return;
	}
	dg_spec_default_resolve(s, dev->info.sm);
	if (why) {
		memset(why, 0, sizeof(*why));
		why->spec = *s;
		snprintf(why->why, sizeof(why->why), "the spec names its tile");
	}
}

dg_status dg_device_tile_choice(dg_device *dev, const dg_spec *spec,
				dg_tune_choice *out)
{
	char msg[DG_SPEC_TEXT_MAX + 256];
	dg_status st = dg__dev_enter(dev);

	if (st)
		return st;
	if (!spec || !out)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_device_tile_choice: %s is NULL",
				    !spec ? "spec" : "out");
	st = dg_spec_validate(spec, msg, sizeof(msg));
	if (st)
		return dg__dev_fail(dev, st, "%s", msg);
	dg_spec s = *spec;
	dg_spec_normalize(&s);
	resolve_tile(dev, &s, out);
	return DG_OK;
}

dg_status dg__spec_as_run(dg_device *dev, const dg_spec *spec, dg_spec *out)
{
	/* what dg_kernel_get resolves, minus the validation the op's _check
	 * already did: no message buffers, no allocation */
	dg_status st = dg__dev_enter(dev);

	if (st)
		return st;
	*out = *spec;
	dg_spec_normalize(out);
	resolve_tile(dev, out, NULL);
	return DG_OK;
}

/* ---- get ------------------------------------------------------------------ */

static dg_status find_entry(dg_device *dev, dg__module *m, const char *entry,
			    dg_kernel **out)
{
	if (!entry) {
		*out = &m->kernels[0];
		return DG_OK;
	}
	for (int i = 0; i < m->n_kernels; i++) {
		if (strcmp(m->kernels[i].entry, entry) == 0) {
			*out = &m->kernels[i];
			return DG_OK;
		}
	}
	char list[1024] = "";
	size_t used = 0;
	for (int i = 0; i < m->n_kernels && used < sizeof(list); i++) {
		int w = snprintf(list + used, sizeof(list) - used, "%s%s",
				 i ? ", " : "", m->kernels[i].entry);
		if (w < 0)
			break;
		used += (size_t)w;
	}
	return dg__dev_fail(dev, DG_ERR_NOT_FOUND, "%s has no entry '%s' (entries: %s)",
			    m->key, entry, list);
}

dg_status dg_kernel_get(dg_device *dev, const dg_spec *spec, const char *entry,
			dg_kernel **out)
{
	char msg[DG_SPEC_TEXT_MAX + 256];
	char key[DG_SPEC_TEXT_MAX];
	dg_spec s;
	dg_status st;

	if (out)
		*out = NULL;
	st = dg__dev_enter(dev);
	if (st)
		return st;
	if (!out || !spec)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_kernel_get: %s is NULL",
				    !out ? "out" : "spec");
	st = dg_spec_validate(spec, msg, sizeof(msg));
	if (st)
		return dg__dev_fail(dev, st, "%s", msg);
	s = *spec;
	dg_spec_normalize(&s);
	resolve_tile(dev, &s, NULL);
	st = dg_spec_to_string(&s, key, sizeof(key));
	if (st)
		return dg__dev_fail(dev, DG_ERR_INTERNAL, "spec text does not fit %d bytes",
				    DG_SPEC_TEXT_MAX);
	if (s.arch > dev->info.sm)
		return dg__dev_fail(dev, DG_ERR_UNSUPPORTED,
				    "%s: arch=sm_%d%s does not run on %s (sm_%d); set arch=sm_%d",
				    key, s.arch, s.arch_specific ? "a" : "",
				    dev->info.name, dev->info.sm, dev->info.sm);

	uint64_t h = dg__fnv1a(key);
	pthread_mutex_lock(&dev->mu);
	dg__module *m = map_find(dev, h, key);
	if (m) {
		if (m->state == DG__MOD_BUILDING) {
			m->waiters++;
			while (m->state == DG__MOD_BUILDING)
				pthread_cond_wait(&dev->cv, &dev->mu);
			m->waiters--;
		}
		if (m->state == DG__MOD_FAILED) {
			/* The builder took it out of the map; the last of its
			 * waiters frees it. */
			st = dg__dev_fail(dev, m->st, "%s", m->err ? m->err : dg_status_str(m->st));
			bool last = m->waiters == 0;
			pthread_mutex_unlock(&dev->mu);
			if (last)
				module_free(dev, m);
			return st;
		}
		pthread_mutex_unlock(&dev->mu);
		return find_entry(dev, m, entry, out);
	}

	m = calloc(1, sizeof(*m));
	if (!m) {
		pthread_mutex_unlock(&dev->mu);
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	}
	m->hash = h;
	memcpy(m->key, key, sizeof(key));
	m->state = DG__MOD_BUILDING;
	map_insert(dev, m);
	pthread_mutex_unlock(&dev->mu);

	char *err = malloc(DG__MSG_SIZE);
	if (err) {
		err[0] = '\0';
		st = build(dev, &s, m, err, DG__MSG_SIZE);
	} else {
		st = DG_ERR_NOMEM;
	}

	pthread_mutex_lock(&dev->mu);
	if (st == DG_OK) {
		m->state = DG__MOD_READY;
		dev->n_kernels += (size_t)m->n_kernels;
		dev->n_builds++;
		free(err);
		pthread_cond_broadcast(&dev->cv);
		pthread_mutex_unlock(&dev->mu);
		return find_entry(dev, m, entry, out);
	}
	m->state = DG__MOD_FAILED;
	m->st = st;
	m->err = err;
	map_remove(dev, m);
	pthread_cond_broadcast(&dev->cv);
	bool last = m->waiters == 0;
	st = dg__dev_fail(dev, st, "%s", err ? err : "out of memory");
	pthread_mutex_unlock(&dev->mu);
	if (last)
		module_free(dev, m);
	return st;
}

dg_status dg_kernel_info_get(const dg_kernel *k, dg_kernel_info *info)
{
	if (!k || !info)
		return DG_ERR_INVALID_ARG;
	memset(info, 0, sizeof(*info));
	info->entry = k->entry;
	snprintf(info->canonical, sizeof(info->canonical), "%s", k->mod->key);
	info->block_threads = k->block_threads;
	info->dyn_smem = k->dyn_smem;
	info->static_smem = k->static_smem;
	info->regs = k->regs;
	info->local_bytes = k->local_bytes;
	info->max_threads = k->max_threads;
	info->cache_hit = k->mod->cache_hit;
	info->load_ms = k->mod->load_ms;
	return DG_OK;
}

size_t dg_device_kernel_count(const dg_device *dev)
{
	if (!dev || dev->init_status)
		return 0;
	dg_device *d = (dg_device *)dev; /* the lock, not the state, changes */
	pthread_mutex_lock(&d->mu);
	size_t n = d->n_kernels;
	pthread_mutex_unlock(&d->mu);
	return n;
}

/* ---- launch --------------------------------------------------------------- */

dg_status dg_kernel_launch(dg_device *dev, const dg_kernel *k,
			   const dg_launch *launch, void **args)
{
	static const char dim[3] = { 'x', 'y', 'z' };
	unsigned block[3];
	dg_status st;

	st = dg__dev_enter(dev);
	if (st)
		return st;
	if (!k || !launch)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_kernel_launch: %s is NULL",
				    !k ? "kernel" : "launch");
	memcpy(block, launch->block, sizeof(block));
	if (!block[0] && !block[1] && !block[2]) {
		if (!k->block_threads)
			return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
					    "%s: launch.block is 0x0x0 and the template gives no block size; set launch.block",
					    k->entry);
		block[0] = (unsigned)k->block_threads;
		block[1] = block[2] = 1;
	}
	for (int i = 0; i < 3; i++) {
		if (launch->grid[i] == 0)
			return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
					    "%s: grid.%c=0: every grid dimension must be at least 1",
					    k->entry, dim[i]);
		if (launch->grid[i] > (unsigned)dev->max_grid[i])
			return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
					    "%s: grid.%c=%u exceeds the device limit of %d",
					    k->entry, dim[i], launch->grid[i], dev->max_grid[i]);
		if (block[i] == 0)
			return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
					    "%s: block.%c=0: every block dimension must be at least 1",
					    k->entry, dim[i]);
		if (block[i] > (unsigned)dev->max_block[i])
			return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
					    "%s: block.%c=%u exceeds the device limit of %d",
					    k->entry, dim[i], block[i], dev->max_block[i]);
	}
	uint64_t threads = (uint64_t)block[0] * block[1] * block[2];
	int limit = k->max_threads < dev->max_block_threads ? k->max_threads
							    : dev->max_block_threads;
	if (threads > (uint64_t)limit)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "%s: block %ux%ux%u is %llu threads, more than the %d this kernel can run a block",
				    k->entry, block[0], block[1], block[2],
				    (unsigned long long)threads, limit);
	unsigned smem = launch->smem ? launch->smem : (unsigned)k->dyn_smem;
	if ((uint64_t)smem + (uint64_t)k->static_smem > (uint64_t)dev->info.smem_optin)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "%s: smem=%u bytes of dynamic + %d static shared memory exceeds the device limit of %d a block",
				    k->entry, smem, k->static_smem, dev->info.smem_optin);
	if (smem + (unsigned)k->static_smem > SMEM_DEFAULT_LIMIT) {
		dg_kernel *mk = (dg_kernel *)k; /* smem_opted is guarded by dev->mu */
		pthread_mutex_lock(&dev->mu);
		if ((unsigned)mk->smem_opted < smem) {
			CUresult rc = dev->cu->FuncSetAttribute(
				mk->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem);
			if (rc != CUDA_SUCCESS) {
				pthread_mutex_unlock(&dev->mu);
				return dg__dev_cu_fail(dev, rc,
						       "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
			}
			mk->smem_opted = (int)smem;
		}
		pthread_mutex_unlock(&dev->mu);
	}
	CUresult rc = dev->cu->LaunchKernel(k->fn, launch->grid[0], launch->grid[1],
					    launch->grid[2], block[0], block[1], block[2],
					    smem, dev->stream, args, NULL);
	if (rc != CUDA_SUCCESS) {
		char what[256];
		snprintf(what, sizeof(what), "cuLaunchKernel(%s, grid %ux%ux%u, block %ux%ux%u, smem %u)",
			 k->entry, launch->grid[0], launch->grid[1], launch->grid[2],
			 block[0], block[1], block[2], smem);
		return dg__dev_cu_fail(dev, rc, what);
	}
	return DG_OK;
}

dg_status dg__op_launch(dg_device *dev, const dg_spec *spec, const char *entry,
			const dg_launch *launch, void **args)
{
	dg_kernel *k = NULL;
	dg_status st = dg_kernel_get(dev, spec, entry, &k);
	if (st)
		return st;
	return dg_kernel_launch(dev, k, launch, args);
}
