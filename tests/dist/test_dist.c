/* towerpack tests: the MPI-free half of distributed training: the
 * launcher's environment, the shard input (every batch of the common stream
 * goes to exactly one rank's tower, in the order one process with towers x
 * ranks towers would use; resume skips whole steps), and a clear error when
 * the MPI module is absent. The MPI half runs under mpirun in tests/mpi. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/dist.h>

/* An input whose i-th batch (after `skip`) is a scalar int64 i. */
typedef struct {
    int64_t next, size;
    int started;
} s_count_t;

static tp_status_t c_start(void *impl, int towers, uint64_t seed, int64_t skip) {
    s_count_t *c = impl;
    c->next = skip;
    c->started = 1;
    return TP_OK;
}

static tp_status_t c_next(void *impl, int tower, tp_datapoint_t **out) {
    s_count_t *c = impl;
    cr_assert(c->started);
    tp_datapoint_t *dp = tp_datapoint_new(1);
    int64_t shape[1] = {1};
    cr_assert_eq(tp_tensor_init(tp_datapoint_get(dp, 0), TP_INT64, 1, shape), TP_OK);
    ((int64_t *)tp_datapoint_get(dp, 0)->data)[0] = c->next++;
    *out = dp;
    return TP_OK;
}

static int64_t c_size(void *impl) { return ((s_count_t *)impl)->size; }
static void c_destroy(void *impl) { free(impl); }

static const tp_input_ops_t s_count_ops = {
    .name = "Count", .start = c_start, .next = c_next, .size = c_size,
    .destroy = c_destroy,
};

static tp_input_t *s_count(int64_t size) {
    s_count_t *c = calloc(1, sizeof *c);
    c->size = size;
    return tp_input_new(&s_count_ops, c);
}

static int64_t s_take(tp_input_t *in, int tower) {
    tp_datapoint_t *dp = NULL;
    cr_assert_eq(tp_input_ops(in)->next(tp_input_impl(in), tower, &dp), TP_OK,
                 "%s", tp_last_error());
    int64_t v = ((const int64_t *)tp_datapoint_cget(dp, 0)->data)[0];
    tp_datapoint_destroy(&dp);
    return v;
}

Test(dist, shard_partitions_the_stream_like_one_process) {
    /* 3 ranks x 2 towers: one process with 6 towers gives tower k of step s
     * batch 6s + k; rank r's tower t is that process's tower 2r + t */
    const int size = 3, towers = 2, steps = 5;
    int seen[64] = {0};
    for (int r = 0; r < size; r++) {
        tp_input_t *in = tp_input_shard(s_count(60), r, size);
        cr_assert_not_null(in);
        cr_assert_str_eq(tp_input_name(in), "ShardInput");
        cr_assert_eq(tp_input_ops(in)->size(tp_input_impl(in)), 20);
        cr_assert_eq(tp_input_ops(in)->start(tp_input_impl(in), towers, 1, 0), TP_OK);
        for (int s = 0; s < steps; s++)
            for (int t = 0; t < towers; t++) {
                int64_t v = s_take(in, t);
                cr_assert_eq(v, (int64_t)s * size * towers + r * towers + t,
                             "rank %d step %d tower %d got %lld", r, s, t, (long long)v);
                seen[v]++;
            }
        tp_input_destroy(&in);
        cr_assert_null(in);
    }
    for (int i = 0; i < steps * size * towers; i++)
        cr_assert_eq(seen[i], 1, "batch %d taken %d times", i, seen[i]);
}

Test(dist, shard_resume_skips_whole_steps_of_the_job) {
    /* resumed after 4 steps: the trainer asks each rank to skip 4 x towers
     * of its batches; the common stream has moved 4 x towers x size */
    tp_input_t *in = tp_input_shard(s_count(-1), 1, 2);
    cr_assert_eq(tp_input_ops(in)->size(tp_input_impl(in)), -1);
    cr_assert_eq(tp_input_ops(in)->start(tp_input_impl(in), 1, 1, 4), TP_OK);
    cr_assert_eq(s_take(in, 0), 9);   /* step 4 of 2 ranks x 1 tower: 8, 9 */
    cr_assert_eq(s_take(in, 0), 11);
    tp_input_destroy(&in);
}

Test(dist, shard_rejects_a_bad_rank) {
    tp_input_t *in = tp_input_shard(s_count(10), 2, 2);
    cr_assert_null(in);
    cr_assert(strstr(tp_last_error(), "rank 2 of 2"), "%s", tp_last_error());
    cr_assert_null(tp_input_shard(NULL, 0, 1));
}

Test(dist, launcher_environment) {
    const char *names[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK",
                           "PMI_SIZE", "PMIX_RANK", "PMIX_SIZE", "SLURM_PROCID",
                           "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        unsetenv(names[i]);
    int rank = -1, size = -1;
    const char *who = NULL;
    cr_assert_eq(tp_dist_env(&rank, &size, &who), 0);
    /* one task is not distributed */
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "1", 1);
    cr_assert_eq(tp_dist_env(&rank, &size, &who), 0);
    setenv("SLURM_PROCID", "3", 1);
    setenv("SLURM_NTASKS", "4", 1);
    cr_assert_eq(tp_dist_env(&rank, &size, &who), 1);
    cr_assert_eq(rank, 3);
    cr_assert_eq(size, 4);
    cr_assert_str_eq(who, "Slurm");
    /* Open MPI's variables come first; garbage is ignored */
    setenv("OMPI_COMM_WORLD_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "2x", 1);
    cr_assert_eq(tp_dist_env(&rank, &size, &who), 1);
    cr_assert_str_eq(who, "Slurm");
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    cr_assert_eq(tp_dist_env(&rank, &size, NULL), 1);
    cr_assert_eq(rank, 1);
    cr_assert_eq(size, 2);
    cr_assert_eq(tp_dist_env(NULL, NULL, &who), 1);
    cr_assert_str_eq(who, "Open MPI");
}

/* The rank's place on its host (tp-train --devices local): Open MPI's
 * variable first, then MPICH's, then Slurm's; garbage is ignored. */
Test(dist, local_rank_from_the_launcher) {
    unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    unsetenv("MPI_LOCALRANKID");
    unsetenv("SLURM_LOCALID");
    cr_assert_eq(tp_dist_local_rank(), -1);
    setenv("SLURM_LOCALID", "2", 1);
    cr_assert_eq(tp_dist_local_rank(), 2);
    setenv("MPI_LOCALRANKID", "1", 1);
    cr_assert_eq(tp_dist_local_rank(), 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "x3", 1);
    cr_assert_eq(tp_dist_local_rank(), 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
    cr_assert_eq(tp_dist_local_rank(), 3);
}

Test(dist, open_without_the_module_is_a_clear_error) {
    setenv("TP_MPI_MODULE", "/nonexistent/libtowerpack_mpi.so", 1);
    tp_dist_t *d = (tp_dist_t *)1;
    cr_assert_eq(tp_dist_open(&d), TP_ERR_UNSUPPORTED);
    cr_assert_null(d);
    cr_assert(strstr(tp_last_error(), "libtowerpack_mpi.so"), "%s", tp_last_error());
    cr_assert(strstr(tp_last_error(), "libopenmpi-dev"), "%s", tp_last_error());
}

Test(dist, configure_needs_an_input) {
    cr_assert_eq(tp_dist_configure(NULL, NULL, 1), TP_ERR_INVALID);
}
