/* towerpack fuzzing: the pipeline spec parser (dataflow/df_spec.c,
 * tp_spec_parse) with its built-in sources, stages and map stages.
 *
 * The input is the spec text (up to its first NUL). Sources that read
 * files find small real ones: at start the target writes a tiny
 * Fashion-MNIST (4 images per split, TP_FASHION_MNIST_DIR), img.idx,
 * lab.idx and tiny.lmdb into a private temporary directory and works
 * there. The actor module's `remote:` and `processes` (sockets, fork) are
 * not registered here. Property: a spec that fails leaves a message that
 * quotes it; one that parses builds a dataflow that can be destroyed. */
#include <sys/stat.h>
#include "fuzz_common.h"
#include "fuzz_files.h"
#include "dataflow/df_internal.h"

static char s_dir[64];

static void s_cleanup(void) {
    static const char *files[] = {
        "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz",
        "img.idx", "lab.idx", "tiny.lmdb", "tiny.lmdb-lock"};
    char p[128];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(p, sizeof p, "%s/%s", s_dir, files[i]);
        unlink(p);
    }
    rmdir(s_dir);
}

static int s_put_idx(const char *name, uint8_t type, int ndim,
                     const uint32_t *dims, const void *payload, size_t elem,
                     int gz) {
    uint8_t *b = NULL, *z = NULL;
    size_t n = 0, zn = 0;
    if (!fuzz_idx_make(type, ndim, dims, payload, elem, &b, &n))
        return 0;
    int ok = gz ? fuzz_gzip(b, n, &z, &zn) && fuzz_write_file(name, z, zn)
                : fuzz_write_file(name, b, n);
    free(b);
    free(z);
    return ok;
}

static void s_fixtures(void) {
    uint8_t img[4 * 28 * 28], lab[4] = {0, 1, 2, 9};
    for (size_t i = 0; i < sizeof img; i++)
        img[i] = (uint8_t)(i * 7);
    const uint32_t idims[3] = {4, 28, 28}, ldims[1] = {4};
    int ok = s_put_idx("train-images-idx3-ubyte.gz", 0x08, 3, idims, img, 1, 1) &&
             s_put_idx("train-labels-idx1-ubyte.gz", 0x08, 1, ldims, lab, 1, 1) &&
             s_put_idx("t10k-images-idx3-ubyte.gz", 0x08, 3, idims, img, 1, 1) &&
             s_put_idx("t10k-labels-idx1-ubyte.gz", 0x08, 1, ldims, lab, 1, 1) &&
             s_put_idx("img.idx", 0x08, 3, idims, img, 1, 0) &&
             s_put_idx("lab.idx", 0x08, 1, ldims, lab, 1, 0);
    tp_df_fake_comp_t comps[2] = {{TP_UINT8, 2, {4, 4}}, {TP_INT32, 0, {0}}};
    tp_dataflow_t *df = tp_df_fake(comps, 2, 6, 1);
    ok = ok && df && tp_dataflow_reset_state(df, 1, 0) == TP_OK &&
         tp_records_save(df, "tiny.lmdb", NULL, NULL) == TP_OK;
    tp_dataflow_destroy(&df);
    if (!ok) {
        fprintf(stderr, "fuzz_spec: fixtures in %s: %s\n", s_dir,
                tp_last_error());
        abort();
    }
}

/* The image sources walk folders and read whole files: keep them inside
 * the fixtures' folder, or "imagefolder:/" would scan the machine. */
static tp_status_t s_local_only(const char *args, void *user,
                                tp_dataflow_t **out) {
    if (args[0] == '/' || strstr(args, ".."))
        return tp_error(TP_ERR_INVALID, "fuzz: image sources read only "
                        "under the fixtures' folder");
    int which = *(const int *)user;
    return which == 0   ? df_image_folder_src(args, NULL, out)
           : which == 1 ? df_image_list_src(args, NULL, out)
                        : df_image_cifar_src(args, NULL, out);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_quiet();
    snprintf(s_dir, sizeof s_dir, "/tmp/tp-fuzz-spec-XXXXXX");
    if (!mkdtemp(s_dir) || chdir(s_dir) != 0) {
        perror("fuzz_spec: temporary directory");
        abort();
    }
    atexit(s_cleanup);
    setenv("TP_FASHION_MNIST_DIR", s_dir, 1);
    s_fixtures();
    static const int which[3] = {0, 1, 2};
    if (tp_spec_register_source("imagefolder", s_local_only, (void *)&which[0]) ||
        tp_spec_register_source("imagelist", s_local_only, (void *)&which[1]) ||
        tp_spec_register_source("cifar", s_local_only, (void *)&which[2]))
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *spec = malloc(size + 1);
    if (!spec)
        return 0;
    memcpy(spec, data, size);
    spec[size] = '\0';
    tp_dataflow_t *df = NULL;
    tp_status_t rc = tp_spec_parse(spec, &df);
    fuzz_note("spec", rc);
    if (rc == TP_OK) {
        FUZZ_CHECK(df != NULL, "TP_OK without a dataflow");
        (void)tp_dataflow_size(df);
    } else {
        FUZZ_CHECK(df == NULL, "error %d with a dataflow", rc);
        FUZZ_CHECK(strncmp(tp_last_error(), "spec: ", 6) == 0,
                   "message does not start with 'spec: ': %s",
                   tp_last_error());
    }
    tp_dataflow_destroy(&df);
    free(spec);
    return 0;
}
