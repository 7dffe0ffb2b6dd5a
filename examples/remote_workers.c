/* Example: training fed by external tp-worker processes. The trainer binds
 * an ipc endpoint; two tp-worker processes (started here, but they could
 * run anywhere, over tcp) read and batch Fashion-MNIST and push the batches
 * to it. Each worker gets its own seed, so their shuffles differ.
 *
 *   build/bin/example-remote-workers [--logdir DIR] [--tiny]
 *
 * By hand, the same is:
 *   tp-worker --spec 'fashion-mnist:train | batch 64' --connect ipc:///tmp/x.sock --seed 1 &
 *   tp-worker --spec 'fashion-mnist:train | batch 64' --connect ipc:///tmp/x.sock --seed 2 &
 *   tp-train --model mlp --batch 64 --towers 1 --remote @ipc:///tmp/x.sock */
#include <limits.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <towerpack/towerpack.h>
#include <towerpack/dataflow_spec.h>
#include <towerpack/optim.h>
#include <towerpack/launch.h>
#include "common.h"

/* Start `tp-worker` (found next to this program) pushing to `endpoint`. */
static pid_t start_worker(const char *endpoint, int seed) {
    char self[PATH_MAX], worker[PATH_MAX + 16], seed_s[16];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return -1;
    self[n] = '\0';
    *strrchr(self, '/') = '\0';
    snprintf(worker, sizeof worker, "%s/tp-worker", self);
    snprintf(seed_s, sizeof seed_s, "%d", seed);
    pid_t pid = fork();
    if (pid == 0) {
        execl(worker, "tp-worker", "--spec", "fashion-mnist:train | batch 64",
              "--connect", endpoint, "--seed", seed_s, "--log-level", "warn", (char *)NULL);
        _exit(127);
    }
    return pid;
}

int main(int argc, char **argv) {
    example_args_t a = example_args(argc, argv, "train_log/example-remote-workers");
    char dir[] = "/tmp/tp-example-remote-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("example-remote-workers: mkdtemp");
        return 1;
    }
    char endpoint[128], spec[160];
    snprintf(endpoint, sizeof endpoint, "ipc://%s/data.sock", dir);
    snprintf(spec, sizeof spec, "remote:@%s", endpoint);  /* @: the trainer binds */

    pid_t workers[2] = {start_worker(endpoint, 1), start_worker(endpoint, 2)};
    tp_dataflow_t *train = NULL, *test = NULL;
    tp_status_t rc = tp_spec_parse(spec, &train);
    if (rc == TP_OK)
        rc = tp_spec_parse("fashion-mnist:test,shuffle=0 | batch 500 remainder", &test);
    if (rc == TP_OK) {
        if (a.tiny)
            test = tp_df_fixed_size(test, 2, 0);
        /* the model is beside the point here: common.h's MLP */
        tp_model_desc_t model = {example_mlp_inputs, 2, example_mlp_tower,
                                 example_mlp_optimizer, NULL};
        tp_train_config_t cfg;
        tp_train_config_init(&cfg);
        cfg.model = &model;
        cfg.dataflow = train;            /* batches of 64 from the workers */
        cfg.validation = test;
        cfg.infer_batch = 500;
        cfg.batch = 64;
        cfg.max_epoch = a.tiny ? 1 : 5;
        cfg.steps_per_epoch = a.tiny ? 5 : 60000 / 64;  /* a remote stream has no size */
        cfg.logdir = a.logdir;
        rc = tp_launch_train_with_config(&cfg, NULL);
    } else {
        tp_dataflow_destroy(&train);
    }
    if (rc != TP_OK)
        fprintf(stderr, "example-remote-workers: %s\n", tp_last_error());
    for (int i = 0; i < 2; i++) {
        if (workers[i] > 0) {
            kill(workers[i], SIGTERM);  /* tp-worker ends cleanly on SIGTERM */
            waitpid(workers[i], NULL, 0);
        }
    }
    unlink(endpoint + strlen("ipc://"));
    rmdir(dir);
    return rc == TP_OK ? 0 : 1;
}
