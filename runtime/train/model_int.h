/*
 * What the model's files share (runtime/train/): the kind of recipe the
 * step's tape serves.
 */
#ifndef DG_RUNTIME_TRAIN_MODEL_INT_H
#define DG_RUNTIME_TRAIN_MODEL_INT_H

#include <stddef.h>

#include "dragon/model.h"
#include "dragon/safetensors.h"

/* Projection p's recipe in c (dragon/model.h dg_proj), and the
 * projection's name: "encoder", "encoder_v", "decoder". */
const dg_proj_recipe *dg__proj_recipe(const dg_model_config *c, dg_proj p);
const char *dg__proj_name(dg_proj p);

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

/* The metadata a dragon file of weights says itself with: its seal (the
 * file's SHA-256, dragon/safetensors.h) and its kind. Files saved before
 * they were written have neither. */
#define DG__SEAL_KEY "file_sha256"
#define DG__KIND_KEY "kind"
#define DG__KIND_WEIGHTS "weights"       /* dg_model_weights_save */
#define DG__KIND_CHECKPOINT "checkpoint" /* dg_checkpoint_save */
#define DG__KIND_GRADIENTS "gradients"   /* dg_model_grads_save */

/* What every reader of a file of weights checks first (model_file.c):
 * its seal when it has one (else the data_sha256 of a file saved before
 * seals, when it has one), DG_ERR_CORRUPT "<path>: damaged: ..." when the
 * bytes do not hash to it or a file that names its kind has none; its
 * kind, DG_ERR_PARSE for a gradients file or one unknown; and every F32
 * value of its weights (the reference's names) and AdamW moments
 * ("adamw.m.<name>", "adamw.v.<name>"): finite, a second moment >= 0,
 * else DG_ERR_NUMERIC naming the tensor and the first bad index. */
dg_status dg__model_file_check(const dg_safetensors *f, const char *path, char *msg, size_t size);
/* The door of every reader of weights: the file at path (or n bytes,
 * called name) read as safetensors, then dg__model_file_check'ed, into
 * *out (free it with dg_safetensors_destroy; NULL on failure). A file that
 * is not safetensors is DG_ERR_PARSE "<name>: damaged (or not
 * safetensors): <what>"; a missing or unreadable one DG_ERR_NOT_FOUND or
 * DG_ERR_IO. */
dg_status dg__model_file_load(const char *path, dg_safetensors **out, char *msg, size_t size);
dg_status dg__model_file_parse(const void *bytes, size_t n, const char *name, dg_safetensors **out,
			       char *msg, size_t size);

/* dg_model_config_read of a parsed file (path names it in messages); the
 * caller has checked it (dg__model_file_check). */
dg_status dg__model_config_of(const dg_safetensors *f, const char *path, dg_model_config *out,
			      char *msg, size_t size);

#endif
