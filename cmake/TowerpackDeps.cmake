# towerpack: find every external library and give each an imported target
# (tp::<name>). A missing library stops the configure with the Debian package
# that provides it, so the fix is one apt-get away (scripts/install-deps.sh
# installs them all).
find_package(PkgConfig QUIET)

# tp_find_dep(<name> PC <pkg-config module> DEB <debian package>
#             HEADER <header> LIB <library name> [OPTIONAL])
function(tp_find_dep name)
  cmake_parse_arguments(A "OPTIONAL" "PC;DEB;HEADER;LIB" "" ${ARGN})
  if(TARGET tp::${name})
    return()
  endif()
  set(found FALSE)
  if(PkgConfig_FOUND AND A_PC)
    pkg_check_modules(TPDEP_${name} QUIET IMPORTED_TARGET GLOBAL ${A_PC})
    if(TPDEP_${name}_FOUND)
      add_library(tp::${name} INTERFACE IMPORTED GLOBAL)
      target_link_libraries(tp::${name} INTERFACE PkgConfig::TPDEP_${name})
      set(found TRUE)
    endif()
  endif()
  if(NOT found)
    find_path(TPDEP_${name}_INCLUDE ${A_HEADER})
    find_library(TPDEP_${name}_LIBRARY ${A_LIB})
    if(TPDEP_${name}_INCLUDE AND TPDEP_${name}_LIBRARY)
      add_library(tp::${name} UNKNOWN IMPORTED GLOBAL)
      set_target_properties(tp::${name} PROPERTIES
        IMPORTED_LOCATION "${TPDEP_${name}_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${TPDEP_${name}_INCLUDE}")
      set(found TRUE)
    endif()
  endif()
  if(NOT found AND NOT A_OPTIONAL)
    message(FATAL_ERROR
      "towerpack needs ${name} (${A_HEADER}, lib${A_LIB}). Install the Debian "
      "package '${A_DEB}' (apt-get install ${A_DEB}), or run "
      "scripts/install-deps.sh, which installs everything towerpack needs.")
  endif()
  set(TP_HAVE_${name} ${found} PARENT_SCOPE)
endfunction()

tp_find_dep(zmq      PC libzmq   DEB libzmq3-dev      HEADER zmq.h      LIB zmq)
tp_find_dep(czmq     PC libczmq  DEB libczmq-dev      HEADER czmq.h     LIB czmq)
tp_find_dep(lz4      PC liblz4   DEB liblz4-dev       HEADER lz4.h      LIB lz4)
tp_find_dep(lmdb     PC lmdb     DEB liblmdb-dev      HEADER lmdb.h     LIB lmdb)
tp_find_dep(jansson  PC jansson  DEB libjansson-dev   HEADER jansson.h  LIB jansson)
# checkpoints carry an XXH3-64 checksum of each tensor (gpu/graph/checkpoint.c)
tp_find_dep(xxhash   PC libxxhash DEB libxxhash-dev   HEADER xxhash.h   LIB xxhash)
tp_find_dep(zlib     PC zlib     DEB zlib1g-dev       HEADER zlib.h     LIB z)
# the job handshake's probe of a CURVE receiver (core/wire_job.c): libzmq's
# own crypto library, for the CurveZMQ handshake made by hand
tp_find_dep(sodium   PC libsodium DEB libsodium-dev   HEADER sodium.h   LIB sodium)
tp_find_dep(openblas PC openblas DEB libopenblas-dev  HEADER cblas.h    LIB openblas)
# OpenBLAS's OpenMP build (libopenblas-openmp-dev): its threads are then
# libgomp's, the one team that oneDNN and the elementwise ranges run on
# (gpu/cpu/cpu_pool.h), instead of a pthread pool of its own competing with
# it for the cores. Debian's default alternative is the pthread build, so
# the OpenMP library is linked by its path (the build's RPATH finds it
# before the alternative); the headers of the two builds are the same
# files, so the include directory stays the one found above.
find_library(TP_OPENBLAS_OPENMP_LIBRARY openblas NO_DEFAULT_PATH
  PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp)
if(TP_OPENBLAS_OPENMP_LIBRARY)
  get_target_property(_tp_blas_type tp::openblas TYPE)
  if(_tp_blas_type STREQUAL "INTERFACE_LIBRARY")
    get_target_property(_tp_blas_inc PkgConfig::TPDEP_openblas INTERFACE_INCLUDE_DIRECTORIES)
    set_target_properties(tp::openblas PROPERTIES
      INTERFACE_LINK_LIBRARIES "${TP_OPENBLAS_OPENMP_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${_tp_blas_inc}")
  else()
    set_target_properties(tp::openblas PROPERTIES IMPORTED_LOCATION "${TP_OPENBLAS_OPENMP_LIBRARY}")
  endif()
  # installed tools find it too (not Debian's pthread alternative)
  if(PROJECT_NAME STREQUAL "towerpack")
    get_filename_component(_tp_blas_dir "${TP_OPENBLAS_OPENMP_LIBRARY}" DIRECTORY)
    list(APPEND CMAKE_INSTALL_RPATH "${_tp_blas_dir}")
  endif()
else()
  message(WARNING "OpenBLAS's OpenMP build not found: linking its pthread "
    "build, whose threads compete with oneDNN's for the cores at --threads > 1. "
    "Install the Debian package 'libopenblas-openmp-dev' (scripts/install-deps.sh).")
endif()
# the CPU backend's convolutions (gpu/cpu/dnnl_conv.c): oneDNN (Debian's
# libdnnl-dev 2.6, no pkg-config file). Required: a build without it would
# hide the speed behind a silent fallback. Debian builds it on OpenMP
# (DNNL_CPU_RUNTIME_OMP, libgomp); dnnl_conv.c sets the OpenMP thread count
# of the calling thread, so libgomp is linked by name too.
tp_find_dep(dnnl     DEB libdnnl-dev      HEADER oneapi/dnnl/dnnl.h LIB dnnl)
find_library(TP_GOMP_LIBRARY NAMES gomp libgomp.so.1)
if(NOT TP_GOMP_LIBRARY)
  message(FATAL_ERROR "towerpack needs libgomp (the OpenMP runtime oneDNN "
    "runs on). Install the Debian package 'libgomp1' (it comes with gcc), or "
    "run scripts/install-deps.sh.")
endif()
set_property(TARGET tp::dnnl APPEND PROPERTY INTERFACE_LINK_LIBRARIES ${TP_GOMP_LIBRARY})
# tensorpack's msgpack datapoints (dataflow/df_tp_msgpack.c): msgpack-c
tp_find_dep(msgpack  PC msgpack  DEB libmsgpack-dev   HEADER msgpack.h  LIB msgpackc)
# TensorBoard event files (pipeline/callbacks/monitor_tfevents.c): the
# messages are encoded by protobuf-c from .proto files compiled at build time.
tp_find_dep(protobufc PC libprotobuf-c DEB libprotobuf-c-dev
            HEADER protobuf-c/protobuf-c.h LIB protobuf-c)
# Images (dataflow/image/): JPEG through libjpeg-turbo's TurboJPEG API, PNG
# through libpng, EXIF orientation through libexif. Training curves (pipeline/callbacks/plot.c):
# cairo draws them, with a real font found through fontconfig; libpng encodes
# the PNG.
tp_find_dep(turbojpeg PC libturbojpeg DEB libturbojpeg0-dev HEADER turbojpeg.h LIB turbojpeg)
# the libjpeg API of the same libjpeg-turbo: decoding only a region's band
# (jpeg_crop_scanline, jpeg_skip_scanlines), which TurboJPEG 2 lacks
tp_find_dep(jpeg     PC libjpeg  DEB libjpeg62-turbo-dev HEADER jpeglib.h LIB jpeg)
tp_find_dep(png      PC libpng   DEB libpng-dev       HEADER png.h      LIB png)
tp_find_dep(exif     PC libexif  DEB libexif-dev      HEADER libexif/exif-data.h LIB exif)
# the rest of torchvision's image formats (dataflow/image/img_formats.c):
# WebP through libwebp (and its demuxer), TIFF through libtiff; BMP and PGM/PPM through
# stb_image, a header compiled into img_formats.c (libstb-dev), so only its
# header is looked for
tp_find_dep(webp     PC libwebp  DEB libwebp-dev      HEADER webp/decode.h LIB webp)
# an animated WebP's first frame: libwebp's demuxer (the same package)
tp_find_dep(webpdemux PC libwebpdemux DEB libwebp-dev HEADER webp/demux.h LIB webpdemux)
tp_find_dep(tiff     PC libtiff-4 DEB libtiff-dev     HEADER tiffio.h   LIB tiff)
# (a program built on an installed towerpack needs none of it)
if(PROJECT_NAME STREQUAL "towerpack")
  find_path(TP_STB_INCLUDE stb/stb_image.h)
  if(NOT TP_STB_INCLUDE)
    message(FATAL_ERROR "towerpack needs stb_image (stb/stb_image.h) to read "
      "BMP, PGM and PPM images. Install the Debian package 'libstb-dev' "
      "(apt-get install libstb-dev), or run scripts/install-deps.sh.")
  endif()
endif()
tp_find_dep(cairo    PC cairo    DEB libcairo2-dev    HEADER cairo.h    LIB cairo)
# GPT-2's BPE pre-tokeniser (dataflow/tokenizer.c): ICU's Unicode character
# classes (general categories L and N, White_Space)
tp_find_dep(icu      PC icu-uc   DEB libicu-dev       HEADER unicode/uchar.h LIB icuuc)
if(TP_BUILD_TESTS)
  tp_find_dep(criterion PC criterion DEB libcriterion-dev
              HEADER criterion/criterion.h LIB criterion)
endif()
find_package(Threads REQUIRED)
