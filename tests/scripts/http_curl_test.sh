#!/usr/bin/env bash
# The README's HTTP commands with curl against a real local cluster
# (`tandem up` on deploy/local/cluster.yaml, ports made free): a greedy
# completion equals the gRPC result (`tandem generate`), `curl -N` streams
# server-sent events ending in [DONE] with the same text, /metrics shows
# the histograms, /ready answers 200.
# Usage: http_curl_test.sh BUILD_DIR SOURCE_DIR SHARED_DIR
set -euo pipefail
build=$1; src=$2; shared=$3
tmp=$(mktemp -d)
up_pid=""
cleanup() {
  if [ -n "$up_pid" ]; then kill -INT "$up_pid" 2>/dev/null || true; wait "$up_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; echo "--- tandem up log:" >&2; tail -n 40 "$tmp/up.log" >&2 || true; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
grpc_port=$(free_port); http_port=$(free_port)
sed -e "s/listen: 127.0.0.1:50051/listen: 127.0.0.1:$grpc_port/" \
    -e "s/http_listen: 127.0.0.1:8000/http_listen: 127.0.0.1:$http_port/" \
    "$src/deploy/local/cluster.yaml" > "$tmp/cluster.yaml"
grep -q "http_listen: 127.0.0.1:$http_port" "$tmp/cluster.yaml" || fail "deploy/local/cluster.yaml has no http_listen: 127.0.0.1:8000"

"$build/tandem" up --config "$tmp/cluster.yaml" --model "$shared/models/stories260K.gguf" \
  > "$tmp/up.log" 2>&1 < /dev/null &
up_pid=$!
base="http://127.0.0.1:$http_port"
for _ in $(seq 1 300); do
  curl -sf "$base/ready" > /dev/null 2>&1 && break
  kill -0 "$up_pid" 2>/dev/null || fail "tandem up exited"
  sleep 0.2
done
curl -sf "$base/ready" > /dev/null || fail "/ready never answered 200"

body='{"model":"stories260K","prompt":"Once upon a time","max_tokens":16,"temperature":0}'
curl -s "$base/v1/completions" -H 'Content-Type: application/json' -d "$body" > "$tmp/plain.json"
"$build/tandem" generate --router "127.0.0.1:$grpc_port" --json --temperature 0 --max-tokens 16 \
  "Once upon a time" > "$tmp/grpc.json" || fail "tandem generate failed"

stream_body='{"model":"stories260K","prompt":"Once upon a time","max_tokens":16,"temperature":0,"stream":true}'
curl -sN "$base/v1/completions" -H 'Content-Type: application/json' -d "$stream_body" > "$tmp/stream.txt"
curl -s "$base/metrics" > "$tmp/metrics.txt"

python3 - "$tmp" <<'PY' || fail "responses differ (see above)"
import json, sys
tmp = sys.argv[1]
plain = json.load(open(f"{tmp}/plain.json"))
grpc = json.load(open(f"{tmp}/grpc.json"))
text = plain["choices"][0]["text"]
assert text == grpc["text"], (text, grpc["text"])
assert plain["choices"][0]["finish_reason"] == "length", plain
assert plain["usage"]["completion_tokens"] == 16, plain
events = [l[len("data: "):] for l in open(f"{tmp}/stream.txt").read().split("\n") if l.startswith("data: ")]
assert events and events[-1] == "[DONE]", events[-3:]
streamed = "".join(c["text"] for e in events[:-1] for c in json.loads(e)["choices"])
assert streamed == text, (streamed, text)
metrics = open(f"{tmp}/metrics.txt").read()
for name in ["tandem_time_to_first_token_seconds_bucket", "tandem_e2e_request_latency_seconds_count",
             "tandem_inter_token_latency_seconds_bucket", "tandem_time_per_output_token_seconds_bucket",
             "tandem_request_queue_time_seconds_bucket", "tandem_request_phase_seconds_bucket"]:
    assert name in metrics, name
print("ok: completion, SSE stream and /metrics agree:", repr(text))
PY
