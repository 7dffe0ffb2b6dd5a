/* tp-soak: the two ends of the soak test (scripts/soak.sh). Datapoints
 * that number themselves go through multi-process and remote dataflow
 * into a training run of a tiny model, and the receiving end checks that
 * none is lost or duplicated.
 *
 *   tp-soak send  --connect EP --id K [--procs P] [--batch B] --count M
 *       K: this sender's number; P forked workers (MultiProcessRunnerZMQ)
 *       each make 28x28 uint8 images whose first bytes carry (sequence,
 *       worker stream, sender); batched by B; M batches sent to EP.
 *   tp-soak train --bind EP --batches N [--batch B] [--epochs E] [--timeout S]
 *       trains a linear classifier (784 -> 10) on N batches from EP (the
 *       data path dominates) and checks every row: for each (sender,
 *       stream) the sequence must run 0, 1, 2, ... with no gap and no
 *       repeat. Prints one JSON line with the counts; exit 0 when all N
 *       batches arrived and were trained, 1 otherwise. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/towerpack.h>
#include <towerpack/models.h>

#define IMG 784
#define MAX_STREAMS 4096

/* ---- the numbered source --------------------------------------------------------- */

typedef struct {
    uint64_t seq;      /* across passes: never restarts */
    uint16_t stream, sender;
} s_gen_t;

static tp_status_t gen_reset(void *impl, tp_rng_t *rng, uint64_t seed, uint64_t stream) {
    (void)rng;
    (void)seed;
    ((s_gen_t *)impl)->stream = (uint16_t)stream;
    return TP_OK;
}

static tp_status_t gen_next(void *impl, tp_datapoint_t **out) {
    s_gen_t *g = impl;
    int64_t shape[2] = {28, 28};
    tp_tensor_t img, label;
    TP_TRY(tp_tensor_init_zero(&img, TP_UINT8, 2, shape));
    uint8_t *p = img.data;
    uint32_t seq = (uint32_t)g->seq;
    memcpy(p, &seq, 4);
    memcpy(p + 4, &g->stream, 2);
    memcpy(p + 6, &g->sender, 2);
    for (int i = 8; i < IMG; i++)  /* something to learn: a bright column per class */
        p[i] = (uint8_t)((i % 28) == (int)(g->seq % 10) * 2 + 4 ? 200 : 0);
    if (tp_tensor_init(&label, TP_INT32, 0, NULL) < 0) {
        tp_tensor_fini(&img);
        return tp_error(TP_ERR_NOMEM, "soak source");
    }
    *(int32_t *)label.data = (int32_t)(g->seq % 10);
    tp_datapoint_t *dp = tp_datapoint_new(0);
    if (!dp) {
        tp_tensor_fini(&img);
        tp_tensor_fini(&label);
        return tp_error(TP_ERR_NOMEM, "soak source");
    }
    tp_datapoint_append(dp, &img);
    tp_datapoint_append(dp, &label);
    g->seq++;
    *out = dp;
    return TP_OK;
}

static int64_t gen_size(void *impl) {
    (void)impl;
    return -1;
}

static void gen_destroy(void *impl) { free(impl); }

static const tp_dataflow_ops_t s_gen_ops = {.name = "soak-source", .reset_state = gen_reset,
                                            .next = gen_next, .size = gen_size,
                                            .destroy = gen_destroy};

static int s_send(int argc, char **argv) {
    static const struct option opts[] = {
        {"connect", required_argument, 0, 'c'}, {"id", required_argument, 0, 'i'},
        {"procs", required_argument, 0, 'p'},   {"batch", required_argument, 0, 'b'},
        {"count", required_argument, 0, 'n'},   {"lz4", no_argument, 0, 'z'},
        {"curve", required_argument, 0, 'k'},   {0, 0, 0, 0}};
    const char *ep = NULL;
    int id = 0, procs = 2, batch = 256, c;
    tp_send_opts_t so;
    tp_send_opts_init(&so);
    so.linger_s = 30;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'c': ep = optarg; break;
        case 'i': id = atoi(optarg); break;
        case 'p': procs = atoi(optarg); break;
        case 'b': batch = atoi(optarg); break;
        case 'n': so.max_count = atoll(optarg); break;
        case 'z': so.lz4 = 1; break;
        case 'k': so.curve_dir = optarg; break;
        default: return 2;
        }
    }
    if (!ep || so.max_count <= 0 || procs < 1 || batch < 1 || id < 0 || id > 65535) {
        fprintf(stderr, "tp-soak send: needs --connect EP and --count M > 0\n");
        return 2;
    }
    s_gen_t *g = calloc(1, sizeof *g);
    g->sender = (uint16_t)id;
    tp_dataflow_t *src = tp_dataflow_new(&s_gen_ops, g);
    tp_mp_opts_t mo;
    tp_mp_opts_init(&mo);
    mo.hwm = 64;
    tp_dataflow_t *df = tp_df_batch(tp_df_multiprocess(src, procs, &mo), batch, 1);
    if (!df || tp_signals_install() < 0) {
        fprintf(stderr, "tp-soak send: %s\n", tp_last_error());
        return 1;
    }
    so.seed = (uint64_t)id + 1;
    uint64_t sent = 0;
    double t0 = tp_now_s();
    tp_status_t rc = tp_send_dataflow(df, ep, &so, &sent);
    double dt = tp_now_s() - t0;
    printf("{\"role\":\"send\",\"id\":%d,\"batches\":%llu,\"datapoints\":%llu,\"seconds\":%.1f,"
           "\"ok\":%s}\n", id, (unsigned long long)sent, (unsigned long long)sent * batch, dt,
           rc == TP_OK ? "true" : "false");
    if (rc < 0)
        fprintf(stderr, "tp-soak send: %s\n", tp_last_error());
    tp_dataflow_destroy(&df);
    return rc == TP_OK ? 0 : 1;
}

/* ---- the checking end ------------------------------------------------------------ */

typedef struct {
    tp_dataflow_t *inner;
    uint32_t key[MAX_STREAMS];    /* sender << 16 | stream, +1 (0: empty) */
    uint64_t next[MAX_STREAMS];   /* expected sequence */
    uint64_t rows, batches, gaps, repeats;
    char first_problem[256];
} s_check_t;

static tp_status_t chk_reset(void *impl, tp_rng_t *rng, uint64_t seed, uint64_t stream) {
    (void)rng;
    return tp_dataflow_reset_state(((s_check_t *)impl)->inner, seed, stream);
}

static uint64_t *s_slot(s_check_t *c, uint32_t key) {
    uint32_t h = (key * 2654435761u) % MAX_STREAMS;
    for (int i = 0; i < MAX_STREAMS; i++, h = (h + 1) % MAX_STREAMS) {
        if (c->key[h] == key + 1)
            return &c->next[h];
        if (c->key[h] == 0) {
            c->key[h] = key + 1;
            return &c->next[h];
        }
    }
    return NULL;
}

static tp_status_t chk_next(void *impl, tp_datapoint_t **out) {
    s_check_t *c = impl;
    TP_TRY(tp_dataflow_next(c->inner, out));
    const tp_tensor_t *img = tp_datapoint_cget(*out, 0);
    if (img->ndim != 3 || img->shape[1] * img->shape[2] != IMG || img->dtype != TP_UINT8)
        return tp_error(TP_ERR_FORMAT, "soak: a batch of the wrong shape (ndim %d, dtype %d, "
                        "%lld x %lld)", img->ndim, (int)img->dtype,
                        (long long)(img->ndim > 1 ? img->shape[1] : 0),
                        (long long)(img->ndim > 2 ? img->shape[2] : 0));
    const uint8_t *p = img->data;
    for (int64_t r = 0; r < img->shape[0]; r++, p += IMG) {
        uint32_t seq;
        uint16_t stream, sender;
        memcpy(&seq, p, 4);
        memcpy(&stream, p + 4, 2);
        memcpy(&sender, p + 6, 2);
        uint64_t *next = s_slot(c, (uint32_t)sender << 16 | stream);
        if (!next)
            return tp_error(TP_ERR_FORMAT, "soak: more than %d streams", MAX_STREAMS);
        if (seq != (uint32_t)*next) {
            if (seq < (uint32_t)*next)
                c->repeats++;
            else
                c->gaps++;
            if (!c->first_problem[0])
                snprintf(c->first_problem, sizeof c->first_problem,
                         "sender %u stream %u: got %u, expected %llu", sender, stream, seq,
                         (unsigned long long)*next);
        }
        *next = (uint64_t)seq + 1;
        c->rows++;
    }
    c->batches++;
    return TP_OK;
}

static void chk_destroy(void *impl) {
    s_check_t *c = impl;
    tp_dataflow_destroy(&c->inner);
}

static const tp_dataflow_ops_t s_check_ops = {.name = "soak-check", .reset_state = chk_reset,
                                              .next = chk_next, .destroy = chk_destroy};

static tp_status_t s_linear(tp_tower_t *t, tp_node_t *const *in, void *user) {
    (void)user;
    tp_node_t *x = tp_flatten(t, "flat", tp_cast(t, "input", in[0], 1.0f / 255));
    tp_node_t *logits = tp_fc(t, "linear", x, 10, 1);
    tp_node_t *cost = tp_softmax_xent(t, "cost", logits, in[1]);
    tp_tower_add_output(t, "cost", cost);
    TP_TRY(tp_tower_status(t));
    return tp_tower_set_cost(t, cost);
}

static tp_optimizer_t *s_opt(void *user) {
    (void)user;
    return tp_optimizer_sgd(0.01, 0.9, 0);
}

static int s_train(int argc, char **argv) {
    static const struct option opts[] = {
        {"bind", required_argument, 0, 'b'},    {"batches", required_argument, 0, 'n'},
        {"batch", required_argument, 0, 'B'},   {"epochs", required_argument, 0, 'e'},
        {"timeout", required_argument, 0, 't'}, {"curve", required_argument, 0, 'k'},
        {0, 0, 0, 0}};
    const char *ep = NULL;
    int64_t batches = 0;
    int batch = 256, epochs = 10, c;
    tp_remote_opts_t ro;
    tp_remote_opts_init(&ro);
    ro.timeout_s = 60;
    ro.hwm = 64;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'b': ep = optarg; break;
        case 'n': batches = atoll(optarg); break;
        case 'B': batch = atoi(optarg); break;
        case 'e': epochs = atoi(optarg); break;
        case 't': ro.timeout_s = atof(optarg); break;
        case 'k': ro.curve_dir = optarg; break;
        default: return 2;
        }
    }
    if (!ep || batches <= 0 || epochs < 1 || batches % epochs) {
        fprintf(stderr, "tp-soak train: needs --bind EP and --batches N (a multiple of "
                        "--epochs, 10)\n");
        return 2;
    }
    s_check_t *chk = calloc(1, sizeof *chk);
    chk->inner = tp_df_remote(ep, &ro);
    if (!chk->inner) {
        fprintf(stderr, "tp-soak train: %s\n", tp_last_error());
        return 1;
    }
    tp_dataflow_t *df = tp_dataflow_new(&s_check_ops, chk);
    tp_input_desc_t inputs[2];
    memcpy(inputs, tp_zoo_inputs(), sizeof inputs);
    tp_model_desc_t desc = {inputs, 2, s_linear, s_opt, NULL};
    tp_train_config_t cfg;
    tp_train_config_init(&cfg);
    cfg.model = &desc;
    cfg.dataflow = df;
    cfg.batch = batch;
    cfg.threads = 1;
    cfg.max_epoch = epochs;
    cfg.steps_per_epoch = batches / epochs;
    cfg.default_callbacks = 0;
    cfg.stats = "off";
    double t0 = tp_now_s();
    tp_status_t rc = tp_launch_train_with_config(&cfg, NULL);
    double dt = tp_now_s() - t0;
    /* The prefetching input may have taken a few batches past the last step:
     * every expected one must have arrived, intact and once. */
    int ok = rc == TP_OK && chk->gaps == 0 && chk->repeats == 0 &&
             chk->batches >= (uint64_t)batches;
    printf("{\"role\":\"train\",\"batches_trained\":%lld,\"batches_received\":%llu,"
           "\"datapoints_received\":%llu,\"gaps\":%llu,\"repeats\":%llu,\"seconds\":%.1f,"
           "\"datapoints_per_s\":%.0f,\"ok\":%s%s%s%s}\n",
           rc == TP_OK ? (long long)batches : -1LL, (unsigned long long)chk->batches,
           (unsigned long long)chk->rows, (unsigned long long)chk->gaps,
           (unsigned long long)chk->repeats, dt, dt > 0 ? chk->rows / dt : 0.0,
           ok ? "true" : "false", chk->first_problem[0] ? ",\"first_problem\":\"" : "",
           chk->first_problem, chk->first_problem[0] ? "\"" : "");
    if (rc < 0)
        fprintf(stderr, "tp-soak train: %s\n", tp_last_error());
    free(chk);  /* the trainer destroyed the dataflow; chk_destroy keeps chk */
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "send"))
        return s_send(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "train"))
        return s_train(argc - 1, argv + 1);
    fprintf(stderr, "usage: tp-soak send --connect EP --id K [--procs P] [--batch B] "
                    "--count M [--lz4] [--curve DIR]\n"
                    "       tp-soak train --bind EP --batches N [--batch B] [--epochs E] "
                    "[--timeout S] [--curve DIR]\n");
    return 2;
}
