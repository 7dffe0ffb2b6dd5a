/* towerpack tests: core types (status, log, tensor, datapoint, rng). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>
#include <towerpack/towerpack.h>

Test(core, strerror_names_every_status) {
    for (int s = 0; s >= TP_ERR_NOT_FOUND; s--) {
        const char *m = tp_strerror((tp_status_t)s);
        cr_assert(m && *m);
        cr_assert_str_neq(m, "unknown status", "status %d has no name", s);
    }
    cr_assert_str_eq(tp_strerror((tp_status_t)-999), "unknown status");
}

Test(core, last_error_is_per_thread_and_wrappable) {
    tp_clear_error();
    cr_assert_str_eq(tp_last_error(), "");
    cr_assert_eq(tp_error(TP_ERR_IO, "open %s", "x.bin"), TP_ERR_IO);
    cr_assert_str_eq(tp_last_error(), "open x.bin");
    cr_assert_eq(tp_error_wrap(TP_ERR_FORMAT, "reading %d", 3), TP_ERR_FORMAT);
    cr_assert_str_eq(tp_last_error(), "reading 3: open x.bin");
}

/* tools prefix the last error with where it happened by passing it back
 * in: the message must read as written, not overwritten while formatted */
Test(core, last_error_can_be_an_argument_of_the_next) {
    tp_error(TP_ERR_INVALID, "data source '%s': use fashion-mnist:SPLIT", "nosuch:x");
    cr_assert_eq(tp_error(TP_ERR_INVALID, "--data: %s", tp_last_error()), TP_ERR_INVALID);
    cr_assert_str_eq(tp_last_error(),
                     "--data: data source 'nosuch:x': use fashion-mnist:SPLIT");
    tp_error_wrap(TP_ERR_INVALID, "in %s", tp_last_error());
    cr_assert(!strncmp(tp_last_error(), "in --data: data source 'nosuch:x'", 33),
              "%s", tp_last_error());
}

static void *s_thread_err(void *arg) {
    (void)arg;
    tp_error(TP_ERR_PEER, "other thread");
    return NULL;
}

Test(core, last_error_does_not_leak_across_threads) {
    pthread_t th;
    tp_error(TP_ERR_IO, "mine");
    pthread_create(&th, NULL, s_thread_err, NULL);
    pthread_join(th, NULL);
    cr_assert_str_eq(tp_last_error(), "mine");
}

Test(core, log_levels_and_file) {
    tp_log_level_t l;
    cr_assert_eq(tp_log_level_parse("WARN", &l), TP_OK);
    cr_assert_eq(l, TP_LOG_WARN);
    cr_assert_eq(tp_log_level_parse("loud", &l), TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "loud"));

    char path[] = "/tmp/tp_log_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    tp_log_set_stderr(0);
    cr_assert_eq(tp_log_set_file(path), TP_OK);
    tp_log_set_level(TP_LOG_INFO);
    TP_DEBUG("hidden %d", 1);
    TP_INFO("shown %d", 2);
    TP_ERROR("bad %s", "thing");
    cr_assert_eq(tp_log_set_file(NULL), TP_OK);
    tp_log_set_stderr(1);
    FILE *f = fopen(path, "r");
    char buf[4096] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    unlink(path);
    cr_assert(n > 0);
    cr_assert_null(strstr(buf, "hidden"));
    cr_assert(strstr(buf, "info  ") && strstr(buf, "shown 2"));
    cr_assert(strstr(buf, "error ") && strstr(buf, "bad thing"));
    cr_assert(strstr(buf, "test_core.c:"), "records name file and line");
    cr_assert_eq(tp_log_set_file("/nonexistent-dir/x.log"), TP_ERR_IO);
    cr_assert(strstr(tp_last_error(), "/nonexistent-dir/x.log"));
}

/* A tool's fatal error: its plain line on stderr, and a record in the log
 * file whatever the level (the log says why a run stopped; issue 48). */
Test(core, log_fatal_goes_to_stderr_and_the_file) {
    char path[] = "/tmp/tp_log_XXXXXX", err[] = "/tmp/tp_err_XXXXXX";
    int fd = mkstemp(path), efd = mkstemp(err);
    cr_assert(fd >= 0 && efd >= 0);
    close(fd);
    cr_assert_eq(tp_log_set_file(path), TP_OK);
    tp_log_set_level(TP_LOG_OFF);
    int saved = dup(2);
    dup2(efd, 2);
    tp_log_fatal("tp-tool", "training data: %s", "no such file");
    dup2(saved, 2);
    close(saved);
    cr_assert_eq(tp_log_set_file(NULL), TP_OK);
    tp_log_set_level(TP_LOG_INFO);
    char buf[4096] = {0};
    cr_assert_gt(pread(efd, buf, sizeof buf - 1, 0), 0);
    close(efd);
    unlink(err);
    cr_assert_str_eq(buf, "tp-tool: training data: no such file\n");
    FILE *f = fopen(path, "r");
    memset(buf, 0, sizeof buf);
    cr_assert_gt(fread(buf, 1, sizeof buf - 1, f), 0);
    fclose(f);
    unlink(path);
    cr_assert(strstr(buf, "error ") && strstr(buf, "tp-tool fatal: training data: no such "
                                                   "file\n"), "%s", buf);
}

Test(core, dtypes) {
    size_t sizes[] = {1, 4, 8, 2, 2, 4, 8};
    for (int d = 0; d < TP_DTYPE_COUNT; d++) {
        cr_assert_eq(tp_dtype_size((tp_dtype_t)d), sizes[d]);
        tp_dtype_t back;
        cr_assert_eq(tp_dtype_parse(tp_dtype_name((tp_dtype_t)d), &back), TP_OK);
        cr_assert_eq(back, (tp_dtype_t)d);
    }
    tp_dtype_t x;
    cr_assert_eq(tp_dtype_parse("bf16", &x), TP_OK);
    cr_assert_eq(x, TP_BFLOAT16);
    cr_assert_eq(tp_dtype_parse("complex64", &x), TP_ERR_INVALID);
    cr_assert_eq(tp_dtype_size((tp_dtype_t)42), 0);
    cr_assert(!tp_dtype_valid(TP_DTYPE_COUNT));
}

Test(core, tensor_owned_shape_and_alignment) {
    tp_tensor_t t;
    int64_t shape[] = {2, 3, 4};
    cr_assert_eq(tp_tensor_init_zero(&t, TP_FLOAT32, 3, shape), TP_OK);
    cr_assert_eq(t.nbytes, 96);
    cr_assert_eq(tp_tensor_numel(&t), 24);
    cr_assert_eq((uintptr_t)t.data % TP_ALIGNMENT, 0);
    for (int i = 0; i < 24; i++)
        cr_assert_eq(((float *)t.data)[i], 0.0f);
    char desc[64];
    cr_assert_str_eq(tp_tensor_describe(&t, desc, sizeof desc), "float32[2,3,4]");
    tp_tensor_fini(&t);
    cr_assert_null(t.data);
    tp_tensor_fini(&t); /* twice is harmless */
}

Test(core, tensor_rejects_bad_shapes) {
    tp_tensor_t t;
    int64_t neg[] = {2, -1};
    cr_assert_eq(tp_tensor_init(&t, TP_UINT8, 2, neg), TP_ERR_SHAPE);
    cr_assert_null(t.data);
    int64_t huge[] = {INT64_MAX, INT64_MAX};
    cr_assert_eq(tp_tensor_init(&t, TP_FLOAT32, 2, huge), TP_ERR_SHAPE);
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    cr_assert_eq(tp_tensor_init(&t, TP_FLOAT32, 9, nine), TP_ERR_SHAPE);
    cr_assert_eq(tp_tensor_init(&t, (tp_dtype_t)99, 0, NULL), TP_ERR_INVALID);
    int64_t zero[] = {0, 5};
    cr_assert_eq(tp_tensor_init(&t, TP_FLOAT32, 2, zero), TP_OK);
    cr_assert_eq(t.nbytes, 0);
    tp_tensor_fini(&t);
}

static int s_freed;
static void *s_freed_ptr;
static void s_count_free(void *data, void *hint) {
    s_freed++;
    s_freed_ptr = data;
    cr_assert_eq(hint, (void *)0x1234);
}

Test(core, tensor_wrap_runs_destructor_once) {
    static float buf[6];
    int64_t shape[] = {6};
    tp_tensor_t t, u;
    s_freed = 0;
    cr_assert_eq(tp_tensor_init_wrap(&t, TP_FLOAT32, 1, shape, buf,
                                     s_count_free, (void *)0x1234), TP_OK);
    tp_tensor_move(&u, &t);
    cr_assert_null(t.data);
    tp_tensor_fini(&t);
    cr_assert_eq(s_freed, 0, "moved-from tensor must not free");
    tp_tensor_fini(&u);
    cr_assert_eq(s_freed, 1);
    cr_assert_eq(s_freed_ptr, buf);
    /* Borrowed: no destructor at all. */
    cr_assert_eq(tp_tensor_init_wrap(&t, TP_FLOAT32, 1, shape, buf, NULL, NULL), TP_OK);
    tp_tensor_fini(&t);
    cr_assert_eq(s_freed, 1);
    cr_assert_eq(tp_tensor_init_wrap(&t, TP_FLOAT32, 1, shape, NULL, NULL, NULL),
                 TP_ERR_INVALID);
}

Test(core, tensor_copy_is_deep) {
    tp_tensor_t a, b;
    int64_t shape[] = {4};
    cr_assert_eq(tp_tensor_init(&a, TP_INT32, 1, shape), TP_OK);
    for (int i = 0; i < 4; i++)
        ((int32_t *)a.data)[i] = i * 7;
    cr_assert_eq(tp_tensor_copy(&b, &a), TP_OK);
    cr_assert(tp_tensor_equal(&a, &b));
    cr_assert_neq(a.data, b.data);
    ((int32_t *)b.data)[0] = 99;
    cr_assert(!tp_tensor_equal(&a, &b));
    tp_tensor_fini(&a);
    tp_tensor_fini(&b);
}

Test(core, half_conversions_round_trip) {
    float vals[] = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f,
                    5.9604645e-08f, 0.333251953125f};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
        cr_assert_eq(tp_f16_to_f32(tp_f32_to_f16(vals[i])), vals[i], "f16 %g", vals[i]);
    cr_assert_eq(tp_f32_to_f16(1e6f), 0x7c00, "overflow becomes inf");
    cr_assert_eq(tp_f16_to_f32(tp_f32_to_f16(1.0f + 1.0f / 4096)), 1.0f,
                 "ties round to even");
    cr_assert_eq(tp_bf16_to_f32(tp_f32_to_bf16(3.140625f)), 3.140625f);
    cr_assert_eq(tp_bf16_to_f32(tp_f32_to_bf16(1.00390625f)), 1.0f);
    float nan = __builtin_nanf("");
    cr_assert(tp_f16_to_f32(tp_f32_to_f16(nan)) != tp_f16_to_f32(tp_f32_to_f16(nan)));
    cr_assert(tp_bf16_to_f32(tp_f32_to_bf16(nan)) != tp_bf16_to_f32(tp_f32_to_bf16(nan)));
}

Test(core, datapoint_owns_components) {
    tp_datapoint_t *dp = tp_datapoint_new(0);
    cr_assert_not_null(dp);
    s_freed = 0;
    static uint8_t img[16];
    for (int i = 0; i < 7; i++) { /* past the inline capacity */
        tp_tensor_t t;
        int64_t shape[] = {16};
        cr_assert_eq(tp_tensor_init_wrap(&t, TP_UINT8, 1, shape, img,
                                         s_count_free, (void *)0x1234), TP_OK);
        cr_assert_eq(tp_datapoint_append(dp, &t), TP_OK);
        cr_assert_null(t.data, "append moves the tensor");
    }
    cr_assert_eq(tp_datapoint_size(dp), 7);
    cr_assert_eq(tp_datapoint_nbytes(dp), 7 * 16);
    cr_assert_eq(tp_datapoint_resize(dp, 5), TP_OK);
    cr_assert_eq(s_freed, 2, "shrinking frees the dropped components");
    tp_datapoint_destroy(&dp);
    cr_assert_null(dp);
    cr_assert_eq(s_freed, 7);
    tp_datapoint_destroy(&dp); /* NULL is fine */
    cr_assert_null(tp_datapoint_new(-1));
    cr_assert_null(tp_datapoint_new(TP_DP_MAX_COMPONENTS + 1));
}

Test(core, datapoint_copy_and_equal) {
    tp_datapoint_t *a = tp_datapoint_new(2);
    int64_t s1[] = {3};
    tp_tensor_init(tp_datapoint_get(a, 0), TP_FLOAT64, 1, s1);
    tp_tensor_init(tp_datapoint_get(a, 1), TP_INT64, 0, NULL);
    ((double *)tp_datapoint_get(a, 0)->data)[1] = 2.5;
    *(int64_t *)tp_datapoint_get(a, 1)->data = -3;
    tp_datapoint_t *b = tp_datapoint_copy(a);
    cr_assert(tp_datapoint_equal(a, b));
    *(int64_t *)tp_datapoint_get(b, 1)->data = 4;
    cr_assert(!tp_datapoint_equal(a, b));
    tp_datapoint_destroy(&a);
    tp_datapoint_destroy(&b);
}

Test(core, rng_is_deterministic_and_streams_differ) {
    tp_rng_t a, b, c;
    tp_rng_init(&a, 42, 0);
    tp_rng_init(&b, 42, 0);
    tp_rng_init(&c, 42, 1);
    int same_c = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t x = tp_rng_u64(&a);
        cr_assert_eq(x, tp_rng_u64(&b));
        same_c += x == tp_rng_u64(&c);
    }
    cr_assert_eq(same_c, 0, "stream 1 must not repeat stream 0");
    tp_rng_t d, e;
    tp_rng_init(&d, 43, 0);
    tp_rng_init(&e, 42, 1);
    cr_assert_neq(tp_rng_u64(&d), tp_rng_u64(&e));
}

Test(core, rng_distributions) {
    tp_rng_t r;
    tp_rng_init(&r, 7, 3);
    int hist[10] = {0};
    double sum = 0, sum2 = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        uint64_t k = tp_rng_below(&r, 10);
        cr_assert(k < 10);
        hist[k]++;
        float f = tp_rng_float(&r);
        cr_assert(f >= 0.0f && f < 1.0f);
        double z = tp_rng_normal(&r);
        sum += z;
        sum2 += z * z;
    }
    for (int k = 0; k < 10; k++)
        cr_assert(hist[k] > n / 10 * 0.95 && hist[k] < n / 10 * 1.05, "bucket %d: %d", k, hist[k]);
    cr_assert(fabs(sum / n) < 0.02);
    cr_assert(fabs(sum2 / n - 1.0) < 0.03);
}

Test(core, rng_shuffle_is_a_permutation) {
    tp_rng_t r;
    tp_rng_init(&r, 1, 0);
    uint32_t idx[100];
    for (uint32_t i = 0; i < 100; i++)
        idx[i] = i;
    tp_rng_shuffle_u32(&r, idx, 100);
    int seen[100] = {0}, moved = 0;
    for (uint32_t i = 0; i < 100; i++) {
        seen[idx[i]]++;
        moved += idx[i] != i;
    }
    for (int i = 0; i < 100; i++)
        cr_assert_eq(seen[i], 1);
    cr_assert(moved > 80);
    tp_rng_t j = r;
    tp_rng_jump(&j);
    cr_assert_neq(tp_rng_u64(&j), tp_rng_u64(&r));
}

Test(core, clock_is_monotonic) {
    uint64_t a = tp_now_ns();
    usleep(2000);
    uint64_t b = tp_now_ns();
    cr_assert(b - a >= 1500000);
    cr_assert(tp_wall_s() > 1.7e9);
}

Test(core, datapoint_views_borrow) {
    tp_datapoint_t *dp = tp_datapoint_new(2);
    int64_t shape[] = {3};
    tp_tensor_init_zero(tp_datapoint_get(dp, 0), TP_FLOAT32, 1, shape);
    tp_tensor_init(tp_datapoint_get(dp, 1), TP_INT32, 0, NULL);
    tp_tensor_t v[4];
    cr_assert_eq(tp_datapoint_views(dp, v, 4), 2);
    cr_assert_eq(v[0].data, tp_datapoint_get(dp, 0)->data);
    cr_assert_null((void *)v[0].free_fn, "a view frees nothing");
    tp_tensor_fini(&v[0]);  /* harmless on a view */
    cr_assert_eq(tp_datapoint_views(dp, v, 1), 1);
    tp_datapoint_destroy(&dp);  /* frees the real memory once (ASan checks) */
}

/* ---- the large-block cache behind tp_alloc / tp_free ---- */

static void *s_free_on_thread(void *p) {
    tp_free(p);
    return NULL;
}

Test(core, large_blocks_are_reused_across_threads_and_bounded) {
    tp_alloc_trim();
    cr_assert_eq(tp_alloc_cached_bytes(), 0);
    const size_t batch = 128 * 784;  /* a Fashion-MNIST batch of uint8 */
    void *a = tp_alloc(batch);
    cr_assert_not_null(a);
    memset(a, 7, batch);
    tp_free(a);
    if (tp_alloc_cached_bytes() == 0) {
        /* AddressSanitizer build: every block goes straight back to malloc */
        void *b = tp_alloc(batch);
        cr_assert_not_null(b);
        tp_free(b);
        cr_assert_eq(tp_alloc_cached_bytes(), 0);
        return;
    }
    cr_assert_geq(tp_alloc_cached_bytes(), batch);
    /* made on this thread, freed on another, made again here: the same
     * memory, still aligned */
    void *b = tp_alloc(batch);
    cr_assert_eq(b, a, "a freed block of the same size is handed out again");
    cr_assert_eq((uintptr_t)b % TP_ALIGNMENT, 0);
    cr_assert_eq(tp_alloc_cached_bytes(), 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, s_free_on_thread, b), 0);
    pthread_join(th, NULL);
    cr_assert_eq(tp_alloc(batch), b, "freed by another thread, reused here");
    /* a block far larger than asked is not handed out (waste over 1/8) */
    void *small = tp_alloc(batch / 2);
    cr_assert_neq(small, b);
    tp_free(small);
    tp_free(b);
    /* small blocks are not kept at all */
    size_t before = tp_alloc_cached_bytes();
    tp_free(tp_alloc(4096));
    cr_assert_eq(tp_alloc_cached_bytes(), before);
    /* freeing a lot keeps at most 64 MiB (and 32 blocks) */
    enum { N = 100 };
    void *big[N];
    for (int i = 0; i < N; i++) {
        big[i] = tp_alloc((size_t)3 << 20);
        cr_assert_not_null(big[i]);
    }
    for (int i = 0; i < N; i++)
        tp_free(big[i]);
    cr_assert_leq(tp_alloc_cached_bytes(), (size_t)64 << 20);
    cr_assert_gt(tp_alloc_cached_bytes(), (size_t)32 << 20);
    /* a request larger than any kept block still gets fresh memory */
    void *huge = tp_alloc((size_t)5 << 20);
    cr_assert_not_null(huge);
    memset(huge, 1, (size_t)5 << 20);
    tp_free(huge);
    tp_alloc_trim();
    cr_assert_eq(tp_alloc_cached_bytes(), 0);
}

/* ---- process memory -------------------------------------------------------- */

/* The kernel's view of this process: touching 64 MB raises the resident
 * set and its peak by about that; after freeing it, a reset peak falls
 * back. Another process's memory is readable too; a gone one is named. */
Test(process, memory_now_and_peak_from_the_kernel) {
    int64_t rss0, peak0, rss1, peak1;
    cr_assert_eq(tp_process_memory(0, &rss0, &peak0), TP_OK, "%s", tp_last_error());
    cr_assert_gt(rss0, 0);
    cr_assert_geq(peak0, rss0);
    const size_t big = 64u << 20;
    char *p = malloc(big);
    cr_assert_not_null(p);
    memset(p, 1, big);  /* resident, not only reserved */
    /* the block is never read: without this, an optimising build (GCC
     * -O2 under ThreadSanitizer) may drop the memset as a dead store */
    __asm__ volatile("" : : "r"(p) : "memory");
    cr_assert_eq(tp_process_memory(getpid(), &rss1, &peak1), TP_OK);
    cr_assert_geq(rss1 - rss0, 60 << 10, "rss grew by %lld KiB", (long long)(rss1 - rss0));
    cr_assert_geq(peak1, rss1);
    free(p);  /* a block this large goes back to the kernel at once */
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    /* (a sanitizer's allocator keeps freed blocks in quarantine) */
    if (tp_process_reset_peak() == TP_OK) {
        int64_t rss2, peak2;
        cr_assert_eq(tp_process_memory(0, &rss2, &peak2), TP_OK);
        cr_assert_lt(peak2, peak1 - (32 << 10), "the peak fell after the reset: %lld -> %lld KiB",
                     (long long)peak1, (long long)peak2);
    }
#endif
    cr_assert_eq(tp_process_memory(1 << 30, &rss1, NULL), TP_ERR_NOT_FOUND);
    cr_assert(strstr(tp_last_error(), "memory of process"), "%s", tp_last_error());
}

/* A message with TP_ERR_NOMEM always says out of memory (issue 48), once,
 * also when it is wrapped in context; other statuses are left alone. */
Test(process, out_of_memory_is_always_named) {
    tp_error(TP_ERR_NOMEM, "tower0: %d bytes of activations", 42);
    cr_assert_str_eq(tp_last_error(), "out of memory: tower0: 42 bytes of activations");
    tp_error_wrap(TP_ERR_NOMEM, "building the model");
    cr_assert_str_eq(tp_last_error(),
                     "building the model: out of memory: tower0: 42 bytes of activations");
    tp_error(TP_ERR_NOMEM, "out of memory: said already");
    cr_assert_str_eq(tp_last_error(), "out of memory: said already");
    tp_error(TP_ERR_IO, "disk full");
    cr_assert_str_eq(tp_last_error(), "disk full");
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#include <sys/resource.h>
/* Under ulimit -v the room left is the limit less what is mapped, and a
 * plan past it is refused naming the bytes and the limit; a plan past the
 * machine's RAM and swap is refused without any limit. (Criterion runs
 * each test in its own process: the limit ends with it.) */
Test(process, memory_room_under_an_address_space_limit) {
    tp_mem_room_t room;
    char why[256];
    tp_mem_room(&room, why, sizeof why);
    cr_assert_gt(room.machine, (uint64_t)1 << 20);
    cr_assert_neq(room.machine, UINT64_MAX, "RAM is read from /proc/meminfo");
    cr_assert_eq(tp_mem_check((uint64_t)1 << 62, "lower it", "for %s", "a test"), TP_ERR_NOMEM);
    cr_assert(strstr(tp_last_error(), "out of memory: 4611686018427387904 bytes (4096.0 PiB) "
                     "for a test: more than"), "%s", tp_last_error());
    cr_assert(strstr(tp_last_error(), "; lower it"), "%s", tp_last_error());

    char statm[64];
    FILE *f = fopen("/proc/self/statm", "r");
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(statm, sizeof statm, f));
    fclose(f);
    uint64_t mapped = strtoull(statm, NULL, 10) * (uint64_t)sysconf(_SC_PAGESIZE);
    struct rlimit rl = {mapped + ((uint64_t)256 << 20), RLIM_INFINITY};
    cr_assert_eq(setrlimit(RLIMIT_AS, &rl), 0);
    tp_mem_room(&room, why, sizeof why);
    cr_assert_leq(room.space, (uint64_t)256 << 20);
    cr_assert_geq(room.space, (uint64_t)200 << 20);
    cr_assert(strstr(why, "the address-space limit (ulimit -v)"), "%s", why);
    cr_assert_eq(tp_mem_check((uint64_t)64 << 20, NULL, "for a test"), TP_OK);
    cr_assert_eq(tp_mem_check((uint64_t)512 << 20, NULL, "for a test"), TP_ERR_NOMEM);
    cr_assert(strstr(tp_last_error(), "out of memory: 536870912 bytes (512.0 MiB) for a test: "
                     "more than the address-space limit (ulimit -v)"), "%s", tp_last_error());
}
#endif

/* A process that must end at once (the stop deadline) unlinks the
 * temporaries of the writes it is in the middle of, and only those: a
 * committed file and another process's temporary stay. */
Test(core, pending_atomic_writes_are_unlinked_and_nothing_else) {
    char dir[] = "/tmp/tp-fileio-XXXXXX";
    cr_assert(mkdtemp(dir));
    char done[256], open_[256];
    snprintf(done, sizeof done, "%s/done.bin", dir);
    snprintf(open_, sizeof open_, "%s/open.bin", dir);
    cr_assert_eq(tp_file_write_atomic(done, "old", 3), TP_OK);
    tp_atomic_file_t f;
    cr_assert_eq(tp_atomic_file_open(&f, open_), TP_OK);
    cr_assert_eq(tp_atomic_file_write(&f, "half", 4), TP_OK);
    cr_assert_eq(access(f.tmp, F_OK), 0, "the temporary exists while writing");
    tp_atomic_file_unlink_pending();
    cr_assert_neq(access(f.tmp, F_OK), 0, "the pending temporary %s is left", f.tmp);
    cr_assert_eq(access(done, F_OK), 0, "a committed file was removed");
    cr_assert_neq(access(open_, F_OK), 0, "the target of a cut write exists");
    tp_atomic_file_abort(&f);
    /* after commit or abort nothing is listed: a new write's file stays */
    tp_atomic_file_t g;
    cr_assert_eq(tp_atomic_file_open(&g, open_), TP_OK);
    cr_assert_eq(tp_atomic_file_write(&g, "x", 1), TP_OK);
    cr_assert_eq(tp_atomic_file_commit(&g), TP_OK);
    tp_atomic_file_unlink_pending();
    cr_assert_eq(access(open_, F_OK), 0);
    unlink(done);
    unlink(open_);
    rmdir(dir);
}

/* A file that cannot be made is named first, then the system's reason:
 * the temporary's name led ("creating X.onnx.tmp.PID: ..."), as if the
 * user had asked for that file. */
Test(core, an_atomic_write_that_cannot_start_names_its_file) {
    const char *path = "/tmp/tp-no-such-dir-for-a-test/x.onnx";
    cr_assert_eq(tp_file_write_atomic(path, "x", 1), TP_ERR_IO);
    const char *want = "creating /tmp/tp-no-such-dir-for-a-test/x.onnx: No such file or "
                       "directory (written as /tmp/tp-no-such-dir-for-a-test/x.onnx.tmp.";
    cr_assert(strstr(tp_last_error(), want) == tp_last_error(), "%s", tp_last_error());
}
