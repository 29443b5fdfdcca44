"""Issue 28's sections of docs/results.md, from bench/smpi_sweep.sh's JSON
lines (docs/results/smpi/): the SMPI mirrors of the emulated clusters beside
what ran there (docs/results/model-*.jsonl), and the cost model's accuracy
on simulated fat trees at 2-64 ranks. The section replaces any earlier one
between its markers, so the rest of results.md stays as bench/report.py wrote it.

Its scale runs go to docs/scaling.md the same way.

    python3 bench/smpi_report.py docs/results/smpi docs/results.md [docs/scaling.md]"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sections  # noqa: E402

BEGIN, END = "<!-- smpi-sweep: begin -->", "<!-- smpi-sweep: end -->"
DECOMPOSED = ("ring", "bidirectional")
LIBRARY = ("bulk", "ring", "bidirectional", "others")
# A candidate of the cost model and the overlap-bench row that ran it.
ROW_OF = {("bulk", "named"): "bulk", ("ring", "named"): "ring", ("bidirectional", "named"): "bidirectional",
          ("bulk", "others"): "others"}


def load(path):
    """{(op, variant, m, n, k, ranks): {strategy: row}} of one JSON-lines file."""
    out = {}
    for line in open(path):
        r = json.loads(line)
        out.setdefault((r["op"], r["variant"], r["m"], r["n"], r["k"], r["ranks"]), {})[r["strategy"]] = r
    return out


def where(paths):
    """Where the JSON lines of `paths` were simulated: the CPU whose core timed the GEMMs, its
    oneDNN ISA and version, and the dates, as overlap-bench records them. Lines from before it
    recorded them (2026-12-02, an AMD EPYC with AVX-512) say so."""
    seen = set()
    for path in paths:
        for line in open(path):
            r = json.loads(line)
            isa = r["gemm_path"].rsplit("(", 1)[-1].rstrip(")") + ", " if "gemm_path" in r else ""
            seen.add((r.get("cpu", "AMD EPYC (not recorded)"), isa, r.get("onednn", "2.6.3"),
                      r.get("date", "2026-12-02 or before")))
    return "; ".join(f"{cpu}, {isa}oneDNN {dnnl}, {date}" for cpu, isa, dnnl, date in sorted(seen))


def label(key):
    op, variant, m, n, k = key[:5]
    return f"{'AG' if op == 'all_gather_matmul' else 'RS'} {variant} {m}x{n}x{k}"


def ms(by, s, field="time_ms"):
    return f"{by[s][field]:.1f}" if s in by and by[s].get(field) is not None else "-"


def validation(smpi_dir, results_dir):
    lines = ["### Validation: the emulated clusters and their SMPI mirrors", "",
             "The same overlap-bench cases (bench/model_sweep.sh's shapes, both ops, thin to square) on the",
             "emulated clusters (TCP over veth with tc rate limits, docs/vcluster.md; docs/results/model-*.jsonl)",
             "and on their mirrors under SMPI (tools/smpi/, GEMMs computed and every result checked). `emu` is",
             "measured on the emulated cluster, `sim` simulated on its mirror; ms, medians of the slowest rank.",
             "`comm only` and `compute only` are the ring schedule's transfers alone and GEMMs alone;",
             "`best decomposed / limit` is the fastest of ring and bidirectional over its own limit, the larger",
             "of its own GEMMs alone and its own transfers alone. Simulated with GEMMs timed on: "
             + where(glob.glob(os.path.join(smpi_dir, "mirror-*.jsonl"))) + ".", "",
             "| cluster | shape | comm only emu / sim | compute only emu / sim | bulk emu / sim | ring emu / sim | "
             "best decomposed / limit emu / sim | automatic chose (sim) |", "|---|---|---|---|---|---|---|---|"]
    ratios = {"comm": [], "compute": []}
    targets = []
    for f in sorted(glob.glob(os.path.join(smpi_dir, "mirror-*.jsonl"))):
        mirror = os.path.basename(f)[len("mirror-"):-len(".jsonl")]
        emu_path = os.path.join(results_dir, f"model-{mirror}.jsonl")
        emu = load(emu_path) if os.path.exists(emu_path) else {}
        for key, sim in load(f).items():
            e = emu.get(key, {})
            ref_sim = sim.get("ring", next(iter(sim.values())))
            ref_emu = e.get("ring")
            if ref_emu:
                ratios["comm"].append(ref_sim["comm_only_ms"] / ref_emu["comm_only_ms"])
                ratios["compute"].append(ref_sim["compute_only_ms"] / ref_emu["compute_only_ms"])

            def best_ratio(by):
                """The fastest decomposed schedule's time over its own limit, max(its GEMMs alone, its transfers alone)."""
                runs = [by[s] for s in DECOMPOSED if s in by and by[s].get("own_comm_only_ms") is not None]
                if not runs:
                    return None
                r = min(runs, key=lambda x: x["time_ms"])
                return r["time_ms"] / max(r["own_compute_only_ms"], r["own_comm_only_ms"])
            bs, be = best_ratio(sim), best_ratio(e) if e else None
            chose = (sim.get("automatic", {}).get("schedule") or {}).get("text", "-")
            cell = lambda x: f"{x:.3f}" if x is not None else "-"
            lines.append(f"| {mirror} | {label(key)} | {ms(e, 'ring', 'comm_only_ms')} / {ms(sim, 'ring', 'comm_only_ms')}"
                         f" | {ms(e, 'ring', 'compute_only_ms')} / {ms(sim, 'ring', 'compute_only_ms')}"
                         f" | {ms(e, 'bulk')} / {ms(sim, 'bulk')} | {ms(e, 'ring')} / {ms(sim, 'ring')}"
                         f" | {cell(be)} / {cell(bs)} | {chose.split(';')[0]} |")
            if key[2] == key[3] == key[4] == 2048 and key[1] in ("lhs_rows", "rows"):
                targets.append((mirror, label(key), bs))
    med = lambda v: sorted(v)[len(v) // 2] if v else float("nan")
    lines += ["", f"Over the {len(ratios['comm'])} cases with both sides, simulated over emulated: the ring's "
              f"transfers alone {min(ratios['comm'], default=0):.2f}-{max(ratios['comm'], default=0):.2f} "
              f"(median {med(ratios['comm']):.2f}), its GEMMs alone {min(ratios['compute'], default=0):.2f}-"
              f"{max(ratios['compute'], default=0):.2f} (median {med(ratios['compute']):.2f}).", ""]
    met = [t for t in targets if t[2] is not None and t[2] <= 1.05]
    lines += [f"- **Target: decomposed / limit <= 1.05 at 2048^3 on the mirrors**: {len(met)} of {len(targets)} "
              "cases: " + ", ".join(f"{m} {l} {r:.3f}" for m, l, r in targets if r is not None) + ".", ""]
    return lines


def model_cases(smpi_dir, prefix):
    """[(platform, key, by)] of the model sweep's files PREFIX-fattree*.jsonl."""
    cases = []
    for f in sorted(glob.glob(os.path.join(smpi_dir, f"{prefix}-fattree*.jsonl"))):
        platform = os.path.basename(f)[len(prefix) + 1:-len(".jsonl")]
        for key, by in load(f).items():
            cases.append((platform, key, by))
    return cases


MODEL_INTRO = {
    "model": ["### The cost model on simulated fat trees (2-64 ranks): schedules and network", "",
              "Every GEMM was charged the calibration's own figure for its shape, its flops over the rate the",
              "calibration's grid gives it (OVERLAP_SIM_COMPUTE=calibrated; no GEMM ran): the simulated compute",
              "is what the model believes, so these rows check what it predicts from it (the schedules, the",
              "pieces' shapes, the transfers over the simulated network, their overlap). The grid's own",
              "accuracy is checked in the next table. Grid measured on: "],
    "model-measured": ["### The cost model on simulated fat trees (2-64 ranks): end to end", "",
                       "The same cases with every GEMM shape timed on one core (5 runs, back to back, the",
                       "median charged; OVERLAP_SIM_COMPUTE=skipped), so the rate grid's interpolation and the",
                       "difference between two measurements of a shape on this machine are included. Not",
                       "rerun by default (35 minutes on 2 cores; SMPI_SWEEP_PARTS=model-measured). GEMMs timed on: "],
}


def grid_accuracy(smpi_dir):
    """The rate grid against the GEMMs' measured charges: per case of both model sweeps, the
    ring schedule's GEMMs alone (compute_only_ms) and bulk's one GEMM, measured / calibrated."""
    calibrated = {(p, k): by for p, k, by in model_cases(smpi_dir, "model")}
    ratios = {"ring's pieces": [], "bulk's GEMM": []}
    for p, k, by in model_cases(smpi_dir, "model-measured"):
        c = calibrated.get((p, k))
        if not c or "automatic" not in by or "automatic" not in c:
            continue
        for name, field in (("ring's pieces", "compute_only_ms"), ("bulk's GEMM", "one_gemm_ms")):
            m, g = by["automatic"].get(field), c["automatic"].get(field)
            if m and g:
                ratios[name].append(m / g)
    if not any(ratios.values()):
        return []
    lines = ["Where the end-to-end run misses, the GEMMs differ: the same cases' GEMM times as measured over",
             "the calibration's figures (measured / calibrated). Both are warm runs of the same shapes on the",
             "same kind of machine, one from the grid (interpolated between measured shapes), one from the",
             "shape itself.", "", "| GEMMs | cases | within 10% | median | range |", "|---|---|---|---|---|"]
    for name, r in ratios.items():
        if r:
            s = sorted(r)
            lines.append(f"| {name} | {len(r)} | {sum(abs(x - 1) <= 0.10 for x in r)} | {s[len(s) // 2]:.3f} | "
                         f"{s[0]:.2f}-{s[-1]:.2f} |")
    return lines + [""]


def model(smpi_dir, prefix="model"):
    preds = []  # (platform, key, row, predicted, simulated)
    cases = model_cases(smpi_dir, prefix)
    if not cases:
        return []
    files = glob.glob(os.path.join(smpi_dir, f"{prefix}-fattree*.jsonl"))
    intro = MODEL_INTRO[prefix]
    lines = intro[:2] + [
             f"{len(cases)} cases from bench/smpi_sweep.sh: both ops, 2-64 ranks of the 1024-node fat trees",
             "(tools/smpi/fattree1024-*.xml; nodes of 3.2 Tf, 32 of this machine's cores) at 25, 100 and",
             "200 Gbit/s per link, each rank holding the same shard at every rank count. The calibration",
             "of each platform and rank count was measured there (docs/results/smpi/model-*-calibration.json).",
             "These runs time the schedules and do not check results. A simulated run of a schedule is",
             "deterministic, so there is no noise floor here: `automatic` is judged on its own row."] + \
        intro[2:-1] + [intro[-1] + where(files) + ".", "",
             "| platform | ranks | shape | bulk | ring | bidir | others | automatic (chose) | best | auto / best |"
             " auto / bulk | worst prediction error |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    n = auto_ok = bulk_ok = 0
    for platform, key, by in sorted(cases, key=lambda c: (c[0], c[1][5], c[1][0], c[1][4] + c[1][3])):
        t = {s: by[s]["time_ms"] for s in by}
        lib = {s: t[s] for s in LIBRARY if s in t}
        if not lib or "automatic" not in t:
            continue
        best_s = min(lib, key=lib.get)
        best, auto = lib[best_s], t["automatic"]
        sched = by["automatic"].get("schedule") or {}
        chose = ROW_OF.get((sched.get("strategy"), sched.get("algorithm")), sched.get("strategy", "?"))
        n += 1
        auto_ok += auto <= 1.03 * best
        bulk_ok += auto <= 1.02 * t["bulk"]
        cands = sched.get("candidates", [])
        others = [c for c in cands if c["algorithm"] == "others"]
        fastest = min(others, key=lambda c: c["predicted_ms"]) if others else None
        errs = []
        for c in cands:
            row = ROW_OF.get((c["strategy"], c["algorithm"]))
            if row in t and (c["algorithm"] != "others" or c is fastest):
                preds.append((platform, key, row, c["predicted_ms"], t[row]))
                errs.append(c["predicted_ms"] / t[row] - 1)
        worst = max(errs, key=abs) if errs else float("nan")
        cell = lambda s: f"{t[s]:.2f}" if s in t else "-"
        lines.append(f"| {platform.replace('fattree1024-', '')} | {key[5]} | {label(key)} | {cell('bulk')} | "
                     f"{cell('ring')} | {cell('bidirectional')} | {cell('others')} | {auto:.2f} ({chose}) | "
                     f"{best:.2f} ({best_s}) | {auto / best:.3f} | {auto / t['bulk']:.3f} | {100 * worst:+.0f}% |")
    within = sum(abs(p / m - 1) <= 0.10 for *_, p, m in preds)
    lines += ["", f"- **Predictions within 10% of the simulated time** (target: >= 90%): {within} of {len(preds)} "
              f"({100 * within / max(len(preds), 1):.0f}%).",
              f"- **automatic within 3% of the best simulated schedule** (target: >= 95%): {auto_ok} of {n} "
              f"({100 * auto_ok / max(n, 1):.0f}%).",
              f"- **automatic never more than 2% slower than bulk**: {bulk_ok} of {n}.", ""]
    by_row = {}
    for _, _, row, p, m in preds:
        by_row.setdefault(row, []).append(p / m - 1)
    lines += ["Prediction error per schedule (predicted / simulated - 1):", "",
              "| schedule | predictions | within 10% | median error | worst |", "|---|---|---|---|---|"]
    for row, e in sorted(by_row.items()):
        s = sorted(e)
        lines.append(f"| {row} | {len(e)} | {sum(abs(x) <= 0.10 for x in e)} | {100 * s[len(s) // 2]:+.0f}% | "
                     f"{100 * max(e, key=abs):+.0f}% |")
    return lines + [""]


def layer(smpi_dir):
    """The block's training steps on the mirrors (overlap-layer): how much of its communication
    the decomposed ops hide when the cores compute alone, as beside an RDMA NIC."""
    files = sorted(glob.glob(os.path.join(smpi_dir, "layer-*.jsonl")))
    if not files:
        return []
    lines = ["### The transformer block on the mirrors: communication hidden in a training step", "",
             "overlap-layer (its defaults: seq 2048, hidden 1024, 16 heads, ffn 4096; forward and backward)",
             "on the SMPI mirrors of the emulated clusters, every op bulk and every op decomposed, side by side",
             "in one run, each checked against the block in double precision. `comm hidden` = (bulk - mode) /",
             "comm only, where comm only is the step's 4 all-gathers and 4 reduce-scatters alone, as bulk runs",
             "them. Started ops run on the caller's thread under SMPI (docs/smpi.md), so the backward's dW",
             "products are not overlapped with its dX transfers here: the figures are pessimistic for them.",
             "GEMMs timed on: " + where(files) + ".", "",
             "| mirror | dtype | mode | step ms | speedup vs bulk | comm only ms | comm hidden | compute only ms |"
             " max rel err |", "|---|---|---|---|---|---|---|---|---|"]
    hidden = []
    for f in files:
        mirror = os.path.basename(f)[len("layer-"):-len(".jsonl")]
        for r in (json.loads(line) for line in open(f)):
            h = r.get("comm_hidden")
            if r["mode"] != "bulk" and h is not None:
                hidden.append((mirror, r["dtype"], r["mode"], h))
            lines.append(f"| {mirror} | {r['dtype']} | {r['mode']} | {r['step_ms']:.1f} | "
                         f"{r['speedup_vs_bulk']:.3f} | {r['comm_ms']:.1f} | "
                         f"{'-' if h is None else f'{100 * h:.0f}%'} | {r['compute_ms']:.1f} | "
                         f"{r['max_rel_err']:.1e} |")
    best = {}
    for mirror, dtype, mode, h in hidden:
        best[(mirror, dtype)] = max(best.get((mirror, dtype), h), h)
    met = sum(h >= 0.90 for h in best.values())
    lines += ["", f"- **Target: at least 90% of the block's communication hidden in a training step**: {met} of "
              f"{len(best)} (mirror, dtype) pairs, the best decomposed mode of each: "
              + ", ".join(f"{m} {d} {100 * h:.0f}%" for (m, d), h in sorted(best.items())) + ".", ""]
    return lines


SIMPLEST_FIRST = ["bulk", "ring", "bidirectional", "others"]


def projected(row, op):
    """The projection's time (ms) of automatic's rule: the simplest candidate within 3% of the fastest."""
    c = row[op]
    fastest = min(c.values())
    name = next(n for n in SIMPLEST_FIRST if n in c and c[n] <= fastest * 1.03)
    return 1e3 * c[name], name


def scale(smpi_dir):
    """docs/scaling.md's simulated section: the MLP block's products at scale."""
    proj = {}
    path = os.path.join(smpi_dir, "scale-projection.jsonl")
    if os.path.exists(path):
        for line in open(path):
            r = json.loads(line)
            proj[(int(r["gbit"]), r["ranks"])] = r
    files = sorted(glob.glob(os.path.join(smpi_dir, "scale-fattree*.jsonl")))
    if not files:
        return []
    lines = ["## Simulated: the real code on SimGrid SMPI (issue 28)", "",
             "Simulated, not measured: bench/smpi_sweep.sh ran overlap-bench (make smpi) under smpirun on the",
             "1024-node fat trees of tools/smpi/ (nodes of 3.2 Tf, 32 of this machine's cores; 1 us per link, four",
             "links between nodes of different leaves; CM02 network model, Open MPI's collective selection). The",
             "block's two products at tokens 4096, hidden 4096 (ffn 16384), f32: up = all_gather_matmul",
             "(lhs_rows, 4096 x 4096 by 4096 x 16384 / R), down = matmul_reduce_scatter (rows). GEMM times are",
             "this machine's core's (the median of 2 runs per kernel and shape in the simulation, charged at",
             "1/32) and the GEMMs are then skipped (OVERLAP_SIM_COMPUTE=skipped): timing only, results not",
             "checked. Each platform and rank count up to 64 used its own calibration; a dp x tp mesh used its",
             "8-rank group's. Beyond 64 ranks there is no calibration (the links' took over 10 minutes at 128",
             "ranks), so no automatic row: the speedup there is the faster ring schedule's, marked *.",
             "`projected` is bench/projection.cpp on the same platform (the same GEMM rates, 32 cores at",
             "efficiency 1, 4 us per message, no GEMM slowdown), the model of the section above.", "",
             "| platform | ranks | groups x tp | op | bulk | ring | bidirectional | automatic (chose) | "
             "speedup over bulk | best decomposed / its limit | projected bulk / chosen (speedup) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    block = {}
    for f in files:
        platform = os.path.basename(f)[len("scale-"):-len(".jsonl")]
        gbit = int(platform.split("-")[1].replace("gbit", ""))
        rows = [json.loads(l) for l in open(f)]
        by = {}
        for r in rows:
            by.setdefault((r["ranks"], r["tensor_groups"], r["op"]), {})[r["strategy"]] = r
        for (R, groups, op), b in sorted(by.items(), key=lambda x: (x[0][1], x[0][0], x[0][2])):
            t = {s: b[s]["time_ms"] for s in b}
            runs = [b[s] for s in DECOMPOSED if s in b]
            best = min(runs, key=lambda x: x["time_ms"])
            if "automatic" in b:
                chose = (b["automatic"].get("schedule") or {}).get("strategy", "?")
                pick, pick_cell = t["automatic"], f"{t['automatic']:.2f} ({chose})"
            else:  # no calibration at this size: the faster ring schedule
                pick, pick_cell = best["time_ms"], "-"
            lim = best["time_ms"] / max(best["own_compute_only_ms"], best["own_comm_only_ms"])
            key = "up" if op == "all_gather_matmul" else "down"
            p = proj.get((gbit, R)) if groups == 1 else None
            pc = "-"
            if p:
                pt, pn = projected(p, key)
                pc = f"{1e3 * p[key]['bulk']:.2f} / {pt:.2f} {pn} ({1e3 * p[key]['bulk'] / pt:.2f})"
            cell = lambda s: f"{t[s]:.2f}" if s in t else "-"
            lines.append(f"| {gbit} Gbit/s | {R * groups} | {groups} x {R} | {key} | {cell('bulk')} | {cell('ring')} | "
                         f"{cell('bidirectional')} | {pick_cell} | {t['bulk'] / pick:.2f}{'' if 'automatic' in b else '*'} | "
                         f"{lim:.3f} | {pc} |")
            blk = block.setdefault((gbit, R * groups, groups, R),
                                   {"bulk": 0, "auto": 0, "proj": p, "ops": 0, "mark": ""})
            blk["bulk"] += t["bulk"]
            blk["auto"] += pick
            blk["mark"] = blk["mark"] or ("" if "automatic" in b else "*")
            blk["ops"] += 1
    lines += ["", "The block (up + down), simulated speedup of automatic over bulk beside the projection's:", "",
              "| platform | ranks | groups x tp | simulated | projected |", "|---|---|---|---|---|"]
    for (gbit, n, groups, R), b in sorted(block.items(), key=lambda x: (x[0][2], x[0][0], x[0][1])):
        if b["ops"] != 2:  # a block needs both products
            continue
        pr = "-"
        if b["proj"]:
            p = b["proj"]
            pr = f"{1e3 * (p['up']['bulk'] + p['down']['bulk']) / (projected(p, 'up')[0] + projected(p, 'down')[0]):.2f}"
        lines.append(f"| {gbit} Gbit/s | {n} | {groups} x {R} | {b['bulk'] / b['auto']:.2f}{b['mark']} | {pr} |")
    return lines + [""]


def block(smpi_dir):
    """docs/scaling.md: overlap-layer's whole block on the fat tree, a tensor group and a mesh."""
    files = sorted(glob.glob(os.path.join(smpi_dir, "block-fattree*.jsonl")))
    if not files:
        return []
    lines = ["### The whole block (overlap-layer)", "",
             "overlap-layer's default block (seq 2048, hidden 1024, 16 heads, ffn 4096, f32; forward and",
             "backward: 4 all-gather and 4 reduce-scatter products per step, plus attention, layer norms and",
             "the weight gradients) on one tensor group and on a dp x tp mesh of the fat tree, every op bulk",
             "and every op decomposed, side by side in one run. Timing only: GEMMs charged the median of 3",
             "real runs per shape, then skipped; the local work likewise since 2026-12-08",
             "(backend::work_sampler; in runs dated before, SMPI timed it as it ran). `comm hidden` = (bulk - mode) / comm",
             "only, as in results.md's block on the mirrors. GEMMs timed on: " + where(files) + ".", "",
             "| platform | ranks | groups x tp | bulk ms | ring ms | automatic ms | speedup (automatic) |"
             " comm only ms | compute only ms | comm hidden (ring / automatic) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for f in files:
        platform = os.path.basename(f)[len("block-"):-len(".jsonl")]
        gbit = platform.split("-")[1].replace("gbit", "")
        runs = {}
        for r in (json.loads(line) for line in open(f)):
            runs.setdefault((r["tensor_groups"], r["ranks"]), {})[r["mode"]] = r
        for (groups, R), m in sorted(runs.items()):
            if not all(k in m for k in ("bulk", "ring", "automatic")):
                continue
            b, rg, a = m["bulk"], m["ring"], m["automatic"]
            hid = lambda r: "-" if r.get("comm_hidden") is None else f"{100 * r['comm_hidden']:.0f}%"
            lines.append(f"| {gbit} Gbit/s | {R} | {groups} x {R // groups} | {b['step_ms']:.1f} | {rg['step_ms']:.1f} | "
                         f"{a['step_ms']:.1f} | {b['step_ms'] / a['step_ms']:.2f} | {b['comm_ms']:.1f} | "
                         f"{b['compute_ms']:.1f} | {hid(rg)} / {hid(a)} |")
    return lines + [""]


def replace_section(path, body):
    sections.replace(path, (BEGIN, END), "\n".join(body))


def main(smpi_dir, results_md, scaling_md=None):
    results_dir = os.path.dirname(os.path.abspath(smpi_dir.rstrip("/")))
    body = ["## Simulated clusters: SimGrid SMPI (issue 28)", "",
            "Simulated, not measured: the real programs built with smpicxx (make smpi) against SimGrid 3.32's",
            "SMPI, its own MPI, under tools/smpi/run on the platforms of tools/smpi/ (CM02 network model: the",
            "stated bandwidths and latencies; collectives chosen as Open MPI's tuned component chooses them). A",
            "rank's computation is timed on one core of the machine that runs the simulation (each part",
            "below names it) and charged to simulated time; transfers progress on their own as beside an RDMA NIC. Times are simulated ms.",
            "docs/smpi.md says what differs from a real run and why the two sides below differ.", ""]
    body += validation(smpi_dir, results_dir) + layer(smpi_dir) + model(smpi_dir, "model")
    body += model(smpi_dir, "model-measured") + grid_accuracy(smpi_dir)
    replace_section(results_md, body)
    if scaling_md:
        section = scale(smpi_dir)
        section += block(smpi_dir) if section else []
        if section:
            replace_section(scaling_md, section)


if __name__ == "__main__":
    main(*sys.argv[1:4])
