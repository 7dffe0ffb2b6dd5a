/* towerpack dataflow: a strict decoder of the pickles tensorpack sends
 * (pickle.dumps(datapoint, protocol=-1), and protocols 2..4).
 *
 * It runs pickle's stack machine over the opcodes that these datapoints
 * use and nothing else; it never calls, imports or executes anything. A
 * GLOBAL may only name numpy's own reconstructors, which are understood
 * here as data layouts:
 *   numpy.core.multiarray._reconstruct + numpy.ndarray, then BUILD with
 *     (1, shape, dtype, is_fortran, raw bytes)        protocols 2..4
 *   numpy.core.numeric._frombuffer(buffer, dtype, shape, order)  protocol 5
 *   numpy.core.multiarray.scalar(dtype, bytes)         numpy scalars
 *   numpy.dtype(typecode, False, True), then BUILD with its state
 *   _codecs.encode(str, 'latin1')   protocol 2's spelling of raw bytes,
 *   bytes(those bytes) or bytes()    and of a bytes object
 * (numpy 2.x spells numpy.core as numpy._core; both are taken). Any other
 * global, any other opcode, nesting deeper than TP_TPK_MAX_DEPTH, more
 * than MAX_OBJECTS objects, or a length past the end of the message is
 * refused with an error naming it and its offset. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "df_tp.h"

#define MAX_OBJECTS (1u << 22)   /* objects a message may make (4M: a few
                                    datapoints need tens; __keys__ of
                                    ImageNet 1.3M) */
#define NO_NODE UINT32_MAX

enum { PV_NONE, PV_BOOL, PV_INT, PV_FLOAT, PV_BYTES, PV_STR, PV_LIST, PV_TUPLE,
       PV_GLOBAL, PV_DTYPE, PV_ARRAY, PV_EMPTY_ARRAY };

enum { G_RECONSTRUCT, G_NDARRAY, G_DTYPE, G_FROMBUFFER, G_SCALAR, G_ENCODE, G_BYTES };

typedef struct {
    uint8_t kind;
    uint8_t depth;     /* nesting of lists/tuples below and including it */
    uint8_t order;     /* dtype: byte order; array: 1 when Fortran order */
    uint8_t sub;       /* global: G_*; dtype: kind letter */
    uint32_t n;        /* list/tuple: items; dtype: itemsize; array: ndim */
    union {
        int64_t i;
        double f;
        struct { const uint8_t *p; size_t len; } s;   /* bytes, str */
        struct { uint32_t *items; uint32_t cap, off; } seq;  /* list: items;
                                                                 tuple: off in vm->pool */
    } u;
} pv_t;

/* An array: its data (in the message, or latin1-decoded), dtype, shape. */
struct s_arr {
    const uint8_t *p;
    size_t len;
    tp_dtype_t dt;
    uint32_t ndim;
    int64_t shape[TP_MAX_DIMS];
};

typedef struct {
    const uint8_t *p;
    size_t n, off;
    pv_t *nodes;
    uint32_t nnodes, cap;
    uint32_t *stack;
    uint32_t sp, scap;
    uint32_t *marks;
    uint32_t nmarks, mcap;
    uint32_t *memo;
    uint32_t nmemo, memocap;
    struct s_arr *arrs;              /* the arrays made (a node holds an index) */
    uint32_t narrs, acap;
    uint32_t *pool;                  /* tuples' items, back to back */
    uint32_t npool, pcap;
    uint8_t **owned;                 /* latin1-decoded bytes */
    uint32_t nowned, ocap;
    size_t op_off;                   /* offset of the opcode being run */
    void *inl;                       /* the inline storage (inl_t) */
    uint32_t nlistmem;               /* lists whose items were allocated */
    int litems_taken;                /* the inline list items are in use */
} vm_t;

/* A message's first allocations come from here (on the caller's stack):
 * a datapoint of a few arrays needs no malloc for the machine itself. */
#define INL_NODES 256
#define INL_STACK 128
#define INL_MEMO 256
#define INL_MARKS 32
#define INL_ARRS 16
#define INL_POOL 256
#define INL_LITEMS 64  /* the first list's items (the datapoint's, usually) */
typedef struct {
    pv_t nodes[INL_NODES];
    uint32_t stack[INL_STACK], memo[INL_MEMO], marks[INL_MARKS], pool[INL_POOL];
    uint32_t litems[INL_LITEMS];
    struct s_arr arrs[INL_ARRS];
} inl_t;

static void s_vm_init(vm_t *vm, inl_t *in, const uint8_t *p, size_t n) {
    memset(vm, 0, sizeof *vm);
    vm->p = p;
    vm->n = n;
    vm->nodes = in->nodes;
    vm->cap = INL_NODES;
    vm->stack = in->stack;
    vm->scap = INL_STACK;
    vm->memo = in->memo;
    vm->memocap = INL_MEMO;
    vm->marks = in->marks;
    vm->mcap = INL_MARKS;
    vm->pool = in->pool;
    vm->pcap = INL_POOL;
    vm->arrs = in->arrs;
    vm->acap = INL_ARRS;
    vm->inl = in;
}

static tp_status_t s_bad(vm_t *vm, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), cold, noinline));
static tp_status_t s_bad(vm_t *vm, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tp_error(TP_ERR_PROTOCOL, "pickle: offset %zu: %s", vm->op_off, msg);
}

/* Grow *p (cap elements of elem bytes) to at least need. Storage inside
 * the inline block is copied out to the heap, never realloc'd. */
static __attribute__((noinline)) int s_grow_in(const void *inl, size_t inl_size, void **p, uint32_t *cap,
                     uint32_t need, size_t elem) {
    if (need <= *cap)
        return 1;
    uint32_t c = *cap ? *cap : 16;
    while (c < need)
        c = c > UINT32_MAX / 2 ? need : c * 2;
    int inside = inl && (const char *)*p >= (const char *)inl &&
                 (const char *)*p < (const char *)inl + inl_size;
    void *q = inside ? malloc((size_t)c * elem) : realloc(*p, (size_t)c * elem);
    if (!q)
        return 0;
    if (inside)
        memcpy(q, *p, (size_t)*cap * elem);
    *p = q;
    *cap = c;
    return 1;
}
#define s_grow(p, cap, need, elem) s_grow_in(vm->inl, sizeof(inl_t), p, cap, need, elem)

static inline __attribute__((always_inline)) tp_status_t s_new(vm_t *vm, uint8_t kind, uint32_t *idx) {
    if (vm->nnodes >= MAX_OBJECTS)
        return s_bad(vm, "more than %u objects", MAX_OBJECTS);
    if (vm->nnodes >= vm->cap &&
        !s_grow((void **)&vm->nodes, &vm->cap, vm->nnodes + 1, sizeof *vm->nodes))
        return tp_error(TP_ERR_NOMEM, "pickle: objects");
    pv_t *v = &vm->nodes[vm->nnodes];
    memset(v, 0, sizeof *v);
    v->kind = kind;
    *idx = vm->nnodes++;
    return TP_OK;
}

static inline __attribute__((always_inline)) tp_status_t s_push(vm_t *vm, uint32_t idx) {
    if (vm->sp >= MAX_OBJECTS)
        return s_bad(vm, "stack deeper than %u", MAX_OBJECTS);
    if (vm->sp >= vm->scap &&
        !s_grow((void **)&vm->stack, &vm->scap, vm->sp + 1, sizeof *vm->stack))
        return tp_error(TP_ERR_NOMEM, "pickle: stack");
    vm->stack[vm->sp++] = idx;
    return TP_OK;
}

/* A new node of `kind` pushed; *v points at it (valid until the next new). */
static inline __attribute__((always_inline)) tp_status_t s_push_new(vm_t *vm, uint8_t kind, pv_t **v) {
    uint32_t idx = 0;
    TP_TRY(s_new(vm, kind, &idx));
    TP_TRY(s_push(vm, idx));
    *v = &vm->nodes[idx];
    return TP_OK;
}

static uint32_t s_stack_base(vm_t *vm) {
    return vm->nmarks ? vm->marks[vm->nmarks - 1] : 0;
}

static inline __attribute__((always_inline)) tp_status_t s_pop(vm_t *vm, uint32_t *idx) {
    if (vm->sp <= s_stack_base(vm))
        return s_bad(vm, "stack underflow");
    *idx = vm->stack[--vm->sp];
    return TP_OK;
}

static inline __attribute__((always_inline)) tp_status_t s_top(vm_t *vm, uint32_t *idx) {
    if (vm->sp <= s_stack_base(vm))
        return s_bad(vm, "stack underflow");
    *idx = vm->stack[vm->sp - 1];
    return TP_OK;
}

static inline __attribute__((always_inline)) tp_status_t s_need(vm_t *vm, size_t k) {
    if (vm->n - vm->off < k)
        return s_bad(vm, "truncated: needs %zu more bytes, %zu are left", k,
                     vm->n - vm->off);
    return TP_OK;
}

static uint64_t s_le(const uint8_t *p, int k) {
    uint64_t v = 0;
    for (int i = k - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* A length field of k bytes, then that many bytes: *p and *len. */
static inline __attribute__((always_inline)) tp_status_t s_counted(vm_t *vm, int k, const uint8_t **p, size_t *len) {
    TP_TRY(s_need(vm, (size_t)k));
    uint64_t l = s_le(vm->p + vm->off, k);
    vm->off += (size_t)k;
    if (l > vm->n - vm->off)
        return s_bad(vm, "a length of %llu bytes, only %zu are left",
                     (unsigned long long)l, vm->n - vm->off);
    *p = vm->p + vm->off;
    *len = (size_t)l;
    vm->off += (size_t)l;
    return TP_OK;
}

static int s_in_inl(const vm_t *vm, const void *p) {
    const char *in = vm->inl;
    return (const char *)p >= in && (const char *)p < in + sizeof(inl_t);
}

static tp_status_t s_append(vm_t *vm, uint32_t list, uint32_t item) {
    pv_t *l = &vm->nodes[list];
    if (l->kind != PV_LIST)
        return s_bad(vm, "APPEND to something that is not a list");
    if (!l->u.seq.items && !vm->litems_taken) {  /* no malloc for the first list */
        l->u.seq.items = ((inl_t *)vm->inl)->litems;
        l->u.seq.cap = INL_LITEMS;
        vm->litems_taken = 1;
    }
    if (l->n >= l->u.seq.cap) {
        int was_heap = l->u.seq.items && !s_in_inl(vm, l->u.seq.items);
        if (!s_grow((void **)&l->u.seq.items, &l->u.seq.cap, l->n + 1, sizeof(uint32_t)))
            return tp_error(TP_ERR_NOMEM, "pickle: list");
        if (!was_heap)
            vm->nlistmem++;  /* now on the heap: s_vm_fini frees it */
    }
    l->u.seq.items[l->n++] = item;
    unsigned d = (unsigned)vm->nodes[item].depth + 1;
    if (d > l->depth)
        l->depth = (uint8_t)(d > 255 ? 255 : d);
    if (l->depth > TP_TPK_MAX_DEPTH)
        return s_bad(vm, "lists or tuples nested deeper than %d", TP_TPK_MAX_DEPTH);
    return TP_OK;
}

/* A tuple of the stack items [from, sp): popped, the tuple pushed. */
static tp_status_t s_tuple(vm_t *vm, uint32_t from) {
    uint32_t k = vm->sp - from, idx = 0;
    TP_TRY(s_new(vm, PV_TUPLE, &idx));
    if (vm->npool > MAX_OBJECTS * 2u)
        return s_bad(vm, "more than %u tuple items", MAX_OBJECTS * 2u);
    if (vm->npool + k > vm->pcap &&
        !s_grow((void **)&vm->pool, &vm->pcap, vm->npool + k, sizeof *vm->pool))
        return tp_error(TP_ERR_NOMEM, "pickle: tuple");
    pv_t *t = &vm->nodes[idx];
    t->u.seq.off = vm->npool;
    vm->npool += k;
    unsigned d = 1;
    for (uint32_t i = 0; i < k; i++) {
        uint32_t it = vm->stack[from + i];
        vm->pool[t->u.seq.off + i] = it;
        if ((unsigned)vm->nodes[it].depth + 1 > d)
            d = (unsigned)vm->nodes[it].depth + 1;
    }
    t->n = k;
    t->depth = (uint8_t)(d > 255 ? 255 : d);
    if (d > TP_TPK_MAX_DEPTH)
        return s_bad(vm, "lists or tuples nested deeper than %d", TP_TPK_MAX_DEPTH);
    vm->sp = from;
    return s_push(vm, idx);
}

/* The items of a list or tuple. */
static uint32_t *s_items(vm_t *vm, const pv_t *v) {
    return v->kind == PV_TUPLE ? vm->pool + v->u.seq.off : v->u.seq.items;
}

static int s_streq(const pv_t *v, const char *s) {
    size_t l = strlen(s);
    return v->kind == PV_STR && v->u.s.len == l && !memcmp(v->u.s.p, s, l);
}

/* The one place a global is looked up: numpy's reconstructors only. */
static tp_status_t s_global(vm_t *vm, const uint8_t *mod, size_t ml,
                            const uint8_t *name, size_t nl) {
#define G(m, n, id) {m, n, sizeof m - 1, sizeof n - 1, id}
    static const struct { const char *mod, *name; size_t ml, nl; int id; } ok[] = {
        G("numpy.core.multiarray", "_reconstruct", G_RECONSTRUCT),
        G("numpy._core.multiarray", "_reconstruct", G_RECONSTRUCT),
        G("numpy", "ndarray", G_NDARRAY),
        G("numpy", "dtype", G_DTYPE),
        G("numpy.core.numeric", "_frombuffer", G_FROMBUFFER),
        G("numpy._core.numeric", "_frombuffer", G_FROMBUFFER),
        G("numpy.core.multiarray", "scalar", G_SCALAR),
        G("numpy._core.multiarray", "scalar", G_SCALAR),
        G("_codecs", "encode", G_ENCODE),
        G("__builtin__", "bytes", G_BYTES),   /* protocol 2's bytes(...) */
        G("builtins", "bytes", G_BYTES),
    };
#undef G
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        if (ok[i].ml == ml && ok[i].nl == nl && !memcmp(ok[i].mod, mod, ml) &&
            !memcmp(ok[i].name, name, nl)) {
            pv_t *v;
            TP_TRY(s_push_new(vm, PV_GLOBAL, &v));
            v->sub = (uint8_t)ok[i].id;
            return TP_OK;
        }
    char m[80], n[80];
    size_t a = ml < 79 ? ml : 79, b = nl < 79 ? nl : 79;
    for (size_t i = 0; i < a; i++)
        m[i] = mod[i] >= 32 && mod[i] < 127 ? (char)mod[i] : '?';
    for (size_t i = 0; i < b; i++)
        n[i] = name[i] >= 32 && name[i] < 127 ? (char)name[i] : '?';
    m[a] = n[b] = '\0';
    return s_bad(vm, "global '%s.%s' refused: only numpy's array, scalar and dtype "
                 "reconstructors are taken (nothing is ever imported or called)", m, n);
}

static tp_status_t s_dtype_of(vm_t *vm, uint32_t idx, tp_dtype_t *dt) {
    pv_t *d = &vm->nodes[idx];
    if (d->kind != PV_DTYPE)
        return s_bad(vm, "an array's dtype is not a numpy.dtype");
    char why[200];
    if (!df_tpk_np_dtype((char)d->sub, (int)d->n, (char)d->order, dt, why, sizeof why))
        return s_bad(vm, "%s", why);
    return TP_OK;
}

static tp_status_t s_shape_of(vm_t *vm, uint32_t idx, int64_t *shape, uint32_t *ndim) {
    pv_t *t = &vm->nodes[idx];
    if (t->kind != PV_TUPLE)
        return s_bad(vm, "an array's shape is not a tuple");
    if (t->n > TP_MAX_DIMS)
        return s_bad(vm, "an array of %u dimensions (at most %d)", t->n, TP_MAX_DIMS);
    for (uint32_t i = 0; i < t->n; i++) {
        pv_t *d = &vm->nodes[s_items(vm, t)[i]];
        if (d->kind != PV_INT || d->u.i < 0)
            return s_bad(vm, "an array's dimension %u is not a non-negative int", i);
        shape[i] = d->u.i;
    }
    *ndim = t->n;
    return TP_OK;
}

/* An array node over bytes [p, p+len) after every check. */
static tp_status_t s_array(vm_t *vm, uint32_t dtype, const int64_t *shape,
                           uint32_t ndim, int fortran, const pv_t *buf, uint32_t *out) {
    tp_dtype_t dt;
    TP_TRY(s_dtype_of(vm, dtype, &dt));
    if (fortran && ndim > 1)
        return s_bad(vm, "a Fortran-order array (np.ascontiguousarray it before "
                     "sending: only C order is taken)");
    if (buf->kind != PV_BYTES)
        return s_bad(vm, "an array's data is not bytes (an object array?)");
    size_t numel;
    if (tp_shape_numel((int)ndim, shape, tp_dtype_size(dt), &numel) != TP_OK ||
        numel * tp_dtype_size(dt) != buf->u.s.len)
        return s_bad(vm, "an array's shape and dtype need other than its %zu bytes",
                     buf->u.s.len);
    if (vm->narrs >= vm->acap &&
        !s_grow((void **)&vm->arrs, &vm->acap, vm->narrs + 1, sizeof *vm->arrs))
        return tp_error(TP_ERR_NOMEM, "pickle: arrays");
    struct s_arr *ar = &vm->arrs[vm->narrs];
    memset(ar, 0, sizeof *ar);
    ar->p = buf->u.s.p;
    ar->len = buf->u.s.len;
    ar->dt = dt;
    ar->ndim = ndim;
    if (ndim)
        memcpy(ar->shape, shape, ndim * sizeof *shape);
    uint32_t idx = 0;
    TP_TRY(s_new(vm, PV_ARRAY, &idx));
    vm->nodes[idx].u.i = vm->narrs++;
    *out = idx;
    return TP_OK;
}

static tp_status_t s_reduce(vm_t *vm) {
    uint32_t args = 0, fn = 0;
    TP_TRY(s_pop(vm, &args));
    TP_TRY(s_pop(vm, &fn));
    pv_t *f = &vm->nodes[fn], *a = &vm->nodes[args];
    if (f->kind != PV_GLOBAL)
        return s_bad(vm, "REDUCE of something that is not a numpy reconstructor");
    if (a->kind != PV_TUPLE)
        return s_bad(vm, "REDUCE with arguments that are not a tuple");
    uint32_t *it = s_items(vm, a), na = a->n;
    switch (f->sub) {
    case G_DTYPE: {  /* numpy.dtype('f4', False, True) */
        if (na < 1 || vm->nodes[it[0]].kind != PV_STR)
            return s_bad(vm, "numpy.dtype() without a type code");
        pv_t *s = &vm->nodes[it[0]];
        char code[16];
        size_t l = s->u.s.len;
        if (l < 2 || l > 6)
            return s_bad(vm, "numpy.dtype('%.*s'): not a number type", (int)(l < 16 ? l : 16),
                         (const char *)s->u.s.p);
        memcpy(code, s->u.s.p, l);
        code[l] = '\0';
        const char *c = code;
        char order = '=';
        if (*c == '<' || *c == '>' || *c == '|' || *c == '=')
            order = *c++;
        long size = 0;
        const char *e = c + 1;
        while (*e >= '0' && *e <= '9' && size < 1000)
            size = size * 10 + (*e++ - '0');
        if (*e || e == c + 1 || size <= 0 || size > 64)
            return s_bad(vm, "numpy.dtype('%s'): not a kind and a size", code);
        pv_t *d;
        TP_TRY(s_push_new(vm, PV_DTYPE, &d));
        d->sub = (uint8_t)c[0];
        d->n = (uint32_t)size;
        d->order = (uint8_t)order;
        return TP_OK;
    }
    case G_FROMBUFFER: {  /* _frombuffer(buffer, dtype, shape, order) */
        if (na != 4)
            return s_bad(vm, "_frombuffer with %u arguments (4 expected)", na);
        int64_t shape[TP_MAX_DIMS];
        uint32_t ndim;
        TP_TRY(s_shape_of(vm, it[2], shape, &ndim));
        pv_t *ord = &vm->nodes[it[3]];
        if (!s_streq(ord, "C") && !s_streq(ord, "F"))
            return s_bad(vm, "_frombuffer: order is not 'C' or 'F'");
        pv_t buf = vm->nodes[it[0]];
        uint32_t idx = 0;
        TP_TRY(s_array(vm, it[1], shape, ndim, s_streq(ord, "F"), &buf, &idx));
        return s_push(vm, idx);
    }
    case G_RECONSTRUCT: {  /* _reconstruct(ndarray, (0,), b'b'): BUILD fills */
        if (na != 3 || vm->nodes[it[0]].kind != PV_GLOBAL ||
            vm->nodes[it[0]].sub != G_NDARRAY)
            return s_bad(vm, "_reconstruct of something other than numpy.ndarray");
        pv_t *v;
        return s_push_new(vm, PV_EMPTY_ARRAY, &v);
    }
    case G_SCALAR: {  /* scalar(dtype, bytes) */
        if (na != 2)
            return s_bad(vm, "numpy scalar with %u arguments (2 expected)", na);
        pv_t buf = vm->nodes[it[1]];
        uint32_t idx = 0;
        TP_TRY(s_array(vm, it[0], NULL, 0, 0, &buf, &idx));
        return s_push(vm, idx);
    }
    case G_ENCODE: {  /* _codecs.encode(str, 'latin1'): code points -> bytes */
        if (na != 2 || vm->nodes[it[0]].kind != PV_STR ||
            (!s_streq(&vm->nodes[it[1]], "latin1") && !s_streq(&vm->nodes[it[1]], "latin-1")))
            return s_bad(vm, "_codecs.encode other than of a str to 'latin1'");
        pv_t *s = &vm->nodes[it[0]];
        uint8_t *out = malloc(s->u.s.len ? s->u.s.len : 1);
        if (!out || !s_grow((void **)&vm->owned, &vm->ocap, vm->nowned + 1, sizeof *vm->owned)) {
            free(out);
            return tp_error(TP_ERR_NOMEM, "pickle: bytes");
        }
        vm->owned[vm->nowned++] = out;
        size_t o = 0;
        const uint8_t *q = s->u.s.p, *e = q + s->u.s.len;
        while (q < e) {  /* UTF-8 of code points < 256: 1 or 2 bytes */
            if (*q < 0x80)
                out[o++] = *q++;
            else if ((*q & 0xfe) == 0xc2 && q + 1 < e && (q[1] & 0xc0) == 0x80) {
                out[o++] = (uint8_t)((q[0] & 0x03) << 6 | (q[1] & 0x3f));
                q += 2;
            } else
                return s_bad(vm, "_codecs.encode: a character outside latin1");
        }
        pv_t *b;
        TP_TRY(s_push_new(vm, PV_BYTES, &b));
        b->u.s.p = out;
        b->u.s.len = o;
        return TP_OK;
    }
    case G_BYTES: {  /* bytes(b) is b; bytes() is b'' */
        if (na == 1 && vm->nodes[it[0]].kind == PV_BYTES)
            return s_push(vm, it[0]);
        if (na == 0) {
            pv_t *b;
            TP_TRY(s_push_new(vm, PV_BYTES, &b));
            b->u.s.p = vm->p;  /* empty, inside the message */
            return TP_OK;
        }
        return s_bad(vm, "bytes() of something other than bytes");
    }
    default:
        return s_bad(vm, "numpy.ndarray called directly");
    }
}

static tp_status_t s_build_op(vm_t *vm) {
    uint32_t state = 0, obj = 0;
    TP_TRY(s_pop(vm, &state));
    TP_TRY(s_top(vm, &obj));
    pv_t *o = &vm->nodes[obj], *st = &vm->nodes[state];
    if (st->kind != PV_TUPLE)
        return s_bad(vm, "BUILD with a state that is not a tuple");
    uint32_t *it = s_items(vm, st), n = st->n;
    if (o->kind == PV_DTYPE) {
        /* (version, byteorder, subarray, names, fields, elsize, alignment,
         * flags[, metadata]) */
        if (n < 8 || vm->nodes[it[1]].kind != PV_STR || vm->nodes[it[1]].u.s.len != 1)
            return s_bad(vm, "a numpy.dtype state of %u items", n);
        if (vm->nodes[it[2]].kind != PV_NONE || vm->nodes[it[3]].kind != PV_NONE)
            return s_bad(vm, "a structured or sub-array numpy dtype");
        o->order = vm->nodes[it[1]].u.s.p[0];
        return TP_OK;
    }
    if (o->kind == PV_EMPTY_ARRAY) {
        /* (version, shape, dtype, is_fortran, raw data) */
        if (n != 5)
            return s_bad(vm, "an ndarray state of %u items (5 expected)", n);
        int64_t shape[TP_MAX_DIMS];
        uint32_t ndim;
        TP_TRY(s_shape_of(vm, it[1], shape, &ndim));
        pv_t *f = &vm->nodes[it[3]];
        int fortran = (f->kind == PV_BOOL || f->kind == PV_INT) && f->u.i != 0;
        pv_t buf = vm->nodes[it[4]];
        if (buf.kind == PV_LIST)
            return s_bad(vm, "an object array (its items are Python objects)");
        uint32_t idx = 0;
        TP_TRY(s_array(vm, it[2], shape, ndim, fortran, &buf, &idx));
        vm->stack[vm->sp - 1] = idx;  /* the array replaces the empty one */
        return TP_OK;
    }
    return s_bad(vm, "BUILD of something other than a numpy array or dtype");
}

static const char *s_opname(uint8_t op) {
    switch (op) {
    case 'I': return "INT"; case 'L': return "LONG"; case 'F': return "FLOAT";
    case 'S': return "STRING"; case 'T': return "BINSTRING"; case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE"; case 'P': return "PERSID"; case 'Q': return "BINPERSID";
    case 'i': return "INST"; case 'o': return "OBJ"; case 0x81: return "NEWOBJ";
    case 0x92: return "NEWOBJ_EX"; case 0x82: return "EXT1"; case 0x83: return "EXT2";
    case 0x84: return "EXT4"; case '}': return "EMPTY_DICT"; case 'd': return "DICT";
    case 's': return "SETITEM"; case 'u': return "SETITEMS"; case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS"; case 0x91: return "FROZENSET"; case 0x8b: return "LONG4";
    case 0x97: return "NEXT_BUFFER"; case 0x98: return "READONLY_BUFFER";
    case 'g': return "GET"; case 'p': return "PUT"; case '2': return "DUP";
    default: return "unknown";
    }
}

static tp_status_t s_run(vm_t *vm, uint32_t *result) {
    if (vm->n < 2 || vm->p[0] != 0x80 || vm->p[1] < 2 || vm->p[1] > 5)
        return tp_error(TP_ERR_PROTOCOL, "pickle: does not start with PROTO 2..5");
    vm->off = 2;
    for (;;) {
        vm->op_off = vm->off;
        if (vm->off >= vm->n)
            return s_bad(vm, "truncated: no STOP");
        uint8_t op = vm->p[vm->off++];
        pv_t *v;
        const uint8_t *sp = NULL;
        size_t sl = 0;
        uint32_t a = 0, b = 0;
        switch (op) {
        case 0x80:  /* PROTO */
            TP_TRY(s_need(vm, 1));
            if (vm->p[vm->off] > 5)
                return s_bad(vm, "pickle protocol %d", vm->p[vm->off]);
            vm->off++;
            break;
        case 0x95:  /* FRAME: a length; the frame's content follows inline */
            TP_TRY(s_need(vm, 8));
            if (s_le(vm->p + vm->off, 8) > vm->n - vm->off - 8)
                return s_bad(vm, "truncated: FRAME of %llu bytes, %zu are left",
                             (unsigned long long)s_le(vm->p + vm->off, 8),
                             vm->n - vm->off - 8);
            vm->off += 8;
            break;
        case '.':  /* STOP */
            if (vm->nmarks)
                return s_bad(vm, "STOP with a MARK open");
            TP_TRY(s_pop(vm, result));
            if (vm->off != vm->n)
                return s_bad(vm, "%zu bytes after STOP", vm->n - vm->off);
            return TP_OK;
        case '(':  /* MARK */
            if (vm->nmarks >= MAX_OBJECTS)
                return s_bad(vm, "too many marks");
            if (vm->nmarks >= vm->mcap &&
                !s_grow((void **)&vm->marks, &vm->mcap, vm->nmarks + 1, sizeof *vm->marks))
                return tp_error(TP_ERR_NOMEM, "pickle: marks");
            vm->marks[vm->nmarks++] = vm->sp;
            break;
        case '0':  /* POP */
            TP_TRY(s_pop(vm, &a));
            break;
        case '1':  /* POP_MARK */
            if (!vm->nmarks)
                return s_bad(vm, "POP_MARK without MARK");
            vm->sp = vm->marks[--vm->nmarks];
            break;
        case 'N': TP_TRY(s_push_new(vm, PV_NONE, &v)); break;
        case 0x88: case 0x89:  /* NEWTRUE, NEWFALSE */
            TP_TRY(s_push_new(vm, PV_BOOL, &v));
            v->u.i = op == 0x88;
            break;
        case 'K': case 'M': case 'J': {  /* BININT1, BININT2, BININT */
            int k = op == 'K' ? 1 : op == 'M' ? 2 : 4;
            TP_TRY(s_need(vm, (size_t)k));
            uint64_t u = s_le(vm->p + vm->off, k);
            vm->off += (size_t)k;
            TP_TRY(s_push_new(vm, PV_INT, &v));
            v->u.i = k == 4 ? (int64_t)(int32_t)(uint32_t)u : (int64_t)u;
            break;
        }
        case 0x8a: {  /* LONG1: n bytes of two's complement, little-endian */
            TP_TRY(s_need(vm, 1));
            int k = vm->p[vm->off++];
            if (k > 8)
                return s_bad(vm, "an int of %d bytes (at most 8 taken)", k);
            TP_TRY(s_need(vm, (size_t)k));
            uint64_t u = k ? s_le(vm->p + vm->off, k) : 0;
            if (k && k < 8 && (vm->p[vm->off + (size_t)k - 1] & 0x80))
                u |= ~(uint64_t)0 << (8 * k);
            vm->off += (size_t)k;
            TP_TRY(s_push_new(vm, PV_INT, &v));
            v->u.i = (int64_t)u;
            break;
        }
        case 'G': {  /* BINFLOAT: big-endian double */
            TP_TRY(s_need(vm, 8));
            uint64_t u = 0;
            for (int i = 0; i < 8; i++)
                u = u << 8 | vm->p[vm->off + (size_t)i];
            vm->off += 8;
            TP_TRY(s_push_new(vm, PV_FLOAT, &v));
            memcpy(&v->u.f, &u, 8);
            break;
        }
        case 0x8c: case 'X': case 0x8d:  /* SHORT_BINUNICODE, BINUNICODE(8) */
            TP_TRY(s_counted(vm, op == 0x8c ? 1 : op == 'X' ? 4 : 8, &sp, &sl));
            TP_TRY(s_push_new(vm, PV_STR, &v));
            v->u.s.p = sp;
            v->u.s.len = sl;
            break;
        case 'C': case 'B': case 0x8e: case 0x96:  /* bytes; BYTEARRAY8 */
            TP_TRY(s_counted(vm, op == 'C' ? 1 : op == 'B' ? 4 : 8, &sp, &sl));
            TP_TRY(s_push_new(vm, PV_BYTES, &v));
            v->u.s.p = sp;
            v->u.s.len = sl;
            break;
        case ']': TP_TRY(s_push_new(vm, PV_LIST, &v)); v->depth = 1; break;
        case ')': TP_TRY(s_tuple(vm, vm->sp)); break;
        case 0x85: case 0x86: case 0x87: {  /* TUPLE1..3 */
            uint32_t k = (uint32_t)(op - 0x84);
            if (vm->sp - s_stack_base(vm) < k)
                return s_bad(vm, "stack underflow");
            TP_TRY(s_tuple(vm, vm->sp - k));
            break;
        }
        case 't': case 'l': {  /* TUPLE, LIST: from the last MARK */
            if (!vm->nmarks)
                return s_bad(vm, "%s without MARK", op == 't' ? "TUPLE" : "LIST");
            uint32_t from = vm->marks[--vm->nmarks];
            if (op == 't') {
                TP_TRY(s_tuple(vm, from));
            } else {
                uint32_t k = vm->sp - from, idx = 0;
                TP_TRY(s_new(vm, PV_LIST, &idx));
                vm->nodes[idx].depth = 1;
                for (uint32_t i = 0; i < k; i++)
                    TP_TRY(s_append(vm, idx, vm->stack[from + i]));
                vm->sp = from;
                TP_TRY(s_push(vm, idx));
            }
            break;
        }
        case 'a':  /* APPEND */
            TP_TRY(s_pop(vm, &b));
            TP_TRY(s_top(vm, &a));
            TP_TRY(s_append(vm, a, b));
            break;
        case 'e': {  /* APPENDS: the items since the last MARK */
            if (!vm->nmarks)
                return s_bad(vm, "APPENDS without MARK");
            uint32_t from = vm->marks[--vm->nmarks];
            if (from == 0 || from <= s_stack_base(vm))
                return s_bad(vm, "APPENDS without a list");
            a = vm->stack[from - 1];
            for (uint32_t i = from; i < vm->sp; i++)
                TP_TRY(s_append(vm, a, vm->stack[i]));
            vm->sp = from;
            break;
        }
        case 'c': {  /* GLOBAL "module\nname\n" */
            const uint8_t *m = vm->p + vm->off, *e = vm->p + vm->n;
            const uint8_t *nl1 = memchr(m, '\n', (size_t)(e - m));
            const uint8_t *nl2 = nl1 ? memchr(nl1 + 1, '\n', (size_t)(e - nl1 - 1)) : NULL;
            if (!nl2)
                return s_bad(vm, "truncated GLOBAL");
            vm->off = (size_t)(nl2 + 1 - vm->p);
            TP_TRY(s_global(vm, m, (size_t)(nl1 - m), nl1 + 1, (size_t)(nl2 - nl1 - 1)));
            break;
        }
        case 0x93: {  /* STACK_GLOBAL: module and name strings on the stack */
            TP_TRY(s_pop(vm, &b));
            TP_TRY(s_pop(vm, &a));
            pv_t *m = &vm->nodes[a], *nm = &vm->nodes[b];
            if (m->kind != PV_STR || nm->kind != PV_STR)
                return s_bad(vm, "STACK_GLOBAL of something other than two strings");
            TP_TRY(s_global(vm, m->u.s.p, m->u.s.len, nm->u.s.p, nm->u.s.len));
            break;
        }
        case 'R': TP_TRY(s_reduce(vm)); break;
        case 'b': TP_TRY(s_build_op(vm)); break;
        case 'q': case 'r': case 0x94: {  /* BINPUT, LONG_BINPUT, MEMOIZE */
            uint64_t i;
            if (op == 0x94) {
                i = vm->nmemo;
            } else {
                int k = op == 'q' ? 1 : 4;
                TP_TRY(s_need(vm, (size_t)k));
                i = s_le(vm->p + vm->off, k);
                vm->off += (size_t)k;
            }
            if (i >= MAX_OBJECTS)
                return s_bad(vm, "memo index %llu (at most %u)", (unsigned long long)i,
                             MAX_OBJECTS);
            TP_TRY(s_top(vm, &a));
            uint32_t used = vm->nmemo;
            if (i >= used) {
                if (i >= vm->memocap &&
                    !s_grow((void **)&vm->memo, &vm->memocap, (uint32_t)i + 1,
                            sizeof *vm->memo))
                    return tp_error(TP_ERR_NOMEM, "pickle: memo");
                for (uint32_t j = used; j <= i; j++)
                    vm->memo[j] = NO_NODE;
                vm->nmemo = (uint32_t)i + 1;
            }
            vm->memo[i] = a;
            break;
        }
        case 'h': case 'j': {  /* BINGET, LONG_BINGET */
            int k = op == 'h' ? 1 : 4;
            TP_TRY(s_need(vm, (size_t)k));
            uint64_t i = s_le(vm->p + vm->off, k);
            vm->off += (size_t)k;
            if (i >= vm->nmemo || vm->memo[i] == NO_NODE)
                return s_bad(vm, "memo %llu was never stored", (unsigned long long)i);
            TP_TRY(s_push(vm, vm->memo[i]));
            break;
        }
        default:
            return s_bad(vm, "opcode 0x%02x (%s) refused: not one tensorpack's "
                         "datapoints use", op, s_opname(op));
        }
    }
}

static void s_vm_free(vm_t *vm, void *p) {
    if (!s_in_inl(vm, p))
        free(p);
}

static void s_vm_fini(vm_t *vm) {
    for (uint32_t i = 0; i < vm->nnodes && vm->nlistmem; i++)
        if (vm->nodes[i].kind == PV_LIST && vm->nodes[i].u.seq.items &&
            !s_in_inl(vm, vm->nodes[i].u.seq.items)) {
            free(vm->nodes[i].u.seq.items);
            vm->nlistmem--;
        }
    for (uint32_t i = 0; i < vm->nowned; i++)
        free(vm->owned[i]);
    free(vm->owned);
    s_vm_free(vm, vm->nodes);
    s_vm_free(vm, vm->stack);
    s_vm_free(vm, vm->marks);
    s_vm_free(vm, vm->memo);
    s_vm_free(vm, vm->arrs);
    s_vm_free(vm, vm->pool);
}

static tp_status_t s_item(vm_t *vm, uint32_t idx, int i, df_tpk_comps_t *cs) {
    pv_t *v = &vm->nodes[idx];
    switch (v->kind) {
    case PV_ARRAY: {
        struct s_arr *ar = &vm->arrs[v->u.i];
        df_tpk_comp_t *c = df_tpk_comps_push(cs);
        if (!c)
            return TP_ERR_PROTOCOL;
        c->dtype = ar->dt;
        c->ndim = (int)ar->ndim;
        memcpy(c->shape, ar->shape, sizeof c->shape);
        c->nbytes = ar->len;
        /* latin1-decoded bytes live in the VM: copy them */
        if (ar->p >= vm->p && ar->p + ar->len <= vm->p + vm->n) {
            c->data = ar->p;
        } else {
            if (!(c->owned = malloc(c->nbytes ? c->nbytes : 1)))
                return tp_error(TP_ERR_NOMEM, "pickle");
            memcpy(c->owned, ar->p, c->nbytes);
        }
        return TP_OK;
    }
    case PV_INT: return df_tpk_comp_int(cs, v->u.i) ? TP_OK : TP_ERR_PROTOCOL;
    case PV_FLOAT: return df_tpk_comp_float(cs, v->u.f) ? TP_OK : TP_ERR_PROTOCOL;
    case PV_BOOL: return df_tpk_comp_bool(cs, (int)v->u.i) ? TP_OK : TP_ERR_PROTOCOL;
    case PV_BYTES: case PV_STR:
        if (!(v->u.s.p >= vm->p && v->u.s.p + v->u.s.len <= vm->p + vm->n)) {
            df_tpk_comp_t *c = df_tpk_comp_bytes(cs, NULL, v->u.s.len);
            if (!c || !(c->owned = malloc(v->u.s.len ? v->u.s.len : 1)))
                return c ? tp_error(TP_ERR_NOMEM, "pickle") : TP_ERR_PROTOCOL;
            memcpy(c->owned, v->u.s.p, v->u.s.len);
            return TP_OK;
        }
        return df_tpk_comp_bytes(cs, v->u.s.p, v->u.s.len) ? TP_OK : TP_ERR_PROTOCOL;
    default: {
        static const char *names[] = {"None", "a bool", "an int", "a float", "bytes",
                                      "a str", "a list", "a tuple", "a global",
                                      "a dtype", "an array", "an unfinished array"};
        return tp_error(TP_ERR_PROTOCOL, "pickle: component %d is %s: only arrays, "
                        "numbers, bytes and str are components", i, names[v->kind]);
    }
    }
}

tp_status_t df_tpk_pickle(const uint8_t *p, size_t n, df_tpk_comps_t *cs) {
    vm_t vm;
    inl_t inl;
    s_vm_init(&vm, &inl, p, n);
    uint32_t top = 0;
    tp_status_t rc = s_run(&vm, &top);
    if (rc == TP_OK) {
        pv_t *t = &vm.nodes[top];
        if (t->kind != PV_LIST && t->kind != PV_TUPLE)
            rc = tp_error(TP_ERR_PROTOCOL, "pickle: the datapoint is not a list or tuple");
        for (uint32_t i = 0; rc == TP_OK && i < t->n; i++)
            rc = s_item(&vm, s_items(&vm, t)[i], (int)i, cs);
    }
    s_vm_fini(&vm);
    return rc;
}

tp_status_t df_tpk_pickle_keys(const uint8_t *p, size_t n, char **keys, size_t **offs,
                               size_t **lens, size_t *count) {
    vm_t vm;
    inl_t inl;
    s_vm_init(&vm, &inl, p, n);
    uint32_t top = 0;
    *keys = NULL;
    *offs = *lens = NULL;
    *count = 0;
    tp_status_t rc = s_run(&vm, &top);
    if (rc == TP_OK) {
        pv_t *t = &vm.nodes[top];
        size_t total = 0;
        if (t->kind != PV_LIST && t->kind != PV_TUPLE)
            rc = tp_error(TP_ERR_FORMAT, "pickle: the keys are not a list");
        for (uint32_t i = 0; rc == TP_OK && i < t->n; i++) {
            pv_t *k = &vm.nodes[s_items(&vm, t)[i]];
            if (k->kind != PV_BYTES && k->kind != PV_STR)
                rc = tp_error(TP_ERR_FORMAT, "pickle: key %u is not bytes or str", i);
            else
                total += k->u.s.len;
        }
        if (rc == TP_OK) {
            *keys = malloc(total ? total : 1);
            *offs = malloc((t->n ? t->n : 1) * sizeof **offs);
            *lens = malloc((t->n ? t->n : 1) * sizeof **lens);
            if (!*keys || !*offs || !*lens) {
                rc = tp_error(TP_ERR_NOMEM, "pickle: keys");
            } else {
                size_t o = 0;
                for (uint32_t i = 0; i < t->n; i++) {
                    pv_t *k = &vm.nodes[s_items(&vm, t)[i]];
                    if (k->u.s.len)
                        memcpy(*keys + o, k->u.s.p, k->u.s.len);
                    (*offs)[i] = o;
                    (*lens)[i] = k->u.s.len;
                    o += k->u.s.len;
                }
                *count = t->n;
            }
        }
    } else {
        rc = tp_error_wrap(TP_ERR_FORMAT, "keys");
    }
    if (rc != TP_OK) {
        free(*keys);
        free(*offs);
        free(*lens);
        *keys = NULL;
        *offs = *lens = NULL;
    }
    s_vm_fini(&vm);
    return rc;
}
