"""What a person reads after a nemesis run: the verdict per invariant and round, the fault
timeline with per-fault counts and the time the sale took to answer again after each, how busy
the cores were, and one plot — the sale's throughput and latency with the faults as bands."""

import json
import os
from collections import Counter, defaultdict

# An answer the buyer can act on: the engine served it (every 503 and no answer is not one).
DEFINITE = lambda o: o.get("status") is not None and o["status"] < 500


def recovery_times(timeline, ops):
    """Per fault: seconds from its end until a second in which 90% of the purchase-path answers
    were definite again (None: the sale had no more traffic to tell)."""
    per_sec = defaultdict(lambda: [0, 0])
    for o in ops:
        if o.get("op") in ("token", "purchase"):
            s = per_sec[int(o["t1"])]
            s[0] += 1
            s[1] += DEFINITE(o)
    out = []
    for f in timeline:
        t, back = int(f["t1"]), None
        for sec in range(t, t + 120):
            n, ok = per_sec.get(sec, (0, 0))
            if n >= 5 and ok / n >= 0.9:
                back = max(0.0, sec - f["t1"])
                break
        out.append(back)
    return out


def write(out, args, started, plan, timeline, results, ops, cpu):
    timeline = sorted(timeline, key=lambda f: f["t0"])
    rec = recovery_times(timeline, ops)
    lines = [f"seckill nemesis: seed {args.seed}, {args.minutes} minutes, {len(results)} rounds, "
             f"{args.stock} units and {args.users} buyers a round"
             + (f", PLANTED {args.planted}" if args.planted else "")
             + (", the engine's fault points armed" if args.stalls else "")]
    failed = []
    for r in results:
        lines.append(f"round {r['round']} (sale {r['activity']}):")
        for name, v, note in r["verdicts"]:
            lines.append(f"  {'ok      ' if not v else 'VIOLATED'} {name}{': ' + note if note else ''}")
            for x in v[:10]:
                lines.append(f"      {x if isinstance(x, str) else x[0]}")
                if not isinstance(x, str):
                    for op in x[1]:
                        lines.append(f"        {json.dumps(op)[:300]}")
            if v:
                failed.append(f"round {r['round']} {name}")
    counts = Counter(f["kind"] for f in timeline)
    lines.append("faults injected: " + ", ".join(f"{k}={n}" for k, n in sorted(counts.items())))
    not_injected = [f for f in timeline if f.get("failed")]
    if not_injected:
        lines.append(f"faults that could not be injected: {len(not_injected)}")
    lines.append("timeline (seconds from the start; recovery = until 90% of answers were definite again):")
    for f, back in zip(timeline, rec):
        lines.append(f"  {f['t0'] - started:8.2f} .. {f['t1'] - started:8.2f}  {f['kind']:<24} {f['target']:<22} "
                     f"recovered {'-' if back is None else f'{back:.0f} s'}  {f.get('detail', '')[:100]}")
    buys = [o for o in ops if o.get("op") == "purchase"]
    answers = Counter(str(o.get("status")) for o in buys)
    lines.append("purchase answers: " + ", ".join(f"{k}={n}" for k, n in sorted(answers.items())))
    lat = sorted(o["t1"] - o["t0"] for o in buys if o.get("status") is not None)
    if lat:
        q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
        lines.append(f"purchase latency: p50 {q(0.5) * 1000:.0f} ms, p99 {q(0.99) * 1000:.0f} ms, "
                     f"max {lat[-1] * 1000:.0f} ms")
    if cpu:
        busy = [c for _, c in cpu]
        lines.append(f"cores busy: mean {100 * sum(busy) / len(busy):.0f}%, max {100 * max(busy):.0f}%, "
                     f"seconds above 95%: {sum(1 for b in busy if b > 0.95)} of {len(busy)} "
                     "(a fault the machine caused is not a finding)")
    lines.append("verdict: " + ("ok" if not failed else "VIOLATED " + "; ".join(failed)))
    with open(os.path.join(out, "report.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(dict(seed=args.seed, plan=plan, timeline=timeline, recovery=rec,
                       rounds=[dict(r, verdicts=[(n, [x if isinstance(x, str) else x[0] for x in v], note)
                                                for n, v, note in r["verdicts"]]) for r in results]), f)
    plot(os.path.join(out, "sale.png"), started, timeline, buys, results, cpu)
    print("\n".join(lines))
    return not failed


def plot(path, started, timeline, buys, results, cpu):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({f["kind"] for f in timeline})
    fig, (ax, lx, fx) = plt.subplots(3, 1, figsize=(14, 8 + 0.2 * len(kinds)), sharex=True,
                                     gridspec_kw=dict(height_ratios=[3, 2, 0.4 + 0.3 * len(kinds)]))
    per = defaultdict(Counter)
    lat = defaultdict(list)
    for o in buys:
        sec = int(o["t1"] - started)
        st = o.get("status")
        cls = "queued (202)" if st == 202 else "refused (4xx)" if st and st < 500 else "unavailable (503/none)"
        per[cls][sec] += 1
        if st is not None:
            lat[sec].append((o["t1"] - o["t0"]) * 1000)
    end = int(max([o["t1"] for o in buys] + [f["t1"] for f in timeline] + [started]) - started) + 2
    xs = list(range(end))
    for cls, color in (("queued (202)", "tab:green"), ("refused (4xx)", "tab:blue"),
                       ("unavailable (503/none)", "tab:red")):
        ax.plot(xs, [per[cls].get(x, 0) for x in xs], label=cls, color=color, lw=1)
    q = lambda v, p: sorted(v)[min(len(v) - 1, int(p * len(v)))] if v else None
    lx.plot(xs, [q(lat[x], 0.5) for x in xs], label="p50", color="tab:gray", lw=1)
    lx.plot(xs, [q(lat[x], 0.99) for x in xs], label="p99", color="black", lw=1)
    lx.set_yscale("log")
    if cpu:
        cx = lx.twinx()
        cx.plot([t - started for t, _ in cpu], [100 * c for _, c in cpu], color="tab:orange", lw=0.6,
                alpha=0.6, label="cores busy %")
        cx.set_ylim(0, 105)
        cx.set_ylabel("cores busy %", color="tab:orange")
    # The faults as Jepsen draws them: one lane per kind, a band per fault, shaded above.
    cmap = plt.get_cmap("tab20")
    for i, k in enumerate(kinds):
        spans = [(f["t0"] - started, f["t1"] - f["t0"]) for f in timeline if f["kind"] == k]
        fx.broken_barh(spans, (i - 0.4, 0.8), color=cmap(i % 20))
        for a in (ax, lx):
            for x0, w in spans:
                a.axvspan(x0, x0 + w, color=cmap(i % 20), alpha=0.12, lw=0)
    fx.set_yticks(range(len(kinds)), kinds, fontsize=7)
    fx.set_ylim(-0.6, len(kinds) - 0.4)
    for r in results:
        for a in (ax, lx, fx):
            a.axvline(r["t0"] - started, color="gray", ls=":", lw=0.8)
    ax.set_ylabel("purchase answers / s")
    lx.set_ylabel("purchase latency (ms)")
    fx.set_xlabel("seconds (dotted: a round's sale begins)")
    ax.legend(loc="upper right", fontsize=8)
    lx.legend(loc="upper left", fontsize=8)
    ax.set_title("seckill under the nemesis: the sale's answers and latency, the faults below")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
