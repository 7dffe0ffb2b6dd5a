/* towerpack tests: the tp-top samples in the docs have the tool's current
 * columns. scripts/docs-snapshots.sh makes the marked samples from real
 * runs; this checks every table in the docs' .md files (marked or written
 * by hand) against `tp-top --columns`, so a change of the layout fails here until
 * the script is run again. Own executable: it runs a tool. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/wait.h>

static void s_columns(char *out, size_t size) {
    FILE *p = popen(TP_BINARY_DIR "/bin/tp-top --columns", "r");
    cr_assert_not_null(p);
    cr_assert_not_null(fgets(out, (int)size, p), "tp-top --columns printed nothing");
    cr_assert_eq(pclose(p), 0);
    cr_assert(!strncmp(out, "ACTOR ", 6), "%s", out);
}

Test(docs_snapshots, every_tp_top_table_in_the_docs_has_the_current_columns) {
    char want[512];
    s_columns(want, sizeof want);
    DIR *d = opendir(TP_SOURCE_DIR "/docs");
    cr_assert_not_null(d);
    struct dirent *e;
    int tables = 0, marked = 0;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 4 || strcmp(e->d_name + n - 3, ".md"))
            continue;
        char path[1024], line[1024];
        snprintf(path, sizeof path, "%s/docs/%s", TP_SOURCE_DIR, e->d_name);
        FILE *f = fopen(path, "r");
        cr_assert_not_null(f, "%s", path);
        int lineno = 0, in_marked = 0, marked_rows = 0;
        while (fgets(line, sizeof line, f)) {
            lineno++;
            if (!strncmp(line, "<!-- tp-top:", 12)) {
                in_marked = 1;
                marked_rows = 0;
                marked++;
            } else if (!strncmp(line, "<!-- /tp-top:", 13)) {
                cr_assert_gt(marked_rows, 0, "%s:%d: an empty tp-top sample: run "
                             "scripts/docs-snapshots.sh", path, lineno);
                in_marked = 0;
            }
            /* tp-top merging several publishers (the ranks of an mpirun)
             * puts RANK before the same columns */
            const char *cols = !strncmp(line, "RANK ACTOR ", 11) ? line + 5 : line;
            if (!strncmp(cols, "ACTOR ", 6)) {
                tables++;
                marked_rows += in_marked;
                cr_assert_str_eq(cols, want, "%s:%d: a tp-top table with old columns: "
                                 "run scripts/docs-snapshots.sh (or fix the hand-written "
                                 "one)", path, lineno);
            }
        }
        fclose(f);
    }
    closedir(d);
    cr_assert_geq(tables, 3, "the docs' tp-top samples were not found");
    cr_assert_geq(marked, 3, "the marked samples (<!-- tp-top:NAME -->) were not found");
}

/* A caption says which command made its sample, and users copy it: a
 * trainer fed by workers whose spec augments must say --augment (the
 * images arrive as augmented floats), or the copied command fails at step 0. */
Test(docs_snapshots, a_caption_with_augmenting_workers_gives_tp_train_augment) {
    const char *docs[] = {"actors.md", "observability.md", "tuning.md"};
    int captions = 0;
    for (size_t i = 0; i < sizeof docs / sizeof *docs; i++) {
        char path[1024], line[2048];
        snprintf(path, sizeof path, "%s/docs/%s", TP_SOURCE_DIR, docs[i]);
        FILE *f = fopen(path, "r");
        cr_assert_not_null(f, "%s", path);
        int lineno = 0;
        while (fgets(line, sizeof line, f)) {
            lineno++;
            if (strncmp(line, "(Made by `scripts/docs-snapshots.sh`", 36))
                continue;
            const char *w = strstr(line, "tp-worker --spec");
            if (!w || !strstr(w, "augment"))
                continue;
            captions++;
            char trainer[2048];
            snprintf(trainer, sizeof trainer, "%.*s", (int)(w - line), line);
            cr_assert(!strstr(trainer, "tp-train ") || strstr(trainer, "--augment"),
                      "%s:%d: the caption's tp-train has no --augment while its "
                      "workers augment: fix scripts/docs-snapshots.sh's cmd",
                      path, lineno);
        }
        fclose(f);
    }
    cr_assert_geq(captions, 2, "no caption of a remote sample was found");
}

/* Issue 47: every command in docs/distributed.md, actors.md,
 * observability.md and tuning.md that shows output has a snapshot entry:
 * `scripts/docs-snapshots.sh --check` finds each fenced block of what a
 * program printed (a tp-top table, "PROGRAM: ..." lines, steps.tsv) and
 * fails for one outside the markers of a sample the script makes. Here on
 * the docs (passes), and on a page with an unmarked output block and one
 * with a marker of no such sample (both fail, naming the line). */
static int s_check(const char *docs, char *out, size_t size) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cd %s && TP_DOCS='%s' bash scripts/docs-snapshots.sh --check 2>&1",
             TP_SOURCE_DIR, docs);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* s_check on a page of `text` written to `page`. */
static int s_check_page(const char *page, const char *text, char *out, size_t size) {
    FILE *f = fopen(page, "w");
    cr_assert_not_null(f, "%s", page);
    fputs(text, f);
    cr_assert_eq(fclose(f), 0, "%s", page);
    return s_check(page, out, size);
}

Test(docs_snapshots, every_doc_command_with_output_has_a_snapshot_entry) {
    char out[16384];
    int rc = s_check("docs/actors.md docs/tuning.md docs/observability.md "
                     "docs/distributed.md", out, sizeof out);
    cr_assert_eq(rc, 0, "scripts/docs-snapshots.sh --check:\n%s", out);
    cr_assert(strstr(out, "docs/distributed.md") && strstr(out, " mpi-rank1 ") &&
                  strstr(out, " unfit ") && strstr(out, " netns "),
              "the listing misses the marked samples:\n%s", out);
    char dir[] = "/tmp/tp-docs-check-XXXXXX", page[128], cmd[256];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(page, sizeof page, "%s/page.md", dir);
    rc = s_check_page(page,
                      "Run it:\n\n```\ntp-train --model mlp\n```\n\n```\n"
                      "tp-train: test accuracy 0.88 | wall time 9 s\n```\n",
                      out, sizeof out);
    cr_assert_eq(rc, 1, "an unmarked output block passed:\n%s", out);
    cr_assert(strstr(out, "page.md:8: MISSING    tp-train: test accuracy"), "%s", out);
    rc = s_check_page(page,
                      "<!-- output:nosuch -->\n```\ntp-train: test accuracy 0.88\n```\n"
                      "<!-- /output:nosuch -->\n",
                      out, sizeof out);
    cr_assert_eq(rc, 1, "a marker of no sample passed:\n%s", out);
    cr_assert(strstr(out, "marker nosuch: no such NAME"), "%s", out);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}
