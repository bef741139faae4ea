/*
 * How every reader of a file of weights opens it (dg_model_config_read,
 * dg_model_weights_load, dg_checkpoint_load and _parse,
 * dg_model_file_check), and what it checks before it uses a value of it:
 * that the file is safetensors and as it was written (its seal), that it
 * is weights and not gradients (its kind), and that its weights and AdamW
 * moments are numbers a run can go on from. One door, so no reader checks
 * less than another. The parameters' names in a file are kept here too.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/msg.h"
#include "dragon/model.h"
#include "runtime/store/safetensors.h"
#include "runtime/train/model_int.h"

/* The parameters' names in a file: the reference's (pathwaycom/bdh), so
 * PyTorch loads dragon's files and dragon PyTorch's. */
static const char *const param_names[DG_MODEL_N_PARAMS] = {
	"embed.weight", "encoder", "encoder_v", "decoder", "lm_head",
};

const char *dg_model_param_name(dg_model_param p)
{
	return (unsigned)p < DG_MODEL_N_PARAMS ? param_names[p] : "?";
}

/* What a tensor of the file is to the check: 0 none of the model's, else
 * 1 a weight, 2 AdamW's first moment, 3 its second. */
static int role_of(const char *name)
{
	int role = 1;
	if (strncmp(name, "adamw.m.", 8) == 0)
		role = 2, name += 8;
	else if (strncmp(name, "adamw.v.", 8) == 0)
		role = 3, name += 8;
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++)
		if (strcmp(name, dg_model_param_name((dg_model_param)p)) == 0)
			return role;
	return 0;
}

/* Every value of t (F32, role) finite, a second moment >= 0: else
 * DG_ERR_NUMERIC naming the tensor and the first bad index. */
static dg_status values_check(const dg_st_tensor *t, int role, const char *path, char *msg, size_t size)
{
	const unsigned char *b = t->data; /* unaligned in general: each value copied */
	uint64_t n = t->bytes / sizeof(float);
	for (uint64_t i = 0; i < n; i++) {
		float x;
		memcpy(&x, b + i * sizeof(float), sizeof(float));
		if (isfinite(x) && !(role == 3 && x < 0.0f))
			continue;
		const char *what = role == 1   ? "a weight that is not a finite number"
				   : role == 2 ? "AdamW's first moment is not a finite number"
				   : !isfinite(x) ? "AdamW's second moment is not a finite number"
						  : "AdamW's second moment is never negative";
		return dg__msgf(DG_ERR_NUMERIC, msg, size,
				"%s: %s[%llu] is %g: %s (a run that diverged, or a damaged file); use the checkpoint "
				"before it",
				path, t->name, (unsigned long long)i, (double)x, what);
	}
	return DG_OK;
}

dg_status dg__model_file_check(const dg_safetensors *f, const char *path, char *msg, size_t size)
{
	char why[512];
	const char *kind = dg_safetensors_meta(f, DG__KIND_KEY);
	dg_status st = dg_safetensors_seal_check(f, DG__SEAL_KEY, why, sizeof(why));
	if (st == DG_ERR_NOT_FOUND) {
		if (kind) /* every file that names its kind is sealed */
			return dg__msgf(DG_ERR_CORRUPT, msg, size,
					"%s: damaged: it says it is dragon's %s but has no %s (a flipped bit, a cut or "
					"an edit); use an intact copy, or the checkpoint before it",
					path, kind, DG__SEAL_KEY);
		/* a file saved before seals (a dragon-checkpoint-1), or another
		 * program's: its tensors' hash when it has one */
		const char *want = dg_safetensors_meta(f, "data_sha256");
		char got[65];
		if (want) {
			dg_safetensors_data_sha256(f, got);
			if (strcmp(got, want) != 0)
				return dg__msgf(DG_ERR_CORRUPT, msg, size,
						"%s: damaged: its tensors hash to %.16s..., its data_sha256 says %.16s... "
						"(a flipped bit, a cut or an edit); use an intact copy, or the checkpoint "
						"before it",
						path, got, want);
		}
	} else if (st) {
		return dg__msgf(DG_ERR_CORRUPT, msg, size,
				"%s: damaged: %s (a flipped bit, a cut or an edit); use an intact copy, or the "
				"checkpoint before it",
				path, why);
	}
	if (kind && strcmp(kind, DG__KIND_WEIGHTS) != 0 && strcmp(kind, DG__KIND_CHECKPOINT) != 0) {
		if (strcmp(kind, DG__KIND_GRADIENTS) == 0)
			return dg__msgf(DG_ERR_PARSE, msg, size,
					"%s: a gradients file (what dragon eval --grads writes), not weights; give a "
					"weights file or a checkpoint",
					path);
		return dg__msgf(DG_ERR_PARSE, msg, size, "%s: metadata %s='%.64s': not weights (%s or %s)", path,
				DG__KIND_KEY, kind, DG__KIND_WEIGHTS, DG__KIND_CHECKPOINT);
	}
	for (size_t i = 0; i < dg_safetensors_count(f); i++) {
		const dg_st_tensor *t = dg_safetensors_at(f, i);
		int role = role_of(t->name);
		if (role && t->dtype == DG_ST_F32 && (st = values_check(t, role, path, msg, size)))
			return st;
	}
	return DG_OK;
}

/* The status st of reading name as safetensors, its message in msg
 * ("<name>: <what>"): to a reader of weights, a file that is not
 * safetensors is a damaged one (a cut, a flipped bit of its header) or
 * not weights at all, and the message says so. */
static dg_status damaged_or_not(dg_status st, const char *name, char *msg, size_t size)
{
	if (st != DG_ERR_PARSE || !msg || !size)
		return st;
	char what[1024];
	size_t k = strlen(name);
	bool named = strncmp(msg, name, k) == 0 && msg[k] == ':' && msg[k + 1] == ' ';
	snprintf(what, sizeof(what), "%s", named ? msg + k + 2 : msg);
	return dg__msgf(st, msg, size, "%s: damaged (or not safetensors): %s", name, what);
}

/* f (read from name) checked, or destroyed and *out NULL. */
static dg_status checked(dg_status st, dg_safetensors **out, const char *name, char *msg, size_t size)
{
	if (st)
		return damaged_or_not(st, name, msg, size);
	if ((st = dg__model_file_check(*out, name, msg, size))) {
		dg_safetensors_destroy(*out);
		*out = NULL;
	}
	return st;
}

dg_status dg__model_file_load(const char *path, dg_safetensors **out, char *msg, size_t size)
{
	return checked(dg_safetensors_load(path, out, msg, size), out, path, msg, size);
}

dg_status dg__model_file_parse(const void *bytes, size_t n, const char *name, dg_safetensors **out,
			       char *msg, size_t size)
{
	return checked(dg_safetensors_parse(bytes, n, name, out, msg, size), out, name, msg, size);
}

dg_status dg_model_file_check(const void *bytes, size_t size, const char *name, char *msg,
			      size_t msg_size)
{
	if (!bytes && size)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_model_file_check: bytes is NULL");
	if (!name)
		name = "weights";
	dg_safetensors *f = NULL;
	dg_status st = dg__model_file_parse(bytes, size, name, &f, msg, msg_size);
	dg_safetensors_destroy(f);
	return st;
}
