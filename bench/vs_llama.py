#!/usr/bin/env python3
"""Summarizes scripts/bench-vs-llama's rounds as Markdown tables.

Input: a folder holding machine.txt, tandem-<model>@<kv>@<q8>-<round>.json
(Google Benchmark JSON of BM_Prefill/threads:T and
BM_Decode/batch:B/threads:T, counter tokens/s) and
llama-<model>@<kv>@-<round>.json (llama-bench -o json: n_prompt, n_gen,
n_threads, avg_ts per entry).

Output (stdout):
1. The machine (machine.txt).
2. Per (model, KV dtype, Tandem's Q8_0 path, phase, threads): the median
   over rounds of Tandem's and llama.cpp's tokens/s, the median of the
   per-round ratios Tandem / llama.cpp and their spread (min-max), and
   issue #19's target where it has one (prefill >= 1.2x, batch-1 decode
   >= 1.1x on the 110M F32 and Q8_0 models). Prefill = pp512 beside
   BM_Prefill (512 tokens); decode = tg128 beside BM_Decode/batch:1
   (context 128).
3. Per (model, KV, path, threads): Tandem's batch-32 / batch-1 decode
   tokens/s (median of per-round ratios; target >= 8x on 110M Q8_0 with
   int8 and F16 KV).
"""
import glob
import json
import os
import re
import statistics
import sys

NAME = re.compile(r"(tandem|llama)-(.*)@(\w*)@(\w*)-(\d+)\.json$")


def load(folder):
    """{(model, kv, q8, phase, threads, round): tokens/s} per program."""
    tandem, llama = {}, {}
    for path in glob.glob(os.path.join(folder, "*.json")):
        m = NAME.match(os.path.basename(path))
        if not m:
            continue
        prog, model, kv, q8, rnd = m.groups()
        try:
            data = json.load(open(path))
        except json.JSONDecodeError:
            continue
        if prog == "tandem":
            for b in data["benchmarks"]:
                if b.get("run_type") != "iteration" or "tokens/s" not in b:
                    continue
                t = re.search(r"threads:(\d+)", b["name"])
                batch = re.search(r"batch:(\d+)", b["name"])
                if b["name"].startswith("BM_Prefill"):
                    phase = "prefill"
                elif batch:
                    phase = f"decode b{batch.group(1)}"
                else:
                    continue
                tandem[(model, kv, q8, phase, int(t.group(1)), int(rnd))] = b["tokens/s"]
        else:
            for e in data:
                phase = "prefill" if e.get("n_prompt", 0) > 0 else "decode b1"
                llama[(model, kv, phase, int(e["n_threads"]), int(rnd))] = e["avg_ts"]
    return tandem, llama


def target(model, kv, q8, phase):
    if not re.match(r"110M-(f32|q8_0)$", model):
        return ""
    return {"prefill": ">= 1.2x", "decode b1": ">= 1.1x"}.get(phase, "")


def spread(values):
    return f"{min(values):.2f}-{max(values):.2f}"


def main():
    folder = sys.argv[1]
    machine = os.path.join(folder, "machine.txt")
    if os.path.exists(machine):
        print("```")
        print(open(machine).read().rstrip())
        print("```\n")
    tandem, llama = load(folder)
    print("| model | KV | Q8_0 path | phase | threads | Tandem tok/s | llama.cpp tok/s "
          "| Tandem / llama.cpp (median of rounds) | spread | target | rounds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    keys = sorted({k[:5] for k in tandem if k[3] in ("prefill", "decode b1")})
    for model, kv, q8, phase, threads in keys:
        rounds = sorted(k[5] for k in tandem if k[:5] == (model, kv, q8, phase, threads))
        t = [tandem[(model, kv, q8, phase, threads, r)] for r in rounds]
        l = [llama.get((model, kv, phase, threads, r)) for r in rounds]
        pairs = [(a, b) for a, b in zip(t, l) if b]
        ratios = [a / b for a, b in pairs]
        lm = f"{statistics.median([b for _, b in pairs]):.1f}" if pairs else "n/a"
        ratio = f"{statistics.median(ratios):.2f}x" if ratios else "n/a"
        print(f"| {model} | {kv} | {q8} | {phase} | {threads} | {statistics.median(t):.1f} "
              f"| {lm} | {ratio} | {spread(ratios) if ratios else ''} "
              f"| {target(model, kv, q8, phase)} | {len(rounds)} |")
    print()
    print("| model | KV | Q8_0 path | threads | Tandem batch-32 / batch-1 decode "
          "(median of rounds) | spread | target |")
    print("|---|---|---|---|---|---|---|")
    for model, kv, q8, phase, threads in sorted({k[:5] for k in tandem if k[3] == "decode b32"}):
        rounds = [k[5] for k in tandem if k[:5] == (model, kv, q8, phase, threads)]
        ratios = [tandem[(model, kv, q8, "decode b32", threads, r)] /
                  tandem[(model, kv, q8, "decode b1", threads, r)]
                  for r in rounds if (model, kv, q8, "decode b1", threads, r) in tandem]
        if not ratios:
            continue
        goal = ">= 8x" if (model, kv, q8) == ("110M-q8_0", "f16", "int8") else ""
        print(f"| {model} | {kv} | {q8} | {threads} | {statistics.median(ratios):.2f}x "
              f"| {spread(ratios)} | {goal} |")


if __name__ == "__main__":
    main()
