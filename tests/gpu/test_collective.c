/* towerpack tests: the all-reduce of gradient buffers (gpu/graph/
 * collective.c) on plain arrays, with no model: buckets cut from variable
 * offsets and their last writers, begun and ended by ranks on their own
 * threads, and one thread reducing every buffer onto the first. */
#include <criterion/criterion.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/towerpack.h>
#include "gpu/backend_impl.h"
#include "gpu/graph/collective.h"

/* Four variables of 16 floats in a buffer of 64; their gradients are final
 * after nodes 5, 3, 9 and 2 (backward runs from the highest node down). */
static const size_t s_off[4] = {0, 16, 32, 48};
static const int s_after[4] = {5, 3, 9, 2};

Test(collective, buckets_close_at_their_size_and_begin_after_their_last_writer) {
    struct tp_bucket *bk = NULL;
    int nb = -1;
    cr_assert_eq(tp_buckets_plan_(s_off, s_after, 4, 64, 10, 32, &bk, &nb), TP_OK);
    /* from the end: [32, 64) closes at 32 floats, its earliest writer node
     * 2; [0, 32) at the buffer's start, node 3. Begun in backward order:
     * node 3's first */
    cr_assert_eq(nb, 2);
    cr_expect(bk[0].lo == 0 && bk[0].hi == 32 && bk[0].after == 3,
              "bucket 0: [%zu, %zu) after %d", bk[0].lo, bk[0].hi, bk[0].after);
    cr_expect(bk[1].lo == 32 && bk[1].hi == 64 && bk[1].after == 2,
              "bucket 1: [%zu, %zu) after %d", bk[1].lo, bk[1].hi, bk[1].after);
    free(bk);
}

Test(collective, one_bucket_per_variable_in_backward_order) {
    struct tp_bucket *bk = NULL;
    int nb = -1;
    cr_assert_eq(tp_buckets_plan_(s_off, s_after, 4, 64, 10, 1, &bk, &nb), TP_OK);
    const size_t lo[4] = {32, 0, 16, 48};  /* after 9, 5, 3, 2 */
    cr_assert_eq(nb, 4);
    for (int k = 0; k < 4; k++)
        cr_expect_eq(bk[k].lo, lo[k], "bucket %d starts at %zu", k, bk[k].lo);
    free(bk);
}

Test(collective, gradients_never_written_are_begun_first) {
    const int never[4] = {10, 10, 10, 10};
    struct tp_bucket *bk = NULL;
    int nb = -1;
    cr_assert_eq(tp_buckets_plan_(s_off, never, 4, 64, 10, 64, &bk, &nb), TP_OK);
    cr_assert_eq(nb, 1);
    cr_expect(bk[0].lo == 0 && bk[0].hi == 64 && bk[0].after == 10);
    free(bk);
}

/* Two ranks on threads of their own, each beginning every bucket of its
 * buffer and ending them: both hold the mean. */
typedef struct {
    tp_reduce_rank_t r;
    const struct tp_bucket *bk;
    int nb;
    tp_status_t rc;
} s_rank_arg_t;

static void *s_rank(void *p) {
    s_rank_arg_t *a = p;
    int k = 0;
    a->rc = tp_buckets_begin_(&a->r, a->bk, a->nb, &k, INT_MIN);
    if (a->rc == TP_OK && k != a->nb)
        a->rc = TP_ERR_STATE;
    if (a->rc == TP_OK)
        a->rc = tp_buckets_end_(&a->r);
    return NULL;
}

Test(collective, ranks_on_their_threads_end_with_the_mean) {
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    tp_comm_t *comm = b->ops->comm_new(b, 2);
    cr_assert_not_null(comm);
    float g[2][64];
    for (int i = 0; i < 64; i++) {
        g[0][i] = (float)i;
        g[1][i] = (float)(3 * i);
    }
    struct tp_bucket *bk = NULL;
    int nb = 0;
    cr_assert_eq(tp_buckets_plan_(s_off, s_after, 4, 64, 10, 16, &bk, &nb), TP_OK);
    s_rank_arg_t a[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        a[r] = (s_rank_arg_t){{b, comm, r, NULL, g[r], 64, 1, r ? "r1" : "r0"},
                              bk, nb, TP_OK};
        cr_assert_eq(pthread_create(&th[r], NULL, s_rank, &a[r]), 0);
    }
    for (int r = 0; r < 2; r++) {
        pthread_join(th[r], NULL);
        cr_expect_eq(a[r].rc, TP_OK, "rank %d: %s", r, tp_last_error());
    }
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 64; i++)
            cr_expect_eq(g[r][i], (float)(2 * i), "rank %d float %d: %f", r, i,
                         (double)g[r][i]);
    free(bk);
    b->ops->comm_destroy(b, comm);
    tp_backend_destroy(&b);
}

Test(collective, one_thread_sums_every_buffer_onto_the_first) {
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    float g0[8], g1[8], g2[8];
    for (int i = 0; i < 8; i++) {
        g0[i] = 1.0f;
        g1[i] = 2.0f;
        g2[i] = (float)i;
    }
    float *bufs[3] = {g0, g1, g2};
    cr_assert_eq(tp_allreduce_root_(b, bufs, 3, 8, 0), TP_OK);
    for (int i = 0; i < 8; i++) {
        cr_expect_eq(g0[i], 3.0f + (float)i);
        cr_expect_eq(g1[i], 2.0f, "the others keep their own");
    }
    tp_backend_destroy(&b);
}

/* The all-reduce fused with SGD (backend_impl.h's allreduce_sgd), ranks on
 * their threads, against allreduce then one sgd_update of the whole
 * buffer: the same bits in the sums, the weights and the momentum, for
 * momentum, Nesterov and plain SGD; 3 ranks over 5000 floats, so that the
 * slices are uneven and cross the 1024-float blocks. */
enum { S_FN = 5000, S_FR = 3 };

typedef struct {
    tp_backend_t *b;
    tp_comm_t *comm;
    int rank, fused;
    float *g, *w, *v;
    float lr, mu;
    int nesterov;
    tp_status_t rc;
} s_fused_arg_t;

static void *s_fused_rank(void *p) {
    s_fused_arg_t *a = p;
    if (a->fused)
        a->rc = a->b->ops->allreduce_sgd(a->b, a->comm, a->rank, NULL, a->g, S_FN, 1,
                                         a->w, a->v, a->lr, a->mu, a->nesterov);
    else
        a->rc = a->b->ops->allreduce(a->b, a->comm, a->rank, NULL, a->g, S_FN, 1);
    return NULL;
}

/* Two identical copies (k 0 and 1) of every rank's gradient, the weights
 * and the momentum, from the seed. */
static void s_fused_fill(float g[2][S_FR][S_FN], float w[2][S_FN], float v[2][S_FN],
                         uint64_t x) {
    for (int i = 0; i < S_FN; i++) {
        for (int r = 0; r < S_FR; r++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            g[0][r][i] = g[1][r][i] = (float)((int64_t)(x >> 40) - (1 << 23)) / 3e6f;
        }
        w[0][i] = w[1][i] = (float)((i * 37) % 101) / 7.0f - 7.0f;
        v[0][i] = v[1][i] = (float)((i * 13) % 17) / 29.0f;
    }
}

/* Every rank of a[] (a[r] given but for its rank's buffers) on a thread of
 * its own, through fn; asserts each one's status. */
static void s_fused_ranks(s_fused_arg_t *a, void *(*fn)(void *)) {
    pthread_t th[S_FR];
    for (int r = 0; r < S_FR; r++)
        cr_assert_eq(pthread_create(&th[r], NULL, fn, &a[r]), 0);
    for (int r = 0; r < S_FR; r++) {
        pthread_join(th[r], NULL);
        cr_assert_eq(a[r].rc, TP_OK, "rank %d: %s", r, tp_last_error());
    }
}

static void s_fused_case(tp_backend_t *b, float mu, int nesterov) {
    static float g[2][S_FR][S_FN], w[2][S_FN], v[2][S_FN];
    s_fused_fill(g, w, v, 12345);
    for (int k = 0; k < 2; k++) {  /* k 0: allreduce then sgd_update; 1: fused */
        tp_comm_t *comm = b->ops->comm_new(b, S_FR);
        cr_assert_not_null(comm);
        s_fused_arg_t a[S_FR];
        for (int r = 0; r < S_FR; r++)
            a[r] = (s_fused_arg_t){b, comm, r, k, g[k][r], w[k], mu > 0 ? v[k] : NULL,
                                   0.05f, mu, nesterov, TP_OK};
        s_fused_ranks(a, s_fused_rank);
        if (k == 0)
            cr_assert_eq(b->ops->sgd_update(b, NULL, w[0], g[0][0], mu > 0 ? v[0] : NULL,
                                            S_FN, 0.05f, mu, nesterov), TP_OK);
        b->ops->comm_destroy(b, comm);
    }
    for (int r = 0; r < S_FR; r++)
        cr_expect_eq(memcmp(g[0][r], g[1][r], sizeof g[0][r]), 0, "rank %d's sums", r);
    cr_expect_eq(memcmp(w[0], w[1], sizeof w[0]), 0, "weights (momentum %g, nesterov %d)",
                 (double)mu, nesterov);
    cr_expect_eq(memcmp(v[0], v[1], sizeof v[0]), 0, "momentum (momentum %g, nesterov %d)",
                 (double)mu, nesterov);
}

Test(collective, allreduce_fused_with_sgd_gives_allreduce_then_sgd_bit_for_bit) {
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    cr_assert_not_null(b->ops->allreduce_sgd, "the CPU backend fuses the update");
    s_fused_case(b, 0.9f, 0);
    s_fused_case(b, 0.9f, 1);
    s_fused_case(b, 0.0f, 0);
    tp_backend_destroy(&b);
}

/* The same fused with SGD's coupled decay (allreduce_sgd_wd), a decay a
 * segment (some 0, segments inside and across the 1024-float blocks and
 * the ranks' slices): the bits of allreduce then sgd_wd_update (or
 * sgd_update where the decay is 0) segment by segment. */
static const size_t s_wd_seg[] = {0, 700, 1024, 1100, 1667, 3000, 3001, S_FN};
static const float s_wd_decay[] = {0.1f, 0.0f, 0.02f, 0.5f, 0.0f, 0.07f, 0.3f};
enum { S_WD_NSEG = 7 };

static void *s_fused_wd_rank(void *p) {
    s_fused_arg_t *a = p;
    if (a->fused)
        a->rc = a->b->ops->allreduce_sgd_wd(a->b, a->comm, a->rank, NULL, a->g, S_FN, 1,
                                            a->w, a->v, a->lr, a->mu, a->nesterov,
                                            s_wd_seg, s_wd_decay, S_WD_NSEG);
    else
        a->rc = a->b->ops->allreduce(a->b, a->comm, a->rank, NULL, a->g, S_FN, 1);
    return NULL;
}

Test(collective, allreduce_fused_with_decayed_sgd_gives_allreduce_then_the_update_bit_for_bit) {
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    cr_assert_not_null(b->ops->allreduce_sgd_wd, "the CPU backend fuses the decayed update");
    static float g[2][S_FR][S_FN], w[2][S_FN], v[2][S_FN];
    s_fused_fill(g, w, v, 777);
    for (int k = 0; k < 2; k++) {
        tp_comm_t *comm = b->ops->comm_new(b, S_FR);
        cr_assert_not_null(comm);
        s_fused_arg_t a[S_FR];
        for (int r = 0; r < S_FR; r++)
            a[r] = (s_fused_arg_t){b, comm, r, k, g[k][r], w[k], v[k], 0.05f, 0.9f, 0, TP_OK};
        s_fused_ranks(a, s_fused_wd_rank);
        for (int s = 0; k == 0 && s < S_WD_NSEG; s++) {
            const size_t o = s_wd_seg[s], n = s_wd_seg[s + 1] - o;
            cr_assert_eq(s_wd_decay[s] > 0
                             ? b->ops->sgd_wd_update(b, NULL, w[0] + o, g[0][0] + o, v[0] + o,
                                                     n, 0.05f, 0.9f, 0, s_wd_decay[s])
                             : b->ops->sgd_update(b, NULL, w[0] + o, g[0][0] + o, v[0] + o, n,
                                                  0.05f, 0.9f, 0),
                         TP_OK);
        }
        b->ops->comm_destroy(b, comm);
    }
    cr_expect_eq(memcmp(w[0], w[1], sizeof w[0]), 0, "weights");
    cr_expect_eq(memcmp(v[0], v[1], sizeof v[0]), 0, "momentum");
    /* segments that do not cover the buffer are refused, naming it */
    tp_comm_t *comm = b->ops->comm_new(b, 1);
    const size_t bad[] = {0, 10};
    cr_expect_eq(b->ops->allreduce_sgd_wd(b, comm, 0, NULL, g[0][0], S_FN, 1, w[0], v[0],
                                          0.05f, 0.9f, 0, bad, s_wd_decay, 1),
                 TP_ERR_INVALID);
    cr_expect(strstr(tp_last_error(), "segments"), "%s", tp_last_error());
    b->ops->comm_destroy(b, comm);
    tp_backend_destroy(&b);
}

/* The all-reduce fused with the global-norm clip and Adam/AdamW
 * (allreduce_adam) against allreduce, grad_sumsq over the whole buffer,
 * grad_clip, then adam_update a decay segment at a time: the same bits in
 * the weights and both moments. 3 ranks over 20000 floats: the slices
 * start on the sum of squares' 4096-float blocks and the last is short;
 * gradients over six decades, so that a norm added in another order
 * would round differently. Clipped, not clipped (a norm under the clip),
 * no clip; AdamW's segments and Adam's none. Two ranks (the GPT's 2
 * towers x 1 thread) take their own loop, the sums' squares in the same
 * pass (tp_cpu_sum2_sumsq_block): with the mean and without, and a
 * length whose last block ends off the squares' eight lanes. */
enum { S_AN = 20000, S_AR = 3 };
static const size_t s_adam_seg[] = {0, 700, 4096, 4100, 8191, 8193, 13000, S_AN};
static const float s_adam_decay[] = {0.1f, 0.0f, 0.02f, 0.5f, 0.0f, 0.07f, 0.3f};
enum { S_ADAM_NSEG = 7 };

typedef struct {
    tp_backend_t *b;
    tp_comm_t *comm;
    int rank, fused, nseg, average;
    size_t count;
    float *g, *w, *m, *v;
    float clip;
    tp_status_t rc;
} s_adam_arg_t;

static void *s_adam_rank(void *p) {
    s_adam_arg_t *a = p;
    if (a->fused)
        a->rc = a->b->ops->allreduce_adam(a->b, a->comm, a->rank, NULL, a->g, a->count,
                                          a->average,
                                          a->w, a->m, a->v, 1e-3f, 0.9f, 0.95f, 1e-8f, 3,
                                          a->clip, a->nseg ? s_adam_seg : NULL,
                                          a->nseg ? s_adam_decay : NULL, a->nseg);
    else
        a->rc = a->b->ops->allreduce(a->b, a->comm, a->rank, NULL, a->g, a->count,
                                     a->average);
    return NULL;
}

/* nr ranks over the first `count` floats (all of them with segments) */
static void s_adam_case(tp_backend_t *b, int nr, size_t count, int average, float clip,
                        int nseg) {
    static float g[2][S_AR][S_AN], w[2][S_AN], m[2][S_AN], v[2][S_AN];
    uint64_t x = 4242;
    for (int i = 0; i < S_AN; i++) {
        for (int r = 0; r < S_AR; r++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            const float mant = (float)((int64_t)(x >> 40) - (1 << 23)) / 8e6f;
            g[0][r][i] = g[1][r][i] = mant * powf(10.0f, (float)((x >> 20) % 7) - 4.0f);
        }
        w[0][i] = w[1][i] = (float)((i * 37) % 101) / 7.0f - 7.0f;
        m[0][i] = m[1][i] = (float)((i * 11) % 23) / 230.0f - 0.05f;
        v[0][i] = v[1][i] = (float)((i * 13) % 17) / 2900.0f;
    }
    for (int k = 0; k < 2; k++) {  /* k 0: the unfused calls; 1: fused */
        tp_comm_t *comm = b->ops->comm_new(b, nr);
        cr_assert_not_null(comm);
        pthread_t th[S_AR];
        s_adam_arg_t a[S_AR];
        for (int r = 0; r < nr; r++) {
            a[r] = (s_adam_arg_t){b,     comm,     r,    k,    nseg, average, count,
                                  g[k][r], w[k], m[k], v[k], clip, TP_OK};
            cr_assert_eq(pthread_create(&th[r], NULL, s_adam_rank, &a[r]), 0);
        }
        for (int r = 0; r < nr; r++) {
            pthread_join(th[r], NULL);
            cr_assert_eq(a[r].rc, TP_OK, "rank %d: %s", r, tp_last_error());
        }
        if (k == 0) {
            float acc[1];
            cr_assert_eq(b->ops->grad_sumsq(b, NULL, g[0][0], count, acc, 0), TP_OK);
            if (clip > 0)
                cr_assert_eq(b->ops->grad_clip(b, NULL, g[0][0], count, clip, acc), TP_OK);
            for (int s = 0; s < (nseg ? nseg : 1); s++) {
                const size_t o = nseg ? s_adam_seg[s] : 0;
                const size_t n = nseg ? s_adam_seg[s + 1] - o : count;
                cr_assert_eq(b->ops->adam_update(b, NULL, w[0] + o, g[0][0] + o, m[0] + o,
                                                 v[0] + o, n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                                                 nseg ? s_adam_decay[s] : 0.0f, 3),
                             TP_OK);
            }
        }
        b->ops->comm_destroy(b, comm);
    }
    cr_expect_eq(memcmp(w[0], w[1], sizeof w[0]), 0,
                 "weights (%d ranks, average %d, clip %g, %d segments)", nr, average,
                 (double)clip, nseg);
    cr_expect_eq(memcmp(m[0], m[1], sizeof m[0]), 0, "first moment (%d ranks, clip %g)", nr,
                 (double)clip);
    cr_expect_eq(memcmp(v[0], v[1], sizeof v[0]), 0, "second moment (%d ranks, clip %g)", nr,
                 (double)clip);
}

Test(collective, allreduce_fused_with_clip_and_adam_gives_the_unfused_calls_bit_for_bit) {
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    cr_assert_not_null(b->ops->allreduce_adam, "the CPU backend fuses clip and Adam");
    s_adam_case(b, S_AR, S_AN, 1, 0.5f, S_ADAM_NSEG);  /* the norm is ~5600: clipped */
    s_adam_case(b, S_AR, S_AN, 1, 1e6f, S_ADAM_NSEG);  /* under the clip */
    s_adam_case(b, S_AR, S_AN, 1, 0.0f, S_ADAM_NSEG);  /* no clip */
    s_adam_case(b, S_AR, S_AN, 1, 0.5f, 0);            /* Adam: no decay anywhere */
    /* segments that do not cover the buffer are refused, naming them */
    tp_comm_t *comm = b->ops->comm_new(b, 1);
    static float g[S_AN], w[S_AN], m[S_AN], v[S_AN];
    const size_t bad[] = {0, 10};
    cr_expect_eq(b->ops->allreduce_adam(b, comm, 0, NULL, g, S_AN, 1, w, m, v, 1e-3f, 0.9f,
                                        0.95f, 1e-8f, 1, 1.0f, bad, s_adam_decay, 1),
                 TP_ERR_INVALID);
    cr_expect(strstr(tp_last_error(), "segments"), "%s", tp_last_error());
    b->ops->comm_destroy(b, comm);
    tp_backend_destroy(&b);
}

/* Two ranks, the towers' case: their own loop (the sums and their squares
 * in one pass), the same bits as the unfused calls. 20000 floats cut at
 * 12288 (three 4096-float blocks, then two, the last short); 19995 ends
 * the last block 3 floats past a multiple of the eight lanes. */
Test(collective, allreduce_adam_on_two_ranks_gives_the_unfused_calls_bit_for_bit) {
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    s_adam_case(b, 2, S_AN, 1, 0.5f, S_ADAM_NSEG);   /* the mean, clipped */
    s_adam_case(b, 2, S_AN, 0, 0.5f, S_ADAM_NSEG);   /* the sum, clipped */
    s_adam_case(b, 2, S_AN, 1, 1e6f, S_ADAM_NSEG);   /* under the clip */
    s_adam_case(b, 2, S_AN - 5, 1, 0.5f, 0);         /* Adam, the lanes' tail */
    s_adam_case(b, 2, S_AN - 5, 0, 0.0f, 0);         /* no clip, no mean */
    tp_backend_destroy(&b);
}
