/*
 * The one door to the CUDA driver: libcuda.so.1 is dlopen'd the first time
 * it is needed (never at load time, so a process that forks before using a
 * GPU — Criterion does — is safe) and the driver functions the runtime
 * uses are resolved into one table. <cuda.h> is included for its types
 * only: nothing links against libcuda. Private to runtime/gpu/.
 */
#ifndef DG_RUNTIME_CU_LOADER_H
#define DG_RUNTIME_CU_LOADER_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda.h>

#include "dragon/status.h"

/* X(field, name for cuGetProcAddress, exported symbol for dlsym, required,
 *   parameter list). The table field is `CUresult (*field) params`.
 * Optional entries (required 0) are NULL on drivers without them. */
#define DG_CU_FUNCS(X)                                                        \
	X(Init, "cuInit", "cuInit", 1, (unsigned int))                        \
	X(DriverGetVersion, "cuDriverGetVersion", "cuDriverGetVersion", 1,    \
	  (int *))                                                            \
	X(GetErrorName, "cuGetErrorName", "cuGetErrorName", 1,                \
	  (CUresult, const char **))                                          \
	X(GetErrorString, "cuGetErrorString", "cuGetErrorString", 1,          \
	  (CUresult, const char **))                                          \
	X(DeviceGetCount, "cuDeviceGetCount", "cuDeviceGetCount", 1, (int *)) \
	X(DeviceGet, "cuDeviceGet", "cuDeviceGet", 1, (CUdevice *, int))      \
	X(DeviceGetName, "cuDeviceGetName", "cuDeviceGetName", 1,             \
	  (char *, int, CUdevice))                                            \
	X(DeviceGetAttribute, "cuDeviceGetAttribute", "cuDeviceGetAttribute", \
	  1, (int *, CUdevice_attribute, CUdevice))                           \
	X(DeviceTotalMem, "cuDeviceTotalMem", "cuDeviceTotalMem_v2", 1,       \
	  (size_t *, CUdevice))                                               \
	X(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain",                 \
	  "cuDevicePrimaryCtxRetain", 1, (CUcontext *, CUdevice))             \
	X(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease",               \
	  "cuDevicePrimaryCtxRelease_v2", 1, (CUdevice))                      \
	X(CtxSetCurrent, "cuCtxSetCurrent", "cuCtxSetCurrent", 1, (CUcontext)) \
	X(CtxSynchronize, "cuCtxSynchronize", "cuCtxSynchronize", 1, (void))   \
	X(StreamCreate, "cuStreamCreate", "cuStreamCreate", 1,                \
	  (CUstream *, unsigned int))                                         \
	X(StreamDestroy, "cuStreamDestroy", "cuStreamDestroy_v2", 1,          \
	  (CUstream))                                                         \
	X(StreamSynchronize, "cuStreamSynchronize", "cuStreamSynchronize", 1, \
	  (CUstream))                                                         \
	X(StreamWaitEvent, "cuStreamWaitEvent", "cuStreamWaitEvent", 1,       \
	  (CUstream, CUevent, unsigned int))                                  \
	X(MemGetInfo, "cuMemGetInfo", "cuMemGetInfo_v2", 1,                   \
	  (size_t *, size_t *))                                               \
	X(MemAlloc, "cuMemAlloc", "cuMemAlloc_v2", 1, (CUdeviceptr *, size_t)) \
	X(MemFree, "cuMemFree", "cuMemFree_v2", 1, (CUdeviceptr))             \
	X(MemGetAddressRange, "cuMemGetAddressRange",                         \
	  "cuMemGetAddressRange_v2", 1, (CUdeviceptr *, size_t *, CUdeviceptr)) \
	X(MemcpyHtoDAsync, "cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2", 1,    \
	  (CUdeviceptr, const void *, size_t, CUstream))                      \
	X(MemcpyDtoHAsync, "cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2", 1,    \
	  (void *, CUdeviceptr, size_t, CUstream))                            \
	X(MemcpyDtoDAsync, "cuMemcpyDtoDAsync", "cuMemcpyDtoDAsync_v2", 1,    \
	  (CUdeviceptr, CUdeviceptr, size_t, CUstream))                       \
	X(MemHostAlloc, "cuMemHostAlloc", "cuMemHostAlloc", 1,                \
	  (void **, size_t, unsigned int))                                    \
	X(MemFreeHost, "cuMemFreeHost", "cuMemFreeHost", 1, (void *))         \
	X(MemsetD8Async, "cuMemsetD8Async", "cuMemsetD8Async", 1,             \
	  (CUdeviceptr, unsigned char, size_t, CUstream))                     \
	X(ModuleLoadData, "cuModuleLoadData", "cuModuleLoadData", 1,          \
	  (CUmodule *, const void *))                                         \
	X(ModuleUnload, "cuModuleUnload", "cuModuleUnload", 1, (CUmodule))    \
	X(ModuleGetFunction, "cuModuleGetFunction", "cuModuleGetFunction", 1, \
	  (CUfunction *, CUmodule, const char *))                             \
	X(LibraryLoadData, "cuLibraryLoadData", "cuLibraryLoadData", 0,       \
	  (CUlibrary *, const void *, CUjit_option *, void **, unsigned int,  \
	   CUlibraryOption *, void **, unsigned int))                         \
	X(LibraryUnload, "cuLibraryUnload", "cuLibraryUnload", 0, (CUlibrary)) \
	X(LibraryGetKernel, "cuLibraryGetKernel", "cuLibraryGetKernel", 0,    \
	  (CUkernel *, CUlibrary, const char *))                              \
	X(KernelGetFunction, "cuKernelGetFunction", "cuKernelGetFunction", 0, \
	  (CUfunction *, CUkernel))                                           \
	X(FuncGetAttribute, "cuFuncGetAttribute", "cuFuncGetAttribute", 1,    \
	  (int *, CUfunction_attribute, CUfunction))                          \
	X(FuncSetAttribute, "cuFuncSetAttribute", "cuFuncSetAttribute", 1,    \
	  (CUfunction, CUfunction_attribute, int))                            \
	X(LaunchKernel, "cuLaunchKernel", "cuLaunchKernel", 1,                \
	  (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, \
	   unsigned int, unsigned int, unsigned int, CUstream, void **,       \
	   void **))                                                          \
	X(EventCreate, "cuEventCreate", "cuEventCreate", 1,                   \
	  (CUevent *, unsigned int))                                          \
	X(EventDestroy, "cuEventDestroy", "cuEventDestroy_v2", 1, (CUevent))  \
	X(EventRecord, "cuEventRecord", "cuEventRecord", 1,                   \
	  (CUevent, CUstream))                                                \
	X(EventSynchronize, "cuEventSynchronize", "cuEventSynchronize", 1,    \
	  (CUevent))                                                          \
	X(EventElapsedTime, "cuEventElapsedTime", "cuEventElapsedTime", 1,    \
	  (float *, CUevent, CUevent))                                        \
	X(StreamBeginCapture, "cuStreamBeginCapture", "cuStreamBeginCapture_v2", \
	  1, (CUstream, CUstreamCaptureMode))                                 \
	X(StreamEndCapture, "cuStreamEndCapture", "cuStreamEndCapture", 1,    \
	  (CUstream, CUgraph *))                                              \
	X(StreamIsCapturing, "cuStreamIsCapturing", "cuStreamIsCapturing", 1, \
	  (CUstream, CUstreamCaptureStatus *))                                \
	X(GraphInstantiateWithFlags, "cuGraphInstantiateWithFlags",           \
	  "cuGraphInstantiateWithFlags", 1,                                   \
	  (CUgraphExec *, CUgraph, unsigned long long))                       \
	X(GraphLaunch, "cuGraphLaunch", "cuGraphLaunch", 1,                   \
	  (CUgraphExec, CUstream))                                            \
	X(GraphExecDestroy, "cuGraphExecDestroy", "cuGraphExecDestroy", 1,    \
	  (CUgraphExec))                                                      \
	X(GraphDestroy, "cuGraphDestroy", "cuGraphDestroy", 1, (CUgraph))    \
	X(TensorMapEncodeTiled, "cuTensorMapEncodeTiled",                     \
	  "cuTensorMapEncodeTiled", 0,                                        \
	  (CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,            \
	   const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,        \
	   const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,     \
	   CUtensorMapL2promotion, CUtensorMapFloatOOBfill))

typedef struct dg__cu {
#define DG__CU_FIELD(f, name, sym, req, params) CUresult(CUDAAPI *f) params;
	DG_CU_FUNCS(DG__CU_FIELD)
#undef DG__CU_FIELD
	/* the library API (cuLibrary*, cuKernelGetFunction) is all there */
	bool has_library;
} dg__cu;

/*
 * The driver table, loaded and cuInit'ed once per process (thread-safe).
 * On success *out is the table and DG_OK. No libcuda.so.1, or a driver
 * that reports no device: DG_ERR_NO_DEVICE; a driver that fails
 * otherwise (or lacks a required function): DG_ERR_CUDA. Either way msg
 * (if non-NULL) says why; the outcome is the same on every call.
 */
dg_status dg__cu_load(const dg__cu **out, char *msg, size_t msg_size);

/*
 * Writes "<call>: <CUDA_ERROR_NAME> (<driver's description>)" into msg and
 * returns the dg_status for rc: DG_OK for CUDA_SUCCESS, DG_ERR_NOMEM for
 * CUDA_ERROR_OUT_OF_MEMORY, DG_ERR_NO_DEVICE for CUDA_ERROR_NO_DEVICE, else
 * DG_ERR_CUDA.
 */
dg_status dg__cu_error(const dg__cu *cu, CUresult rc, const char *call,
		       char *msg, size_t msg_size);

#endif
