#!/usr/bin/env bash
# towerpack tests: every C snippet users read compiles against the public
# headers, so none can rot (issue 41). The snippets are
#   - the ```c blocks of the Markdown files given, indented ones too (a
#     block inside a list item: its fence's indentation is cut from its
#     lines);
#   - in a public header, each run of comment lines indented by three spaces
#     or more (" *   ...") set off by a blank comment line before it (not
#     the continuation of a "  - " list item) in which a line ends with ';'
#     (C, not a table).
# A snippet with a main() is a whole program: compiled as it stands (its
# own #includes, no prelude) and linked against libtowerpack. Any other is a fragment: compiled as the body of a function
# returning tp_status_t (so TP_TRY works), or, when it defines functions or
# file-scope objects, at file scope; the definitions of the file-scope
# snippets of a file are seen by the snippets after them in that file (as a
# reader reads them). A fragment may also use, without declaring them, the
# names the docs use for the reader's own things (prelude.h below).
#
#   doc_snippets.sh CC SRC_DIR GEN_INCLUDE_DIR LIBTOWERPACK FILE...
# (FILE relative to SRC_DIR; GEN_INCLUDE_DIR holds the generated version.h.)
set -u
cc=$1 src=$2 geninc=$3 lib=$4; shift 4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags=(-std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -pedantic-errors
       -Wno-unused-variable -Wno-unused-parameter -Wno-unused-but-set-variable
       -Wno-unused-function -I"$src/include" -I"$geninc")

# The reader's own things, as the snippets name them.
cat > "$tmp/prelude.h" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/towerpack.h>
extern tp_model_desc_t model;                /* the tutorial's model */
extern const tp_model_desc_t my_model_desc;
extern tp_train_config_t cfg;
extern tp_dataflow_t *train_df, *test_df;
extern tp_callback_t *my_callback;
extern tp_tensor_t images, logits;           /* a predictor's batch */
extern uint64_t seed;
extern int worker_index;
extern tp_status_t rc;
void die(const char *message);
/* training.md, predict.md, dataflow.md and callbacks.md's: a model and
 * its parts, an actor's functions, the GAN tower's nodes, a callback's
 * state, the spec registry's factories */
extern tp_model_desc_t model_desc;
extern const tp_input_desc_t my_inputs[];
tp_status_t my_tower(tp_tower_t *t, tp_node_t *const *in, void *user);
tp_optimizer_t *adam_2e4_b05(void *user);
extern tp_callback_t **my_callbacks;
extern size_t n;
tp_status_t feed_init(tp_actor_ctx_t *ctx, void *arg, void **state);
tp_status_t feed_produce(tp_actor_ctx_t *ctx, void *state);
void feed_fini(void *state);
extern int feed_arg;
extern tp_tower_t *t;
extern tp_node_t *g_loss, *d_loss, *acc_r;
extern tp_node_t *xent, *head_cost;          /* training.md's two named costs */
extern tp_trainer_t *tr, *trainer;
extern tp_predict_config_t c;
void use(tp_datapoint_t *dp);
typedef struct my_state my_state_t;
extern my_state_t *state;
double compute(my_state_t *s);
extern void *ctx;
tp_status_t my_remote_factory(const char *args, void *user, tp_dataflow_t **out);
tp_status_t my_processes_stage(tp_dataflow_t *inner, const char *args, void *user,
                               tp_dataflow_t **out);
tp_status_t my_map_factory(const char *args, void *user, tp_df_map_fn *fn, void **fn_user,
                           tp_df_free_fn *fn_free);
C

# Cut the snippets out: snippet files "N.c" holding "#line" + the code,
# and "N.where" (FILE:LINE).
n=0
for f in "$@"; do
  case $f in
    *.md) awk -v out="$tmp" -v f="$f" -v n0="$n" '
        BEGIN { n = n0 }
        /^[ \t]*```c[ \t]*$/ && !inb {
                         n++; file = out "/" n ".c"; print f ":" NR + 1 > (out "/" n ".where")
                         match($0, /^[ \t]*/); ind = RLENGTH
                         printf "#line %d \"%s\"\n", NR + 1, f > file; inb = 1; next }
        /^[ \t]*```/ { if (inb) close(file); inb = 0; next }
        inb { print substr($0, ind + 1) > file }
        END { print n > (out "/count") }' "$src/$f" ;;
    *.h) awk -v out="$tmp" -v f="$f" -v n0="$n" '
        function flush() {
            if (nl > 0 && code) {
                n++; file = out "/" n ".c"
                print f ":" first > (out "/" n ".where")
                printf "#line %d \"%s\"\n", first, f > file
                for (i = 1; i <= nl; i++) print buf[i] > file
                close(file)
            }
            nl = 0; code = 0
        }
        BEGIN { n = n0 }
        /^ \*   / && (nl > 0 || prev ~ /^ \*[ \t]*$/) {
            if (nl == 0) first = FNR
            l = substr($0, 4); buf[++nl] = l; prev = $0
            sub(/[ \t]*\/\/.*$/, "", l)
            if (l ~ /;[ \t]*$/) code = 1
            next
        }
        { flush(); prev = $0 }
        END { flush(); print n > (out "/count") }' "$src/$f" ;;
    *) echo "doc_snippets: $f: neither Markdown nor a header" >&2; exit 2 ;;
  esac
  n=$(cat "$tmp/count")
done

bad=0
for ((i = 1; i <= n; i++)); do
  where=$(cat "$tmp/$i.where")
  if grep -qE '(^|[^A-Za-z0-9_])main[ \t]*\(' "$tmp/$i.c"; then
    # without the prelude: a reader copies a whole program as it stands,
    # so it must name its own #includes (api.md's first program did not)
    cp "$tmp/$i.c" "$tmp/prog$i.c"
    if ! "$cc" "${flags[@]}" "$tmp/prog$i.c" "$lib" -lm -o "$tmp/prog$i" 2> "$tmp/err$i"; then
      echo "doc_snippets: $where: the program does not compile and link:"; cat "$tmp/err$i"; bad=1
    fi
    continue
  fi
  # what the earlier snippets of the same file defined at file scope
  defs="$tmp/defs-$(md5sum <<<"${where%:*}" | cut -c1-12).h"
  touch "$defs"
  { echo '#include "prelude.h"'; cat "$defs"; echo 'tp_status_t snippet(void);'
    echo 'tp_status_t snippet(void) {'; cat "$tmp/$i.c"; echo 'return TP_OK; }'; } > "$tmp/body$i.c"
  { echo '#include "prelude.h"'; cat "$defs" "$tmp/$i.c"; } > "$tmp/file$i.c"
  if "$cc" "${flags[@]}" -I"$tmp" -c "$tmp/body$i.c" -o "$tmp/body$i.o" 2> "$tmp/err$i"; then continue; fi
  if "$cc" "${flags[@]}" -I"$tmp" -c "$tmp/file$i.c" -o "$tmp/file$i.o" 2>> "$tmp/err$i"; then
    cat "$tmp/$i.c" >> "$defs"
    continue
  fi
  echo "doc_snippets: $where: the snippet compiles neither as a function body nor at file scope:"
  cat "$tmp/err$i"
  bad=1
done
[ $bad -eq 0 ] && echo "doc_snippets: ok: $n snippets in $# files compile"
exit $bad
