/*
 * CUDA graphs: capture the calling thread's stream, instantiate, replay.
 *
 * Capture is thread-local (CU_STREAM_CAPTURE_MODE_THREAD_LOCAL): a call on
 * this thread that is unsafe during capture (an allocation, a synchronous
 * copy, a stream synchronize) fails, and the capture is invalidated, so a
 * graph never holds half of a step. The ops are written so that nothing on
 * a launch path allocates, frees or synchronizes once their kernels are
 * loaded; run a step once before capturing it (as a training loop's
 * warm-up does), so that no kernel is first compiled and loaded inside the
 * capture.
 */
#include <stdlib.h>

#include "runtime/gpu/device_int.h"
#include "runtime/gpu/gpu_int.h"

struct dg_graph {
	dg_device *dev;
	CUgraph graph;
	CUgraphExec exec;
};

dg_status dg_graph_begin(dg_device *dev)
{
	dg_status st = dg__dev_enter(dev);
	if (st)
		return st;
	CUstream s = dg__dev_stream(dev);
	CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
	CUresult rc = dev->cu->StreamIsCapturing(s, &cs);
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuStreamIsCapturing");
	if (cs != CU_STREAM_CAPTURE_STATUS_NONE)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "dg_graph_begin: the stream is already capturing; end that capture first");
	rc = dev->cu->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc,
				       "cuStreamBeginCapture (the legacy default stream cannot be captured; set a stream)");
	return DG_OK;
}

dg_status dg_graph_end(dg_device *dev, dg_graph **out)
{
	if (out)
		*out = NULL;
	dg_status st = dg__dev_enter(dev);
	if (st)
		return st;
	CUgraph graph = NULL;
	CUresult rc = dev->cu->StreamEndCapture(dg__dev_stream(dev), &graph);
	if (rc != CUDA_SUCCESS) {
		if (graph)
			(void)dev->cu->GraphDestroy(graph);
		return dg__dev_cu_fail(dev, rc,
				       "cuStreamEndCapture (a call during the capture was not allowed, or none was begun)");
	}
	if (!out) {
		(void)dev->cu->GraphDestroy(graph);
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_graph_end: out is NULL");
	}
	dg_graph *g = calloc(1, sizeof(*g));
	if (!g) {
		(void)dev->cu->GraphDestroy(graph);
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	}
	g->dev = dev;
	g->graph = graph;
	rc = dev->cu->GraphInstantiateWithFlags(&g->exec, graph, 0);
	if (rc != CUDA_SUCCESS) {
		dg_graph_destroy(g);
		return dg__dev_cu_fail(dev, rc, "cuGraphInstantiateWithFlags");
	}
	*out = g;
	return DG_OK;
}

dg_status dg_graph_launch(dg_graph *g)
{
	if (!g)
		return DG_ERR_INVALID_ARG;
	dg_status st = dg__dev_enter(g->dev);
	if (st)
		return st;
	CUresult rc = g->dev->cu->GraphLaunch(g->exec, dg__dev_stream(g->dev));
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(g->dev, rc, "cuGraphLaunch");
	return DG_OK;
}

void dg_graph_destroy(dg_graph *g)
{
	if (!g)
		return;
	if (dg__dev_enter(g->dev) == DG_OK) {
		if (g->exec)
			(void)g->dev->cu->GraphExecDestroy(g->exec);
		if (g->graph)
			(void)g->dev->cu->GraphDestroy(g->graph);
	}
	free(g);
}
