#!/usr/bin/env python3
"""Turns Google Benchmark JSON from tandem_bench_kernels/_engine into
markdown tables (beside the llama.cpp reference points of issue #4) and a
roofline plot as SVG. Standard library only (no matplotlib on the machine).

Usage: report.py KERNELS_JSON ENGINE_JSON OUT_MD OUT_SVG
Reads, per benchmark, the "median" aggregate when repetitions were run,
else the single run. Counters are already in GFLOP/s, GB/s, tokens/s.
"""
import json
import math
import sys

# Issue #4: llama.cpp (CPU build, F32 stories260K) and machine limits
# measured on the same 2-core machine.
REF_PREFILL = {2: 7800.0}           # pp512, tokens/s by threads
REF_DECODE = {1: 8500.0, 2: 6700.0}  # tg, batch 1, tokens/s by threads
REF_SGEMM = 205.0                    # OpenBLAS SGEMM GFLOP/s, 2 threads
REF_MEMCPY = 27.0                    # GB/s


def load(path):
    """{run_name: entry} keeping medians over single runs."""
    with open(path) as f:
        data = json.load(f)
    runs, cvs, reps = {}, {}, {}
    for b in data.get("benchmarks", []):
        if b.get("error_occurred"):
            continue
        name = b.get("run_name", b["name"])
        agg = b.get("aggregate_name")
        if agg is None:
            reps.setdefault(name, []).append(b)
            runs.setdefault(name, b)
        elif agg == "median":
            runs[name] = b
        elif agg == "cv":
            cvs[name] = b
    for name, b in runs.items():
        b["_cv"] = cvs.get(name, {})
        b["_reps"] = reps.get(name, [])
    return data.get("context", {}), runs


def args(name):
    """'BM_X/a:1/b:2/real_time' -> ('BM_X', {'a': 1, 'b': 2})."""
    parts = name.split("/")
    out = {}
    for p in parts[1:]:
        if ":" in p:
            k, v = p.split(":", 1)
            out[k] = int(v)
    return parts[0], out


def pick(runs, bench, **want):
    for name, b in runs.items():
        base, a = args(name)
        if base == bench and all(a.get(k) == v for k, v in want.items()):
            return b
    return None


def cpu_share(b):
    """CPU time of the benchmark thread / wall time: < 1 shows contention
    (or time spent in pool workers, which the main thread does not see)."""
    if b is None or not b.get("real_time"):
        return ""
    return "%.2f" % (b["cpu_time"] / b["real_time"])


def fmt(v, digits=0):
    if v is None:
        return "n/a"
    return ("{:,.%df}" % digits).format(v)


def val(b, key, digits=0):
    """The median of counter `key`, its coefficient of variation over the
    repetitions (the noise) and the best repetition, e.g.
    '6,262 ±3% (best 6,401)'."""
    if not b or b.get(key) is None:
        return "n/a"
    out = fmt(b[key], digits)
    cv = b.get("_cv", {}).get(key)
    if cv is not None:
        out += " ±%.0f%%" % (100.0 * cv)
    best = max((r.get(key, 0.0) for r in b.get("_reps", [])), default=None)
    if best is not None and len(b.get("_reps", [])) > 1:
        out += " (best %s)" % fmt(best, digits)
    return out


def best(b, key):
    """The highest value of counter `key` over the repetitions (the least
    disturbed run on a shared machine), else the median."""
    if not b:
        return None
    return max((r.get(key, 0.0) for r in b.get("_reps", [])), default=b.get(key))


def engine_tables(runs):
    out = ["### Engine (stories260K, F32)", "",
           "| benchmark | threads | batch | Tandem tokens/s: median ±cv (best) | llama.cpp tokens/s | Tandem / llama.cpp: median, best |",
           "|---|---|---|---|---|---|"]
    for t in (1, 2):
        b = pick(runs, "BM_Prefill", threads=t)
        v = b and b.get("tokens/s")
        ref = REF_PREFILL.get(t)
        ratio = "%.2f, %.2f" % (v / ref, best(b, "tokens/s") / ref) if v and ref else ""
        out.append("| prefill pp512 | %d | 1 | %s | %s | %s |" % (t, val(b, "tokens/s"), fmt(ref) if ref else "", ratio))
    for t in (1, 2):
        for batch in (1, 8, 32):
            b = pick(runs, "BM_Decode", batch=batch, threads=t)
            v = b and b.get("tokens/s")
            ref = REF_DECODE.get(t) if batch == 1 else None
            ratio = "%.2f, %.2f" % (v / ref, best(b, "tokens/s") / ref) if v and ref else ""
            out.append("| decode, ctx 128 (raw Forward) | %d | %d | %s | %s | %s |" % (
                t, batch, val(b, "tokens/s"), fmt(ref) if ref else "", ratio))
    out += ["", "### Serving loop overhead (DecodeEngine, no gRPC, no-op sink)", "",
            "| threads | batch | raw Forward tokens/s: median ±cv (best) | DecodeEngine tokens/s: median ±cv (best) | loop overhead: medians, bests |",
            "|---|---|---|---|---|"]
    for t in (1, 2):
        for batch in (1, 8, 32):
            raw = pick(runs, "BM_Decode", batch=batch, threads=t)
            srv = pick(runs, "BM_ServingLoop", batch=batch, threads=t)
            rv = raw and raw.get("tokens/s")
            sv = srv and srv.get("tokens/s")
            over = "%+.0f%%, %+.0f%%" % (100.0 * (1.0 - sv / rv),
                                         100.0 * (1.0 - best(srv, "tokens/s") / best(raw, "tokens/s"))) if rv and sv else ""
            out.append("| %d | %d | %s | %s | %s |" % (t, batch, val(raw, "tokens/s"), val(srv, "tokens/s"), over))
    return out


def kernel_tables(runs):
    peaks = {t: best(pick(runs, "BM_FmaPeak", threads=t), "GFLOP/s") for t in (1, 2)}
    out = ["### FMA peak (own loop, see bench/README.md)", "",
           "| threads | GFLOP/s | OpenBLAS SGEMM reference |", "|---|---|---|"]
    for t in (1, 2):
        b = pick(runs, "BM_FmaPeak", threads=t)
        isa = b.get("label", "") if b else ""
        out.append("| %d (%s) | %s | %s |" % (t, isa, val(b, "GFLOP/s", 1), fmt(REF_SGEMM) if t == 2 else ""))
    out += ["", "### MatMul (engine/model/cpu_kernels.h)", "",
            "| M | K x N | threads | GFLOP/s: median ±cv (best) | best % of best FMA peak | flop/byte | CPU/wall |",
            "|---|---|---|---|---|---|---|"]
    for t in (1, 2):
        for name, b in sorted(runs.items(), key=lambda kv: (args(kv[0])[1].get("N", 0), args(kv[0])[1].get("M", 0))):
            base, a = args(name)
            if base != "BM_MatMul" or a.get("threads") != t:
                continue
            g = best(b, "GFLOP/s")
            pct = "%.1f%%" % (100.0 * g / peaks[t]) if g and peaks[t] else ""
            out.append("| %d | %d x %d | %d | %s | %s | %.1f | %s |" % (
                a["M"], a["K"], a["N"], t, val(b, "GFLOP/s", 2), pct, b.get("flop_per_byte", 0), cpu_share(b)))
    out += ["", "### Memory", "",
            "| benchmark | size | GB/s | reference |", "|---|---|---|---|"]
    for mib in (1, 16, 256):
        b = pick(runs, "BM_Memcpy", MiB=mib)
        out.append("| memcpy | %d MiB | %s | %s |" % (mib, val(b, "GB/s", 1),
                                                       "llama.cpp machine memcpy %.0f GB/s" % REF_MEMCPY if mib == 256 else ""))
    for fn in ("BM_ReadKvRows", "BM_WriteKvRows"):
        for kv_dim in (32, 768):
            for tokens in (128, 2048):
                b = pick(runs, fn, kv_dim=kv_dim, tokens=tokens)
                mb = 2 * 4 * 12 * tokens * kv_dim / 2**20
                out.append("| %s | kv_dim %d, %d tokens x 12 layers (%.1f MiB) | %s | |" % (
                    fn[3:], kv_dim, tokens, mb, val(b, "GB/s", 1)))
    return out, peaks


def roofline_svg(runs, peaks, path):
    """Log-log roofline: min(peak, bandwidth * intensity), MatMul points."""
    bw = best(pick(runs, "BM_Memcpy", MiB=256), "GB/s")
    peak = peaks.get(2) or peaks.get(1)
    W, H, L, R, T, B = 720, 460, 70, 20, 30, 50
    x0, x1, y0, y1 = math.log10(0.1), math.log10(1000.0), math.log10(1.0), math.log10(1000.0)

    def px(ai):
        return L + (math.log10(ai) - x0) / (x1 - x0) * (W - L - R)

    def py(g):
        return H - B - (math.log10(max(g, 1.0)) - y0) / (y1 - y0) * (H - T - B)

    s = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">' % (W, H),
         '<rect width="100%" height="100%" fill="white"/>',
         '<text x="%d" y="18" font-size="14">Tandem MatMul roofline (best runs; measured 2-thread FMA peak, 256 MiB memcpy)</text>' % L]
    for e in range(-1, 4):
        x = px(10.0 ** e)
        s.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>' % (x, T, x, H - B))
        s.append('<text x="%.1f" y="%d" text-anchor="middle">%g</text>' % (x, H - B + 16, 10.0 ** e))
    for e in range(0, 4):
        y = py(10.0 ** e)
        s.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (L, y, W - R, y))
        s.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>' % (L - 6, y + 4, 10.0 ** e))
    s.append('<text x="%d" y="%d" text-anchor="middle">arithmetic intensity (FLOP/byte, minimal traffic)</text>' % ((L + W - R) // 2, H - 12))
    s.append('<text x="16" y="%d" transform="rotate(-90 16 %d)" text-anchor="middle">GFLOP/s</text>' % ((T + H - B) // 2, (T + H - B) // 2))
    if bw and peak:
        pts = []
        for i in range(0, 201):
            ai = 10.0 ** (x0 + (x1 - x0) * i / 200.0)
            pts.append("%.1f,%.1f" % (px(ai), py(min(peak, bw * ai))))
        s.append('<polyline fill="none" stroke="black" stroke-width="2" points="%s"/>' % " ".join(pts))
        s.append('<text x="%d" y="%.1f" text-anchor="end">FMA peak %.0f GFLOP/s; memcpy %.1f GB/s</text>' % (W - R - 4, py(peak) - 6, peak, bw))
        ref = py(REF_SGEMM)
        s.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#888" stroke-dasharray="6,4"/>' % (L, ref, W - R, ref))
        s.append('<text x="%d" y="%.1f" fill="#555">OpenBLAS SGEMM %.0f GFLOP/s (reference)</text>' % (L + 6, ref - 5, REF_SGEMM))
    colors = {1: "#1f77b4", 2: "#d62728"}
    for name, b in runs.items():
        base, a = args(name)
        if base != "BM_MatMul" or not b.get("GFLOP/s"):
            continue
        x, y = px(b["flop_per_byte"]), py(best(b, "GFLOP/s"))
        s.append('<circle cx="%.1f" cy="%.1f" r="4" fill="%s"><title>%s</title></circle>' % (x, y, colors.get(a["threads"], "gray"), name))
        if a["threads"] == 2:
            s.append('<text x="%.1f" y="%.1f" font-size="10">M=%d N=%d</text>' % (x + 6, y + 12, a["M"], a["N"]))
    s.append('<circle cx="%d" cy="%d" r="4" fill="#1f77b4"/><text x="%d" y="%d">MatMul, 1 thread</text>' % (L + 16, T + 20, L + 26, T + 24))
    s.append('<circle cx="%d" cy="%d" r="4" fill="#d62728"/><text x="%d" y="%d">MatMul, 2 threads</text>' % (L + 16, T + 38, L + 26, T + 42))
    s.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(s) + "\n")


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    kctx, kruns = load(sys.argv[1])
    _, eruns = load(sys.argv[2])
    ktab, peaks = kernel_tables(kruns)
    lines = ["<!-- generated by bench/report.py from %s and %s -->" % (sys.argv[1], sys.argv[2]),
             "", "Run: %s, %s CPUs at %s MHz (as Google Benchmark reports), load average %s." % (
                 kctx.get("date", "?"), kctx.get("num_cpus", "?"), kctx.get("mhz_per_cpu", "?"),
                 ", ".join("%.2f" % v for v in kctx.get("load_avg", []))), ""]
    lines += engine_tables(eruns) + [""] + ktab + [""]
    with open(sys.argv[3], "w") as f:
        f.write("\n".join(lines))
    roofline_svg(kruns, peaks, sys.argv[4])


if __name__ == "__main__":
    main()
