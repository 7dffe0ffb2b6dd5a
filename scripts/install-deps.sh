#!/usr/bin/env bash
# towerpack: install every Debian package the build, the tests and the main
# job need. Idempotent: packages already present are left alone, and when
# nothing is missing nothing is downloaded (not even the package lists).
#
#   scripts/install-deps.sh          install what is missing
#   scripts/install-deps.sh --check  only list what is missing (exit 1 if any)
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake pkg-config
  # actors and transport
  libzmq3-dev libczmq-dev libsodium-dev
  # wire format compression, record files
  liblz4-dev liblmdb-dev
  # tensorpack's msgpack datapoints (msgpack-c); the tensorpack tests'
  # Python side: numpy, msgpack(-numpy), zmq, lmdb
  libmsgpack-dev python3-numpy python3-msgpack python3-msgpack-numpy
  python3-zmq python3-lmdb
  # JSON (safetensors headers, stats.json): jansson, see docs/building.md
  libjansson-dev
  # checkpoint checksums (XXH3-64 per tensor); Python's xxhash checks them
  # in tests/gpu/test_checkpoint.c
  libxxhash-dev python3-xxhash
  # TensorBoard event files: protobuf-c encodes the messages, protoc-c
  # compiles their .proto at build time
  libprotobuf-c-dev protobuf-c-compiler
  # training curves: cairo draws, DejaVu is its font, libpng encodes
  libcairo2-dev fonts-dejavu-core libpng-dev
  # GPT-2's BPE (dataflow/tokenizer.c): ICU's Unicode classes; Python's
  # regex module checks the pre-tokeniser (tests/dataflow/test_proc_tokenizer.c)
  libicu-dev python3-regex
  # the curves test's outside PNG decoder
  python3-pil
  # gzip'd IDX files, checksums
  zlib1g-dev
  # images (dataflow/image/): JPEG, PNG, EXIF; the decoders' tests compare
  # with PIL and OpenCV, the augmentors' with numpy
  libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev libexif-dev python3-pil python3-opencv python3-numpy
  # the other formats torchvision's ImageFolder reads: WebP, TIFF, and
  # BMP / PGM / PPM through stb_image (dataflow/image/img_formats.c)
  libwebp-dev libtiff-dev libstb-dev
  # CPU backend: OpenBLAS products, oneDNN convolutions (gpu/cpu/dnnl_conv.c)
  libopenblas-dev libdnnl-dev
  # OpenBLAS's OpenMP build: its threads are the OpenMP team oneDNN and the
  # elementwise ops run on (gpu/cpu/cpu_pool.h), linked when present
  libopenblas-openmp-dev
  # tests; the API reference (scripts/api-docs.sh, checked by a test)
  libcriterion-dev doxygen
  # the event-file test's reader: Python's protobuf with the schema compiled
  # by protoc, crcmod's CRC32C
  python3-protobuf protobuf-compiler python3-crcmod
  # the cnn-bn training step checked against PyTorch (tests/models/
  # test_proc_torch_step.c)
  python3-torch
  # torchvision: the class order of an image folder (tests/tools/
  # colour_check.py) and the ResNet-18 image benchmark's PyTorch side
  # (bench/images/resnet18.py)
  python3-torchvision
  # distributed training (optional: without it the MPI module is not built)
  openmpi-bin libopenmpi-dev
  # hardening (scripts/fuzz.sh, scripts/valgrind.sh): libFuzzer needs clang
  # and its runtime library; memcheck
  clang libclang-rt-dev valgrind
  # the flake hunt's CPU load (scripts/test-repeat.sh --load)
  stress-ng
  # the main job's data: Fashion-MNIST IDX files under /usr/share/datasets
  dataset-fashion-mnist
  # tp-predict's confusion matrix image (cairo; fontconfig for its fonts)
  libcairo2-dev libfontconfig-dev
  # the ONNX export's checks (tests): ONNX's schema (compiled by protoc-c at
  # build time), its checker, OpenCV's DNN as an independent runtime
  libonnx-dev python3-onnx python3-opencv python3-numpy
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${1:-}" = "--check" ]; then
  if [ ${#missing[@]} -eq 0 ]; then echo "all towerpack dependencies are installed"; exit 0; fi
  echo "missing: ${missing[*]}"; exit 1
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then sudo="sudo"; else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
  fi
fi
echo "install-deps: installing ${missing[*]}"
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
