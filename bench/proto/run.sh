#!/usr/bin/env bash
# Builds and runs the attention prototype on the GPU machine: bench/proto/run.sh [B T]...
set -uo pipefail
cd "$(dirname "$0")"
out=${OUT:-/tmp}
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v attn_ws.cu -o /tmp/attn_ws -lcuda -lcublas >$out/proto_build.txt 2>&1 || { tail -30 $out/proto_build.txt; exit 1; }
while [ $# -ge 2 ]; do
  timeout 120 /tmp/attn_ws "$1" "$2" 2>&1 | tee -a $out/proto.txt
  shift 2
done
