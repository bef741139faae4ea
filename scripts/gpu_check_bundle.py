#!/usr/bin/env python3
"""Loads every kernel of a dragon-gen bundle on the GPU and reports it.

    scripts/gpu_check_bundle.py DIR [--json OUT] [--gpu N]

Reads DIR/manifest.json (format 2). For each kernel: cuModuleLoadData on
the cubin (or PTX), then cuModuleGetFunction for every entry, and the
function's registers, static shared memory, local memory and max threads
a block; an entry whose launch (the manifest's threads a block, dynamic
shared memory) the loaded function or the device cannot take fails too.
Needs only the CUDA driver (libcuda.so.1), through ctypes.

Exit status: 0 only when every kernel was loaded and every entry found
and launchable; 1 when a kernel failed; 2 when the bundle could not be
checked (no driver, no GPU, an unreadable manifest, a kernel built for
another SM than the GPU's), with the reason on stderr.
"""
import ctypes
import json
import os
import sys

FORMAT = 2
# CUdevice_attribute / CUfunction_attribute values (cuda.h)
ATTR_CC_MAJOR, ATTR_CC_MINOR = 75, 76
ATTR_SMEM_OPTIN = 97  # MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
FUNC_ATTRS = {"max_threads": 0, "shared_bytes": 1, "local_bytes": 3, "regs": 4}


class CannotCheck(Exception):
    """The bundle could not be checked at all (exit 2)."""


def usage(code):
    print(__doc__.strip(), file=sys.stdout if code == 0 else sys.stderr)
    return code


def parse_args(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        return None
    bundle, out, gpu = None, None, 0
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in ("--json", "--gpu"):
            if i + 1 >= len(argv):
                raise CannotCheck(f"{a} needs a value")
            if a == "--json":
                out = argv[i + 1]
            else:
                try:
                    gpu = int(argv[i + 1])
                except ValueError:
                    raise CannotCheck(f"--gpu {argv[i + 1]}: expected a device number")
            i += 2
            continue
        if a.startswith("-") or bundle is not None:
            raise CannotCheck(f"unexpected argument '{a}'; see --help")
        bundle = a
        i += 1
    if bundle is None:
        raise CannotCheck("give the bundle folder")
    return bundle, out, gpu


def read_manifest(bundle):
    path = os.path.join(bundle, "manifest.json")
    try:
        with open(path) as f:
            m = json.load(f)
    except (OSError, ValueError) as err:
        raise CannotCheck(f"{path}: {err}")
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        got = m.get("format") if isinstance(m, dict) else None
        raise CannotCheck(f"{path}: manifest format {got}, this script reads {FORMAT}")
    kernels = m.get("kernels")
    if not isinstance(kernels, list):
        raise CannotCheck(f"{path}: kernels: expected an array")
    for i, k in enumerate(kernels):
        ok = (isinstance(k, dict) and isinstance(k.get("file"), str) and
              isinstance(k.get("arch"), int) and isinstance(k.get("entries"), list) and
              all(isinstance(e, dict) and isinstance(e.get("name"), str) and
                  isinstance(e.get("threads"), int) and isinstance(e.get("smem"), int)
                  for e in k["entries"]))
        if not ok or "/" in k["file"]:
            raise CannotCheck(f"{path}: kernels[{i}]: expected file, arch and entries "
                              "[{name, threads, smem}]")
    return m


class Driver:
    def __init__(self, gpu):
        try:
            self.cu = ctypes.CDLL("libcuda.so.1")
        except OSError as err:
            raise CannotCheck(f"no CUDA driver: {err}")
        self.call(self.cu.cuInit(0), "cuInit", fatal=True)
        n = ctypes.c_int()
        self.call(self.cu.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount", fatal=True)
        if n.value == 0:
            raise CannotCheck("no CUDA device")
        if gpu >= n.value:
            raise CannotCheck(f"--gpu {gpu}: there are {n.value} devices")
        self.dev = ctypes.c_int()
        self.call(self.cu.cuDeviceGet(ctypes.byref(self.dev), gpu), "cuDeviceGet", fatal=True)
        name = ctypes.create_string_buffer(256)
        self.cu.cuDeviceGetName(name, 256, self.dev)
        self.name = name.value.decode()
        self.sm = self.attr(ATTR_CC_MAJOR) * 10 + self.attr(ATTR_CC_MINOR)
        self.smem_optin = self.attr(ATTR_SMEM_OPTIN)
        self.ctx = ctypes.c_void_p()
        self.call(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), self.dev),
                  "cuDevicePrimaryCtxRetain", fatal=True)
        self.call(self.cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent", fatal=True)

    def call(self, rc, what, fatal=False):
        if rc == 0:
            return
        name = ctypes.c_char_p()
        self.cu.cuGetErrorName(rc, ctypes.byref(name))
        msg = f"{what}: {name.value.decode() if name.value else rc}"
        raise CannotCheck(msg) if fatal else RuntimeError(msg)

    def attr(self, a):
        v = ctypes.c_int()
        self.call(self.cu.cuDeviceGetAttribute(ctypes.byref(v), a, self.dev),
                  "cuDeviceGetAttribute", fatal=True)
        return v.value

    def check_kernel(self, bundle, k):
        """The entries' figures; raises RuntimeError naming what failed."""
        with open(os.path.join(bundle, k["file"]), "rb") as f:
            image = f.read()
        if k.get("ptx"):
            image += b"\0"
        mod = ctypes.c_void_p()
        self.call(self.cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(image)),
                  f"cuModuleLoadData {k['file']}")
        try:
            entries = {}
            for e in k["entries"]:
                fn = ctypes.c_void_p()
                self.call(self.cu.cuModuleGetFunction(ctypes.byref(fn), mod,
                                                      e["name"].encode()),
                          f"cuModuleGetFunction {e['name']}")
                vals = {}
                for key, a in FUNC_ATTRS.items():
                    v = ctypes.c_int()
                    self.call(self.cu.cuFuncGetAttribute(ctypes.byref(v), a, fn),
                              "cuFuncGetAttribute")
                    vals[key] = v.value
                if e["threads"] > vals["max_threads"]:
                    raise RuntimeError(f"{e['name']}: launched with {e['threads']} threads a "
                                       f"block, the function allows {vals['max_threads']}")
                if vals["shared_bytes"] + e["smem"] > self.smem_optin:
                    raise RuntimeError(f"{e['name']}: {vals['shared_bytes']} static + "
                                       f"{e['smem']} dynamic bytes of shared memory, the "
                                       f"device allows {self.smem_optin}")
                vals["threads"], vals["smem"] = e["threads"], e["smem"]
                entries[e["name"]] = vals
            return entries
        finally:
            self.cu.cuModuleUnload(mod)


def main():
    try:
        args = parse_args(sys.argv)
        if args is None:
            return usage(0 if len(sys.argv) >= 2 else 2)
        bundle, out, gpu = args
        manifest = read_manifest(bundle)
        drv = Driver(gpu)
    except CannotCheck as err:
        print(f"gpu_check_bundle: cannot check: {err}", file=sys.stderr)
        return 2

    rows, failures, other_sm = [], 0, 0
    for k in manifest["kernels"]:
        row = {"spec": k.get("spec", ""), "file": k["file"], "arch": k["arch"]}
        if k["arch"] != drv.sm:
            row["ok"] = None
            row["error"] = f"built for sm_{k['arch']}, the GPU is sm_{drv.sm}: not checked"
            other_sm += 1
        else:
            try:
                row["entries"] = drv.check_kernel(bundle, k)
                row["ok"] = True
            except (RuntimeError, OSError) as err:
                row["ok"] = False
                row["error"] = str(err)
                failures += 1
        rows.append(row)

    loaded = sum(1 for r in rows if r["ok"])
    report = {"device": drv.name, "sm": drv.sm, "bundle_device": manifest.get("device", ""),
              "bundle_sm": manifest.get("sm", 0), "kernels": len(rows), "loaded": loaded,
              "failed": failures, "not_checked": other_sm, "results": rows}
    for r in rows:
        if r["ok"] is False:
            print(f"FAIL {r['file']}: {r['error']}", file=sys.stderr)
    vals = [v for r in rows if r["ok"] for v in r["entries"].values()]
    regs = [v["regs"] for v in vals]
    local = [v["local_bytes"] for v in vals]
    print(f"{drv.name} (sm_{drv.sm}): {loaded} of {len(rows)} kernels loaded; "
          f"registers {min(regs) if regs else 0}..{max(regs) if regs else 0}, "
          f"local memory max {max(local) if local else 0} bytes")
    print(f"gpu_check_bundle: {loaded} passed, {failures} failed, {other_sm} not checked")
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)
    if failures:
        return 1
    if other_sm:
        what = "1 kernel is" if other_sm == 1 else f"{other_sm} kernels are"
        print(f"gpu_check_bundle: cannot check: {what} for another SM than the GPU's "
              f"sm_{drv.sm}", file=sys.stderr)
        return 2
    if not rows:
        print("gpu_check_bundle: cannot check: the manifest lists no kernels", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
