/*
 * Each thread's state on a device: its message and its stream, and the
 * entry check every GPU call starts with.
 *
 * Messages are per thread and per device: dg_device_errmsg returns the
 * message of the calling thread's last failure on dev, valid until that
 * thread's next failing call on dev (a success leaves it in place). The
 * stream is per thread too, like PyTorch's current stream: a thread that
 * never set one works on the device's own stream. Each thread's record
 * lives until dg_device_close.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/gpu/device_int.h"
#include "runtime/gpu/gpu_int.h"

dg__thread *dg__dev_thread(dg_device *dev)
{
	dg__thread *t;

	if (!dev->thr_key_ok)
		return &dev->thr_shared;
	t = pthread_getspecific(dev->thr_key);
	if (t)
		return t;
	t = calloc(1, sizeof(*t));
	if (!t)
		return &dev->thr_shared;
	if (pthread_setspecific(dev->thr_key, t)) {
		free(t);
		return &dev->thr_shared;
	}
	pthread_mutex_lock(&dev->thr_mu);
	t->next = dev->threads;
	dev->threads = t;
	pthread_mutex_unlock(&dev->thr_mu);
	return t;
}

void dg__dev_threads_destroy(dg_device *dev)
{
	for (dg__thread *t = dev->threads, *next; t; t = next) {
		next = t->next;
		free(t);
	}
	dev->threads = NULL;
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
	const dg__thread *t;

	if (!dev)
		return "device is NULL";
	if (!dev->thr_key_ok)
		return dev->thr_shared.text;
	t = pthread_getspecific(dev->thr_key);
	if (t && t->text[0])
		return t->text;
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
