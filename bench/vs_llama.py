#!/usr/bin/env python3
"""Summarizes scripts/bench-vs-llama's rounds as a Markdown table.

Input: a folder of tandem-<model>-<round>.json (Google Benchmark JSON of
BM_Decode/batch:1/threads:T, counter tokens/s and weight_bytes) and
llama-<model>-<round>.json (llama-bench -o json: n_threads, avg_ts per
entry). Output (stdout): per model and thread count, the median over the
rounds of Tandem's and llama.cpp's batch-1 decode tokens/s, their ratio,
and Tandem's weight bytes streamed per second (tokens/s x weight bytes).
"""
import glob
import json
import os
import re
import statistics
import sys


def tandem_rounds(folder):
    """{(model, threads): [tokens/s per round]} and {model: weight bytes}."""
    rates, weights = {}, {}
    for path in glob.glob(os.path.join(folder, "tandem-*-*.json")):
        model = re.match(r"tandem-(.*)-\d+\.json$", os.path.basename(path)).group(1)
        for b in json.load(open(path))["benchmarks"]:
            m = re.search(r"threads:(\d+)", b["name"])
            if b.get("run_type") != "iteration" or not m:
                continue
            rates.setdefault((model, int(m.group(1))), []).append(b["tokens/s"])
            weights[model] = b["weight_bytes"]
    return rates, weights


def llama_rounds(folder):
    """{(model, threads): [tokens/s per round]} from llama-bench's JSON."""
    rates = {}
    for path in glob.glob(os.path.join(folder, "llama-*-*.json")):
        model = re.match(r"llama-(.*)-\d+\.json$", os.path.basename(path)).group(1)
        try:
            entries = json.load(open(path))
        except json.JSONDecodeError:
            continue
        for e in entries:
            if e.get("n_gen", 0) > 0 and e.get("n_prompt", 0) == 0:
                rates.setdefault((model, int(e["n_threads"])), []).append(e["avg_ts"])
    return rates


def main():
    folder = sys.argv[1]
    tandem, weights = tandem_rounds(folder)
    llama = llama_rounds(folder)
    print("| model | threads | Tandem tok/s (median of rounds) | llama.cpp tok/s (tg128) "
          "| Tandem / llama.cpp | Tandem weight GB/s | rounds |")
    print("|---|---|---|---|---|---|---|")
    for key in sorted(tandem):
        model, threads = key
        t = statistics.median(tandem[key])
        l = statistics.median(llama[key]) if key in llama else float("nan")
        gbs = t * weights[model] / 1e9
        print(f"| {model} | {threads} | {t:.1f} | {l:.1f} | {t / l:.2f}x | {gbs:.1f} "
              f"| {len(tandem[key])} |")


if __name__ == "__main__":
    main()
