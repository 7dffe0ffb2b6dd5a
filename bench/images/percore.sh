#!/bin/bash
# towerpack bench: one core's rate of tp-train's ImageNet input pipeline at
# 224 px (`tp-train --image-size 224 --augment imagenet`'s spec, as its
# log's `training data:` line gives it, in batches of 64), in one process
# with no workers, so that it compares with one DataLoader worker of
# torchvision's (bench/peers/resnet18_torch.py --time-getitem N).
# docs/performance.md, "The input pipeline at 224 px per core".
#
# usage: bench/images/percore.sh DIR [BIN] [BATCHES]
#   DIR      a folder of class folders of JPEGs (bench/images/gen_colour.py DIR 400 256)
#   BIN      the folder with tp-bench (default build/bin)
#   BATCHES  batches of 64 to time after 2 untimed (default 20)
# Prints tp-bench's JSON line (samples_per_s: images a second of one core
# on a quiet host; on a loaded one time it with /usr/bin/time instead).
set -euo pipefail
dir=${1:?usage: percore.sh DIR [BIN] [BATCHES]}
bin=${2:-build/bin}
n=${3:-20}
rest='flip,random-order=brightness-scale=0.6:1.4;contrast=0.6:1.4;saturation=0.4,lighting=0.1,chw'
exec "$bin/tp-bench" dataflow \
    "imagefolder:$dir,mode=rgb,min-short=224,random-resized-crop=224 | imgaug $rest | batch 64" \
    --count "$n" --warmup 2 --json
