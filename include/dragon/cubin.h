/*
 * dragon — sanity check of a cubin image before it is shipped or loaded.
 *
 * A cubin is an ELF64 little-endian file for EM_CUDA (190), of type ET_EXEC
 * (what NVRTC and `nvcc -cubin` emit) or ET_REL (`-rdc=true`). The SM it
 * targets is in e_flags, in one of two layouts chosen by EI_ABIVERSION
 * (observed with CUDA 13.0 nvcc and NVRTC; the names are LLVM's, from
 * llvm/BinaryFormat/ELF.h):
 *
 *   ABI version <= 7 (EI_OSABI 0x33, CUDA <= 12.x): SM = e_flags & 0xff
 *     (EF_CUDA_SM); bits 16..23 hold the virtual SM, 0x400 = 64-bit
 *     addresses, 0x800 = arch-specific ("a") features.
 *       sm_90 → 0x005a055a
 *   ABI version >= 8 (EI_OSABI 0x41, CUDA 13): SM = (e_flags >> 8) & 0xff
 *     (EF_CUDA_SM_MASK 0xff00, EF_CUDA_SM_OFFSET 8); the low byte is 0x04
 *     up to sm_90 and 0x02 from sm_100 on, and 0x06000000 is always set.
 *       sm_80 → 0x06005004, sm_90 → 0x06005a04, sm_100 → 0x06006402,
 *       sm_120 → 0x06007802
 *     CUDA 13.0 writes the same e_flags for sm_90 and sm_90a (and for
 *     sm_100, sm_100a and sm_100f): the "a" lives in the .nv.compat
 *     section, so this check compares the SM number only.
 */
#ifndef DRAGON_CUBIN_H
#define DRAGON_CUBIN_H

#include <stddef.h>

#include "export.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Checks that image (size bytes) is a well-formed CUDA ELF whose e_flags
 * name SM `arch` (90 for sm_90): the header, and that every section and
 * program header lies inside the image. Reads nothing past image + size, so
 * any bytes are safe to hand in.
 *
 * Returns DG_OK; DG_ERR_INVALID_ARG for a NULL image or an arch outside
 * 10..999; DG_ERR_CORRUPT when the bytes are not a whole CUDA ELF
 * (truncated, not ELF, wrong class, byte order or machine, a header that
 * points outside the image); DG_ERR_UNSUPPORTED when it is a good cubin for
 * another SM. msg (if non-NULL) gets one line saying which, e.g.
 * "cubin targets sm_80, expected sm_90".
 */
DG_API dg_status dg_cubin_check(const void *image, size_t size, int arch, char *msg,
				size_t msg_size);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_CUBIN_H */
