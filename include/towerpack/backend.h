/* towerpack: compute backends, as a user sees them: make one, ask what it
 * is, stage batches through it, destroy it.
 *
 * A backend owns device memory, streams, the kernels of every graph op, the
 * optimizer updates and a collective all-reduce. The table a backend
 * implements (tp_backend_ops_t, tp_op_call_t) is private to gpu/, in
 * gpu/backend_impl.h: the CPU backend (OpenBLAS + plain C) is the reference,
 * the CUDA module fills the same table. */
#ifndef TOWERPACK_BACKEND_H
#define TOWERPACK_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/rng.h>
#include <towerpack/status.h>
#include <towerpack/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every op a graph can hold. Leaves (INPUT, VARIABLE) have no kernel. */
typedef enum {
    TP_OP_INPUT = 0,
    TP_OP_VARIABLE,
    TP_OP_MATMUL,          /* x[N,K] (any trailing dims flattened) @ W[K,M] */
    TP_OP_CONV2D,          /* x[N,C,H,W] * W[O,C,KH,KW] (+ b[O]) -> [N,O,OH,OW] */
    TP_OP_BIAS_ADD,        /* x[N,C,...] + b[C] */
    TP_OP_RELU,
    TP_OP_LEAKY_RELU,      /* attr.alpha: slope for x < 0 */
    TP_OP_TANH,
    TP_OP_SIGMOID,
    TP_OP_MAX_POOL,        /* x[N,C,H,W], window/stride/pad in attr */
    TP_OP_AVG_POOL,        /* average over the window's in-image elements */
    TP_OP_GLOBAL_AVG_POOL, /* [N,C,H,W] -> [N,C] */
    TP_OP_BATCH_NORM,      /* x, gamma[C], beta[C]; state: mean[C], var[C] */
    TP_OP_DROPOUT,         /* attr.alpha: drop rate */
    TP_OP_RESHAPE,         /* also flatten; the value aliases the input */
    TP_OP_ADD,             /* a + b, NumPy broadcasting (docs/ops.md) */
    TP_OP_CONCAT,          /* along attr.axis (tp_concat: dim 1) */
    TP_OP_SOFTMAX_XENT,    /* logits[N,K], labels int32[N] -> mean loss []
                              (attr alpha: label smoothing) */
    TP_OP_ACCURACY,        /* logits[N,K], labels int32[N] -> fraction [] */
    TP_OP_ERROR_COUNT,     /* logits[N,K], labels int32[N] -> wrong count [] */
    TP_OP_L2_DECAY,        /* vars... -> alpha * sum(w^2) / 2 */
    TP_OP_CAST,            /* uint8 or float32 -> float32 * attr.alpha */
    TP_OP_SCALE,           /* x * attr.alpha */
    /* the elementwise family (docs/ops.md): binary ops broadcast as NumPy
     * does, unary ops keep the shape */
    TP_OP_SUB,             /* a - b */
    TP_OP_MUL,             /* a * b */
    TP_OP_DIV,             /* a / b */
    TP_OP_MAXIMUM,         /* max(a, b); ties split the gradient in halves */
    TP_OP_MINIMUM,         /* min(a, b); likewise */
    TP_OP_NEG,             /* -x */
    TP_OP_ABS,             /* |x| */
    TP_OP_SQUARE,          /* x^2 */
    TP_OP_SQRT,            /* sqrt(x) */
    TP_OP_RSQRT,           /* 1 / sqrt(x) */
    TP_OP_EXP,             /* e^x */
    TP_OP_LOG,             /* ln(x) */
    TP_OP_POW,             /* x^attr.alpha */
    TP_OP_CLIP,            /* min(max(x, attr.alpha), attr.beta) */
    TP_OP_GELU,            /* x * Phi(x) (erf) */
    TP_OP_GELU_TANH,       /* GELU's tanh approximation */
    TP_OP_SILU,            /* x * sigmoid(x) */
    TP_OP_SOFTPLUS,        /* ln(1 + e^x); x above 20: x (PyTorch's) */
    TP_OP_CONSTANT,        /* no inputs: fixed values (attr.data) */
    TP_OP_STOP_GRADIENT,   /* x forward; no gradient flows back */
    /* the loss family (docs/ops.md): two inputs of one shape -> the mean
     * over every element, a scalar [] (PyTorch's reduction='mean') */
    TP_OP_MSE,             /* mean (pred - target)^2 */
    TP_OP_L1_LOSS,         /* mean |pred - target| */
    TP_OP_HUBER_LOSS,      /* mean Huber of pred - target (attr.alpha: delta) */
    TP_OP_SIGMOID_XENT,    /* mean of max(x,0) - x z + ln(1 + e^-|x|),
                              logits x, float labels z */
    /* the shape family (docs/ops.md): float32 or int32 values moved, a
     * batched input's batch kept at dim 0 */
    TP_OP_TRANSPOSE,       /* y.d[i] = x.d[perm[i]] (attr.dims_a: perm) */
    TP_OP_SLICE,           /* x[start::step] per axis (attr.dims_a: start,
                              dims_b: step; y's shape the counts) */
    TP_OP_PAD,             /* constant attr.alpha around x (attr.dims_a:
                              before, dims_b: after, per axis) */
    TP_OP_BROADCAST_TO,    /* x stretched to y's shape (NumPy's rule) */
    TP_OP_GATHER,          /* table[V,...], int32 indices[...] ->
                              [..., table dims 1..] (embedding lookup) */
    TP_OP_ONE_HOT,         /* int32 [...] -> float32 [..., depth]; no gradient */
    /* the convolution family (docs/ops.md); CONV2D above takes the
     * family's dilation and groups too */
    TP_OP_CONV_TRANSPOSE,  /* x[N,C,H,W] W[C,O/g,KH,KW] (+ b[O]) -> [N,O,OH,OW],
                              OH = (H-1) s - 2 p + d (KH-1) + op + 1 */
    TP_OP_UPSAMPLE_NEAREST,  /* [N,C,H,W] -> [N,C,H f,W f] (f: attr sh, sw) */
    TP_OP_UPSAMPLE_BILINEAR, /* likewise, bilinear (attr align_corners) */
    /* the linalg family (docs/ops.md): batched matmul and the norms */
    TP_OP_BATCH_MATMUL,    /* a[...,M,K] @ b[...,K,N], batch dims broadcast
                              (attr.trans_a, trans_b: stored transposed) */
    TP_OP_LAYER_NORM,      /* x, gamma, beta [the last attr.norm_axes dims] */
    TP_OP_GROUP_NORM,      /* x[N,C,...], gamma[C], beta[C]; norm_groups */
    TP_OP_INSTANCE_NORM,   /* group norm with C groups (x rank >= 3) */
    /* the reduce family (docs/ops.md): attr.axes is a bit set of input
     * axes (bit i: axis i); kept dims are size 1 or dropped by the builder */
    TP_OP_REDUCE_SUM,      /* sum over attr.axes */
    TP_OP_REDUCE_MEAN,     /* mean over attr.axes */
    TP_OP_REDUCE_MAX,      /* max over attr.axes; tied maxima share the
                              gradient evenly (torch.amax's) */
    TP_OP_ARGMAX,          /* int32 index of the first max along the one
                              axis of attr.axes; no gradient */
    TP_OP_SOFTMAX,         /* softmax along the one axis of attr.axes */
    TP_OP_LOG_SOFTMAX,     /* log-softmax along the one axis of attr.axes */
    TP_OP_SOFTMAX_XENT_SEQ, /* logits [..., V], labels int32 [...] -> mean
                              loss over the labels != attr.alpha (the
                              ignore label) [] */
    TP_OP_TOP_K_ACCURACY,  /* logits[N,K], labels int32[N] -> fraction whose
                              label is among the attr.alpha largest [] */
    /* fused attention (docs/ops.md): q [...,Tq,D], k and v [...,Tk,D] ->
     * softmax(attr.alpha q k^T (+ the causal mask when attr.beta != 0)) v,
     * [...,Tq,D], the T x T scores never stored whole */
    TP_OP_ATTENTION,
    TP_OP_COUNT
} tp_op_kind_t;

/* "matmul", "conv2d", ...; "invalid" for an unknown kind. */
const char *tp_op_name(tp_op_kind_t kind);

typedef struct tp_shape {
    int ndim;
    int64_t d[TP_MAX_DIMS];
} tp_shape_t;

/* Element count of a shape (1 for a scalar). */
size_t tp_shape_count(const tp_shape_t *s);

/* 1 when a and b have the same rank and dims, else 0. */
int tp_shape_same(const tp_shape_t *a, const tp_shape_t *b);

typedef struct tp_backend tp_backend_t;
typedef struct tp_stream tp_stream_t;
typedef struct tp_comm tp_comm_t;
typedef struct tp_stage tp_stage_t;

/* The CPU backend: OpenBLAS for matrix products (with `threads` OpenBLAS
 * threads; 0 keeps OpenBLAS's own setting, OPENBLAS_NUM_THREADS), plain C
 * elsewhere. Caller owns; NULL on failure. */
tp_backend_t *tp_backend_cpu_new(int threads);

/* Destroy any backend through its vtable; nulls *b_p. Accepts NULL. */
void tp_backend_destroy(tp_backend_t **b_p);

/* The backend's name: "cpu", "cuda". */
const char *tp_backend_name(const tp_backend_t *b);
/* The device the backend runs on; -1 for the CPU (host memory). */
int tp_backend_device(const tp_backend_t *b);

/* ---- raw device work, for benchmarks (tp-bench's reference products) ----
 * Thin calls through the backend's table. Memory is device memory aligned
 * to TP_ALIGNMENT (NULL on failure); calls on one stream run in order. */
void *tp_backend_alloc(tp_backend_t *b, size_t bytes);
void tp_backend_free(tp_backend_t *b, void *ptr);
/* Copy between host and backend memory on the backend's default stream
 * (the pointers say which way), complete on return. For set-up and
 * checks, not for every step. */
tp_status_t tp_backend_copy(tp_backend_t *b, void *dst, const void *src,
                            size_t bytes);
tp_stream_t *tp_backend_stream_new(tp_backend_t *b);
void tp_backend_stream_destroy(tp_backend_t *b, tp_stream_t *s);
tp_status_t tp_backend_stream_sync(tp_backend_t *b, tp_stream_t *s);
/* dst[0..count) = value. */
tp_status_t tp_backend_fill(tp_backend_t *b, tp_stream_t *s, float *dst,
                            float value, size_t count);
/* Row-major C = alpha * op(A) @ op(B) + beta * C. */
tp_status_t tp_backend_gemm(tp_backend_t *b, tp_stream_t *s, int trans_a,
                            int trans_b, int m, int n, int k, float alpha,
                            const float *a, int lda, const float *bm, int ldb,
                            float beta, float *c, int ldc);

/* The OpenBLAS thread count now in effect. */
int tp_backend_cpu_threads(void);

/* bf16 products on the CPU, for the whole process (the CPU backends share
 * oneDNN's primitive cache): on (1), oneDNN's matrix products (dense
 * layers, batch_matmul) round their two operands to bf16 and sum in fp32,
 * about twice as fast where the CPU has bf16 dot products (AVX512_BF16,
 * AMX), and so do the convolutions oneDNN runs direct (inputs in bf16,
 * outputs fp32; where fp32 Winograd measured faster it stays); tensors
 * and weights stay fp32; attention, batch norm and pooling keep fp32.
 * Off (0): exact fp32 products. Unasked, $TP_CPU_BF16 decides
 * (unset or "0": off). Returns 1 when the products now run in bf16, 0
 * when off or when this CPU has no bf16 instructions (then the products
 * stay fp32). Takes effect at the next product built; docs/compute.md. */
int tp_backend_cpu_bf16(int on);

/* tp_backend_cpu_bf16 as a tool or a config asks for it (tp-train's,
 * tp-predict's, tp-generate's and tp-bench's --bf16, TrainConfig.bf16,
 * tp_predict_config_t.bf16), said in the log: -1 leaves it to
 * $TP_CPU_BF16 and says nothing; 1 turns the products to bf16 and says so
 * (info), or, on a CPU without bf16 dot products, warns that they stay
 * fp32 (nothing is refused); 0 turns them off. Call it before the model
 * is built (its workspaces are planned then). Returns 1 when the products
 * now run in bf16. */
int tp_backend_cpu_bf16_ask(int bf16);

/* Staging through any backend (see the stage_* entries above). A backend
 * without them gets host-memory stages: host == device, no copy. */
tp_stage_t *tp_backend_stage_new(tp_backend_t *b, size_t bytes);
void tp_backend_stage_destroy(tp_backend_t *b, tp_stage_t **st_p);
void *tp_backend_stage_host(tp_backend_t *b, tp_stage_t *st);
void *tp_backend_stage_device(tp_backend_t *b, tp_stage_t *st);
tp_status_t tp_backend_stage_begin(tp_backend_t *b, tp_stage_t *st,
                                   size_t bytes);
tp_status_t tp_backend_stage_wait(tp_backend_t *b, tp_stage_t *st,
                                  tp_stream_t *s);
tp_status_t tp_backend_stage_release(tp_backend_t *b, tp_stage_t *st,
                                     tp_stream_t *s);
tp_status_t tp_backend_stage_host_wait(tp_backend_t *b, tp_stage_t *st);

/* ---- batches made where the data lives ------------------------------------
 * A data set resident in a backend's memory (uint8 images, int32 labels)
 * becomes training batches there: each output image is one source image,
 * padded with zeros, cropped, maybe mirrored and normalised to float32, as
 * tensorpack's crop + flip + normalise chain does on the host. The caller
 * draws the picks (which image, where to crop, whether to flip); the
 * backend only moves pixels, so the CPU and a GPU make the same batch from
 * the same picks. */

/* One output image: source image `index`, cropped at (y, x) of the padded
 * image (0 <= y <= h + 2 pad - crop_h, likewise x), then mirrored left to
 * right when flip is 1. */
typedef struct tp_augment_pick {
    int32_t index, y, x, flip;
} tp_augment_pick_t;

typedef struct tp_augment_shape {
    int h, w, c;          /* a source image: uint8 [h, w] (c = 1) or [h, w, c] */
    int crop_h, crop_w;   /* an output image: float32 [crop_h, crop_w] or
                             [crop_h, crop_w, c] */
    int pad;              /* zeros around the source, each side */
    float mean[4];        /* per channel (c <= 4): out = (v - mean) * inv_std */
    float inv_std[4];
} tp_augment_shape_t;

/* Batch of n images into dst (float32, n x crop_h x crop_w x c, backend
 * memory) from `images` (nsrc source images, backend memory) as `picks`
 * (host memory, n of them) and `shape` say; with labels and labels_dst
 * (int32, backend memory), labels_dst[i] = labels[picks[i].index]. Runs on
 * stream s (NULL: the backend's default stream, which a tower's stream
 * waits for before its next call). A pick out of range is TP_ERR_INVALID
 * naming it, before anything runs. */
tp_status_t tp_backend_augment_batch(tp_backend_t *b, tp_stream_t *s, float *dst,
                                     int32_t *labels_dst, const uint8_t *images,
                                     const int32_t *labels, int64_t nsrc,
                                     const tp_augment_pick_t *picks, int n,
                                     const tp_augment_shape_t *shape);

#ifdef __cplusplus
}
#endif
#endif
