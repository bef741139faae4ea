/*
 * TMA tensor maps (runtime/gpu/gpu_int.h): the driver's description of a
 * global tensor that Hopper's bulk tensor copies read box by box into
 * shared memory, swizzled as the warpgroup tensor cores read it. A kernel
 * takes the map by value (a __grid_constant__ parameter), so encoding it
 * is host work only: nothing is allocated or queued, and a map made for a
 * captured launch is copied into the graph with the launch's parameters.
 */
#include <string.h>

#include "runtime/gpu/device_int.h"
#include "runtime/gpu/gpu_int.h"

/* A tiled map of rank 3 to 5 of elements of es bytes (f32 4, bf16 2, codes
 * 1), dims[0] contiguous, dims 1 .. rank-1 at strides (bytes), boxes of
 * box[0] x .. x box[rank-1], the swizzle of swz bytes (64 or 128). */
static dg_status tmap_tiled(dg_device *dev, dg__tmap *out, dg_dptr base, int es, int rank, const uint64_t *dims,
			    const uint64_t *strides, const uint32_t *box, int swz)
{
	_Static_assert(sizeof(dg__tmap) == sizeof(CUtensorMap), "dg__tmap is a CUtensorMap");
	const char *what = es == 4 ? "f32" : es == 2 ? "bf16" : "bytes";
	const CUtensorMapDataType type = es == 4   ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
					 : es == 2 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
						   : CU_TENSOR_MAP_DATA_TYPE_UINT8;
	memset(out, 0, sizeof(*out));
	if (!dev || !dev->cu)
		return DG_ERR_INVALID_ARG;
	if (!dev->cu->TensorMapEncodeTiled)
		return dg__dev_fail(dev, DG_ERR_UNSUPPORTED,
				    "tensor map: this driver has no cuTensorMapEncodeTiled (CUDA 12 or later has)");
	if (base % 16 != 0 || (dims[0] * (uint64_t)es) % 16 != 0)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "tensor map: rows of %llu %s at 0x%llx: TMA needs a 16-byte aligned base and rows a multiple of 16 bytes",
				    (unsigned long long)dims[0], what, (unsigned long long)base);
	bool box_ok = box[0] * (uint32_t)es <= (uint32_t)swz && box[0] > 0;
	for (int d = 1; d < rank; d++)
		box_ok = box_ok && box[d] > 0 && box[d] <= 256 && strides[d - 1] % 16 == 0 &&
			 strides[d - 1] < (1ull << 40);
	if (!box_ok)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "tensor map: box %u x %u x %u %s: at most %d bytes x 256 x 256 rows with the %d-byte swizzle, strides multiples of 16 bytes",
				    box[0], box[1], box[2], what, swz, swz);
	cuuint64_t gdim[5], gstride[4];
	cuuint32_t b[5], st[5];
	for (int d = 0; d < rank; d++) {
		gdim[d] = dims[d];
		b[d] = box[d];
		st[d] = 1;
		if (d)
			gstride[d - 1] = strides[d - 1];
	}
	CUresult rc = dev->cu->TensorMapEncodeTiled(
		(CUtensorMap *)(void *)out->bytes, type, (cuuint32_t)rank, (void *)(uintptr_t)base, gdim, gstride, b, st,
		CU_TENSOR_MAP_INTERLEAVE_NONE, swz == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
		CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
		CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuTensorMapEncodeTiled");
	return DG_OK;
}

/* dims packed: dim 1's stride a row of dim 0, dim 2's a plane */
static dg_status tmap_packed(dg_device *dev, dg__tmap *out, dg_dptr base, int es, const uint64_t dims[3],
			     const uint32_t box[3], int swz)
{
	const uint64_t strides[2] = { dims[0] * (uint64_t)es, dims[0] * dims[1] * (uint64_t)es };
	return tmap_tiled(dev, out, base, es, 3, dims, strides, box, swz);
}

dg_status dg__tmap_bf16(dg_device *dev, dg__tmap *out, dg_dptr base, const uint64_t dims[3],
			const uint32_t box[2])
{
	return tmap_packed(dev, out, base, 2, dims, (const uint32_t[3]){ box[0], box[1], 1 }, 128);
}

dg_status dg__tmap_u8(dg_device *dev, dg__tmap *out, dg_dptr base, const uint64_t dims[3],
		      const uint32_t box[2])
{
	return tmap_packed(dev, out, base, 1, dims, (const uint32_t[3]){ box[0], box[1], 1 }, 128);
}

dg_status dg__tmap_box3(dg_device *dev, dg__tmap *out, dg_dptr base, int es, const uint64_t dims[3],
			const uint32_t box[3])
{
	return tmap_packed(dev, out, base, es, dims, box, 128);
}

dg_status dg__tmap_rank5(dg_device *dev, dg__tmap *out, dg_dptr base, int es, const uint64_t dims[5],
			 const uint64_t strides[4], const uint32_t box[5])
{
	return tmap_tiled(dev, out, base, es, 5, dims, strides, box, 128);
}

dg_status dg__tmap_rows(dg_device *dev, dg__tmap *out, dg_dptr base, int es, const uint64_t dims[3],
			const uint32_t box[2])
{
	const int swz = box[0] * (uint32_t)es <= 64 ? 64 : 128;
	return tmap_packed(dev, out, base, es, dims, (const uint32_t[3]){ box[0], box[1], 1 }, swz);
}
