#!/usr/bin/env bash
# scripts/device-check and scripts/device-bundle without a GPU: the
# one-line exit 77 (no visible device; nvidia-smi missing or listing none),
# bad flags (exit 2 naming the flag), a whole run against fake binaries and
# a fake nvidia-smi (every section, the report's numbers and ratios, $OUT,
# a failing section), tandem-gpu-bench's own exit 77, and the bundle's
# library list (no glibc, driver, NCCL or cuBLAS).
# Usage: device_check_test.sh BUILD_DIR SOURCE_DIR SHARED_DIR
set -euo pipefail
build=$1; src=$2; shared=$3
check=$src/scripts/device-check
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# expect_77 REASON [env...]: exactly one line, exit 77.
expect_77() {
  local reason=$1; shift
  local out rc=0
  out=$(env "$@" "$BASH" "$check" 2>&1) || rc=$?
  [ "$rc" = 77 ] || fail "exit $rc, not 77 ($reason): $out"
  [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] || fail "not one line ($reason): $out"
  [ "$out" = "device-check: no CUDA GPU ($reason); nothing to check" ] || fail "line: $out"
}
expect_77 "CUDA_VISIBLE_DEVICES is empty" CUDA_VISIBLE_DEVICES=
mkdir -p "$tmp/none" "$tmp/nogpu" "$tmp/gpu"
expect_77 "nvidia-smi not found" -u CUDA_VISIBLE_DEVICES PATH="$tmp/none"
printf '#!/bin/sh\necho "No devices were found"\nexit 6\n' > "$tmp/nogpu/nvidia-smi"
chmod +x "$tmp/nogpu/nvidia-smi"
expect_77 "nvidia-smi lists no GPU" -u CUDA_VISIBLE_DEVICES PATH="$tmp/nogpu:$PATH"

for flags in "--bogus" "--bin" "--shared ''"; do
  rc=0; out=$(eval bash "$check" "$flags" 2>&1) || rc=$?
  [ "$rc" = 2 ] || fail "$flags: exit $rc, not 2: $out"
  name=${flags%% *}
  printf '%s' "$out" | grep -q -- "$name" || fail "$flags: message does not name the flag: $out"
done

# --- A whole run against fakes.
cat > "$tmp/gpu/nvidia-smi" <<'EOF'
#!/bin/sh
case "$1" in
  -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-fake)" ;;
  --query-gpu=*) echo "NVIDIA H200, 580.159.04, 143771 MiB, 1980 MHz" ;;
  *) echo "| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0 |" ;;
esac
EOF
chmod +x "$tmp/gpu/nvidia-smi"
mkdir -p "$tmp/bin"
cat > "$tmp/bin/tandem-gpu-bench" <<'EOF'
#!/bin/sh
case "$1" in
  peak) echo "peak_bf16_gemm_tflops=790.0"; echo "copy_gbps=4300" ;;
  prefill) echo "prefill_tflops=355.5"; echo "prefill_pct_of_peak=45.0"; echo "prefill_ms=12.5"
           echo "prefill_gemm_ms=10.0"; echo "prefill_attention_ms=1.5"; echo "prefill_other_ms=1.0"
           echo "| gemm | m | n | k | engine ms | cuBLASLt ms | engine speed (cuBLASLt ms / engine ms) |"
           echo "| qkv | 2048 | 3072 | 2048 | 0.0400 | 0.0380 | 95% |" ;;
  decode) for a in "$@"; do case "$prev" in --batch) b=$a ;; esac; prev=$a; done
          [ "$b" = 32 ] && [ -n "${FAIL_B32:-}" ] && { echo "decode failed" >&2; exit 1; }
          echo "decode_tokens_per_s=$((b * 400)).0"; echo "decode_step_ms=2.0"
          echo "decode_weight_gbps=2600"; echo "decode_weight_pct_of_copy=60.5" ;;
  invariance) echo "| n x k | engine | m=1 |"; echo "| 3072 x 2048 | cublaslt | yes |" ;;
esac
EOF
# The fake tandem: selftest, synth-model, and for the KV sections
# (scripts/device-kv) `up` and `generate`. `up` reads the generated
# config's metrics ports and kv.transport, serves canned /metrics for P and D
# (python3 -m http.server; the bytes on the config's transport, or on tcp
# when $FAKE_KV_FALLBACK names that transport; nccl's count only with
# --nccl-one-gpu-test), prints tandem up's process table with the servers'
# pids as P's and D's, and waits for SIGTERM. `generate --json` answers
# [1, 2, 3] with TTFT 100 ms local, 105 ms remote and one prompt token per
# word plus BOS; a remote request of 4 tokens (the kill case's) waits for
# P's pid to die and then fails.
cat > "$tmp/bin/tandem" <<'FAKE'
#!/bin/bash
d=$(dirname "$0")
case "$1" in
  selftest) echo "selftest: 42 of 42 checks passed (fake)" ;;
  synth-model) echo "tandem: wrote (fake)" ;;
  up)
    cfg=""; flag=0; prev=""
    for a in "$@"; do
      [ "$prev" = --config ] && cfg=$a
      [ "$a" = --nccl-one-gpu-test ] && flag=1
      prev=$a
    done
    transport=$(grep -o 'transport: [a-z_]*' "$cfg" | cut -d' ' -f2)
    moved=$transport
    [ "${FAKE_KV_FALLBACK:-}" = "$transport" ] && moved=tcp
    [ "$transport" = nccl ] && [ "$flag" = 0 ] && moved=none
    mdir=$(mktemp -d); pids=()
    for w in prefill-0 decode-0; do
      port=$(grep "name: $w," "$cfg" | grep -o "metrics_listen: '127.0.0.1:[0-9]*'" | grep -o '[0-9]*' | tail -1)
      mkdir -p "$mdir/$w"
      dir=sent; [ "$w" = decode-0 ] && dir=received
      {
        echo "# TYPE tandem_kv_transfer_bytes_total counter"
        for t in tcp nccl cuda_ipc; do
          v=0; [ "$t" = "$moved" ] && v=4096
          echo "tandem_kv_transfer_bytes_total{direction=\"$dir\",transport=\"$t\"} $v"
        done
        echo "tandem_prefill_tokens_computed_total 100"
        echo 'tandem_kv_cache_blocks{state="used"} 0'
        echo "tandem_kv_transfers_in_flight 0"
        echo "tandem_num_requests_running 0"
        echo "tandem_num_requests_waiting 0"
        echo "tandem_kv_transfer_stream_seconds_sum 0.25"
        echo "tandem_kv_transfer_stream_seconds_count 10"
        echo "tandem_kv_load_to_first_decode_seconds_sum 0.02"
        echo "tandem_kv_load_to_first_decode_seconds_count 10"
      } > "$mdir/$w/metrics"
      python3 -m http.server "$port" --bind 127.0.0.1 --directory "$mdir/$w" > /dev/null 2>&1 &
      pids+=($!)
      until python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2> /dev/null; do
        sleep 0.05
      done
    done
    echo "${pids[0]}" > "$d/fake-prefill.pid"
    trap 'kill "${pids[@]}" 2> /dev/null; rm -rf "$mdir"; exit 0' TERM
    echo "tandem: process router role=router pid=$$ address=127.0.0.1:1"
    echo "tandem: process prefill-0 role=prefill pid=${pids[0]} address=127.0.0.1:2"
    echo "tandem: process decode-0 role=decode pid=${pids[1]} address=127.0.0.1:3 kv=127.0.0.1:4"
    echo "tandem: cluster ready, router at 127.0.0.1:1"
    while :; do sleep 0.1; done ;;
  generate)
    route=""; max=""; prev=""
    for a in "$@"; do
      [ "$prev" = --route ] && route=$a
      [ "$prev" = --max-tokens ] && max=$a
      prev=$a
    done
    prompt=${!#}
    if [ "$route" = remote ] && [ "$max" = 4 ]; then
      p=$(cat "$d/fake-prefill.pid")
      while kill -0 "$p" 2> /dev/null; do sleep 0.05; done
      echo "tandem: UNAVAILABLE: prefill worker lost (fake)" >&2
      exit 1
    fi
    ids=$(python3 -c 'import sys; print(",".join(["1"] * (len(sys.argv[1].split()) + 1)))' "$prompt")
    ttft=100.0; [ "$route" = remote ] && ttft=105.0
    echo "{\"route\":\"$route\",\"prompt_token_ids\":[$ids],\"token_ids\":[1,2,3],\"timing\":{\"ttft_ms\":$ttft,\"e2e_ms\":200.0}}" ;;
esac
FAKE
for b in tandem-router tandem-worker; do
  printf '#!/bin/sh\nexit 1\n' > "$tmp/bin/$b"
done
for t in cuda_kernels_test cuda_resources_test cuda_backend_test; do
  printf '#!/bin/sh\necho "[  PASSED  ] 3 tests. (fake %s, shared $TANDEM_SHARED_DIR)"\n' "$t" \
    > "$tmp/bin/$t"
done
chmod +x "$tmp/bin/"*
run_fake() {
  env -u CUDA_VISIBLE_DEVICES PATH="$tmp/gpu:$PATH" OUT="$tmp/out" "$@" bash "$check" \
    --bin "$tmp/bin" --shared "$shared" --work "$tmp/check" > "$tmp/run.log" 2>&1
}
rc=0; run_fake || rc=$?
[ "$rc" = 0 ] || fail "fake run: exit $rc: $(tail -20 "$tmp/run.log")"
report=$tmp/out/report.md
[ -f "$report" ] && [ -f "$tmp/out/device-check.log" ] || fail "no \$OUT/report.md or log"
for want in \
  "GPU, driver, memory, max SM clock: NVIDIA H200, 580.159.04, 143771 MiB, 1980 MHz; CUDA (driver) 13.0;" \
  "| bf16 GEMM peak (cuBLASLt, 8192^3) | 790.0 TFLOP/s | (ceiling) |" \
  "| device copy bandwidth (read + write) | 4300 GB/s | (ceiling) |" \
  "| prefill 2048 tokens, 1B | 355.5 TFLOP/s = 45.0% of peak (12.5 ms: GEMM 10.0, attention 1.5, other 1.0) | >= 40% (stretch 50%) |" \
  "| decode batch 1 (prompt 128, output 128) | 400.0 tokens/s; weights 2600 GB/s = 60.5% of copy (step 2.0 ms) | >= 55% (stretch 70%) |" \
  "| decode batch 32 | 12800.0 tokens/s | - |" \
  "| decode batch 128 | 51200.0 tokens/s = 128.0x batch 1 | >= 30x |" \
  "| selftest | 42 of 42 checks passed | all |" \
  "| CUDA tests (tests/cuda) | ok, " \
  "| qkv | 2048 | 3072 | 2048 | 0.0400 | 0.0380 | 95% |" \
  "| 3072 x 2048 | cublaslt | yes |" \
  "| KV over cuda_ipc: stories260K golden cases, remote == local | 6 of 6; P sent 4096 B, D received 4096 B over cuda_ipc (other transports: sent tcp 0, nccl 0); TTFT remote / local 1.05; D stream 25.00 ms, FINAL to first decode 2.00 ms | all; only cuda_ipc's counter moves |" \
  "| KV over nccl (one GPU, --nccl-one-gpu-test): stories260K golden cases, remote == local | 6 of 6; P sent 4096 B, D received 4096 B over nccl (other transports: sent tcp 0, cuda_ipc 0); TTFT remote / local 1.05;" \
  "| KV over tcp (staged through pinned host memory): stories260K golden cases, remote == local | 6 of 6; P sent 4096 B, D received 4096 B over tcp (other transports: sent nccl 0, cuda_ipc 0);" \
  "| SIGKILL of P during 8 remote prefills (4000 tokens) | 8 failed, 0 finished, 0 hung; last ended " \
  "D: 0 blocks in use, 0 transfers in flight, serves after: yes | all end within the timeout; 0 blocks, 0 in flight |" \
  "| remote-prefill TTFT / local, 2048 tokens, 1B, cuda_ipc (median of 5, first excluded) | 1.050 (105.00 ms / 100.00 ms) | <= 1.10 |"; do
  grep -qF -- "$want" "$report" || fail "report lacks: $want
$(cat "$report")"
done
grep -qF "===== report (for docs/benchmarks.md) =====" "$tmp/run.log" || fail "no report on stdout"
tail -n "$(wc -l < "$report")" "$tmp/run.log" | cmp -s - "$report" || fail "stdout ends otherwise than report.md"
grep -q "decode_b128 ok" "$report" || fail "sections line: $(grep Sections "$report")"
for k in kv_cuda_ipc kv_nccl kv_tcp kv_kill kv_overlap; do
  grep -q "$k ok" "$report" || fail "$k not ok: $(grep Sections "$report")
$(cat "$tmp/check/$k.out")"
done
# The generated cluster: P and D on cuda:0, the transport fixed.
grep -q "transport: nccl" "$tmp/check/kv/golden-nccl.yaml" ||
  fail "nccl config: $(cat "$tmp/check/kv/golden-nccl.yaml")"
[ "$(grep -c "device: 'cuda:0'" "$tmp/check/kv/golden-nccl.yaml")" = 2 ] || fail "P and D not both on cuda:0"
grep -qF "fake cuda_backend_test, shared $(cd "$shared" && pwd)" "$tmp/check/cuda_tests.out" ||
  fail "CUDA tests not run with TANDEM_SHARED_DIR: $(cat "$tmp/check/cuda_tests.out")"

# A failing section: reported, the others still run, exit 1. And a silent
# fallback (the nccl run's bytes counted under tcp) fails that section
# alone, naming the fallback.
rc=0; run_fake FAIL_B32=1 FAKE_KV_FALLBACK=nccl || rc=$?
[ "$rc" = 1 ] || fail "failing section: exit $rc, not 1"
grep -q "decode_b32 FAILED (rc 1)" "$report" || fail "failed section not reported: $(cat "$report")"
grep -q "decode_b128 ok" "$report" || fail "sections after the failure did not run"
grep -q "kv_nccl FAILED (rc 1)" "$report" || fail "fallback not reported: $(grep Sections "$report")"
grep -q "kv_cuda_ipc ok" "$report" && grep -q "kv_tcp ok" "$report" ||
  fail "other transports: $(grep Sections "$report")"
grep -q "FAIL: bytes over tcp in a nccl run" "$tmp/check/kv_nccl.out" || fail "$(cat "$tmp/check/kv_nccl.out")"

# --quick: no 1B model, a short decode.
rm -rf "$tmp/out"
rc=0; env -u CUDA_VISIBLE_DEVICES PATH="$tmp/gpu:$PATH" OUT="$tmp/out" bash "$check" --quick \
  --bin "$tmp/bin" --shared "$shared" --work "$tmp/check" > "$tmp/run.log" 2>&1 || rc=$?
[ "$rc" = 0 ] || fail "--quick: exit $rc"
grep -q "synth_1b" "$tmp/out/report.md" && fail "--quick wrote the 1B model"
grep -qF "| decode batch 1, stories260K (prompt 32, output 32) | 400.0 tokens/s | - |" \
  "$tmp/out/report.md" || fail "--quick report: $(cat "$tmp/out/report.md")"
grep -qF "| SIGKILL of P during 16 remote prefills (1500 tokens) | 16 failed" "$tmp/out/report.md" ||
  fail "--quick kill case: $(cat "$tmp/out/report.md")"
grep -q "kv_overlap" "$tmp/out/report.md" && fail "--quick ran the overlap figure"

# --kv-only: versions, the 1B model, the KV sections; no benchmarks.
rm -rf "$tmp/out"
rc=0; env -u CUDA_VISIBLE_DEVICES PATH="$tmp/gpu:$PATH" OUT="$tmp/out" bash "$check" --kv-only \
  --bin "$tmp/bin" --shared "$shared" --work "$tmp/check" > "$tmp/run.log" 2>&1 || rc=$?
[ "$rc" = 0 ] || fail "--kv-only: exit $rc: $(tail -20 "$tmp/run.log")"
grep -q "Sections: versions ok, [0-9.]* s; synth_1b ok, [0-9.]* s; kv_cuda_ipc ok" "$tmp/out/report.md" ||
  fail "--kv-only sections: $(grep Sections "$tmp/out/report.md")"
grep -qE "bf16 GEMM peak|decode batch|selftest" "$tmp/out/report.md" && fail "--kv-only ran a benchmark"
grep -qF "| 1.050 (105.00 ms / 100.00 ms) | <= 1.10 |" "$tmp/out/report.md" || fail "--kv-only overlap"
rc=0; bash "$check" --quick --kv-only > /dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "--quick --kv-only: exit $rc, not 2"

# --- tandem-gpu-bench (CUDA builds only): one line, exit 77.
if [ -x "$build/tandem-gpu-bench" ]; then
  rc=0; out=$(CUDA_VISIBLE_DEVICES= "$build/tandem-gpu-bench" peak 2>&1) || rc=$?
  [ "$rc" = 77 ] || fail "tandem-gpu-bench: exit $rc, not 77: $out"
  [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] || fail "tandem-gpu-bench: not one line: $out"
  case "$out" in "tandem-gpu-bench: no CUDA GPU ("*"); nothing to measure") ;;
    *) fail "tandem-gpu-bench: $out" ;; esac
fi

# --- The bundle's libraries: what the machine lacks, nothing it has.
libs=$(bash "$src/scripts/device-bundle" --list-libs "$build/tandem")
printf '%s\n' "$libs" | grep -q '/libstdc++\.so' || fail "libstdc++ not bundled: $libs"
if printf '%s\n' "$libs" | grep -E '/(libc|libm|libdl|librt|libpthread|libcuda|libnccl|libcublas|libcublasLt)\.so|ld-linux'; then
  fail "a system, driver, NCCL or cuBLAS library would be bundled"
fi
rc=0; bash "$src/scripts/device-bundle" --bogus > /dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "device-bundle --bogus: exit $rc"
echo "PASS"
