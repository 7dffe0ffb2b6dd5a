/* towerpack: dtypes and the tensor value type.
 *
 * A tensor is a contiguous, row-major block of up to TP_MAX_DIMS dimensions.
 * It either owns its memory (freed through free_fn at tp_tensor_fini) or
 * borrows it (free_fn NULL). Wrapping foreign memory with a destructor lets
 * a ZeroMQ frame or a pinned buffer become a tensor without a copy.
 *
 * tp_tensor_t is held by value (init/fini). Copying the struct with `=`
 * would duplicate ownership: move it with tp_tensor_move instead. */
#ifndef TOWERPACK_TENSOR_H
#define TOWERPACK_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TP_MAX_DIMS 8
/* Alignment of memory allocated by towerpack (cache line, AVX-512). */
#define TP_ALIGNMENT 64

typedef enum {
    TP_UINT8 = 0,
    TP_INT32 = 1,
    TP_INT64 = 2,
    TP_FLOAT16 = 3,
    TP_BFLOAT16 = 4,
    TP_FLOAT32 = 5,
    TP_FLOAT64 = 6,
    TP_DTYPE_COUNT = 7,
} tp_dtype_t;

/* Bytes per element; 0 for an invalid dtype. */
size_t tp_dtype_size(tp_dtype_t dtype);
/* "uint8", "float32", ...; "invalid" for an unknown value. */
const char *tp_dtype_name(tp_dtype_t dtype);
/* Parse a dtype name (also "u8", "i32", "i64", "f16", "bf16", "f32", "f64"). */
tp_status_t tp_dtype_parse(const char *name, tp_dtype_t *dtype);
/* 1 when `value` names a dtype. */
int tp_dtype_valid(int value);

typedef void (*tp_free_fn)(void *data, void *hint);

typedef struct tp_tensor {
    tp_dtype_t dtype;
    int ndim;                     /* 0 (scalar) .. TP_MAX_DIMS */
    int64_t shape[TP_MAX_DIMS];   /* shape[0..ndim-1], each >= 0 */
    void *data;                   /* nbytes, row-major; NULL when empty */
    size_t nbytes;                /* numel * dtype size */
    tp_free_fn free_fn;           /* NULL: borrowed memory, never freed */
    void *free_hint;              /* passed to free_fn */
} tp_tensor_t;

/* Aligned host allocation (TP_ALIGNMENT); NULL on failure. size 0 is valid.
 * Blocks of 64 KiB to 64 MiB that tp_free gets back are kept (64 MiB and
 * 32 blocks at most, process-wide, any thread) and handed out again for a
 * request they fit: batches made on one thread and freed on another then
 * reuse memory that is already mapped. A block from tp_alloc may also be
 * given to free(). Not under AddressSanitizer (every block is freed). */
void *tp_alloc(size_t size);
void tp_free(void *ptr);
/* Hand the kept blocks back to malloc; the bytes kept now. */
void tp_alloc_trim(void);
size_t tp_alloc_cached_bytes(void);

/* Element count of a shape into *numel, TP_ERR_SHAPE on a negative dim, too
 * many dims or overflow of `elem_size * numel` past SIZE_MAX/2. */
tp_status_t tp_shape_numel(int ndim, const int64_t *shape, size_t elem_size,
                           size_t *numel);

/* An empty tensor (no data, ndim 0, float32); fini on it is a no-op. */
void tp_tensor_init_empty(tp_tensor_t *t);

/* Allocate an owned, uninitialised tensor. On failure *t is empty. */
tp_status_t tp_tensor_init(tp_tensor_t *t, tp_dtype_t dtype, int ndim,
                           const int64_t *shape);

/* As tp_tensor_init, memory zeroed. */
tp_status_t tp_tensor_init_zero(tp_tensor_t *t, tp_dtype_t dtype, int ndim,
                                const int64_t *shape);

/* Wrap `data` (at least the shape's byte size) without a copy. free_fn(data,
 * hint) runs at fini; NULL free_fn borrows. On failure nothing is freed and
 * *t is empty. */
tp_status_t tp_tensor_init_wrap(tp_tensor_t *t, tp_dtype_t dtype, int ndim,
                                const int64_t *shape, void *data,
                                tp_free_fn free_fn, void *hint);

/* Release the memory if owned; leaves *t empty. Accepts an empty tensor. */
void tp_tensor_fini(tp_tensor_t *t);

/* Move: *dst (must be empty or finished) takes src's memory; src is empty. */
void tp_tensor_move(tp_tensor_t *dst, tp_tensor_t *src);

/* Deep copy into a new owned tensor in *dst. */
tp_status_t tp_tensor_copy(tp_tensor_t *dst, const tp_tensor_t *src);

/* Number of elements. */
size_t tp_tensor_numel(const tp_tensor_t *t);

/* 1 when dtype and shape match. */
int tp_tensor_same_shape(const tp_tensor_t *a, const tp_tensor_t *b);

/* 1 when dtype, shape and bytes match. */
int tp_tensor_equal(const tp_tensor_t *a, const tp_tensor_t *b);

/* Write "float32[128,1,28,28]" into buf (always terminated); returns buf. */
char *tp_tensor_describe(const tp_tensor_t *t, char *buf, size_t size);

/* Half-precision conversions (round to nearest even). */
uint16_t tp_f32_to_f16(float f);
float tp_f16_to_f32(uint16_t h);
uint16_t tp_f32_to_bf16(float f);
float tp_bf16_to_f32(uint16_t h);

#ifdef __cplusplus
}
#endif
#endif
