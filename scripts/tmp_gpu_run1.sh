#!/usr/bin/env bash
# one-off device run (not committed)
export DRAGON_TEST_QUICK=1
t0=$(date +%s)
scripts/gpu_test.sh --target test_gpu_train --target test_gpu_gate --target test_gpu_model --target test_gpu_decoder_gate --target test_gpu_graph --target step --target dragon -- -R 'gpu_train|gpu_gate|gpu_model|decoder_gate|gpu_graph' > $OUT/suite.txt 2>&1
echo "suite rc=$? $(( $(date +%s) - t0 ))s"
tail -5 $OUT/suite.txt
grep -E "Passed|Failed|\*\*\*" $OUT/ctest.log | head -20
export LD_LIBRARY_PATH=$PWD/.gpu/prefix/runlib
timeout 150 build-gpu/bench/step --presets bf16,w8a8,bitnet --train --no-torch --reps 10 --warmup 3 --out $OUT/step-train.json 2> $OUT/step-train.err
echo "step rc=$? $(( $(date +%s) - t0 ))s"; grep -E "training|ms$" $OUT/step-train.err | head; grep -E '"mode"|step_ms|fwd_bwd_ms|error' $OUT/step-train.json
DRAGON_CORPUS=$PWD/.gpu/corpus/shakespeare.txt timeout 120 build-gpu/dragon train --preset w8a8 --steps 300 --eval-every 100 --out $OUT/run-w8a8 --json
echo "train rc=$? $(( $(date +%s) - t0 ))s"
head -3 $OUT/run-w8a8/log.jsonl; grep val_loss $OUT/run-w8a8/log.jsonl; rm -f $OUT/run-w8a8/*.safetensors
