/* Execution contexts of a dt_model: activations, workspaces and gradients of one execution over shared parameters. */
#ifndef DTRAIN_MODEL_CTX_H
#define DTRAIN_MODEL_CTX_H

#include <stdint.h>

#include "dtrain/model.h"
#include "dtrain/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A context holds one execution of the model: activations, per-layer
 * workspaces, backward ping-pong buffers and a gradient arena (the layout of
 * the parameter arena). The model owns one (dt_model_default_ctx, which the
 * dt_model_forward/backward calls use); a data-parallel strategy makes one per
 * worker over the same parameters. Contexts never outlive their model. */
typedef struct dt_model_ctx dt_model_ctx;

/* A context for batches up to max_batch over the built model m; the caller
 * owns *out. update_buffers: whether training forwards update the model's BN
 * running statistics (one replica should). Convolution workspaces hold a block
 * per thread of the budget (dt_set_threads) when the context is made; a larger
 * budget set afterwards leaves convolutions at the smallest count any context
 * was sized for (slower, not wrong). */
dt_status dt_model_ctx_new(dt_model *m, int max_batch, int update_buffers, dt_model_ctx **out);
void dt_model_ctx_free(dt_model_ctx *c); /* accepts NULL */
/* The model's own context (owned by the model); NULL before dt_model_build. */
dt_model_ctx *dt_model_default_ctx(dt_model *m);

/* As dt_model_forward/backward, in context c. *out (batch, outputs) lives in c
 * until its next forward. */
dt_status dt_model_ctx_forward(dt_model *m, dt_model_ctx *c, const void *x, int batch, const float **out);
dt_status dt_model_ctx_backward(dt_model *m, dt_model_ctx *c, const float *dout);
/* c's gradient arena (n_params floats, owned by c); backward accumulates into it. Gradients a deferred zero_grad
 * left unwritten are cleared before it returns (so it writes then: not to be called from several threads on a
 * context whose deferred zero_grad no backward has followed). */
float *dt_model_ctx_grads(dt_model_ctx *c);
void dt_model_ctx_zero_grad(const dt_model *m, dt_model_ctx *c);
/* zero_grad without its pass over the arena (PyTorch's zero_grad(set_to_none=True)): row tables are cleared now,
 * every other gradient counts as zero but keeps its stale floats until the next backward writes it (Linear and
 * attention assign theirs, sparing their GEMMs a read of the block; other layers' blocks are cleared just before
 * their backward). The arena reads as after dt_model_ctx_zero_grad once a backward has run, or through
 * dt_model_ctx_grads / dt_model_grads, which clear what is still deferred; a pointer kept from before holds
 * stale floats until then. */
void dt_model_ctx_zero_grad_deferred(const dt_model *m, dt_model_ctx *c);
/* For a caller about to write every gradient of c but its row tables' (a reduce summing replicas into c's arena):
 * 1 when a deferred zero_grad left every dense block unwritten, which now count as written: the caller must store
 * each of them, not add to it. 0 otherwise, what was deferred cleared: the caller adds. Row tables were cleared by
 * the zero_grad itself, so adding to their rows is right in both cases. */
int dt_model_ctx_grads_take_deferred(dt_model_ctx *c);

/* Each sample's weight in the loss the next backwards differentiate (a mean
 * over a batch of B: 1/B; accumulation and data-parallel slices scale it);
 * 0 (the default): 1/batch of the forward. Terms a layer adds to the loss
 * per sample (an embedding's L2) use it. */
void dt_model_ctx_set_loss_weight(dt_model_ctx *c, float w);

/* ---- row tables (embeddings): gradients that are non-zero on touched rows only ---- */
typedef struct dt_rows {
  int tensor;          /* dt_model_tensor_info index */
  size_t off;          /* element offset in the arenas */
  int64_t rows, width;
  int64_t n;           /* rows touched since zero_grad ... */
  const int32_t *list; /* ... these (unordered, distinct) */
  int64_t refs;        /* lookups since zero_grad (>= n; equal on every replica of a step) */
} dt_rows;
int dt_model_num_row_tables(const dt_model *m);
/* Table k (arena order) and its touched rows in c; valid until c's next backward or zero_grad. */
void dt_model_ctx_rows(const dt_model *m, const dt_model_ctx *c, int k, dt_rows *out);
/* Marks rows (of table k) as touched in c: rows whose gradient another replica made non-zero. */
void dt_model_ctx_rows_touch(const dt_model *m, dt_model_ctx *c, int k, const int32_t *rows, int64_t n);

/* Mixed precision (torch.autocast): Linear, Conv2d and attention's products take inputs and weights rounded to
 * bf16 or fp16, accumulate in f32 and round their outputs; everything else, the master weights and the optimizer
 * stay f32. On a CPU without native bf16/fp16 arithmetic the rounding is emulated (slower than f32). */
typedef enum dt_amp { DT_AMP_OFF, DT_AMP_BF16, DT_AMP_FP16 } dt_amp;
/* Parses "off", "bf16", "fp16"; DT_INVALID_ARGUMENT naming the value otherwise. */
dt_status dt_amp_parse(const char *s, dt_amp *out);
/* The mode of c's next forwards and backwards; allocates c's rounded copy of the parameters and the layers'
 * rounded operands (DT_OUT_OF_MEMORY). */
dt_status dt_model_ctx_set_amp(dt_model *m, dt_model_ctx *c, dt_amp mode);
/* The path mode takes on this CPU ("bf16 emulated (...)"), for the run banner; 1 when the CPU has native support
 * (dt_amp_cpu_native) and when dtrain's GEMMs use it (dt_amp_native_gemm: bf16 on a CPU with AVX512_BF16, unless
 * DT_AMP_KERNELS=emulated). */
const char *dt_amp_path_name(dt_amp mode);
int dt_amp_cpu_native(dt_amp mode);
int dt_amp_native_gemm(dt_amp mode);
/* DT_AMP_KERNELS checked (auto: native where it can, dtrain's kernel or oneDNN's on AMX CPUs; own: dtrain's; onednn:
 * oneDNN's; emulated: the emulation everywhere): DT_INVALID_ARGUMENT for another value or a kernel this CPU or
 * build lacks. dt_model_ctx_set_amp checks it too. */
dt_status dt_amp_kernels_check(void);

/* Dropout masks of c derive from (seed, stream, layer, step). */
void dt_model_ctx_set_rng_stream(dt_model_ctx *c, uint64_t stream);
/* Training forwards run so far (the dropout step); set it to resume a run. */
uint64_t dt_model_ctx_rng_step(const dt_model_ctx *c);
void dt_model_ctx_set_rng_step(dt_model_ctx *c, uint64_t step);

/* As dt_model_on_grad_ready, for backwards run in c. */
void dt_model_ctx_on_grad_ready(dt_model_ctx *c, dt_grad_ready_fn fn, void *user);
/* Compute the gradient w.r.t. the model input in backward (off by default). */
void dt_model_ctx_want_input_grad(dt_model_ctx *c, int on);
/* The input gradient (batch, sample) of the last backward, owned by c; NULL unless wanted. */
const float *dt_model_ctx_input_grad(const dt_model_ctx *c);

#ifdef __cplusplus
}
#endif
#endif
