"""Issue 12's section of docs/results.md, from bench/model_sweep.sh's JSON
lines (docs/results/model-*.jsonl): P6 (the best of this library against
ScaLAPACK and the pipeline), P7 (automatic against the best strategy and
bulk) and the model's accuracy (each candidate's prediction against the same
schedule measured in the same run), with a gnuplot scatter plot."""
import glob
import json
import os
import subprocess

LIBRARY = ("bulk", "ring", "bidirectional", "others", "automatic")
# A candidate of the cost model and the overlap-bench row that ran it.
ROW_OF = {("bulk", "named"): "bulk", ("ring", "named"): "ring", ("bidirectional", "named"): "bidirectional",
          ("bulk", "others"): "others"}


def shapes(path):
    """(cluster, shape key, {strategy: row}) for every shape of one file."""
    rows = [json.loads(l) for l in open(path)]
    cluster = os.path.basename(path)[len("model-"):-len(".jsonl")]
    out = {}
    for r in rows:
        key = (r["op"], r["variant"], r["m"], r["n"], r["k"])
        out.setdefault(key, {})[r["strategy"]] = r
    return [(cluster, k, v) for k, v in out.items()]


def label(key):
    op, variant, m, n, k = key
    return f"{'AG' if op == 'all_gather_matmul' else 'RS'} {variant} {m}x{n}x{k}"


def shape_class(key):
    """Thin (smallest extent <= 256), medium (<= 512) or square, per op."""
    op, _, m, n, k = key
    small = min(m, n, k)
    size = "thin" if small <= 256 else "medium" if small <= 512 else "square"
    return f"{'AG' if op == 'all_gather_matmul' else 'RS'} {size}"


def section(out_dir):
    files = sorted(glob.glob(os.path.join(out_dir, "model-*.jsonl")))
    if not files:
        return []
    cases = [c for f in files for c in shapes(f)]
    lines = ["## Choosing a schedule: P6, P7 and the cost model (issue 12)", "",
             f"{len(cases)} shapes x clusters from bench/model_sweep.sh (emulated TCP clusters: 2-node star and",
             "4-node ring at 1 and 10 Gbit/s per link). Per cluster overlap-calibrate measured the calibration the",
             "runs used (docs/results/model-*-calibration.json). Times are medians of the slowest rank; every",
             "row of a shape comes from one overlap-bench run, side by side. `best` is the fastest of bulk, ring,",
             "bidirectional and others (bulk collectives moving the other operands); `chosen` is the row of the",
             "schedule automatic chose, measured as a forced strategy in the same run (automatic runs the same",
             "plan; the two differ by run-to-run noise only). ScaLAPACK had its best grid and block size from a",
             "small search (recorded in the JSON `setup`). Before every timed call, the peers' included, overlap-bench",
             "drains the emulated links' token buckets (docs/vcluster.md): no row gets a burst of free transfer.",
             "`others` runs the piece count the model predicts fastest (docs/design.md); the prediction error below",
             "compares that candidate.", ""]
    head = ("| cluster | shape | bulk | ring | bidir | others | automatic (chose) | best | auto / best | "
            "chosen / best | auto / bulk | scalapack (setup) | pipeline | best / scalapack | best / pipeline |")
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    p6_ok = p6_n = 0
    auto_ok = chosen_ok = bulk_ok = n7 = 0
    acc = []
    per = {}  # cluster -> [shapes, P6 met, chosen within 3%, automatic within 3%]
    per_class = {}  # shape class -> [shapes, P6 met, chosen within 3%, automatic within 3%, within 2% of bulk]
    for cluster, key, by in cases:
        t = {s: by[s]["time_ms"] for s in by}
        lib = {s: t[s] for s in LIBRARY if s in t and s != "automatic"}
        if not lib or "automatic" not in by:
            continue
        best_s = min(lib, key=lib.get)
        best = lib[best_s]
        sched = by["automatic"].get("schedule") or {}
        chosen_row = ROW_OF.get((sched.get("strategy"), sched.get("algorithm")), "bulk")
        chosen = t.get(chosen_row, float("nan"))
        auto = t["automatic"]
        n7 += 1
        auto_ok += auto <= best * 1.03
        chosen_ok += chosen <= best * 1.03
        bulk_ok += auto <= t["bulk"] * 1.02
        c = per.setdefault(cluster, [0, 0, 0, 0])
        c[0] += 1
        c[2] += chosen <= best * 1.03
        c[3] += auto <= best * 1.03
        k = per_class.setdefault(shape_class(key), [0, 0, 0, 0, 0])
        k[0] += 1
        k[2] += chosen <= best * 1.03
        k[3] += auto <= best * 1.03
        k[4] += auto <= t["bulk"] * 1.02
        sc = next((s for s in by if "scalapack" in s), None)
        pl = next((s for s in by if "pipeline" in s), None)
        lib_best = min(best, auto)
        peers = [t[s] for s in (sc, pl) if s]
        if peers:
            p6_n += 1
            p6_ok += all(lib_best < x for x in peers)
            c[1] += all(lib_best < x for x in peers)
            k[1] += all(lib_best < x for x in peers)
        setup = by[sc]["setup"]["best"] if sc and by[sc].get("setup") else ""
        cell = lambda s: f"{t[s]:.1f}" if s in t else "-"
        lines.append(f"| {cluster} | {label(key)} | {cell('bulk')} | {cell('ring')} | {cell('bidirectional')} | "
                     f"{cell('others')} | {auto:.1f} ({chosen_row}) | {best:.1f} ({best_s}) | {auto / best:.3f} | "
                     f"{chosen / best:.3f} | {auto / t['bulk']:.3f} | "
                     + (f"{t[sc]:.1f} ({setup})" if sc else "-") + " | " + (f"{t[pl]:.1f}" if pl else "-") + " | " +
                     (f"{lib_best / t[sc]:.2f}" if sc else "-") + " | " + (f"{lib_best / t[pl]:.2f}" if pl else "-") +
                     " |")
        # The others row ran the piece count the model predicts fastest (a
        # forced others with a calibration at hand): its candidate only.
        cands = sched.get("candidates", [])
        others = [c for c in cands if c["algorithm"] == "others"]
        fastest = min(others, key=lambda c: c["predicted_ms"]) if others else None
        for c in cands:
            row = ROW_OF.get((c["strategy"], c["algorithm"]))
            if row in t and (c["algorithm"] != "others" or c is fastest):
                acc.append((cluster, key, row, c["predicted_ms"], t[row]))
    within = sum(abs(p / m - 1) <= 0.10 for _, _, _, p, m in acc)
    lines += ["",
              f"- **P6** (the best of this library faster than ScaLAPACK and the pipeline on every shape): "
              f"{p6_ok} of {p6_n} shapes: " + ("met" if p6_ok == p6_n and p6_n else "**not met**") + ".",
              f"- **P7** (automatic within 3% of the best strategy on >= 95%, never > 2% slower than bulk): "
              f"automatic's own row within 3% on {auto_ok} of {n7} ({100 * auto_ok / max(n7, 1):.0f}%); the "
              f"schedule it chose within 3% on {chosen_ok} of {n7} ({100 * chosen_ok / max(n7, 1):.0f}%); "
              f"within 2% of bulk or faster on {bulk_ok} of {n7}.",
              f"- **Model accuracy** (prediction within 10% of the measured time on >= 90%): {within} of "
              f"{len(acc)} predictions ({100 * within / max(len(acc), 1):.0f}%).", ""]
    lines += ["Per shape class (thin: smallest extent 128 or 256; medium: 512; square: 2048), over the clusters:",
              "", "| class | shapes | P6 met | chosen within 3% of best | automatic's row within 3% | "
              "automatic within 2% of bulk | predictions within 10% |", "|---|---|---|---|---|---|---|"]
    for cls, (n, p6, ch, au, bu) in sorted(per_class.items()):
        mine = [abs(p / m - 1) <= 0.10 for _, key, _, p, m in acc if shape_class(key) == cls]
        lines.append(f"| {cls} | {n} | {p6} | {ch} | {au} | {bu} | {sum(mine)} of {len(mine)} |")
    lines += ["", "Per cluster (this machine has 2 cores: the 4-node ring runs 4 ranks on them, so GEMMs share",
              "cores with each other and with the emulated network's TCP stacks; `vcluster run` makes waiting",
              "ranks yield the core there, as Open MPI does on an oversubscribed node):", "",
              "| cluster | shapes | P6 met | chosen within 3% of best | automatic's row within 3% | "
              "predictions within 10% |", "|---|---|---|---|---|---|"]
    for cluster, (n, p6, ch, au) in sorted(per.items()):
        mine = [abs(p / m - 1) <= 0.10 for cl, _, _, p, m in acc if cl == cluster]
        lines.append(f"| {cluster} | {n} | {p6} | {ch} | {au} | {sum(mine)} of {len(mine)} |")
    lines += ["", "### Prediction error", "", "| cluster | shape | schedule | predicted ms | measured ms | error |",
              "|---|---|---|---|---|---|"]
    dat = os.path.join(out_dir, "model-accuracy.dat")
    with open(dat, "w") as f:
        f.write("# predicted_ms measured_ms\n")
        for cluster, key, row, p, m in acc:
            lines.append(f"| {cluster} | {label(key)} | {row} | {p:.1f} | {m:.1f} | {100 * (p / m - 1):+.0f}% |")
            f.write(f"{p} {m}\n")
    svg = os.path.join(out_dir, "model-accuracy.svg")
    hi = max([max(p, m) for *_, p, m in acc] + [1]) * 1.5
    plot = ["set terminal svg size 560,480 dynamic", f"set output '{svg}'",
            "set title 'cost model: predicted against measured (every candidate of every shape)'",
            "set xlabel 'measured (ms)'", "set ylabel 'predicted (ms)'", "set logscale xy", "set grid",
            f"set xrange [1:{hi}]", f"set yrange [1:{hi}]", "set key left top",
            f"plot x with lines lc rgb 'black' title 'exact', 1.1*x with lines dt 2 lc rgb 'gray' title '+10%', "
            f"0.9*x with lines dt 2 lc rgb 'gray' title '-10%', '{dat}' using 2:1 with points pt 7 title 'candidates'"]
    subprocess.run(["gnuplot"], input="\n".join(plot), text=True, check=True)
    lines += ["", "![cost model accuracy](results/model-accuracy.svg)", ""]
    return lines + noise_floor(out_dir)


def noise_floor(out_dir):
    """The same schedules measured twice in one session (model_sweep.sh's
    second pass, noise-*.jsonl, against the sweep itself): how far apart two
    runs of one schedule are, and what an oracle reaches that predicts each
    schedule's time in the sweep by its time in the second pass, and chooses
    by it. No cost model can be judged more precisely than that on this machine."""
    pairs = []  # (cluster, key, schedule, sweep ms, second pass ms)
    choices = []  # (cluster, key, oracle within 3% of the sweep's best, within 2% of bulk)
    for f in sorted(glob.glob(os.path.join(out_dir, "noise-*.jsonl"))):
        sweep = os.path.join(out_dir, "model-" + os.path.basename(f)[len("noise-"):])
        if not os.path.exists(sweep):
            continue
        first = {(c, k): v for c, k, v in shapes(sweep)}
        for cluster, key, again in shapes(f):
            by = first.get((cluster, key)) or {}  # shapes() names both files' cluster alike
            a = {s: by[s]["time_ms"] for s in LIBRARY if s in by and s in again}
            b = {s: again[s]["time_ms"] for s in a}
            for s in a:
                pairs.append((cluster, key, s, a[s], b[s]))
            lib = [s for s in a if s != "automatic"]
            if not lib or "bulk" not in a:
                continue
            oracle = min(lib, key=b.get)
            best = min(a[s] for s in lib)
            choices.append((cluster, key, a[oracle] <= 1.03 * best, a[oracle] <= 1.02 * a["bulk"]))
    if not pairs:
        return []
    err = lambda a, b: abs(b / a - 1)
    sched = [p for p in pairs if p[2] != "automatic"]
    w10 = sum(err(a, b) <= 0.10 for *_, a, b in sched)
    w3 = sum(err(a, b) <= 0.03 for *_, a, b in sched)
    ch3 = sum(c[2] for c in choices)
    chb = sum(c[3] for c in choices)
    lines = ["### Noise floor: the same schedules measured twice", "",
             "Right after the sweep, bench/model_sweep.sh runs every shape again with the same calibration",
             "(docs/results/noise-*.jsonl, peers skipped). The table gives each schedule's second time over",
             "its first. An oracle that predicts each schedule's time in the sweep by its time in the second",
             "pass, and chooses the schedule that was fastest there, is the best any cost model can do when",
             "it is judged against one run: it bounds the targets above on this machine.", "",
             f"- Same schedule, two passes: within 10% on {w10} of {len(sched)} pairs "
             f"({100 * w10 / len(sched):.0f}%; the model's target is 90% of its predictions), within 3% on "
             f"{w3} ({100 * w3 / len(sched):.0f}%).",
             f"- The oracle's choice within 3% of the sweep's best on {ch3} of {len(choices)} shapes "
             f"({100 * ch3 / max(len(choices), 1):.0f}%; P7's target is 95%), within 2% of bulk or faster on "
             f"{chb} of {len(choices)}.", "",
             "| cluster | schedules measured twice | within 10% | within 3% | median difference | largest "
             "| oracle's choice within 3% of best | oracle within 2% of bulk |", "|---|---|---|---|---|---|---|---|"]
    for cluster in sorted({p[0] for p in pairs}):
        mine = sorted(err(a, b) for c, _, s, a, b in sched if c == cluster)
        cs = [c for c in choices if c[0] == cluster]
        lines.append(f"| {cluster} | {len(mine)} | {sum(e <= 0.10 for e in mine)} | {sum(e <= 0.03 for e in mine)} | "
                     f"{100 * mine[len(mine) // 2]:.1f}% | {100 * mine[-1]:.0f}% | {sum(c[2] for c in cs)} of "
                     f"{len(cs)} | {sum(c[3] for c in cs)} of {len(cs)} |")
    lines += ["", "Second pass over the sweep, per schedule:", "",
              "| cluster | shape | bulk | ring | bidir | others | automatic |", "|---|---|---|---|---|---|---|"]
    rows = {}
    for c, key, s, a, b in pairs:
        rows.setdefault((c, key), {})[s] = b / a
    for (c, key), r in sorted(rows.items()):
        cell = lambda s: f"{r[s]:.3f}" if s in r else "-"
        lines.append(f"| {c} | {label(key)} | " + " | ".join(cell(s) for s in
                                                                ("bulk", "ring", "bidirectional", "others",
                                                                 "automatic")) + " |")
    return lines + [""]
