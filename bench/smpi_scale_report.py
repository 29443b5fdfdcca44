"""The scale runs of bench/smpi_scale.sh (make bench-smpi-scale) into docs/scaling.md, whose
opening section they are, and docs/results.md, where every (predicted, simulated) pair of the
cost model is listed. Each section replaces any earlier one between its markers.

    python3 bench/smpi_scale_report.py docs/results/smpi/scale docs/scaling.md docs/results.md"""
import glob
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sections  # noqa: E402

OPS = {"all_gather_matmul": "ag", "matmul_reduce_scatter": "rs", "matmul_all_reduce": "ar"}
NAMES = {("bulk", "named"): "bulk", ("ring", "named"): "ring", ("bidirectional", "named"): "bidirectional",
         ("bulk", "others"): "others", ("hierarchical", "named"): "two-level"}
WITHIN = 0.10  # the bar: predictions within 10% of the simulated times


def runs(out, kind):
    """{(gbit, ranks, tp, op): {strategy: row}} of KIND-fattree*.jsonl."""
    by = {}
    for path in sorted(glob.glob(os.path.join(out, f"{kind}-fattree*.jsonl"))):
        gbit = int(os.path.basename(path).split("-")[2].replace("gbit.jsonl", ""))
        for line in open(path):
            r = json.loads(line)
            # overlap-bench's "ranks" are a tensor group's; the world holds tensor_groups of them.
            tp = r["ranks"]
            by.setdefault((gbit, tp * r["tensor_groups"], tp, OPS[r["op"]]), {})[r["strategy"]] = r
    return by


def costs(out):
    """{(kind, gbit, ranks, tp, op): cost row} of tools/smpi/measure's cost.jsonl."""
    path = os.path.join(out, "cost.jsonl")
    by = {}
    if os.path.exists(path):
        for line in open(path):
            c = json.loads(line)
            kind, platform, np, tp, op = c["label"].split()
            by[(kind, int(platform.split("-")[1].replace("gbit", "")), int(np), int(tp), op)] = c
    return by


def with_chunks(name, chunks):
    return f"{name}, {chunks} chunk{'s' if chunks > 1 else ''}" if chunks else name


def chose(row):
    s = row.get("schedule") or {}
    return with_chunks(NAMES.get((s.get("strategy"), s.get("algorithm")), s.get("strategy", "?")), s.get("chunks"))


def pairs(row):
    """The cost model's (candidate, predicted, simulated) for each candidate automatic timed."""
    out = []
    for c in (row.get("schedule") or {}).get("candidates", []):
        if c.get("measured_ms") is not None:
            name = NAMES.get((c["strategy"], c["algorithm"]), c["strategy"])
            out.append((with_chunks(name, c["chunks"]), c["predicted_ms"], c["measured_ms"]))
    return out


def modelled(row):
    """The cost model's speedup over bulk for automatic's choice: bulk's prediction over the choice's."""
    s = row.get("schedule") or {}
    bulk = [c["predicted_ms"] for c in s.get("candidates", []) if c["strategy"] == "bulk" and c["algorithm"] == "named"]
    return bulk[0] / s["predicted_ms"] if bulk and s.get("predicted_ms") else None


def speedup_cell(b):
    if not b or "automatic" not in b or "bulk" not in b:
        return "-"
    m = modelled(b["automatic"])
    return (f"{b['bulk']['time_ms'] / b['automatic']['time_ms']:.2f} / " + (f"{m:.2f}" if m else "-")
            + f" ({chose(b['automatic'])})")


def speedup_table(groups, mesh, rates, tps):
    """Automatic's speedups by op, rate and group size; a column of the meshes unless mesh is None."""
    head = "| op | Gbit/s | " + " | ".join(f"tp {tp}" for tp in tps) + " |"
    lines = [head + (" 1024 ranks (dp x tp) |" if mesh is not None else ""),
             "|---|---|" + "---|" * (len(tps) + (mesh is not None))]
    for op in ("ag", "rs", "ar"):
        for gbit in rates:
            row = f"| {op} | {gbit} | " + " | ".join(speedup_cell(groups.get((gbit, tp, tp, op))) for tp in tps) + " |"
            if mesh is not None:
                m = [f"{R // tp} x {tp}: {speedup_cell(b)}" for (g, R, tp, o), b in sorted(mesh.items())
                     if g == gbit and o == op]
                row += f" {'; '.join(m) or '-'} |"
            lines.append(row)
    return lines


def times_table(groups, mesh, cost):
    lines = ["| Gbit/s | ranks | dp x tp | op | bulk ms | ring ms | automatic ms (chose) | speedup | "
             "ring / its limit | wall s | peak PSS GiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for kind, by in (("groups", groups), ("mesh", mesh)):
        for (gbit, R, tp, op), b in sorted(by.items(), key=lambda x: (x[0][3], x[0][0], x[0][1], x[0][2])):
            c = cost.get((kind, gbit, R, tp, op), {})
            t = {s: b[s]["time_ms"] for s in b}
            auto = f"{t['automatic']:.1f} ({chose(b['automatic'])})" if "automatic" in t else "-"
            sp = f"{t['bulk'] / t['automatic']:.2f}" if "automatic" in t and "bulk" in t else "-"
            lim = f"{b['ring']['ratio_to_limit']:.3f}" if "ring" in b and b["ring"].get("ratio_to_limit") else "-"
            cell = lambda s: f"{t[s]:.1f}" if s in t else "-"
            lines.append(f"| {gbit} | {R} | {R // tp} x {tp} | {op} | {cell('bulk')} | {cell('ring')} | {auto} | {sp} | "
                         f"{lim} | {c.get('wall_s', '-')} | {c.get('peak_pss_gib', '-')} |")
    unfinished = [c for c in cost.values() if c["rc"] != 0]
    for c in unfinished:
        lines.append(f"| {c['label']}: ended with exit {c['rc']} (124: out of its time) after {c['wall_s']} s |"
                     + " |" * 10)
    return lines


def layers(out, cost):
    """overlap-layer's training step at 1024 ranks (layer-fattree*.jsonl), one line per mesh."""
    rows = {}
    for path in sorted(glob.glob(os.path.join(out, "layer-fattree*.jsonl"))):
        gbit = int(os.path.basename(path).split("-")[2].replace("gbit.jsonl", ""))
        for line in open(path):
            r = json.loads(line)
            rows.setdefault((gbit, r["ranks"], r["dp"], r["cp"], r["tp"]), {})[r["mode"]] = r
    if not rows:
        return []
    lines = ["", "### The transformer block at 1024 ranks (overlap-layer)", "",
             "overlap-layer's training step (forward and backward) of its default block (seq 2048, hidden",
             "1024, 16 heads, ffn 4096, f32, sequence parallel) on every tensor group of the mesh at once;",
             "with a cp axis the sequence is split over cp and attention is ring attention between the",
             "shares. The ops' GEMMs are charged from the 8-rank group's calibration; attention, the layer",
             "norms, GELU and the weight gradients are sampled on their first 3 real runs in the simulation",
             "and then charged (backend::work_sampler), and the element-wise passes between them cost",
             "nothing (SMPI_HOST_TIMING=off). `comm hidden`: the share of the step's collectives alone that",
             "automatic's step hides against bulk's ((bulk - automatic) / comm only). One measured step after",
             "one warm-up; the slowest rank.", "",
             "| Gbit/s | ranks | dp x cp x tp | bulk ms | automatic ms | speedup | comm hidden | comm only ms | "
             "compute only ms | wall s | peak PSS GiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (gbit, R, dp, cp, tp), b in sorted(rows.items()):
        c = cost.get(("layer", gbit, R, tp, f"cp{cp}"), {})
        bulk, auto = b.get("bulk"), b.get("automatic")
        if not bulk or not auto:
            continue
        hidden = f"{100 * auto['comm_hidden']:.0f}%" if auto.get("comm_hidden") is not None else "-"
        lines.append(f"| {gbit} | {R} | {dp} x {cp} x {tp} | {bulk['step_ms']:.2f} | {auto['step_ms']:.2f} | "
                     f"{bulk['step_ms'] / auto['step_ms']:.2f} | {hidden} | {auto['comm_ms']:.2f} | "
                     f"{auto['compute_ms']:.2f} | {c.get('wall_s', '-')} | {c.get('peak_pss_gib', '-')} |")
    return lines


def plot(groups, rates, tps, out_svg):
    """Automatic's speedup over bulk against the group size, one line per op and rate (gnuplot)."""
    if not shutil.which("gnuplot"):
        return False
    dat = out_svg[:-4] + ".dat"
    with open(dat, "w") as f:
        for op in ("ag", "rs", "ar"):
            for gbit in rates:
                f.write(f"# {op} {gbit}\n")
                for tp in tps:
                    b = groups.get((gbit, tp, tp, op))
                    if b and "automatic" in b:
                        f.write(f"{tp} {b['bulk']['time_ms'] / b['automatic']['time_ms']}\n")
                f.write("\n\n")
    titles = [f"{op} {gbit} Gbit/s" for op in ("ag", "rs", "ar") for gbit in rates]
    series = ", ".join(f"'{dat}' index {i} with linespoints title '{t}'" for i, t in enumerate(titles))
    script = (f"set terminal svg size 720,420; set output '{out_svg}'; set logscale x 2; "
              "set xlabel 'ranks in the tensor group'; set ylabel 'speedup over bulk (automatic)'; "
              f"set key outside right; set grid; plot {series}")
    subprocess.run(["gnuplot", "-e", script], check=True)
    os.remove(dat)
    return True


def accuracy(groups, mesh, groups128):
    """Every (case, candidate) the cost model predicted and the simulation timed."""
    rows, within, misses = [], 0, []
    for kind, by in (("32 cores", groups), ("32 cores", mesh), ("128 cores", groups128)):
        for (gbit, R, tp, op), b in sorted(by.items(), key=lambda x: (x[0][3], x[0][0], x[0][1])):
            for name, pred, sim in pairs(b.get("automatic", {})):
                err = pred / sim - 1
                within += abs(err) <= WITHIN
                rows.append(f"| {kind} | {gbit} | {R} | {R // tp} x {tp} | {op} | {name} | {pred:.1f} | {sim:.1f} | "
                            f"{100 * err:+.1f}% |")
                if abs(err) > WITHIN:
                    misses.append(f"- {op}, {gbit} Gbit/s, {R // tp} x {tp}, {kind}: {name} predicted {pred:.1f} ms, "
                                  f"simulated {sim:.1f} ({100 * err:+.1f}%)")
    return rows, within, misses


def rings(out, cost):
    """One tensor group of 128-512 ranks, bulk and the ring, beside bench/projection.cpp's projection."""
    sims = {}
    for path in sorted(glob.glob(os.path.join(out, "rings-fattree*.jsonl"))):
        for line in open(path):
            r = json.loads(line)
            sims.setdefault((r["ranks"], OPS[r["op"]]), {})[r["strategy"]] = r["time_ms"]
    proj_path = os.path.join(out, "rings-projection.jsonl")
    if not sims or not os.path.exists(proj_path):
        return []
    proj = {}
    for line in open(proj_path):
        r = json.loads(line)
        proj[r["ranks"]] = r
    lines = ["", "### One ring of 128-512 ranks against the projection", "",
             "A single tensor group's ring of 1024 ranks stays a projection (bench/projection.cpp, the section",
             "below); here the simulation follows every message of single rings of fewer ranks, on the",
             "100 Gbit/s fat tree with GEMMs charged from the 64-rank group's calibration, and the projection",
             "prices the same products from the same calibration (its node GEMM rates, its links' latency).",
             "The MLP block's two products: up = ag 4096 x 4096 by 4096 x 16384 (lhs_rows), down = rs",
             "(rows) back; ms, the slowest rank; `error` = projected / simulated - 1.", "",
             "| ranks | product | bulk simulated | bulk projected | error | ring simulated | ring projected | error |"
             " wall s |", "|---|---|---|---|---|---|---|---|---|"]
    for (R, op), t in sorted(sims.items()):
        key = "up" if op == "ag" else "down"
        p = proj.get(R, {}).get(key)
        c = cost.get(("rings", 100, R, R, op), {})
        cells = []
        for name in ("bulk", "ring"):
            sim = t.get(name)
            pr = 1e3 * p[name] if p else None
            cells += [f"{sim:.2f}" if sim else "-", f"{pr:.2f}" if pr else "-",
                      f"{100 * (pr / sim - 1):+.1f}%" if sim and pr else "-"]
        lines.append(f"| {R} | {key} ({op}) | " + " | ".join(cells) + f" | {c.get('wall_s', '-')} |")
    return lines


def main(out, scaling_md, results_md):
    groups, mesh, cost = runs(out, "groups"), runs(out, "mesh"), costs(out)
    groups128 = runs(out, "groups128")
    if not groups and not mesh:
        sys.exit(f"smpi_scale_report: no runs in {out}")
    rates = sorted({k[0] for k in groups} | {k[0] for k in mesh})
    tps = sorted({k[2] for k in groups})
    any_row = next(iter((groups or mesh).values()))["bulk"]
    where = (f"{any_row['cpu']}, SimGrid SMPI ({any_row['mpi'].split('.')[0]}.{any_row['mpi'].split('.')[1][:2]}), "
             f"overlap {any_row['overlap']}, {any_row['date']}")
    svg = os.path.join(os.path.dirname(scaling_md), "results", "scaling-simulated.svg")
    drawn = plot(groups, rates, tps, svg)
    acc, within, misses = accuracy(groups, mesh, groups128)
    body = ["## Simulated: the real code at 8-1024 ranks (make bench-smpi-scale)", "",
            "Simulated, not measured: overlap-bench (make smpi) under SimGrid SMPI on the 1024-node fat trees",
            "of tools/smpi/ (two levels, full bisection; nodes of 3.2 Tf, 32 of this machine's cores, one",
            "rank per node; 1 us per link; CM02 network model, Open MPI's collective selection; the settings",
            "tools/smpi/run adds at scale are in docs/smpi.md). Each tensor group of tp ranks holds the shards",
            "of one 65536 x 8192 x 8192 product (M x N x K, f32; all-gather: lhs_rows, reduce-scatter and",
            "all-reduce: rows). GEMMs are charged from the platform's calibration for the group size",
            "(OVERLAP_SIM_COMPUTE=calibrated): no GEMM runs, so the cost model and the simulation see the",
            "same compute and what differs is the schedules' transfers. Automatic's measured choice (the",
            "default) timed its three best candidates. One iteration per strategy; the slowest rank.",
            f"Simulated on: {where}. `bench/smpi_scale.sh` says what each run is.", "",
            "The 1024-rank column runs every group of the dp x tp mesh at once on its own nodes: each group's",
            "traffic stays on its own links of the full-bisection tree, so a mesh's times are its group's (the",
            "table below shows both). That column is what the simulation can hold at 1024 ranks in this",
            "sweep's time; the single groups give the rates and group sizes. A mesh times bulk, ring and",
            "automatic only (its limit's halves are its group's).", "",
            "### Speedup over bulk: simulated / the cost model's (automatic's choice)", "",
            "Each cell: automatic's simulated speedup over bulk, then the cost model's prediction of the same",
            "(bulk's predicted time over the chosen schedule's), and the schedule automatic chose.", ""]
    body += speedup_table(groups, mesh, rates, tps)
    if drawn:
        body += ["", f"![simulated speedup over bulk](results/{os.path.basename(svg)})"]
    if groups128:
        rates128 = sorted({k[0] for k in groups128})
        tps128 = sorted({k[2] for k in groups128})
        body += ["", "### Nodes of 128 cores", "",
                 "The same groups with every node computing 4 times as fast (the calibration's GEMM rates times",
                 "4, as the projection below scales a node's rate with its cores); the links are the same.", ""]
        body += speedup_table(groups128, None, rates128, tps128)
    body += ["", "### Times, and what each simulation cost", "",
             "`ring / its limit`: the ring's time over max(its GEMMs alone, its transfers alone). `wall s` and",
             "`peak PSS` are the whole simulation's real time and memory on the machine that ran it",
             "(tools/smpi/measure: PSS summed over the simulation's processes every 0.5-2 s).", ""]
    body += times_table(groups, mesh, cost)
    body += rings(out, cost)
    body += layers(out, cost)
    body += ["", "### Against the cost model", "",
             f"Of {len(acc)} predictions (every candidate automatic timed, every case), {within} "
             f"({100 * within / max(1, len(acc)):.0f}%) are within {100 * WITHIN:.0f}% of the simulated time;",
             "docs/results.md lists them all (\"The cost model at scale\"). Those beyond it:", ""]
    body += misses or ["- none"]
    sections.replace(scaling_md, sections.SMPI_SCALE, "\n".join(body) + "\n", after_title=True)
    res = ["## The cost model at scale: every simulated case (make bench-smpi-scale)", "",
           "bench/smpi_scale.sh's runs (docs/scaling.md, \"Simulated\"): for each case, every schedule",
           "automatic timed, the cost model's prediction against the simulated time of the slowest rank.",
           f"{within} of {len(acc)} ({100 * within / max(1, len(acc)):.0f}%) within {100 * WITHIN:.0f}%. "
           f"Simulated on: {where}.", "",
           "| nodes | Gbit/s | ranks | dp x tp | op | schedule | predicted ms | simulated ms | error |",
           "|---|---|---|---|---|---|---|---|---|"] + acc
    sections.replace(results_md, sections.SMPI_SCALE, "\n".join(res) + "\n")
    print(f"smpi_scale_report: {len(groups)} group cases, {len(mesh)} mesh cases, {within}/{len(acc)} within 10%")


if __name__ == "__main__":
    main(*sys.argv[1:4])
