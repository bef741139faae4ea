/*
 * What the model's files share (runtime/train/): the kind of recipe the
 * step's tape serves.
 */
#ifndef DG_RUNTIME_TRAIN_MODEL_INT_H
#define DG_RUNTIME_TRAIN_MODEL_INT_H

#include <stddef.h>

#include "dragon/model.h"

/* NULL when c's recipe is the low-bit kind the tape serves — every
 * projection's weights and activations integer, the activations a scale
 * a token (absmax): one scale a layer cannot serve the weight gradient's
 * one GEMM over all layers — else why not, naming the field, in buf. */
const char *dg__model_lowbit_why(const dg_model_config *c, char *buf, size_t size);

#endif
