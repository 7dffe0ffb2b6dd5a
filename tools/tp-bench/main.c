/* tp-bench: towerpack's benchmark programs, one subcommand each.
 *
 *   tp-bench wire       [--json] ...   wire encode+decode against memcpy
 *   tp-bench dataflow   SPEC [--count N] [--json]
 *   tp-bench transport  [--json] ...   actors and ipc against raw libzmq
 *   tp-bench step       [--json] ...   a training step against raw BLAS; the GPT's step
 *   tp-bench engine     [--json] ...   the whole engine against a bare loop
 *   tp-bench callbacks  [--json] ...   a slow callback, observing and synchronous
 *   tp-bench saver      [--json] ...   ModelSaver's epoch-end wait, sync and its writer
 *   tp-bench predict    --load CKPT ... a trained model's inference latency and throughput
 *   tp-bench tensorpack [--json] ...   tensorpack's formats against the wire format
 *   tp-bench ops        [--json] ...   each op's forward+backward against PyTorch
 *                       [--device N]   (on CUDA device N and torch's cuda:N)
 *
 * Each subcommand lives in its own file of this folder and defines
 * `int tp_bench_<name>(int argc, char **argv)` (argv[0] is the subcommand).
 * The table below names them weakly, so a build lists only what it has. */
#include <stdio.h>
#include <string.h>
#include <towerpack/towerpack.h>

typedef int (*bench_fn)(int argc, char **argv);

#define BENCH(name) int tp_bench_##name(int argc, char **argv) __attribute__((weak));
BENCH(wire)
BENCH(dataflow)
BENCH(transport)
BENCH(step)
BENCH(engine)
BENCH(callbacks)
BENCH(saver)
BENCH(cuda)
BENCH(predict)
BENCH(tensorpack)
BENCH(ops)
#undef BENCH

static const struct {
    const char *name;
    bench_fn fn;
    const char *help;
} s_benches[] = {
    {"wire", tp_bench_wire, "wire format encode+decode against memcpy"},
    {"dataflow", tp_bench_dataflow, "speed of a dataflow pipeline spec"},
    {"transport", tp_bench_transport, "actor and ipc transport against raw libzmq"},
    {"step", tp_bench_step, "training step against the raw BLAS calls; the GPT's step "
     "(--model gpt)"},
    {"engine", tp_bench_engine, "whole-engine step rate against a bare loop"},
    {"callbacks", tp_bench_callbacks, "a slow callback: observing against none, and synchronous"},
    {"saver", tp_bench_saver, "ModelSaver's epoch-end wait: synchronous write against its writer"},
    {"cuda", tp_bench_cuda, "CUDA backend: GEMM step against cuBLAS, step rates"},
    {"predict", tp_bench_predict, "a trained model's batch-1 latency and batch throughput"},
    {"tensorpack", tp_bench_tensorpack, "tensorpack's formats: receiving against the wire "
     "format, decoding against Python; tensorpack LMDB writer"},
    {"ops", tp_bench_ops, "each op's forward+backward against PyTorch's, on the example "
     "models' shapes (--device N: on a GPU)"},
};
#define NBENCH (sizeof s_benches / sizeof s_benches[0])

static void s_usage(FILE *out) {
    fprintf(out, "usage: tp-bench SUBCOMMAND [options]   (tp-bench SUBCOMMAND --help)\n"
                 "towerpack %s benchmarks:\n", TP_VERSION_STRING);
    for (size_t i = 0; i < NBENCH; i++)
        if (s_benches[i].fn)
            fprintf(out, "  %-10s %s\n", s_benches[i].name, s_benches[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        s_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < NBENCH; i++)
        if (s_benches[i].fn && !strcmp(argv[1], s_benches[i].name))
            return s_benches[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "tp-bench: unknown subcommand '%s'\n", argv[1]);
    s_usage(stderr);
    return 2;
}
