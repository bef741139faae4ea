/*
 * Cubin sanity check: is this image a whole CUDA ELF for the SM we asked
 * for? Run on every binary dragon-gen ships and on every bundle it
 * inspects, so a truncated copy or a cubin for the wrong GPU is named
 * before a driver refuses it with a bare error code.
 *
 * Every field is read byte by byte (no casts onto the image: it may be
 * unaligned and any length) and every offset is checked against the size
 * without overflow, so arbitrary bytes are safe here. The e_flags layouts
 * are documented in dragon/cubin.h.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/msg.h"
#include "dragon/cubin.h"

#define ELF64_EHDR_SIZE 64
#define ELF64_SHDR_SIZE 64
#define ELF64_PHDR_SIZE 56
#define ET_REL 1
#define ET_EXEC 2
#define EM_CUDA 190
#define SHT_NOBITS 8
#define SHN_LORESERVE 0xff00
/* First EI_ABIVERSION with the SM in bits 8..15 (CUDA 13). */
#define CUDA_ABI_V2 8

static uint16_t rd16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t rd32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static uint64_t rd64(const uint8_t *p)
{
	return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

/* [off, off + len) inside an image of `size` bytes, without overflow. */
static bool in_image(uint64_t off, uint64_t len, size_t size)
{
	return off <= size && len <= size - off;
}

/* A table of n entries of `ent` bytes at off; n * ent cannot overflow
 * (both are 16-bit). */
static dg_status check_table(const char *what, uint64_t off, unsigned n,
			     unsigned ent, unsigned want_ent, size_t size,
			     char *msg, size_t msz)
{
	if (n == 0)
		return DG_OK;
	if (ent != want_ent)
		return dg__msgf(DG_ERR_CORRUPT, msg, msz,
				"%s entries are %u bytes; ELF64 has %u", what,
				ent, want_ent);
	if (!in_image(off, (uint64_t)n * ent, size))
		return dg__msgf(DG_ERR_CORRUPT, msg, msz,
				"%s (%u entries at offset %llu) runs past the end of the %zu-byte image (truncated?)",
				what, n, (unsigned long long)off, size);
	return DG_OK;
}

static dg_status check_sections(const uint8_t *b, size_t size, uint64_t shoff,
				unsigned shnum, char *msg, size_t msz)
{
	for (unsigned i = 0; i < shnum; i++) {
		const uint8_t *sh = b + shoff + (uint64_t)i * ELF64_SHDR_SIZE;
		uint32_t type = rd32(sh + 4);
		uint64_t off = rd64(sh + 24), len = rd64(sh + 32);
		if (type == 0 || type == SHT_NOBITS)
			continue;
		if (!in_image(off, len, size))
			return dg__msgf(DG_ERR_CORRUPT, msg, msz,
					"section %u (offset %llu, %llu bytes) runs past the end of the %zu-byte image (truncated?)",
					i, (unsigned long long)off,
					(unsigned long long)len, size);
	}
	return DG_OK;
}

static dg_status check_segments(const uint8_t *b, size_t size, uint64_t phoff,
				unsigned phnum, char *msg, size_t msz)
{
	for (unsigned i = 0; i < phnum; i++) {
		const uint8_t *ph = b + phoff + (uint64_t)i * ELF64_PHDR_SIZE;
		uint64_t off = rd64(ph + 8), len = rd64(ph + 32);
		if (!in_image(off, len, size))
			return dg__msgf(DG_ERR_CORRUPT, msg, msz,
					"segment %u (offset %llu, %llu bytes) runs past the end of the %zu-byte image (truncated?)",
					i, (unsigned long long)off,
					(unsigned long long)len, size);
	}
	return DG_OK;
}

dg_status dg_cubin_check(const void *image, size_t size, int arch, char *msg,
			 size_t msg_size)
{
	const uint8_t *b = image;
	dg_status st;

	if (!image)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
				"cubin image is NULL");
	if (arch < 10 || arch > 999)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
				"arch %d: expected an SM number such as 90",
				arch);
	if (size < 4 || b[0] != 0x7f || b[1] != 'E' || b[2] != 'L' ||
	    b[3] != 'F')
		return dg__msgf(DG_ERR_CORRUPT, msg, msg_size,
				"not an ELF file (no \\x7fELF magic); a cubin is a CUDA ELF image");
	if (size < ELF64_EHDR_SIZE)
		return dg__msgf(DG_ERR_CORRUPT, msg, msg_size,
				"truncated: %zu bytes, less than the %d-byte ELF64 header",
				size, ELF64_EHDR_SIZE);
	if (b[4] != 2)
		return dg__msgf(DG_ERR_CORRUPT, msg, msg_size,
				"ELF class %u; a cubin is ELF64 (class 2)",
				b[4]);
	if (b[5] != 1)
		return dg__msgf(DG_ERR_CORRUPT, msg, msg_size,
				"ELF data encoding %u; a cubin is little-endian (1)",
				b[5]);
	if (b[6] != 1 || rd32(b + 20) != 1)
		return dg__msgf(DG_ERR_CORRUPT, msg, msg_size,
				"ELF version %u/%u; expected 1", b[6],
				rd32(b + 20));
	unsigned type = rd16(b + 16), machine = rd16(b + 18);
	if (machine != EM_CUDA)
		return dg__msgf(DG_ERR_CORRUPT, msg, msg_size,
				"ELF machine %u is not EM_CUDA (%d): not a cubin",
				machine, EM_CUDA);
	if (type != ET_EXEC && type != ET_REL)
		return dg__msgf(DG_ERR_CORRUPT, msg, msg_size,
				"ELF type %u; a cubin is ET_EXEC (2) or ET_REL (1)",
				type);
	if (rd16(b + 52) < ELF64_EHDR_SIZE)
		return dg__msgf(DG_ERR_CORRUPT, msg, msg_size,
				"ELF header size %u is below %d", rd16(b + 52),
				ELF64_EHDR_SIZE);

	uint64_t phoff = rd64(b + 32), shoff = rd64(b + 40);
	unsigned phent = rd16(b + 54), phnum = rd16(b + 56);
	unsigned shent = rd16(b + 58), shnum = rd16(b + 60);
	unsigned shstrndx = rd16(b + 62);
	if (shnum == 0 || shoff == 0)
		return dg__msgf(DG_ERR_CORRUPT, msg, msg_size,
				"no section headers; a cubin has its code in sections");
	if (shnum >= SHN_LORESERVE || shstrndx >= shnum)
		return dg__msgf(DG_ERR_CORRUPT, msg, msg_size,
				"section name table index %u is not below the section count %u",
				shstrndx, shnum);
	st = check_table("section header table", shoff, shnum, shent,
			 ELF64_SHDR_SIZE, size, msg, msg_size);
	if (st)
		return st;
	st = check_table("program header table", phoff, phnum, phent,
			 ELF64_PHDR_SIZE, size, msg, msg_size);
	if (st)
		return st;
	st = check_sections(b, size, shoff, shnum, msg, msg_size);
	if (st)
		return st;
	st = check_segments(b, size, phoff, phnum, msg, msg_size);
	if (st)
		return st;

	uint32_t flags = rd32(b + 48);
	unsigned abi = b[8];
	unsigned sm = abi >= CUDA_ABI_V2 ? (flags >> 8) & 0xff : flags & 0xff;
	if (sm != (unsigned)arch)
		return dg__msgf(DG_ERR_UNSUPPORTED, msg, msg_size,
				"cubin targets sm_%u (e_flags 0x%08x, ELF ABI %u), expected sm_%d",
				sm, flags, abi, arch);
	if (msg && msg_size)
		msg[0] = '\0';
	return DG_OK;
}
