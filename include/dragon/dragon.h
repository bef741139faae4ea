/*
 * dragon — low-bit BDH kernels, generated per specialization and compiled
 * at run time. The umbrella header: include this one.
 */
#ifndef DRAGON_H
#define DRAGON_H

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

#endif /* DRAGON_H */
