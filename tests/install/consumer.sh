#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then builds a tiny outside
# program against it twice: through find_package(towerpack) (shared and
# static) and through pkg-config. Each must build and run.
set -euo pipefail
: "${TP_BUILD_DIR:?}" "${TP_SOURCE_DIR:?}"
work=$(mktemp -d /tmp/tp-install-XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
cmake --install "$TP_BUILD_DIR" --prefix "$prefix" >"$work/install.log"
test -f "$prefix/include/towerpack/towerpack.h"
test -f "$prefix/lib/pkgconfig/towerpack.pc" || test -f "$prefix/lib64/pkgconfig/towerpack.pc"
# The model zoo is tp-train's and the examples', not installed: no header
# may be installed whose functions the installed libraries lack (main.c
# includes towerpack.h, so an umbrella that still named models.h fails too).
if [ -e "$prefix/include/towerpack/models.h" ] ||
   compgen -G "$prefix/lib*/libtowerpack_models*" >/dev/null; then
  echo "the model zoo (models.h, libtowerpack_models) was installed" >&2; exit 1
fi

echo "== find_package(towerpack)"
cmake -S "$TP_SOURCE_DIR/tests/install/consumer" -B "$work/cm" \
      -DCMAKE_PREFIX_PATH="$prefix" >"$work/cm.log"
cmake --build "$work/cm" >>"$work/cm.log"
LD_LIBRARY_PATH="$prefix/lib" "$work/cm/consumer_shared"
"$work/cm/consumer_static"
if ldd "$work/cm/consumer_static" | grep -q libtowerpack; then
  echo "consumer_static links libtowerpack dynamically" >&2; exit 1
fi

echo "== pkg-config towerpack"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# shellcheck disable=SC2046
cc -o "$work/pc_shared" "$TP_SOURCE_DIR/tests/install/consumer/main.c" \
   $(pkg-config --cflags --libs towerpack)
LD_LIBRARY_PATH="$prefix/lib" "$work/pc_shared"
# shellcheck disable=SC2046
cc -o "$work/pc_static" "$TP_SOURCE_DIR/tests/install/consumer/main.c" \
   $(pkg-config --cflags towerpack) "$prefix/lib/libtowerpack.a" \
   $(pkg-config --libs-only-l --static towerpack | sed 's/-ltowerpack//')
"$work/pc_static"
echo "install consumer: 4 builds ok"
