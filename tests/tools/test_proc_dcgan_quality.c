/* towerpack tests: how good the zoo's DCGAN gets, judged from outside:
 * tp-train --model dcgan trains STEPS steps of batch 64 on Fashion-MNIST,
 * tp-generate draws 500 samples, and a Fashion-MNIST classifier trained by
 * PyTorch in the check itself (tests/tools/dcgan_quality.py, one epoch)
 * must name their classes confidently and spread over the classes; the
 * samples of the same generator after one step must not pass. The slow
 * test of the DCGAN (minutes: ctest label "slow"); its own executable: it
 * forks and execs. Skips without Fashion-MNIST or torch. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "proc_testutil.h"

#define STEPS "300"

static char s_out[1 << 16];

/* tp-train --model dcgan, `steps` steps of batch 64 into dir/name, then
 * 500 samples of its generator into dir/name.npy. */
static void s_train_and_sample(const char *dir, const char *name, const char *steps) {
    char logdir[160], npy[160];
    snprintf(logdir, sizeof logdir, "%s/%s", dir, name);
    snprintf(npy, sizeof npy, "%s/%s.npy", dir, name);
    char *train[] = {TP_BINARY_DIR "/bin/tp-train", "--model", "dcgan", "--epochs", "1",
                     "--steps-per-epoch", (char *)steps, "--batch", "64", "--threads", "2",
                     "--logdir", logdir, "--no-tensorboard", "--log-every", "1000", NULL};
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    cr_assert_eq(pu_run(train, env, s_out, sizeof s_out), 0, "tp-train:\n%s", s_out);
    char *gen[] = {TP_BINARY_DIR "/bin/tp-generate", "--load", logdir, "--count", "500",
                   "--output", npy, NULL};
    cr_assert_eq(pu_run(gen, env, s_out, sizeof s_out), 0, "tp-generate:\n%s", s_out);
}

/* Must hold (issue 44, quality): after STEPS steps the samples are
 * garments to a classifier towerpack had no part in (mean top-1
 * probability and the entropy of the predicted classes' histogram above
 * dcgan_quality.py's bounds), and after one step they are not. */
Test(dcgan_quality, samples_are_garments_to_a_pytorch_classifier, .timeout = 1500) {
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK))
        cr_skip_test("Fashion-MNIST is not installed (dataset-fashion-mnist)");
    char dir[] = "/tmp/tp-dcganq-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    s_train_and_sample(dir, "untrained", "1");
    s_train_and_sample(dir, "trained", STEPS);
    PU_PYTHON_EXPECT(TP_SOURCE_DIR "/tests/tools/dcgan_quality.py", dir, "pytorch agrees");
}
