#!/usr/bin/env bash
# towerpack: check the layering of the rooms (docs/architecture.md, "Rooms").
#
#   bash scripts/check-layout.sh [ROOT]   exit 0 and one OK line when clean,
#                                         exit 1 with one line per violation
#
# ROOT is the source tree to check (default: this repository); the test
# tests/tools/check_layout_circles.sh points it at small trees with circles.
# Reads the sources with grep and awk; needs no build (a second or so). Checks:
#  (a) private headers: a quoted include of a header that is not under
#      include/towerpack/ may name only a header of the including file's own
#      room. A private header belongs to the folder it sits in and is visible
#      to that folder and the folders below it (gpu/backend_impl.h to all of
#      gpu/, gpu/graph/graph_internal.h to gpu/graph/ only). Tests are
#      white-box: tests/<room>/ may include the private headers of <room>,
#      and fuzz/ those of the parsers it fuzzes.
#  (b) direction: a room includes public headers (include/towerpack/) only of
#      itself and of the rooms it may use (USES below), never of a room above;
#      a public header counts as a file of its owner's room (OWNER below).
#  (c) CUDA: no #if/#ifdef on CUDA (TP_WITH_CUDA, __CUDACC__, ...) outside
#      gpu/: the CUDA module is loaded at run time, so nothing else may
#      compile differently with or without it.
#  (d) circles: files depend one way (DESIGN 4.7). No header includes itself
#      through others (an include circle), and no circle of files in the
#      rooms where each names a function defined (not static) in the next:
#      a.c calls or takes the address of b_fn from b.c while b.c does so
#      with a_fn from a.c, or a longer ring. The call graph comes from the
#      .c/.cu files of the rooms (functions in headers are not followed).
set -u
if [ $# -gt 0 ]; then cd "$1" || exit 2; else cd "$(dirname "$0")/.." || exit 2; fi

# ---- the rooms, lowest first, and what each may use -------------------------
# dataflow may use actors: the process and remote dataflows run their workers
# under the actors' supervisor, through public headers only (DESIGN 2).
# tests/, fuzz/, bench/ are not rooms: they may include any public header.
declare -A USES=(
  [core]="core"
  [actors]="core actors"
  [dataflow]="core actors dataflow"
  [gpu]="core gpu"
  [pipeline]="core actors dataflow gpu pipeline"
  [dist]="core actors dataflow gpu pipeline dist"
  [models]="core gpu pipeline models"
  [tools]="*"
  [examples]="*"
)
ROOM_ORDER="core actors dataflow gpu pipeline dist models tools examples"

# ---- the owning room of every public header ---------------------------------
declare -A OWNER=(
  [status.h]=core [log.h]=core [clock.h]=core [rng.h]=core [philox.h]=core [tensor.h]=core
  [datapoint.h]=core [fileio.h]=core [process.h]=core [wire.h]=core
  [module.h]=core [version.h]=core
  [actor.h]=actors [stats.h]=actors [supervisor.h]=actors [security.h]=actors
  [dataflow.h]=dataflow [dataflow_lib.h]=dataflow [dataflow_spec.h]=dataflow
  [image.h]=dataflow   # dataflow/image/, a sub-room: decoders, image sources, imgaug
  [actor_dataflow.h]=dataflow [tensorpack.h]=dataflow [tokenizer.h]=dataflow
  [backend.h]=gpu [device.h]=gpu [graph.h]=gpu [optim.h]=gpu [checkpoint.h]=gpu
  [launch.h]=pipeline [input.h]=pipeline [trainer_loop.h]=pipeline [callback.h]=pipeline
  [model_callbacks.h]=pipeline [logdir.h]=pipeline [plot.h]=pipeline
  [predict.h]=pipeline [gan.h]=pipeline
  [dist.h]=dist
  [graph_dist.h]=gpu   # the model's calls only dist/ uses; dist.h includes it
  [models.h]=models
  [towerpack.h]=tools   # the umbrella: for programs, never for the library
)

fail=0
nfiles=0
say() { echo "check-layout: $*"; fail=1; }

# Every public header has an owner (a new header must be given one).
for h in include/towerpack/*.h; do
  [ -e "$h" ] || continue
  b=${h##*/}
  [ -n "${OWNER[$b]:-}" ] || say "$h has no owning room: add it to OWNER in scripts/check-layout.sh"
done

room_of() {  # top-level room of a path, or "" when it is not in a room
  local top=${1%%/*}
  case $top in
    core|actors|dataflow|gpu|pipeline|dist|models|tools|examples|include) echo "$top" ;;
    *) echo "" ;;
  esac
}

# ---- (a) and (b): every #include of every source ----------------------------
# the tracked sources of a repository, every source of another tree
if [ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$(pwd -P)" ]; then
  files=$(git ls-files -- '*.c' '*.h' '*.cu')
  cuda_grep() { git grep -nE "$1" -- '*.c' '*.h' '*.cu' 2>/dev/null; }
else
  files=$(find . \( -name '*.[ch]' -o -name '*.cu' \) -type f | sed 's|^\./||' | sort)
  cuda_grep() { grep -rnE --include='*.c' --include='*.h' --include='*.cu' "$1" . 2>/dev/null | sed 's|^\./||'; }
fi
while IFS= read -r f; do
  [ -n "$f" ] || continue
  f=${f#./}
  nfiles=$((nfiles + 1))
  dir=$(dirname "$f")
  room=$(room_of "$f")
  # a public header belongs to its owner's room: it may include only the
  # public headers of the rooms its owner may use (actor.h may not pull in
  # dataflow.h)
  if [ "$room" = include ]; then
    room=${OWNER[${f##*/}]:-}
    [ -n "$room" ] || continue
  fi
  # tests/<room>/...: a white-box test of <room>
  test_room=""
  case $f in tests/*/*) test_room=$(room_of "${f#tests/}") ;; esac
  while IFS=: read -r line inc; do
    case $inc in
      towerpack/*)  # a public header
        h=${inc#towerpack/}
        owner=${OWNER[$h]:-}
        [ -n "$owner" ] || continue
        [ -n "$room" ] || continue
        uses=${USES[$room]:-}
        [ "$uses" = "*" ] && continue
        case " $uses " in *" $owner "*) ;; *)
          say "$f:$line includes towerpack/$h, a public header of room $owner, which room $room may not use (room $room may use: $uses)" ;;
        esac
        ;;
      *)
        # a quoted include: resolve it from the file's folder, then from the
        # source root (the include path of every target)
        if [ -f "$dir/$inc" ]; then p=$(realpath -m --relative-to=. "$dir/$inc")
        elif [ -f "$inc" ]; then p=$inc
        else continue  # a system or generated header
        fi
        hdir=$(dirname "$p")
        case $p in include/towerpack/*) continue ;; esac
        # own folder or a folder above it: visible
        case "$dir/" in "$hdir/"*) continue ;; esac
        # white-box tests of the header's room
        if [ -n "$test_room" ] && [ "$(room_of "$p")" = "$test_room" ]; then continue; fi
        # fuzz targets reach parser entry points that are not public
        # (df_records_chunk_check): white-box, like tests/<room>/
        case $f in fuzz/*) continue ;; esac
        # helpers of tests/, fuzz/, tools/, examples/ serve their own folder
        case ${p%%/*} in tests|fuzz|examples|tools|bench)
          [ "${f%%/*}" = "${p%%/*}" ] && continue ;;
        esac
        say "$f:$line includes $p, a private header of room $hdir (only files in $hdir may include it)"
        ;;
    esac
  done < <(awk '
      /^[ \t]*#[ \t]*include[ \t]*[<"]/ {
        s = $0; sub(/^[ \t]*#[ \t]*include[ \t]*/, "", s)
        q = substr(s, 1, 1); s = substr(s, 2)
        e = index(s, q == "<" ? ">" : "\"")
        if (e > 0) {
          h = substr(s, 1, e - 1)
          # angle brackets: only towerpack/ headers matter
          if (q == "\"" || h ~ /^towerpack\//) print FNR ":" h
        }
      }' "$f")
done <<< "$files"

# ---- (c) CUDA conditionals outside gpu/ --------------------------------------
while IFS= read -r hit; do
  [ -n "$hit" ] || continue
  f=${hit%%:*}; rest=${hit#*:}; line=${rest%%:*}
  case $f in gpu/*) continue ;; esac
  say "$f:$line tests CUDA in the preprocessor (${rest#*:}); only gpu/ may (the CUDA module is loaded at run time)"
done < <(cuda_grep '^[[:space:]]*#[[:space:]]*(if|ifdef|ifndef|elif)\b.*(TP_WITH_CUDA|TP_CUDA_ENABLED|__CUDACC__|__CUDA_ARCH__|CUDART_VERSION|CUDA_VERSION)')

# ---- (d) circles of includes and of calls ----------------------------------
# One awk pass over every source: the include graph of all files, the names
# each .c/.cu file of a room defines and uses, then the strongly connected
# parts of both graphs (Tarjan). Prints "circle KIND FILES" and its edges.
read -r -d '' CIRCLES_AWK <<'AWK'
# Input: first the list of the tree's source files (one a line), then the
# sources. Prints one line per problem: "circle <kind> <files>", then
# "  <from> -> <to> (<name>)" lines.
FNR == NR { exists[$0] = 1; next }
FNR == 1 {
    incomment = 0; depth = 0; transp = 0; stmt = ""; pp = 0; prev = ""
    f = FILENAME; sub(/^\.\//, "", f)
    fdir = f; if (!sub(/\/[^\/]*$/, "", fdir)) fdir = "."
    calls = (f ~ /\.(c|cu)$/) && (f ~ /^(core|actors|dataflow|gpu|pipeline|dist|models|tools|examples)\//)
}
# includes, of every file
/^[ \t]*#[ \t]*include[ \t]*[<"]/ {
    s = $0; sub(/^[ \t]*#[ \t]*include[ \t]*/, "", s)
    q = substr(s, 1, 1); s = substr(s, 2)
    e = index(s, q == "<" ? ">" : "\"")
    if (e > 0) {
        h = substr(s, 1, e - 1); p = ""
        if (q == "<") { if (h ~ /^towerpack\//) p = "include/" h }
        else {
            p = norm(fdir "/" h)
            if (!(p in exists)) p = (h in exists) ? h : ""
        }
        if (p != "" && (p in exists) && p != f) edge("include", f, p, "#include")
    }
}
!calls { next }
{
    line = $0
    if (pp || (!incomment && line ~ /^[ \t]*#/)) {
        # a preprocessor line: the calls in a macro's body are the file's
        # (the macro expands here); braces there do not count
        isdef = pp ? ppdef : (line ~ /^[ \t]*#[ \t]*define/)
        pp = line ~ /\\$/; ppdef = isdef
        if (isdef) { s = strip(line); sub(/^[ \t]*#[ \t]*define[ \t]+[A-Za-z_0-9]+/, "", s); uses(s) }
        next
    }
    s = strip(line)
    while (s != "") {
        if (match(s, /^[A-Za-z_][A-Za-z0-9_]*/)) {
            tok = substr(s, 1, RLENGTH); s = substr(s, RLENGTH + 1)
            if (depth == 0) stmt = stmt " " tok
            else if (prev != "." && prev != "->") use(tok)
            prev = tok
            continue
        }
        c = substr(s, 1, 1)
        if (c == "-" && substr(s, 2, 1) == ">") {
            s = substr(s, 3); prev = "->"
            continue
        }
        s = substr(s, 2)
        if (c == " " || c == "\t") continue
        prev = c
        if (c == "{") {
            if (depth == 0) {
                # extern "C" { and namespace x { enclose definitions
                if (stmt ~ /extern *"" *$/ || stmt ~ /(^| )namespace( +[A-Za-z_0-9]+)? *$/) {
                    transp++; stmt = ""; continue
                }
                define(stmt); stmt = ""
            }
            depth++
        } else if (c == "}") {
            if (depth == 0) { if (transp > 0) transp--; stmt = ""; continue }
            if (--depth == 0) stmt = ""
        } else if (depth == 0) {
            stmt = (c == ";") ? "" : stmt c
        }
    }
}
# "a/b/../c.h" -> "a/c.h"
function norm(p,    n, i, k, part, out) {
    n = split(p, part, "/"); k = 0
    for (i = 1; i <= n; i++) {
        if (part[i] == "." || part[i] == "") continue
        if (part[i] == ".." && k > 0 && out[k] != "..") { k--; continue }
        out[++k] = part[i]
    }
    p = ""
    for (i = 1; i <= k; i++) p = p (i > 1 ? "/" : "") out[i]
    return p
}
# one line without comments, strings and characters (block comments span lines)
function strip(l,    o, i, t, ch) {
    o = ""
    while (l != "") {
        if (incomment) {
            i = index(l, "*/")
            if (!i) return o
            l = substr(l, i + 2); incomment = 0; o = o " "
            continue
        }
        if (!match(l, /\/\*|\/\/|"|\047/)) { o = o l; break }
        o = o substr(l, 1, RSTART - 1)
        t = substr(l, RSTART, RLENGTH); l = substr(l, RSTART + RLENGTH)
        if (t == "/*") { incomment = 1; continue }
        if (t == "//") break
        while (l != "") {
            ch = substr(l, 1, 1); l = substr(l, 2)
            if (ch == "\\") { l = substr(l, 2); continue }
            if (ch == t) break
        }
        o = o (t == "\"" ? "\"\"" : "0")
    }
    return o
}
function uses(s,    c) {
    while (match(s, /[A-Za-z_][A-Za-z0-9_]*/)) {
        c = RSTART > 1 ? substr(s, RSTART - 1, 1) : ""
        if (c != "." && c != ">") use(substr(s, RSTART, RLENGTH))
        s = substr(s, RSTART + RLENGTH)
    }
}
function use(tok) {
    if (!((f, tok) in seen)) { seen[f, tok] = 1; nu++; uf[nu] = f; un[nu] = tok }
}
# A "{" at file scope opens a function when the statement before it has a
# name followed by "(" outside parentheses and no "=" (an initializer).
function define(st,    pd, c, name, last, rest) {
    if (st ~ /=/ || st !~ /\(/ || st ~ /^ *typedef( |$)/) return
    pd = 0; last = ""; name = ""; rest = st
    while (rest != "") {
        if (match(rest, /^[A-Za-z_][A-Za-z0-9_]*/)) {
            last = substr(rest, 1, RLENGTH); rest = substr(rest, RLENGTH + 1); continue
        }
        c = substr(rest, 1, 1); rest = substr(rest, 2)
        if (c == " ") continue
        if (c == "(") { if (pd == 0 && last != "" && last !~ /^__/) name = last; pd++ }
        else if (c == ")") pd--
        last = ""
    }
    if (name == "" || name == "main") return
    if (st ~ /(^| )static( |$)/) { local[f, name] = 1; return }
    if (!((name, f) in defd)) { defd[name, f] = 1; ndef[name]++; def[name, ndef[name]] = f }
}
function dirof(p) { if (!sub(/\/[^\/]*$/, "", p)) p = "."; return p }
function edge(kind, a, b, why,    k) {
    k = kind SUBSEP a
    if ((k, b) in ename) return
    ename[k, b] = why; nadj[k]++; adj[k, nadj[k]] = kind SUBSEP b
    if (!(k in isnode)) { isnode[k] = 1; node[++nn] = k }
}
END {
    # a name used in file a and defined (not static) in file b: a -> b.
    # A name defined in several files (one program each: tools, examples)
    # resolves to the definer in the user's folder, or not at all.
    for (i = 1; i <= nu; i++) {
        a = uf[i]; n = un[i]
        if (!(n in ndef) || ((a, n) in local) || ((n, a) in defd)) continue
        b = ""
        if (ndef[n] == 1) b = def[n, 1]
        else for (k = 1; k <= ndef[n]; k++) if (dirof(def[n, k]) == dirof(a)) b = def[n, k]
        if (b != "") edge("call", a, b, n)
    }
    for (i = 1; i <= nn; i++) if (!(node[i] in num)) tarjan(node[i])
}
function tarjan(v,    k, w, n, i, j, m, kind, files, sorted, a) {
    num[v] = low[v] = ++idx; stk[++sp] = v; on[v] = 1
    for (k = 1; k <= nadj[v]; k++) {
        w = adj[v, k]
        if (!(w in num)) { tarjan(w); if (low[w] < low[v]) low[v] = low[w] }
        else if (on[w] && num[w] < low[v]) low[v] = num[w]
    }
    if (low[v] != num[v]) return
    n = 0
    do { w = stk[sp--]; on[w] = 0; incomp[w] = v; m[++n] = w } while (w != v)
    if (n < 2) return
    # the circle's files, sorted (insertion sort: circles are small)
    for (i = 1; i <= n; i++) {
        split(m[i], a, SUBSEP); kind = a[1]; sorted[i] = a[2]
        for (j = i; j > 1 && sorted[j - 1] > sorted[j]; j--) {
            w = sorted[j]; sorted[j] = sorted[j - 1]; sorted[j - 1] = w
        }
    }
    files = ""
    for (i = 1; i <= n; i++) files = files (i > 1 ? " " : "") sorted[i]
    print "circle " kind " " files
    for (i = 1; i <= n; i++) for (k = 1; k <= nadj[m[i]]; k++) {
        w = adj[m[i], k]
        if (incomp[w] == v) {
            split(m[i], a, SUBSEP); j = a[2]; split(w, a, SUBSEP)
            print "  " j " -> " a[2] " (" ename[m[i], a[2]] ")"
        }
    }
}
AWK
while IFS= read -r out; do
  case $out in
    "circle include "*)
      say "files include each other in a circle (files must depend one way): ${out#circle include }" ;;
    "circle call "*)
      say "files call each other in a circle (files must depend one way; split out what both use): ${out#circle call }" ;;
    "  "*)
      echo "check-layout:  $out" ;;
  esac
done < <([ -z "$files" ] || awk "$CIRCLES_AWK" <(printf '%s\n' "$files") $files)

if [ $fail -ne 0 ]; then
  echo "check-layout: FAILED (rooms, lowest first: $ROOM_ORDER; see docs/architecture.md)"
  exit 1
fi
echo "check-layout: OK: $nfiles files, rooms $ROOM_ORDER: no private header crosses a room, no room includes a room above it, no CUDA #if outside gpu/, no circle of includes or calls"
