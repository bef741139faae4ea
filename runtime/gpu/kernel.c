/*
 * Kernels: spec → loaded module → dg_kernel, and the launch.
 *
 * The device keeps a hash map from canonical spec text to module, in
 * front of the JIT and its disk cache. A spec is looked up first as asked
 * (its auto tile unresolved): a hit is a hash lookup, with no planning
 * and no allocation. A miss resolves the spec (dg_tune_resolve: the tuning
 * DB's tile, else the template's default for this device), looks the
 * resolved text up (a bundle's kernels are there), and only then builds:
 * it inserts a BUILDING module and builds it outside the lock (render,
 * NVRTC or the cache, load, read every entry's attributes). Other threads
 * asking for the same spec wait on dev->cv and share the result, so a spec
 * is compiled once however many threads want it. A failed build wakes its
 * waiters with the builder's message and leaves the map, so a later call
 * tries again. Both texts (as asked and as resolved) end up naming the
 * module.
 *
 * dg_ctx handles are single-threaded: a resolution or a build takes an
 * idle one from the device's pool (making a new one when all are busy)
 * and gives it back, so builds of different specs run in parallel.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/fnv.h"
#include "dragon/tune.h"
#include "runtime/gpu/device_int.h"
#include "runtime/gpu/gpu_int.h"

#define SMEM_DEFAULT_LIMIT 49152

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- the JIT context pool ------------------------------------------------ */

static dg_status jit_take(dg_device *dev, dg_ctx **out, char *err, size_t err_size)
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

/* dev->mu held. jit_idle has room for every context in jit_all. */
static void jit_give_locked(dg_device *dev, dg_ctx *ctx)
{
	dev->jit_idle[dev->n_jit_idle++] = ctx;
}

static void jit_give(dg_device *dev, dg_ctx *ctx)
{
	pthread_mutex_lock(&dev->mu);
	jit_give_locked(dev, ctx);
	pthread_mutex_unlock(&dev->mu);
}

/* ---- the map (dev->mu held) ---------------------------------------------- */

static dg__kentry *map_find(dg_device *dev, uint64_t h, const char *key)
{
	for (dg__kentry *e = dev->buckets[h & (dev->n_buckets - 1)]; e; e = e->next)
		if (e->hash == h && strcmp(e->key, key) == 0)
			return e;
	return NULL;
}

/* Adds key → m; false when out of memory. */
static bool map_add(dg_device *dev, const char *key, dg__module *m)
{
	dg__kentry *e = malloc(sizeof(*e));
	if (!e)
		return false;
	if (dev->n_entries + 1 > 2 * dev->n_buckets) {
		size_t nb = dev->n_buckets * 2;
		dg__kentry **b = calloc(nb, sizeof(*b));
		if (b) { /* else keep the old table: only chains get longer */
			for (size_t i = 0; i < dev->n_buckets; i++) {
				for (dg__kentry *x = dev->buckets[i], *next; x; x = next) {
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
	snprintf(e->key, sizeof(e->key), "%s", key);
	e->hash = dg__fnv1a(key);
	e->mod = m;
	dg__kentry **head = &dev->buckets[e->hash & (dev->n_buckets - 1)];
	e->next = *head;
	*head = e;
	dev->n_entries++;
	return true;
}

/* Removes every entry naming m, and m from the module list. */
static void map_drop(dg_device *dev, dg__module *m)
{
	for (size_t i = 0; i < dev->n_buckets; i++) {
		for (dg__kentry **p = &dev->buckets[i]; *p;) {
			if ((*p)->mod == m) {
				dg__kentry *dead = *p;
				*p = dead->next;
				free(dead);
				dev->n_entries--;
			} else {
				p = &(*p)->next;
			}
		}
	}
	for (dg__module **p = &dev->modules; *p; p = &(*p)->next) {
		if (*p == m) {
			*p = m->next;
			m->next = NULL;
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
		for (dg__kentry *e = dev->buckets[i], *next; e; e = next) {
			next = e->next;
			free(e);
		}
		dev->buckets[i] = NULL;
	}
	for (dg__module *m = dev->modules, *next; m; m = next) {
		next = m->next;
		module_free(dev, m);
	}
	dev->modules = NULL;
	dev->n_entries = 0;
	memset(&dev->stats, 0, sizeof(dev->stats));
}

/* ---- load ----------------------------------------------------------------- */

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
	/* a kernel's compile-time cluster (__cluster_dims__): 0 where none is
	 * set, or where the driver does not say */
	static const CUfunction_attribute cl[3] = { CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH,
						     CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT,
						     CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH };
	for (int i = 0; i < 3; i++) {
		int v = 0;
		if (cu->FuncGetAttribute(&v, cl[i], k->fn) != CUDA_SUCCESS || v < 1)
			v = 1;
		k->cluster[i] = v;
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

/* Loads image into m and every entry of it (context current). */
static dg_status load_image(dg_device *dev, dg__module *m, const void *image, bool is_ptx,
			    char *const *entries, const int *threads, const int *smem, int n,
			    char *err, size_t esz)
{
	const dg__cu *cu = dev->cu;
	CUresult rc;

	if (cu->has_library)
		rc = cu->LibraryLoadData(&m->lib, image, NULL, NULL, 0, NULL, NULL, 0);
	else
		rc = cu->ModuleLoadData(&m->cumod, image);
	if (rc != CUDA_SUCCESS) {
		char what[DG_SPEC_TEXT_MAX + 128];
		snprintf(what, sizeof(what), "%s of %s (a %s for %s_%d%s; the device is sm_%d)",
			 cu->has_library ? "cuLibraryLoadData" : "cuModuleLoadData",
			 m->key, is_ptx ? "PTX image" : "cubin", is_ptx ? "compute" : "sm",
			 m->spec.arch, m->spec.arch_specific ? "a" : "", dev->info.sm);
		m->lib = NULL;
		m->cumod = NULL;
		return cu_err(dev, rc, what, err, esz);
	}
	m->kernels = calloc((size_t)n, sizeof(dg_kernel));
	if (!m->kernels) {
		snprintf(err, esz, "out of memory loading %s", m->key);
		return DG_ERR_NOMEM;
	}
	m->n_kernels = n;
	for (int i = 0; i < n; i++) {
		dg_kernel *k = &m->kernels[i];
		k->mod = m;
		k->entry = strdup(entries[i]);
		if (!k->entry) {
			snprintf(err, esz, "out of memory loading %s", m->key);
			return DG_ERR_NOMEM;
		}
		k->block_threads = threads ? threads[i] : 0;
		k->dyn_smem = smem ? smem[i] : 0;
		dg_status st = load_entry(dev, m, k, err, esz);
		if (st)
			return st;
	}
	return DG_OK;
}

/* Renders/compiles (or reads from the cache) and loads m->spec. Runs
 * without dev->mu, with jit taken from the pool. */
static dg_status build(dg_device *dev, dg_ctx *jit, dg__module *m, char *err, size_t esz)
{
	dg_binary *bin = NULL;
	double t0 = now_ms();

	dg_status st = dg_jit_compile(jit, &m->spec, &bin);
	if (st) {
		snprintf(err, esz, "%s", dg_ctx_errmsg(jit));
		return st;
	}
	CUresult rc = dev->cu->CtxSetCurrent(dev->ctx);
	if (rc != CUDA_SUCCESS)
		st = cu_err(dev, rc, "cuCtxSetCurrent", err, esz);
	if (!st)
		st = load_image(dev, m, bin->image, bin->is_ptx, bin->entries, bin->block_threads,
				bin->dyn_smem, bin->n_entries, err, esz);
	m->origin = bin->cache_hit ? DG_KERNEL_CACHED : DG_KERNEL_COMPILED;
	m->load_ms = now_ms() - t0;
	dg_binary_destroy(bin);
	return st;
}

dg_status dg__dev_module_add(dg_device *dev, const dg_spec *spec, const void *image,
			     char *const *entries, const int *threads, const int *smem,
			     int n_entries, dg_kernel_origin origin, bool *added, char *err,
			     size_t err_size)
{
	char key[DG_SPEC_TEXT_MAX];
	double t0 = now_ms();

	*added = false;
	if (dg_spec_to_string(spec, key, sizeof(key))) {
		snprintf(err, err_size, "spec text does not fit %d bytes", DG_SPEC_TEXT_MAX);
		return DG_ERR_INTERNAL;
	}
	pthread_mutex_lock(&dev->mu);
	bool have = map_find(dev, dg__fnv1a(key), key) != NULL;
	pthread_mutex_unlock(&dev->mu);
	if (have)
		return DG_OK;
	dg__module *m = calloc(1, sizeof(*m));
	if (!m) {
		snprintf(err, err_size, "out of memory");
		return DG_ERR_NOMEM;
	}
	m->spec = *spec;
	memcpy(m->key, key, sizeof(key));
	m->origin = origin;
	dg_status st = load_image(dev, m, image, false, entries, threads, smem, n_entries, err,
				  err_size);
	m->load_ms = now_ms() - t0;
	pthread_mutex_lock(&dev->mu);
	if (!st && map_find(dev, dg__fnv1a(key), key)) {
		pthread_mutex_unlock(&dev->mu); /* another thread was quicker */
		module_free(dev, m);
		return DG_OK;
	}
	if (!st && !map_add(dev, key, m)) {
		snprintf(err, err_size, "out of memory");
		st = DG_ERR_NOMEM;
	}
	if (!st) {
		m->state = DG__MOD_READY;
		m->next = dev->modules;
		dev->modules = m;
		dev->stats.modules++;
		dev->stats.kernels += (size_t)m->n_kernels;
		dev->stats.bundled += origin == DG_KERNEL_BUNDLED;
		*added = true;
	}
	pthread_mutex_unlock(&dev->mu);
	if (st)
		module_free(dev, m);
	return st;
}

/* ---- the tile of an auto spec: tuning DB, else the template's default ---- */

/* The device's tuning DB, read at the first call (records of this device
 * only) and kept until close; NULL when there is none. Once loaded it is
 * never changed, so lookups need no lock. A device without a disk cache
 * (no_cache) reads only $DRAGON_TUNE_DB and the records built in. */
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
			o.path = "builtin";
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

const dg_tune_db *dg__dev_tune_db(dg_device *dev)
{
	return dev ? tune_db(dev) : NULL;
}

void dg__dev_tune_destroy(dg_device *dev)
{
	dg_tune_db_close(dev->tune_db);
	dev->tune_db = NULL;
	dev->tune_loaded = false;
}

dg_status dg_device_tile_choice(dg_device *dev, const dg_spec *spec,
				dg_tune_choice *out)
{
	char err[DG__MSG_SIZE];
	dg_ctx *jit = NULL;
	dg_status st = dg__dev_enter(dev);

	if (st)
		return st;
	if (!spec || !out)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_device_tile_choice: %s is NULL",
				    !spec ? "spec" : "out");
	st = dg_spec_validate(spec, err, sizeof(err));
	if (st)
		return dg__dev_fail(dev, st, "%s", err);
	st = jit_take(dev, &jit, err, sizeof(err));
	if (st)
		return dg__dev_fail(dev, st, "%s", err);
	dg_codegen *cg = dg_ctx_codegen(jit);
	st = dg_tune_resolve(cg, tune_db(dev), spec, dev->info.name, dev->info.sm, out);
	if (st)
		dg__dev_fail(dev, st, "%s", dg_codegen_errmsg(cg));
	jit_give(dev, jit);
	return st;
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

/* Waits (dev->mu held, released on return) for m and hands out its entry. */
static dg_status take_module(dg_device *dev, dg__module *m, const char *entry,
			     dg_kernel **out)
{
	if (m->state == DG__MOD_BUILDING) {
		m->waiters++;
		while (m->state == DG__MOD_BUILDING)
			pthread_cond_wait(&dev->cv, &dev->mu);
		m->waiters--;
	}
	if (m->state == DG__MOD_FAILED) {
		/* The builder took it out of the map; the last of its waiters
		 * frees it. */
		dg_status st = dg__dev_fail(dev, m->st, "%s", m->err ? m->err : dg_status_str(m->st));
		bool last = m->waiters == 0;
		pthread_mutex_unlock(&dev->mu);
		if (last)
			module_free(dev, m);
		return st;
	}
	pthread_mutex_unlock(&dev->mu);
	return find_entry(dev, m, entry, out);
}

dg_status dg_kernel_get(dg_device *dev, const dg_spec *spec, const char *entry,
			dg_kernel **out)
{
	char asked[DG_SPEC_TEXT_MAX];
	char *err = NULL;
	dg_ctx *jit = NULL;
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
	st = dg_spec_validate(spec, dg__dev_thread(dev)->text, DG__MSG_SIZE);
	if (st)
		return st;
	s = *spec;
	dg_spec_normalize(&s);
	if (dg_spec_to_string(&s, asked, sizeof(asked)))
		return dg__dev_fail(dev, DG_ERR_INTERNAL, "spec text does not fit %d bytes",
				    DG_SPEC_TEXT_MAX);

	/* the hit path: one lookup of the spec as asked */
	uint64_t h = dg__fnv1a(asked);
	pthread_mutex_lock(&dev->mu);
	dg__kentry *e = map_find(dev, h, asked);
	if (e)
		return take_module(dev, e->mod, entry, out);
	pthread_mutex_unlock(&dev->mu);

	/* a miss: resolve the tile (plans, reads the tuning DB once) */
	err = malloc(DG__MSG_SIZE);
	if (!err)
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	err[0] = '\0';
	st = jit_take(dev, &jit, err, DG__MSG_SIZE);
	if (st)
		goto fail;
	dg_tune_choice ch;
	st = dg_tune_resolve(dg_ctx_codegen(jit), tune_db(dev), &s, dev->info.name, dev->info.sm,
			     &ch);
	if (st) {
		snprintf(err, DG__MSG_SIZE, "%s", dg_codegen_errmsg(dg_ctx_codegen(jit)));
		goto fail;
	}
	const char *key = ch.plan.canonical;
	if (ch.spec.arch > dev->info.sm) {
		st = DG_ERR_UNSUPPORTED;
		snprintf(err, DG__MSG_SIZE, "%s: arch=sm_%d%s does not run on %s (sm_%d); set arch=sm_%d",
			 key, ch.spec.arch, ch.spec.arch_specific ? "a" : "", dev->info.name,
			 dev->info.sm, dev->info.sm);
		goto fail;
	}

	pthread_mutex_lock(&dev->mu);
	dev->stats.planned++;
	e = map_find(dev, dg__fnv1a(key), key);
	if (e) {
		/* built, loaded from a bundle, or being built: name it as asked too */
		if (strcmp(key, asked) != 0 && !map_find(dev, h, asked))
			(void)map_add(dev, asked, e->mod); /* out of memory: lookups resolve again */
		jit_give_locked(dev, jit);
		jit = NULL;
		free(err);
		return take_module(dev, e->mod, entry, out);
	}
	dg__module *m = calloc(1, sizeof(*m));
	if (!m || !map_add(dev, key, m) ||
	    (strcmp(key, asked) != 0 && !map_add(dev, asked, m))) {
		if (m)
			map_drop(dev, m);
		pthread_mutex_unlock(&dev->mu);
		free(m);
		st = DG_ERR_NOMEM;
		snprintf(err, DG__MSG_SIZE, "out of memory");
		goto fail;
	}
	m->spec = ch.spec;
	snprintf(m->key, sizeof(m->key), "%s", key);
	m->state = DG__MOD_BUILDING;
	m->next = dev->modules;
	dev->modules = m;
	pthread_mutex_unlock(&dev->mu);

	st = build(dev, jit, m, err, DG__MSG_SIZE);
	jit_give(dev, jit);
	jit = NULL;

	pthread_mutex_lock(&dev->mu);
	if (st == DG_OK) {
		m->state = DG__MOD_READY;
		dev->stats.modules++;
		dev->stats.kernels += (size_t)m->n_kernels;
		dev->stats.compiled += m->origin == DG_KERNEL_COMPILED;
		dev->stats.cached += m->origin == DG_KERNEL_CACHED;
		free(err);
		pthread_cond_broadcast(&dev->cv);
		pthread_mutex_unlock(&dev->mu);
		return find_entry(dev, m, entry, out);
	}
	m->state = DG__MOD_FAILED;
	m->st = st;
	m->err = err;
	err = NULL;
	map_drop(dev, m);
	pthread_cond_broadcast(&dev->cv);
	bool last = m->waiters == 0;
	st = dg__dev_fail(dev, st, "%s", m->err);
	pthread_mutex_unlock(&dev->mu);
	if (last)
		module_free(dev, m);
	return st;
fail:
	if (jit)
		jit_give(dev, jit);
	st = dg__dev_fail(dev, st, "%s", err);
	free(err);
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
	for (int i = 0; i < 3; i++)
		info->cluster[i] = k->cluster[i] > 1 ? k->cluster[i] : 1;
	info->static_smem = k->static_smem;
	info->regs = k->regs;
	info->local_bytes = k->local_bytes;
	info->max_threads = k->max_threads;
	info->cache_hit = k->mod->origin == DG_KERNEL_CACHED;
	info->origin = k->mod->origin;
	info->load_ms = k->mod->load_ms;
	return DG_OK;
}

const dg_spec *dg_kernel_spec(const dg_kernel *k)
{
	return k ? &k->mod->spec : NULL;
}

int dg_kernel_entry_count(const dg_kernel *k)
{
	return k ? k->mod->n_kernels : 0;
}

const dg_kernel *dg_kernel_entry(const dg_kernel *k, int i)
{
	return k && i >= 0 && i < k->mod->n_kernels ? &k->mod->kernels[i] : NULL;
}

const dg_kernel *dg_kernel_entry_named(const dg_kernel *k, const char *entry)
{
	for (int i = 0, n = dg_kernel_entry_count(k); i < n; i++) {
		const dg_kernel *e = &k->mod->kernels[i];
		if (entry && e->entry && strcmp(e->entry, entry) == 0)
			return e;
	}
	return NULL;
}

dg_status dg_device_stats_get(dg_device *dev, dg_device_stats *out)
{
	if (!dev)
		return DG_ERR_INVALID_ARG;
	if (dev->init_status)
		return dg__dev_fail(dev, dev->init_status, "%s", dev->init_msg);
	if (!out)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_device_stats_get: out is NULL");
	pthread_mutex_lock(&dev->mu);
	*out = dev->stats;
	pthread_mutex_unlock(&dev->mu);
	out->allocated = atomic_load(&dev->mem_live);
	out->peak_allocated = atomic_load(&dev->mem_high);
	return DG_OK;
}

/* ---- launch --------------------------------------------------------------- */

dg_status dg__kernel_geometry(dg_device *dev, const dg_kernel *k, const dg_launch *launch,
			      dg_launch *out)
{
	static const char dim[3] = { 'x', 'y', 'z' };
	unsigned block[3];

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
		if (k->cluster[i] > 1 && launch->grid[i] % (unsigned)k->cluster[i])
			return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
					    "%s: grid.%c=%u is not a multiple of the kernel's cluster (%d blocks along %c)",
					    k->entry, dim[i], launch->grid[i], k->cluster[i], dim[i]);
		if (block[i] > (unsigned)dev->max_block[i])
			return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
					    "%s: block.%c=%u exceeds the device limit of %d",
					    k->entry, dim[i], block[i], dev->max_block[i]);
	}
	uint64_t threads = (uint64_t)block[0] * block[1] * block[2];
	int limit = k->max_threads < dev->info.max_block_threads ? k->max_threads
								 : dev->info.max_block_threads;
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
	memcpy(out->grid, launch->grid, sizeof(out->grid));
	memcpy(out->block, block, sizeof(out->block));
	out->smem = smem;
	return DG_OK;
}

dg_status dg__kernel_launch_raw(dg_device *dev, const dg_kernel *k, const dg_launch *l,
				void **args)
{
	CUresult rc = dev->cu->LaunchKernel(k->fn, l->grid[0], l->grid[1], l->grid[2], l->block[0],
					    l->block[1], l->block[2], l->smem,
					    dg__dev_stream(dev), args, NULL);
	if (rc == CUDA_SUCCESS)
		return DG_OK;
	char what[256];
	snprintf(what, sizeof(what), "cuLaunchKernel(%s, grid %ux%ux%u, block %ux%ux%u, smem %u)",
		 k->entry, l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1],
		 l->block[2], l->smem);
	return dg__dev_cu_fail(dev, rc, what);
}

dg_status dg_kernel_launch(dg_device *dev, const dg_kernel *k,
			   const dg_launch *launch, void **args)
{
	dg_launch l;
	dg_status st = dg__dev_enter(dev);

	if (st)
		return st;
	if (!k || !launch)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_kernel_launch: %s is NULL",
				    !k ? "kernel" : "launch");
	st = dg__kernel_geometry(dev, k, launch, &l);
	return st ? st : dg__kernel_launch_raw(dev, k, &l, args);
}
