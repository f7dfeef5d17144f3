#!/usr/bin/env python3
"""Turns Google Benchmark JSON from tandem_bench_kernels/_engine into
markdown tables (beside the llama.cpp reference points and targets of
issue #4) and a roofline plot as PNG (matplotlib, Agg backend).

Usage: report.py KERNELS_JSON OUT_MD OUT_PNG ENGINE_JSON [ENGINE_JSON ...]
Each ENGINE_JSON is one tandem_bench_engine run on one model; the model's
name is the file name without "engine-" and ".json" (engine-110M-f16.json
-> 110M-f16). Reads, per benchmark, the "median" aggregate when
repetitions were run, else the single run. Counters are already in GFLOP/s,
GB/s, tokens/s. Without matplotlib (Debian python3-matplotlib, installed by
`scripts/setup --bench`) the tables are still written, one line says that
no plot was written, and the exit status is 0.
"""
import json
import os
import sys

# Issue #4: llama.cpp (CPU build, F32 stories260K) and machine limits
# measured on the same 2-core machine. The llama.cpp columns apply to the
# model they were measured on only.
REF_MODEL = "stories260K"
REF_PREFILL = {2: 7800.0}           # pp512, tokens/s by threads
REF_DECODE = {1: 8500.0, 2: 6700.0}  # tg, batch 1, tokens/s by threads
REF_SGEMM = 205.0                    # OpenBLAS SGEMM GFLOP/s, 2 threads
REF_MEMCPY = 27.0                    # GB/s
# Issue #4 targets.
TARGET_BATCH_GAIN = 8.0   # decode tokens/s at batch 32 over batch 1
TARGET_PEAK_SHARE = 0.5   # prefill GFLOP/s over the GEMM peak
TARGET_BW_SHARE = 0.5     # batch-1 decode weight GB/s over memcpy GB/s

# GGUF tensor type numbers (ggml.h enum ggml_type), for a weight type
# passed as a benchmark argument.
GGUF_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
              12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 30: "BF16"}


def load(path):
    """(context, {run_name: entry}) keeping medians over single runs; each
    entry gets "_cv" (the cv aggregate) and "_reps" (the repetitions)."""
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
    """'BM_X/a:1/b:F16/real_time' -> ('BM_X', {'a': 1, 'b': 'F16'})."""
    parts = name.split("/")
    out = {}
    for p in parts[1:]:
        if ":" in p:
            k, v = p.split(":", 1)
            try:
                out[k] = int(v)
            except ValueError:
                out[k] = v
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
    best_v = max((r.get(key, 0.0) for r in b.get("_reps", [])), default=None)
    if best_v is not None and len(b.get("_reps", [])) > 1:
        out += " (best %s)" % fmt(best_v, digits)
    return out


def best(b, key):
    """The highest value of counter `key` over the repetitions (the least
    disturbed run on a shared machine), else the median."""
    if not b:
        return None
    return max((r.get(key, 0.0) for r in b.get("_reps", [])), default=b.get(key))


def model_name(path):
    base = os.path.basename(path)
    if base.endswith(".json"):
        base = base[:-5]
    if base.startswith("engine-"):
        base = base[7:]
    return base


def weights_of(runs):
    """(params_matmul, weight_bytes, weight type) published by BM_Prefill /
    BM_Decode, or (None, None, "") for a JSON from an older binary."""
    for name, b in runs.items():
        if args(name)[0] in ("BM_Prefill", "BM_Decode") and b.get("params_matmul"):
            return b["params_matmul"], b.get("weight_bytes"), b.get("label", "")
    return None, None, ""


def ratio_pair(num, den):
    """'median, best' of two (median, best) pairs, or '' when missing."""
    if not num[0] or not den[0]:
        return ""
    return "%.2f, %.2f" % (num[0] / den[0], num[1] / den[1])


def engine_table(model, runs):
    """Prefill and decode tokens/s of one model; llama.cpp columns only for
    the model the references were measured on."""
    params, wbytes, wtype = weights_of(runs)
    title = "### Engine: %s" % model
    if params:
        title += " (%s, %.1f M matrix weights, %.0f MB as stored)" % (wtype, params / 1e6, wbytes / 1e6)
    with_ref = model == REF_MODEL
    if with_ref:
        out = [title, "",
               "| benchmark | threads | batch | Tandem tokens/s: median ±cv (best) | llama.cpp tokens/s | Tandem / llama.cpp: median, best |",
               "|---|---|---|---|---|---|"]
    else:
        out = [title, "",
               "| benchmark | threads | batch | Tandem tokens/s: median ±cv (best) |",
               "|---|---|---|---|"]

    def row(label, t, batch, b, ref):
        v = b and b.get("tokens/s")
        cells = [label, str(t), str(batch), val(b, "tokens/s")]
        if with_ref:
            cells += [fmt(ref) if ref else "",
                      "%.2f, %.2f" % (v / ref, best(b, "tokens/s") / ref) if v and ref else ""]
        out.append("| " + " | ".join(cells) + " |")

    for t in (1, 2):
        row("prefill pp512", t, 1, pick(runs, "BM_Prefill", threads=t), REF_PREFILL.get(t))
    for t in (1, 2):
        for batch in (1, 8, 32):
            row("decode, ctx 128 (raw Forward)", t, batch, pick(runs, "BM_Decode", batch=batch, threads=t),
                REF_DECODE.get(t) if batch == 1 else None)
    return out


def target_table(model, runs, peaks, memcpy_bw):
    """Issue #4 targets of one model: batching gain (every model); for all
    but REF_MODEL also prefill GFLOP/s against half the GEMM peak (the
    issue's OpenBLAS SGEMM; the FMA loop's peak as a stricter line) and batch-1
    decode weight GB/s against half the memcpy bandwidth (measured, and the
    issue's)."""
    params, wbytes, _ = weights_of(runs)
    out = ["", "Targets (%s): measured as median, best; target; median / target, best / target" % model, "",
           "| quantity | threads | measured: median, best | target | measured / target: median, best |",
           "|---|---|---|---|---|"]

    def mb(b, scale=1.0):
        if not b or b.get("tokens/s") is None:
            return (None, None)
        return (b["tokens/s"] * scale, best(b, "tokens/s") * scale)

    def cell(pair, digits):
        return "n/a" if pair[0] is None else "%s, %s" % (fmt(pair[0], digits), fmt(pair[1], digits))

    for t in (1, 2):
        b1, b32 = mb(pick(runs, "BM_Decode", batch=1, threads=t)), mb(pick(runs, "BM_Decode", batch=32, threads=t))
        gain = (b32[0] / b1[0], b32[1] / b1[1]) if b1[0] and b32[0] else (None, None)
        rg = "" if gain[0] is None else "%.2f, %.2f" % (gain[0] / TARGET_BATCH_GAIN, gain[1] / TARGET_BATCH_GAIN)
        out.append("| decode tokens/s, batch 32 / batch 1 | %d | %s | ≥ %.0f× | %s |" % (
            t, "n/a" if gain[0] is None else "%.2f×, %.2f×" % gain, TARGET_BATCH_GAIN, rg))
    if model == REF_MODEL:
        # 1 MB of weights stays in L2 and attention outweighs the MatMuls:
        # neither the FMA peak nor the memory bandwidth is its limit.
        out += ["", "(GFLOP/s and GB/s targets: 110M-class models only; %s's weights stay in cache)" % model]
        return out
    if not params:
        out += ["", "(no params_matmul / weight_bytes counters in this JSON: GFLOP/s and GB/s rows left out)"]
        return out
    for t in (1, 2):
        b = pick(runs, "BM_Prefill", threads=t)
        g = (b["GFLOP/s"], best(b, "GFLOP/s")) if b and b.get("GFLOP/s") else (None, None)
        # The GEMM peak is OpenBLAS SGEMM on 2 threads; one thread
        # gets half of it.
        target = TARGET_PEAK_SHARE * REF_SGEMM * t / 2
        out.append("| prefill pp512 GFLOP/s (MatMuls + attention, exact count) | %d | %s | ≥ %.1f (half the OpenBLAS SGEMM peak %.0f GFLOP/s%s) | %s |" % (
            t, cell(g, 1), target, REF_SGEMM * t / 2, " at 2 threads" if t == 2 else ", 1 of 2 threads",
            ratio_pair(g, (target, target))))
        peak = peaks.get(t)
        if peak:
            out.append("| prefill pp512 GFLOP/s, against the FMA loop | %d | %s | ≥ %.0f (half the %d-thread FMA peak %.0f) | %s |" % (
                t, cell(g, 1), TARGET_PEAK_SHARE * peak, t, peak,
                ratio_pair(g, (TARGET_PEAK_SHARE * peak, TARGET_PEAK_SHARE * peak))))
    for t in (1, 2):
        gbs = mb(pick(runs, "BM_Decode", batch=1, threads=t), wbytes * 1e-9)
        targets = []
        if memcpy_bw:
            targets.append(("half the measured 256 MiB memcpy %.1f GB/s" % memcpy_bw, TARGET_BW_SHARE * memcpy_bw))
        targets.append(("half the issue's memcpy %.0f GB/s" % REF_MEMCPY, TARGET_BW_SHARE * REF_MEMCPY))
        for what, target in targets:
            out.append("| decode batch 1, weight GB/s (tokens/s × %.0f MB) | %d | %s | ≥ %.1f (%s) | %s |" % (
                wbytes / 1e6, t, cell(gbs, 1), target, what, ratio_pair(gbs, (target, target))))
    return out


def serving_table(model, runs):
    out = ["", "### Serving loop overhead: %s (EngineCore, no gRPC, no-op output)" % model, "",
           "| threads | batch | raw Forward tokens/s: median ±cv (best) | EngineCore tokens/s: median ±cv (best) | loop overhead: medians, bests |",
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


def matmul_weight_type(base, a, b):
    """The weight type of a MatMul benchmark when its name, arguments or
    label give one (e.g. BM_MatMul/.../type:1, BM_MatMulF16, label "Q8_0"),
    else ""."""
    for k, v in a.items():
        if "type" in k.lower():
            return GGUF_TYPES.get(v, str(v)) if isinstance(v, int) else str(v)
    suffix = base[len("BM_MatMul"):].strip("_<>")
    if suffix:
        return suffix
    return b.get("label", "") or ""


def matmul_runs(runs):
    """[(name, args, weight type, entry)] of every MatMul benchmark, sorted by
    weight type (F32 first), N, M, threads."""
    out = []
    for name, b in runs.items():
        base, a = args(name)
        if not base.startswith("BM_MatMul") or not b.get("GFLOP/s"):
            continue
        out.append((name, a, matmul_weight_type(base, a, b), b))
    order = {"": 0, "F32": 0, "F16": 1, "BF16": 2, "Q8_0": 3, "Q4_0": 4, "Q4_K": 5, "Q5_K": 6,
             "Q6_K": 7}
    out.sort(key=lambda r: (order.get(r[2], 8), r[2], r[1].get("N", 0), r[1].get("M", 0), r[1].get("threads", 0)))
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
            "| M | K x N | weights | threads | GFLOP/s: median ±cv (best) | best % of best FMA peak | flop/byte | CPU/wall |",
            "|---|---|---|---|---|---|---|---|"]
    for t in (1, 2):
        for name, a, wtype, b in matmul_runs(runs):
            if a.get("threads") != t:
                continue
            g = best(b, "GFLOP/s")
            pct = "%.1f%%" % (100.0 * g / peaks[t]) if g and peaks.get(t) else ""
            out.append("| %s | %s x %s | %s | %d | %s | %s | %.1f | %s |" % (
                a.get("M", "?"), a.get("K", "?"), a.get("N", "?"), wtype or "F32", t, val(b, "GFLOP/s", 2), pct,
                b.get("flop_per_byte", 0), cpu_share(b)))
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
    other = other_kernel_rows(runs)
    if other:
        out += ["", "### Other kernel benchmarks", "",
                "| benchmark | GFLOP/s: median ±cv (best) | GB/s: median ±cv (best) | label |", "|---|---|---|---|"]
        out += other
    return out, peaks


KNOWN_KERNELS = ("BM_FmaPeak", "BM_Memcpy", "BM_ReadKvRows", "BM_WriteKvRows")


def other_kernel_rows(runs):
    """One row per kernel benchmark the tables above do not cover (e.g.
    BM_Attention), with its GFLOP/s and GB/s counters, in file order."""
    out = []
    for name, b in runs.items():
        base = args(name)[0]
        if base in KNOWN_KERNELS or base.startswith("BM_MatMul"):
            continue
        out.append("| %s | %s | %s | %s |" % (name.replace("/real_time", ""), val(b, "GFLOP/s", 2),
                                                val(b, "GB/s", 1), b.get("label", "")))
    return out


def place_labels(fig, ax, labels, avoid):
    """Annotates each (x, y, text, color) point at the nearest of rings of
    offsets (8 directions, growing radius) whose text box stays inside the
    axes and overlaps no placed label, no marker and nothing in `avoid`
    (e.g. the legend); when every candidate collides, at the one with the
    least overlapping area. Labels away from their point get a thin leader
    line. Greedy, points from the top down."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    taken = [a.get_window_extent(renderer) for a in avoid]
    for x, y, _, _ in labels:  # the markers themselves, ~8 px across
        px, py = ax.transData.transform((x, y))
        taken.append(matplotlib_bbox(px - 5, py - 5, px + 5, py + 5))
    frame = ax.get_window_extent(renderer)

    def cost(box):
        if box.x0 < frame.x0 or box.x1 > frame.x1 or box.y0 < frame.y0 or box.y1 > frame.y1:
            return float("inf")
        area = 0.0
        for o in taken:
            w = min(box.x1, o.x1) - max(box.x0, o.x0)
            h = min(box.y1, o.y1) - max(box.y0, o.y0)
            if w > 0 and h > 0:
                area += w * h
        return area

    directions = ((1, 0.4, "left", "bottom"), (1, -0.4, "left", "top"), (-1, 0.4, "right", "bottom"),
                  (-1, -0.4, "right", "top"), (0, 1, "center", "bottom"), (0, -1, "center", "top"),
                  (1, 1.2, "left", "bottom"), (1, -1.2, "left", "top"), (-1, 1.2, "right", "bottom"),
                  (-1, -1.2, "right", "top"))
    for x, y, text, color in sorted(labels, key=lambda l: -l[1]):
        ann = ax.annotate(text, (x, y), textcoords="offset points", xytext=(0, 0), fontsize=7, color=color)
        best_pos, best_cost = None, float("inf")
        for r in (7, 14, 22, 32, 45, 60):
            for dx, dy, ha, va in directions:
                ann.set_position((dx * r, dy * r))
                ann.set_ha(ha)
                ann.set_va(va)
                c = cost(ann.get_window_extent(renderer))
                if c < best_cost:
                    best_pos, best_cost = (dx * r, dy * r, ha, va, r), c
                if c == 0:
                    break
            if best_cost == 0:
                break
        ann.remove()
        if best_pos is None:  # nowhere inside the axes: beside the point
            best_pos = (7, 3, "left", "bottom", 7)
        dx, dy, ha, va, r = best_pos
        ann = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), ha=ha, va=va,
                          fontsize=7, color=color,
                          arrowprops=dict(arrowstyle="-", color=color, lw=0.5, alpha=0.6, shrinkA=0, shrinkB=3)
                          if r > 7 else None)
        taken.append(ann.get_window_extent(renderer))


def matplotlib_bbox(x0, y0, x1, y1):
    from matplotlib.transforms import Bbox
    return Bbox([[x0, y0], [x1, y1]])


def roofline_png(runs, peaks, path):
    """Log-log roofline: min(FMA peak, memcpy GB/s x intensity) from this
    run (the higher of the 1- and 2-thread peaks), the issue's references
    as dashed lines, one labelled point per MatMul benchmark (best
    repetition). Returns False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    bw = best(pick(runs, "BM_Memcpy", MiB=256), "GB/s")
    # The higher of the 1- and 2-thread peaks: on a busy machine the
    # 2-thread loop can read lower than the 1-thread one.
    peak = max([p for p in peaks.values() if p], default=None)
    points = matmul_runs(runs)
    xs = [b["flop_per_byte"] for _, _, _, b in points if b.get("flop_per_byte")]
    lo = min([0.1] + [x / 2 for x in xs])
    hi = max([1000.0] + [x * 2 for x in xs])
    grid = [lo * (hi / lo) ** (i / 400.0) for i in range(401)]

    fig, ax = plt.subplots(figsize=(12, 7.5), dpi=120)
    ax.set_xscale("log")
    ax.set_yscale("log")
    if bw and peak:
        ax.plot(grid, [min(peak, bw * x) for x in grid], color="black", linewidth=2,
                label="roof: min(FMA peak %.0f GFLOP/s, memcpy %.1f GB/s × intensity)" % (peak, bw))
        if peaks.get(1) and peaks[1] < peak:
            ax.plot(grid, [min(peaks[1], bw * x) for x in grid], color="black", linewidth=1, linestyle=":",
                    label="1-thread roof (FMA peak %.0f GFLOP/s)" % peaks[1])
    ax.axhline(REF_SGEMM, color="tab:gray", linestyle="--", linewidth=1.2,
               label="OpenBLAS SGEMM %.0f GFLOP/s, 2 threads (issue #4 reference)" % REF_SGEMM)
    ax.plot(grid, [REF_MEMCPY * x for x in grid], color="tab:green", linestyle="--", linewidth=1.2,
            label="memcpy %.0f GB/s × intensity (issue #4 reference)" % REF_MEMCPY)
    colors = {1: "tab:blue", 2: "tab:red"}
    markers = {"F32": "o", "": "o", "F16": "s", "BF16": "D", "Q8_0": "^"}
    seen = set()
    labels = []  # (x, y, text, color) placed after the axes' limits are set
    for _, a, wtype, b in points:
        t = a.get("threads", 0)
        x, y = b["flop_per_byte"], best(b, "GFLOP/s")
        color = colors.get(t, "tab:purple")
        lab = "MatMul, %d thread%s%s" % (t, "" if t == 1 else "s", ", " + wtype if wtype else "")
        ax.scatter([x], [y], color=color, marker=markers.get(wtype, "P"), s=30, zorder=3,
                   label=None if lab in seen else lab)
        seen.add(lab)
        labels.append((x, y, "%s×%s×%s, %dt%s" % (a.get("M", "?"), a.get("K", "?"), a.get("N", "?"), t,
                                                 ", " + wtype if wtype else ""), color))
    ys = [best(b, "GFLOP/s") for _, _, _, b in points]
    ymax = max([REF_SGEMM, peak or 0.0] + ys) * 2
    ymin = min([1.0] + [y / 2 for y in ys if y])
    ax.set_xlim(lo, hi)
    ax.set_ylim(ymin, ymax)
    ax.set_xlabel("arithmetic intensity (FLOP/byte, minimal traffic)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title("Tandem MatMul roofline (best repetitions; measured FMA peak and 256 MiB memcpy)")
    ax.grid(True, which="major", color="#dddddd")
    ax.grid(True, which="minor", color="#f2f2f2")
    leg = ax.legend(loc="lower right", fontsize=8, framealpha=0.9)
    fig.tight_layout()
    place_labels(fig, ax, labels, [leg])
    fig.savefig(path, format="png")
    plt.close(fig)
    return True


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    kernels_json, out_md, out_png, engine_jsons = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    kctx, kruns = load(kernels_json)
    ktab, peaks = kernel_tables(kruns)
    memcpy_bw = best(pick(kruns, "BM_Memcpy", MiB=256), "GB/s")
    lines = ["<!-- generated by bench/report.py from %s -->" % ", ".join([kernels_json] + engine_jsons),
             "", "Run: %s, %s CPUs at %s MHz (as Google Benchmark reports), load average %s." % (
                 kctx.get("date", "?"), kctx.get("num_cpus", "?"), kctx.get("mhz_per_cpu", "?"),
                 ", ".join("%.2f" % v for v in kctx.get("load_avg", []))), ""]
    for path in engine_jsons:
        model = model_name(path)
        _, eruns = load(path)
        lines += engine_table(model, eruns)
        lines += target_table(model, eruns, peaks, memcpy_bw)
        if any(args(n)[0] == "BM_ServingLoop" for n in eruns):
            lines += serving_table(model, eruns)
        lines.append("")
    lines += ktab + [""]
    with open(out_md, "w") as f:
        f.write("\n".join(lines))
    if not roofline_png(kruns, peaks, out_png):
        print("report.py: python3-matplotlib missing, run scripts/setup --bench; no plot written")


if __name__ == "__main__":
    main()
