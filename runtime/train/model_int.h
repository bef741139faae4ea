/*
 * What the model's files share (runtime/train/): the kind of recipe the
 * step's tape serves.
 */
#ifndef DG_RUNTIME_TRAIN_MODEL_INT_H
#define DG_RUNTIME_TRAIN_MODEL_INT_H

#include <stddef.h>

#include "dragon/model.h"
#include "dragon/safetensors.h"

/* NULL when c's recipe is the low-bit kind the tape serves — every
 * projection's weights and activations integer, the activations a scale
 * a token (absmax): one scale a layer cannot serve the weight gradient's
 * one GEMM over all layers — else why not, naming the field, in buf. */
const char *dg__model_lowbit_why(const dg_model_config *c, char *buf, size_t size);

/* Weights of c, every value zero (storage to fill: a checkpoint's, a
 * gradient's), without dg_model_weights_create's random init. */
dg_status dg__model_weights_alloc(const dg_model_config *c, dg_model_weights **out, char *msg,
				  size_t size);

/* Adds w's tensors (the reference's names, F32) and its config's metadata
 * (layers, embd, heads, neurons, vocab, preset: what dg_model_config_read
 * reads) to sw: dg_model_weights_save's file, and a checkpoint's part. */
dg_status dg__model_weights_add(dg_safetensors_writer *sw, const dg_model_weights *w, char *msg,
				size_t size);

#endif
