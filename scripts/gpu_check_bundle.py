#!/usr/bin/env python3
"""Loads every kernel of a dragon-gen bundle on the GPU and reports it.

    scripts/gpu_check_bundle.py DIR [--json OUT]

For each manifest entry: cuModuleLoadData on the cubin (or PTX), then
cuModuleGetFunction for every entry point, and the function's registers,
static shared memory, local memory and max threads per block. Exits 1 if
any kernel fails to load. Needs only the CUDA driver (libcuda.so.1), via
ctypes; prints "skipped: no CUDA device" and exits 0 without one.
"""
import ctypes
import json
import sys


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) >= 2 else 2
    bundle = sys.argv[1]
    out = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        print("skipped: no CUDA device")
        return 0

    def check(rc, what):
        if rc != 0:
            name = ctypes.c_char_p()
            cu.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what}: {name.value.decode() if name.value else rc}")

    check(cu.cuInit(0), "cuInit")
    n = ctypes.c_int()
    check(cu.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
    if n.value == 0:
        print("skipped: no CUDA device")
        return 0
    dev = ctypes.c_int()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    name = ctypes.create_string_buffer(256)
    cu.cuDeviceGetName(name, 256, dev)
    major, minor = ctypes.c_int(), ctypes.c_int()
    cu.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # COMPUTE_CAPABILITY_MAJOR
    cu.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)  # COMPUTE_CAPABILITY_MINOR
    ctx = ctypes.c_void_p()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    with open(f"{bundle}/manifest.json") as f:
        manifest = json.load(f)
    attrs = {"regs": 4, "shared_bytes": 1, "local_bytes": 3, "max_threads": 0}
    rows, failures = [], 0
    for k in manifest["kernels"]:
        row = {"spec": k["spec"], "file": k["file"]}
        try:
            with open(f"{bundle}/{k['file']}", "rb") as f:
                image = f.read()
            if k.get("ptx"):
                image += b"\0"
            mod = ctypes.c_void_p()
            check(cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(image)),
                  f"cuModuleLoadData {k['file']}")
            row["entries"] = {}
            for e in k["entries"]:
                fn = ctypes.c_void_p()
                check(cu.cuModuleGetFunction(ctypes.byref(fn), mod, e.encode()),
                      f"cuModuleGetFunction {e}")
                vals = {}
                for key, attr in attrs.items():
                    v = ctypes.c_int()
                    check(cu.cuFuncGetAttribute(ctypes.byref(v), attr, fn), "cuFuncGetAttribute")
                    vals[key] = v.value
                row["entries"][e] = vals
            check(cu.cuModuleUnload(mod), "cuModuleUnload")
            row["ok"] = True
        except (RuntimeError, OSError) as err:
            row["ok"] = False
            row["error"] = str(err)
            failures += 1
        rows.append(row)

    report = {"device": name.value.decode(), "sm": f"{major.value}{minor.value}",
              "kernels": len(rows), "loaded": len(rows) - failures, "failed": failures,
              "results": rows}
    for r in rows:
        if not r["ok"]:
            print(f"FAIL {r['file']}: {r['error']}", file=sys.stderr)
    regs = [v["regs"] for r in rows if r["ok"] for v in r["entries"].values()]
    local = [v["local_bytes"] for r in rows if r["ok"] for v in r["entries"].values()]
    print(f"{report['device']} (sm_{report['sm']}): {report['loaded']} of {len(rows)} kernels loaded; "
          f"registers {min(regs) if regs else 0}..{max(regs) if regs else 0}, "
          f"local memory max {max(local) if local else 0} bytes")
    print(f"gpu_check_bundle: {report['loaded']} passed, {failures} failed")
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
