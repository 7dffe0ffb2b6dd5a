#!/usr/bin/env bash
# towerpack tests: scripts/check-layout.sh fails on a circle of files.
# It runs the checker on small trees written here (a call circle of two
# files, one of three files across rooms, an include circle of headers, and
# a clean tree that must pass), then on a copy of this repository's sources
# with one circle injected: df_tp_pickle.c calling the dispatcher
# tp_tpk_decode, which calls df_tpk_pickle (the circle issue 41 removed).
# Needs no build; about a minute (the checker runs twice on the whole tree).
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
check="$root/scripts/check-layout.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bad=0
fail() { echo "check_layout_circles: $*"; bad=1; }

# expect TREE RC PATTERN...: the checker on TREE exits RC, its output
# matches every PATTERN (grep -E)
expect() {
  local tree=$1 rc=$2 out got; shift 2
  out=$(bash "$check" "$tree" 2>&1); got=$?
  [ "$got" -eq "$rc" ] || fail "${tree#$tmp/}: exit $got, expected $rc:"$'\n'"$out"
  for pat in "$@"; do
    grep -qE -- "$pat" <<<"$out" || fail "${tree#$tmp/}: no line matches '$pat':"$'\n'"$out"
  done
}

# a tree: "path<TAB>text" lines on stdin
tree() {
  local dir=$tmp/$1 path text
  mkdir -p "$dir"
  while IFS=$'\t' read -r path text; do
    mkdir -p "$dir/$(dirname "$path")"
    printf '%b\n' "$text" >> "$dir/$path"
  done
}

# two files of one room call each other
tree two <<'T'
core/a.c	#include "a.h"\nint a_fn(void) { return b_fn() + 1; }
core/b.c	#include "a.h"\nint b_fn(void) { return 1; }\nint b_other(void) { return a_fn(); }
core/a.h	int a_fn(void);\nint b_fn(void);
T
expect "$tmp/two" 1 'files call each other in a circle.*core/a\.c core/b\.c' \
  'core/a\.c -> core/b\.c \(b_fn\)' 'core/b\.c -> core/a\.c \(a_fn\)'

# three files in a ring, across rooms; one takes the address (a table)
tree three <<'T'
core/x.c	int x_fn(void) { extern int y_fn(void); return y_fn(); }
dataflow/y.c	int z_fn(void);\nint y_fn(void) { return z_fn(); }
pipeline/z.c	int x_fn(void);\nstatic int (*const table[])(void) = {x_fn};\nint z_fn(void) { return table[0](); }
T
expect "$tmp/three" 1 'call each other in a circle.*core/x\.c dataflow/y\.c pipeline/z\.c' \
  'pipeline/z\.c -> core/x\.c \(x_fn\)'

# a function that returns a struct pointer, its header on the next line
tree ret <<'T'
core/r.c	struct r { int n; };\nstruct r *\nr_get(void)\n{\n    extern int s_fn(void);\n    return s_fn() ? 0 : 0;\n}
core/s.c	struct r;\nstruct r *r_get(void);\nint s_fn(void) { return r_get() != 0; }
T
expect "$tmp/ret" 1 'call each other in a circle.*core/r\.c core/s\.c' 'core/s\.c -> core/r\.c \(r_get\)'

# headers that include each other
tree inc <<'T'
core/p.h	#ifndef P_H\n#define P_H\n#include "q.h"\n#endif
core/q.h	#ifndef Q_H\n#define Q_H\n#include "p.h"\n#endif
core/p.c	#include "p.h"\nint p_fn(void) { return 0; }
T
expect "$tmp/inc" 1 'include each other in a circle.*core/p\.h core/q\.h'

# one way, with what the checker must not take for a call: a static
# function of the same name, a member, a comment, a string
tree clean <<'T'
core/a.c	int a_fn(void) { return 1; }\nint a_two(void) { return 2; }
dataflow/b.c	int a_fn(void);\nint b_fn(void) { return a_fn(); }
dataflow/c.c	struct s { int (*b_fn)(void); };\nstatic int a_two(void) { return 0; }\nint c_fn(struct s *x) { /* b_fn() */ const char *t = "b_fn()"; (void)t; return x->b_fn() + a_two(); }
core/d.c	static int b_fn(void) { return 3; }\nint d_fn(void) { return b_fn(); }
T
expect "$tmp/clean" 0 'check-layout: OK'

# this repository, as it is (only its sources), then with a circle injected
mkdir -p "$tmp/repo"
(cd "$root" && git ls-files -- '*.c' '*.h' '*.cu' | tar -cf - -T - ) | tar -xf - -C "$tmp/repo"
expect "$tmp/repo" 0 'check-layout: OK'
cat >> "$tmp/repo/dataflow/df_tp_pickle.c" <<'C'

/* injected by tests/tools/check_layout_circles.sh */
tp_status_t df_tpk_pickle_injected(const uint8_t *p, size_t n, tp_datapoint_t **out) {
    return tp_tpk_decode(p, n, NULL, NULL, NULL, out);
}
C
expect "$tmp/repo" 1 'call each other in a circle.*dataflow/df_tp_decode\.c dataflow/df_tp_pickle\.c' \
  'dataflow/df_tp_pickle\.c -> dataflow/df_tp_decode\.c \(tp_tpk_decode\)'

[ $bad -eq 0 ] && echo "check_layout_circles: ok"
exit $bad
