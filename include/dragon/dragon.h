/*
 * dragon — low-bit BDH kernels, generated per specialization and compiled
 * at run time. The umbrella header: include this one; it includes every
 * header of the public API (each function in them is marked DG_API,
 * export.h).
 */
#ifndef DRAGON_H
#define DRAGON_H

#include "export.h"
#include "status.h"
#include "fmt.h"
#include "rng.h"
#include "spec.h"
#include "codegen.h"
#include "cache.h"
#include "jit.h"
#include "manifest.h"
#include "cubin.h"
#include "ref.h"
#include "runtime.h"
#include "tensor.h"
#include "ops.h"
#include "tune.h"
#include "autotune.h"
#include "optim.h"
#include "model.h"
#include "data.h"
#include "sample.h"
#include "checkpoint.h"
#include "train.h"
#include "dist.h"
#include "comm.h"
#include "ffi.h"

#endif /* DRAGON_H */
