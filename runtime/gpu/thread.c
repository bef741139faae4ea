/*
 * Each thread's state on a device: its message and its stream, and the
 * entry check every GPU call starts with.
 *
 * Messages are per thread and per device: dg_device_errmsg returns the
 * message of the calling thread's last failure on dev, valid until that
 * thread's next failing call on dev (a success leaves it in place). The
 * stream is per thread too, like PyTorch's current stream: a thread that
 * never set one works on the device's own stream.
 *
 * A thread's record on a device lives until the thread exits (a pthread
 * key's destructor frees its records) or the device closes: close lets go
 * of every record, frees the closing thread's own, and leaves the others
 * to their threads, which free them at their next lookup or their exit. A
 * process that runs many short-lived threads on a device (the model's
 * sizing starts one a node) holds the records of its living threads only.
 * One lock guards every device's list; a thread reads its own list
 * without it (a closing device's mark is atomic).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/gpu/device_int.h"
#include "runtime/gpu/gpu_int.h"

static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t key; /* its value: the thread's list, for the destructor */
static bool key_ok;
static pthread_mutex_t lists_mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local dg__thread *mine; /* the calling thread's records */

/* Off its device's list (lists_mu held). */
static void unlink_record(dg_device *dev, dg__thread *t)
{
	if (t->prev)
		t->prev->next = t->next;
	else
		dev->threads = t->next;
	if (t->next)
		t->next->prev = t->prev;
	t->next = t->prev = NULL;
	dev->n_threads--;
}

/* The thread's exit: each record off its device's list, then freed. */
static void thread_exit(void *v)
{
	dg__thread *list = v;
	mine = NULL;
	pthread_mutex_lock(&lists_mu);
	for (dg__thread *t = list; t; t = t->mine) {
		dg_device *dev = atomic_load_explicit(&t->dev, memory_order_relaxed);
		if (dev)
			unlink_record(dev, t);
	}
	pthread_mutex_unlock(&lists_mu);
	for (dg__thread *t = list, *next; t; t = next) {
		next = t->mine;
		free(t);
	}
}

static void key_make(void)
{
	key_ok = pthread_key_create(&key, thread_exit) == 0;
}

/* The calling thread's record on dev, or NULL; frees on the way the
 * records of devices closed since. */
static dg__thread *find(const dg_device *dev)
{
	dg__thread *found = NULL;
	bool dropped = false;
	for (dg__thread **at = &mine, *t; (t = *at);) {
		dg_device *d = atomic_load_explicit(&t->dev, memory_order_acquire);
		if (!d) { /* its device closed: nobody else holds it */
			*at = t->mine;
			free(t);
			dropped = true;
			continue;
		}
		if (d == dev)
			found = t;
		at = &t->mine;
	}
	if (dropped && key_ok)
		(void)pthread_setspecific(key, mine);
	return found;
}

dg__thread *dg__dev_thread(dg_device *dev)
{
	pthread_once(&key_once, key_make);
	if (!key_ok)
		return &dev->thr_shared;
	dg__thread *t = find(dev);
	if (t)
		return t;
	t = calloc(1, sizeof(*t));
	if (!t)
		return &dev->thr_shared;
	t->mine = mine;
	if (pthread_setspecific(key, t)) {
		free(t);
		return &dev->thr_shared;
	}
	atomic_init(&t->dev, dev);
	pthread_mutex_lock(&lists_mu);
	t->next = dev->threads;
	if (t->next)
		t->next->prev = t;
	dev->threads = t;
	dev->n_threads++;
	pthread_mutex_unlock(&lists_mu);
	mine = t;
	return t;
}

size_t dg__dev_thread_count(dg_device *dev)
{
	pthread_mutex_lock(&lists_mu);
	size_t n = dev->n_threads;
	pthread_mutex_unlock(&lists_mu);
	return n;
}

void dg__dev_threads_destroy(dg_device *dev)
{
	pthread_mutex_lock(&lists_mu);
	for (dg__thread *t = dev->threads, *next; t; t = next) {
		next = t->next;
		t->next = t->prev = NULL;
		atomic_store_explicit(&t->dev, NULL, memory_order_release);
	}
	dev->threads = NULL;
	dev->n_threads = 0;
	pthread_mutex_unlock(&lists_mu);
	(void)find(NULL); /* the closing thread's own, freed now */
}

CUstream dg__dev_stream(dg_device *dev)
{
	CUstream s = dg__dev_thread(dev)->stream;
	return s ? s : dev->own_stream;
}

static dg_status dev_vfail(dg_device *dev, dg_status st, const char *fmt, va_list ap)
{
	if (!dev)
		return st;
	vsnprintf(dg__dev_thread(dev)->text, DG__MSG_SIZE, fmt, ap);
	return st;
}

dg_status dg__dev_fail(dg_device *dev, dg_status st, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	st = dev_vfail(dev, st, fmt, ap);
	va_end(ap);
	return st;
}

dg_status dg__dev_fail_msg(dg_device *dev, dg_status st, const char *msg)
{
	return dg__dev_fail(dev, st, "%s", msg ? msg : "");
}

dg_status dg__dev_cu_fail(dg_device *dev, CUresult rc, const char *call)
{
	char m[512];
	dg_status st = dg__cu_error(dev ? dev->cu : NULL, rc, call, m, sizeof(m));
	return dg__dev_fail(dev, st, "%s", m);
}

const char *dg_device_errmsg(const dg_device *dev)
{
	if (!dev)
		return "device is NULL";
	const dg__thread *t = find(dev);
	if (t && t->text[0])
		return t->text;
	if (!t && dev->thr_shared.text[0]) /* no record: its message went there */
		return dev->thr_shared.text;
	/* A thread that never failed here still learns why open failed. */
	return dev->init_status ? dev->init_msg : "";
}

dg_status dg__dev_enter(dg_device *dev)
{
	if (!dev)
		return DG_ERR_INVALID_ARG;
	if (dev->init_status)
		return dg__dev_fail(dev, dev->init_status, "%s", dev->init_msg);
	CUresult rc = dev->cu->CtxSetCurrent(dev->ctx);
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuCtxSetCurrent");
	return DG_OK;
}

const dg_device_info *dg__dev_info(const dg_device *dev)
{
	return &dev->info;
}

dg_status dg_device_set_stream(dg_device *dev, void *cu_stream)
{
	dg_status st = dg__dev_enter(dev);
	if (st)
		return st;
	dg__dev_thread(dev)->stream = (CUstream)cu_stream;
	return DG_OK;
}

void *dg_device_stream(dg_device *dev)
{
	if (!dev || dev->init_status)
		return NULL;
	return (void *)dg__dev_stream(dev);
}

dg_status dg_device_sync(dg_device *dev)
{
	dg_status st = dg__dev_enter(dev);
	if (st)
		return st;
	CUresult rc = dev->cu->StreamSynchronize(dg__dev_stream(dev));
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuStreamSynchronize");
	return DG_OK;
}
