/*
 * The one door to NCCL (dragon/comm.h): libnccl is dlopen'd once per
 * process under pthread_once, the first time a collective is asked for,
 * and the functions dragon calls are resolved into one table; the outcome
 * (the table, or where it looked) is kept. NCCL's types are declared here
 * as its ABI has them (nccl.h is not needed to build: a toolkit without
 * NCCL still builds dragon).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/comm.h"
#include "runtime/gpu/device_int.h"
#include "runtime/gpu/gpu_int.h"

/* nccl.h's ABI (stable since NCCL 2.0; bf16 since 2.10) */
typedef int nccl_result;
typedef struct nccl_comm *nccl_comm_t;
typedef struct {
	char internal[DG_COMM_ID_BYTES];
} nccl_unique_id;
enum { NCCL_SUCCESS = 0, NCCL_IN_PROGRESS = 7 };
enum { NCCL_SUM = 0, NCCL_AVG = 4 };
enum { NCCL_FLOAT32 = 7, NCCL_BFLOAT16 = 9 };

typedef struct nccl_table {
	nccl_result (*GetVersion)(int *);
	nccl_result (*GetUniqueId)(nccl_unique_id *);
	nccl_result (*CommInitRank)(nccl_comm_t *, int, nccl_unique_id, int);
	nccl_result (*CommDestroy)(nccl_comm_t);
	nccl_result (*CommAbort)(nccl_comm_t);
	nccl_result (*CommGetAsyncError)(nccl_comm_t, nccl_result *);
	nccl_result (*AllReduce)(const void *, void *, size_t, int, int, nccl_comm_t, void *);
	const char *(*GetErrorString)(nccl_result);
} nccl_table;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static nccl_table nc;
static dg_status load_st;
static char load_msg[1024];
static char load_path[512];

static void load(void)
{
	const char *env = getenv("DRAGON_NCCL");
	const char *cuda = getenv("CUDA_HOME");
	char cand[6][512];
	int n = 0;
	if (env && *env) {
		snprintf(cand[n++], sizeof(cand[0]), "%s", env);
	} else {
		snprintf(cand[n++], sizeof(cand[0]), "libnccl.so.2");
		if (cuda && *cuda) {
			snprintf(cand[n++], sizeof(cand[0]), "%s/lib64/libnccl.so.2", cuda);
			snprintf(cand[n++], sizeof(cand[0]), "%s/lib/libnccl.so.2", cuda);
		}
		snprintf(cand[n++], sizeof(cand[0]), "/usr/local/cuda/lib64/libnccl.so.2");
		snprintf(cand[n++], sizeof(cand[0]), "/usr/local/cuda/lib/libnccl.so.2");
	}
	void *lib = NULL;
	size_t used = 0;
	load_msg[0] = 0;
	for (int i = 0; i < n && !lib; i++) {
		lib = dlopen(cand[i], RTLD_NOW | RTLD_LOCAL);
		if (lib) {
			snprintf(load_path, sizeof(load_path), "%.500s", cand[i]);
		} else if (used < sizeof(load_msg)) {
			int k = snprintf(load_msg + used, sizeof(load_msg) - used, "%s%s", used ? ", " : "", cand[i]);
			used += k > 0 ? (size_t)k : 0;
		}
	}
	if (!lib) {
		char tried[1024];
		snprintf(tried, sizeof(tried), "%s", load_msg);
		snprintf(load_msg, sizeof(load_msg),
			 "NCCL not found (looked for %.900s; set DRAGON_NCCL to libnccl.so.2): multi-GPU training needs it",
			 tried);
		load_st = DG_ERR_UNSUPPORTED;
		return;
	}
	void *p;
#define RESOLVE(field, name)                                                                    \
	p = dlsym(lib, name);                                                                   \
	memcpy(&nc.field, &p, sizeof(p));                                                       \
	if (!p) {                                                                               \
		snprintf(load_msg, sizeof(load_msg), "%s lacks %s: NCCL 2.10 or newer is needed", \
			 load_path, name);                                                      \
		load_st = DG_ERR_UNSUPPORTED;                                                   \
		return;                                                                         \
	}
	RESOLVE(GetVersion, "ncclGetVersion")
	RESOLVE(GetUniqueId, "ncclGetUniqueId")
	RESOLVE(CommInitRank, "ncclCommInitRank")
	RESOLVE(CommDestroy, "ncclCommDestroy")
	RESOLVE(CommAbort, "ncclCommAbort")
	RESOLVE(CommGetAsyncError, "ncclCommGetAsyncError")
	RESOLVE(AllReduce, "ncclAllReduce")
	RESOLVE(GetErrorString, "ncclGetErrorString")
#undef RESOLVE
	int v = 0;
	if (nc.GetVersion(&v) != NCCL_SUCCESS || v < 21000) {
		snprintf(load_msg, sizeof(load_msg), "%s is NCCL %d: 2.10 or newer is needed (bf16)", load_path, v);
		load_st = DG_ERR_UNSUPPORTED;
	}
}

static dg_status door(char *msg, size_t msg_size)
{
	pthread_once(&once, load);
	if (load_st && msg && msg_size)
		snprintf(msg, msg_size, "%s", load_msg);
	return load_st;
}

dg_status dg_nccl_version(int *version, char *path, size_t path_size, char *msg, size_t msg_size)
{
	dg_status st = door(msg, msg_size);
	if (st)
		return st;
	if (version)
		nc.GetVersion(version);
	if (path && path_size)
		snprintf(path, path_size, "%s", load_path);
	return DG_OK;
}

dg_status dg_comm_unique_id(uint8_t id[DG_COMM_ID_BYTES], char *msg, size_t msg_size)
{
	if (!id)
		return DG_ERR_INVALID_ARG;
	dg_status st = door(msg, msg_size);
	if (st)
		return st;
	nccl_unique_id u;
	nccl_result r = nc.GetUniqueId(&u);
	if (r != NCCL_SUCCESS) {
		if (msg && msg_size)
			snprintf(msg, msg_size, "ncclGetUniqueId: %s", nc.GetErrorString(r));
		return DG_ERR_CUDA;
	}
	memcpy(id, u.internal, DG_COMM_ID_BYTES);
	return DG_OK;
}

struct dg_comm {
	dg_device *dev;
	nccl_comm_t c;
	int world, rank;
};

static dg_status nccl_fail(dg_device *dev, nccl_result r, const char *call)
{
	return dg__dev_fail(dev, DG_ERR_CUDA, "%s: %s (NCCL %d)", call, nc.GetErrorString(r), r);
}

dg_status dg_comm_create(dg_device *dev, const uint8_t id[DG_COMM_ID_BYTES], int world, int rank, dg_comm **out)
{
	if (!dev || !id || !out)
		return dev ? dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_comm_create: NULL argument") : DG_ERR_INVALID_ARG;
	*out = NULL;
	if (world < 1 || rank < 0 || rank >= world)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "rank %d of world %d: ranks are 0..world-1", rank, world);
	char msg[1024];
	dg_status st = door(msg, sizeof(msg));
	if (st)
		return dg__dev_fail(dev, st, "%s", msg);
	if ((st = dg__dev_enter(dev))) /* NCCL takes the current context's device */
		return st;
	dg_comm *c = calloc(1, sizeof(*c));
	if (!c)
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	nccl_unique_id u;
	memcpy(u.internal, id, DG_COMM_ID_BYTES);
	nccl_result r = nc.CommInitRank(&c->c, world, u, rank);
	if (r != NCCL_SUCCESS) {
		free(c);
		return nccl_fail(dev, r, "ncclCommInitRank");
	}
	c->dev = dev;
	c->world = world;
	c->rank = rank;
	*out = c;
	return DG_OK;
}

void dg_comm_destroy(dg_comm *c, int abort)
{
	if (!c)
		return;
	if (abort)
		nc.CommAbort(c->c);
	else
		nc.CommDestroy(c->c);
	free(c);
}

dg_status dg_comm_allreduce(dg_comm *c, dg_dptr buf, size_t count, dg_fmt fmt, int average)
{
	if (!c)
		return DG_ERR_INVALID_ARG;
	if (fmt != DG_FMT_F32 && fmt != DG_FMT_BF16)
		return dg__dev_fail(c->dev, DG_ERR_INVALID_ARG, "all-reduce of %s: f32 or bf16 only", dg_fmt_name(fmt));
	if (!count)
		return DG_OK;
	if (!buf)
		return dg__dev_fail(c->dev, DG_ERR_INVALID_ARG, "all-reduce: no buffer");
	dg_status st = dg__dev_enter(c->dev);
	if (st)
		return st;
	void *p = (void *)(uintptr_t)buf;
	nccl_result r = nc.AllReduce(p, p, count, fmt == DG_FMT_F32 ? NCCL_FLOAT32 : NCCL_BFLOAT16,
				     average ? NCCL_AVG : NCCL_SUM, c->c, (void *)dg__dev_stream(c->dev));
	return r == NCCL_SUCCESS ? DG_OK : nccl_fail(c->dev, r, "ncclAllReduce");
}

dg_status dg_comm_check(dg_comm *c)
{
	if (!c)
		return DG_ERR_INVALID_ARG;
	nccl_result a = NCCL_SUCCESS;
	nccl_result r = nc.CommGetAsyncError(c->c, &a);
	if (r != NCCL_SUCCESS)
		return nccl_fail(c->dev, r, "ncclCommGetAsyncError");
	if (a != NCCL_SUCCESS && a != NCCL_IN_PROGRESS)
		return dg__dev_fail(c->dev, DG_ERR_CUDA, "rank %d of %d: NCCL: %s (a peer failed?)", c->rank, c->world,
				    nc.GetErrorString(a));
	return DG_OK;
}
