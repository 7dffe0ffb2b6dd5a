#!/usr/bin/env bash
# towerpack: check the layering of the rooms (docs/architecture.md, "Rooms").
#
#   bash scripts/check-layout.sh        exit 0 and one OK line when clean,
#                                       exit 1 with one line per violation
#
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
set -u
cd "$(dirname "$0")/.." || exit 2

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
  [status.h]=core [log.h]=core [clock.h]=core [rng.h]=core [tensor.h]=core
  [datapoint.h]=core [fileio.h]=core [process.h]=core [wire.h]=core
  [module.h]=core [version.h]=core
  [actor.h]=actors [stats.h]=actors [supervisor.h]=actors [security.h]=actors
  [dataflow.h]=dataflow [dataflow_lib.h]=dataflow [dataflow_spec.h]=dataflow
  [image.h]=dataflow   # dataflow/image/, a sub-room: decoders, image sources, imgaug
  [actor_dataflow.h]=dataflow [tensorpack.h]=dataflow
  [backend.h]=gpu [device.h]=gpu [graph.h]=gpu [optim.h]=gpu [checkpoint.h]=gpu
  [launch.h]=pipeline [trainer_loop.h]=pipeline [callback.h]=pipeline
  [model_callbacks.h]=pipeline [logdir.h]=pipeline [plot.h]=pipeline
  [predict.h]=pipeline
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
files=$(git ls-files -- '*.c' '*.h' '*.cu' 2>/dev/null || find . -name '*.[ch]' -o -name '*.cu')
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
done < <(git grep -nE '^[[:space:]]*#[[:space:]]*(if|ifdef|ifndef|elif)\b.*(TP_WITH_CUDA|TP_CUDA_ENABLED|__CUDACC__|__CUDA_ARCH__|CUDART_VERSION|CUDA_VERSION)' \
           -- '*.c' '*.h' '*.cu' 2>/dev/null)

if [ $fail -ne 0 ]; then
  echo "check-layout: FAILED (rooms, lowest first: $ROOM_ORDER; see docs/architecture.md)"
  exit 1
fi
echo "check-layout: OK: $nfiles files, rooms $ROOM_ORDER: no private header crosses a room, no room includes a room above it, no CUDA #if outside gpu/"
