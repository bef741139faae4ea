#!/usr/bin/env bash
o=$OUT; unset OUT
timeout 200 scripts/gpu_test.sh --target test_cli_train_gpu --target dragon-cli -- -R '^test_cli_train_gpu$' > $o/suite.txt 2>&1
grep -E "tests passed|Failed|Assert" build-gpu/results/ctest.log | head > $o/fails.txt
export LD_LIBRARY_PATH=$PWD/.gpu/prefix/runlib
timeout 150 bench/shapes.sh --only "1b hn1m" --presets "w8a8 bf16" --no-anchor --steps 6 --budget 120 --out $o/startup.json > $o/shapes.txt 2>&1
python3 - $o/startup.json <<'PY' > $o/startup.txt
import json,sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["shape"], r["preset"], "first", r.get("first_step_s"), "ready", r.get("ready_s"), r.get("startup"), r.get("kernels"))
PY
