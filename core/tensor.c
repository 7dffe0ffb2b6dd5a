/* towerpack core: dtypes, aligned allocation, tensors, half conversions. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <towerpack/tensor.h>

static const size_t s_dtype_size[TP_DTYPE_COUNT] = {1, 4, 8, 2, 2, 4, 8};
static const char *const s_dtype_name[TP_DTYPE_COUNT] = {
    "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"};
static const char *const s_dtype_short[TP_DTYPE_COUNT] = {
    "u8", "i32", "i64", "f16", "bf16", "f32", "f64"};

int tp_dtype_valid(int value) { return value >= 0 && value < TP_DTYPE_COUNT; }

size_t tp_dtype_size(tp_dtype_t dtype) {
    return tp_dtype_valid((int)dtype) ? s_dtype_size[dtype] : 0;
}

const char *tp_dtype_name(tp_dtype_t dtype) {
    return tp_dtype_valid((int)dtype) ? s_dtype_name[dtype] : "invalid";
}

tp_status_t tp_dtype_parse(const char *name, tp_dtype_t *dtype) {
    for (int i = 0; name && i < TP_DTYPE_COUNT; i++) {
        if (strcasecmp(name, s_dtype_name[i]) == 0 ||
            strcasecmp(name, s_dtype_short[i]) == 0) {
            *dtype = (tp_dtype_t)i;
            return TP_OK;
        }
    }
    return tp_error(TP_ERR_INVALID,
                    "unknown dtype '%s' (uint8, int32, int64, float16, "
                    "bfloat16, float32, float64)",
                    name ? name : "(null)");
}

/* ---- a cache of large blocks ----------------------------------------------------
 *
 * Batches are made on one thread (a prefetch actor) and freed on another
 * (the trainer), at the same sizes, thousands of times. Through malloc
 * alone each free can hand the memory back to the kernel (the arena's top
 * is trimmed with madvise, which also flushes the TLBs of every core) and
 * each allocation then faults the pages in again and has them zeroed: a
 * few percent of a small model's step, on both threads. Freed blocks of
 * CACHE_MIN bytes or more are kept here instead, up to CACHE_SLOTS blocks
 * and CACHE_BYTES in all, and handed out again for a request that fits
 * with little waste. Under AddressSanitizer every block goes back to
 * malloc, so that a use after free is still caught. */
#if defined(__SANITIZE_ADDRESS__)
#define TP_BLOCK_CACHE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TP_BLOCK_CACHE 0
#endif
#endif
#ifndef TP_BLOCK_CACHE
#define TP_BLOCK_CACHE 1
#endif

#if TP_BLOCK_CACHE
#include <malloc.h>
#include <pthread.h>

#define CACHE_MIN ((size_t)64 << 10)
#define CACHE_BYTES ((size_t)64 << 20)
#define CACHE_SLOTS 32

static struct {
    pthread_mutex_t mu;
    void *ptr[CACHE_SLOTS];
    size_t size[CACHE_SLOTS];  /* malloc_usable_size */
    int n;
    size_t bytes;
} s_cache = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* A fork while another thread holds the lock must not leave the child's
 * copy locked for ever. */
static void s_cache_lock(void) { pthread_mutex_lock(&s_cache.mu); }
static void s_cache_unlock(void) { pthread_mutex_unlock(&s_cache.mu); }
static pthread_once_t s_cache_once = PTHREAD_ONCE_INIT;
static void s_cache_init(void) { pthread_atfork(s_cache_lock, s_cache_unlock, s_cache_unlock); }

/* Take slot i out (the lock held); its block is the caller's. */
static void *s_cache_remove(int i) {
    void *p = s_cache.ptr[i];
    s_cache.bytes -= s_cache.size[i];
    s_cache.n--;
    memmove(&s_cache.ptr[i], &s_cache.ptr[i + 1], (size_t)(s_cache.n - i) * sizeof(void *));
    memmove(&s_cache.size[i], &s_cache.size[i + 1], (size_t)(s_cache.n - i) * sizeof(size_t));
    return p;
}

/* The most recently freed block that holds `size` bytes and wastes at
 * most an eighth of it (its memory is the likeliest to be in cache). */
static void *s_cache_take(size_t size) {
    void *p = NULL;
    pthread_mutex_lock(&s_cache.mu);
    for (int i = s_cache.n - 1; i >= 0 && !p; i--)
        if (s_cache.size[i] >= size && s_cache.size[i] - size <= size / 8)
            p = s_cache_remove(i);
    pthread_mutex_unlock(&s_cache.mu);
    return p;
}

/* Keep p (usable size `size`); when full, the oldest block goes back to
 * malloc. */
static void s_cache_put(void *p, size_t size) {
    void *evict[CACHE_SLOTS];
    int nevict = 0;
    pthread_once(&s_cache_once, s_cache_init);
    pthread_mutex_lock(&s_cache.mu);
    while (s_cache.n > 0 && (s_cache.n == CACHE_SLOTS || s_cache.bytes + size > CACHE_BYTES))
        evict[nevict++] = s_cache_remove(0);
    s_cache.ptr[s_cache.n] = p;
    s_cache.size[s_cache.n] = size;
    s_cache.n++;
    s_cache.bytes += size;
    pthread_mutex_unlock(&s_cache.mu);
    for (int i = 0; i < nevict; i++)
        free(evict[i]);
}
#endif

void *tp_alloc(size_t size) {
    /* aligned_alloc needs a multiple of the alignment; size 0 still gives a
     * unique pointer so that "owned" always means "non-NULL data". */
    size_t rounded = (size + TP_ALIGNMENT - 1) & ~(size_t)(TP_ALIGNMENT - 1);
    if (rounded < size)
        return NULL;
#if TP_BLOCK_CACHE
    if (rounded >= CACHE_MIN && rounded <= CACHE_BYTES) {
        void *p = s_cache_take(rounded);
        if (p)
            return p;
    }
#endif
    return aligned_alloc(TP_ALIGNMENT, rounded ? rounded : TP_ALIGNMENT);
}

void tp_free(void *ptr) {
#if TP_BLOCK_CACHE
    if (ptr) {
        size_t size = malloc_usable_size(ptr);
        /* (the alignment test keeps a misdirected malloc block out) */
        if (size >= CACHE_MIN && size <= CACHE_BYTES && !((uintptr_t)ptr % TP_ALIGNMENT)) {
            s_cache_put(ptr, size);
            return;
        }
    }
#endif
    free(ptr);
}

void tp_alloc_trim(void) {
#if TP_BLOCK_CACHE
    pthread_mutex_lock(&s_cache.mu);
    int n = s_cache.n;
    void *ptr[CACHE_SLOTS];
    memcpy(ptr, s_cache.ptr, (size_t)n * sizeof(void *));
    s_cache.n = 0;
    s_cache.bytes = 0;
    pthread_mutex_unlock(&s_cache.mu);
    for (int i = 0; i < n; i++)
        free(ptr[i]);
#endif
}

size_t tp_alloc_cached_bytes(void) {
#if TP_BLOCK_CACHE
    pthread_mutex_lock(&s_cache.mu);
    size_t b = s_cache.bytes;
    pthread_mutex_unlock(&s_cache.mu);
    return b;
#else
    return 0;
#endif
}

static void s_free_owned(void *data, void *hint) {
    (void)hint;
    tp_free(data);
}

tp_status_t tp_shape_numel(int ndim, const int64_t *shape, size_t elem_size,
                           size_t *numel) {
    if (ndim < 0 || ndim > TP_MAX_DIMS)
        return tp_error(TP_ERR_SHAPE, "%d dimensions (0..%d allowed)", ndim,
                        TP_MAX_DIMS);
    size_t n = 1;
    const size_t limit = SIZE_MAX / 2 / (elem_size ? elem_size : 1);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return tp_error(TP_ERR_SHAPE, "dimension %d is negative (%lld)", i,
                            (long long)shape[i]);
        if (shape[i] != 0 && n > limit / (uint64_t)shape[i])
            return tp_error(TP_ERR_SHAPE, "shape overflows the address space");
        n *= (size_t)shape[i];
    }
    *numel = n;
    return TP_OK;
}

void tp_tensor_init_empty(tp_tensor_t *t) {
    memset(t, 0, sizeof *t);
    t->dtype = TP_FLOAT32;
}

static tp_status_t s_set_shape(tp_tensor_t *t, tp_dtype_t dtype, int ndim,
                               const int64_t *shape) {
    tp_tensor_init_empty(t);
    if (!tp_dtype_valid((int)dtype))
        return tp_error(TP_ERR_INVALID, "invalid dtype %d", (int)dtype);
    size_t numel;
    TP_TRY(tp_shape_numel(ndim, shape, tp_dtype_size(dtype), &numel));
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->nbytes = numel * tp_dtype_size(dtype);
    return TP_OK;
}

tp_status_t tp_tensor_init(tp_tensor_t *t, tp_dtype_t dtype, int ndim,
                           const int64_t *shape) {
    tp_status_t rc = s_set_shape(t, dtype, ndim, shape);
    if (rc != TP_OK)
        return rc;
    t->data = tp_alloc(t->nbytes);
    if (!t->data) {
        size_t n = t->nbytes;
        tp_tensor_init_empty(t);
        return tp_error(TP_ERR_NOMEM, "tensor of %zu bytes", n);
    }
    t->free_fn = s_free_owned;
    return TP_OK;
}

tp_status_t tp_tensor_init_zero(tp_tensor_t *t, tp_dtype_t dtype, int ndim,
                                const int64_t *shape) {
    TP_TRY(tp_tensor_init(t, dtype, ndim, shape));
    memset(t->data, 0, t->nbytes);
    return TP_OK;
}

tp_status_t tp_tensor_init_wrap(tp_tensor_t *t, tp_dtype_t dtype, int ndim,
                                const int64_t *shape, void *data,
                                tp_free_fn free_fn, void *hint) {
    tp_status_t rc = s_set_shape(t, dtype, ndim, shape);
    if (rc != TP_OK)
        return rc;
    if (!data && t->nbytes > 0) {
        tp_tensor_init_empty(t);
        return tp_error(TP_ERR_INVALID, "wrapping NULL data");
    }
    t->data = data;
    t->free_fn = free_fn;
    t->free_hint = hint;
    return TP_OK;
}

void tp_tensor_fini(tp_tensor_t *t) {
    if (!t)
        return;
    if (t->free_fn && t->data)
        t->free_fn(t->data, t->free_hint);
    tp_tensor_init_empty(t);
}

void tp_tensor_move(tp_tensor_t *dst, tp_tensor_t *src) {
    TP_ASSERT(dst != src);
    *dst = *src;
    tp_tensor_init_empty(src);
}

tp_status_t tp_tensor_copy(tp_tensor_t *dst, const tp_tensor_t *src) {
    TP_TRY(tp_tensor_init(dst, src->dtype, src->ndim, src->shape));
    if (src->nbytes)
        memcpy(dst->data, src->data, src->nbytes);
    return TP_OK;
}

size_t tp_tensor_numel(const tp_tensor_t *t) {
    size_t es = tp_dtype_size(t->dtype);
    return es ? t->nbytes / es : 0;
}

int tp_tensor_same_shape(const tp_tensor_t *a, const tp_tensor_t *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return 0;
    return 1;
}

int tp_tensor_equal(const tp_tensor_t *a, const tp_tensor_t *b) {
    if (!tp_tensor_same_shape(a, b) || a->nbytes != b->nbytes)
        return 0;
    return a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0;
}

char *tp_tensor_describe(const tp_tensor_t *t, char *buf, size_t size) {
    if (!size)
        return buf;
    size_t off = 0;
    int n = snprintf(buf, size, "%s[", tp_dtype_name(t->dtype));
    off = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < t->ndim && off < size; i++) {
        n = snprintf(buf + off, size - off, i ? ",%lld" : "%lld",
                     (long long)t->shape[i]);
        off += n > 0 ? (size_t)n : 0;
    }
    if (off < size)
        snprintf(buf + off, size - off, "]");
    buf[size - 1] = '\0';
    return buf;
}

uint16_t tp_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t mant = x & 0x7fffffu;
    if (((x >> 23) & 0xff) == 0xff) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10)
            return (uint16_t)sign;
        mant |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1)))
        half++; /* may carry into the exponent, which is correct rounding */
    return (uint16_t)half;
}

float tp_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t x;
    if (exp == 0) {
        if (mant == 0) {
            x = sign;
        } else {
            exp = 127 - 15 + 1;
            while (!(mant & 0x400u)) {
                mant <<= 1;
                exp--;
            }
            x = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        x = sign | 0x7f800000u | (mant << 13);
    } else {
        x = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

uint16_t tp_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu))
        return (uint16_t)((x >> 16) | 0x40u); /* keep NaN a NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float tp_bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}
