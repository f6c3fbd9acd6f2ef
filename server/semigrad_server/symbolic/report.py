"""A cross-check report as readable text (the same text the RPC returns and the CLI prints)."""

from __future__ import annotations

MAX_BLOCK_LINES = 6  # failing blocks listed per comparison
MAX_NODE_LINES = 30


def format_report(r) -> str:
    verdict = "PASSED" if r.passed else "FAILED"
    lines = [f"cross-check of graph {r.graph_id}: {verdict}",
             f"  semiring {r.semiring}; an element passes when |a - b| <= atol + rtol*|b| "
             f"(atol {r.atol:g}, rtol {r.rtol:g}; b: the reference)", "", "methods:"]
    width = max(len(m.method) for m in r.methods)
    for m in r.methods:
        state = f"ran in {m.seconds:.3f} s" if m.ran else "did not run"
        lines.append(f"  {m.method.ljust(width)}  {state}: {m.detail}")
    lines += ["", "comparisons (method vs reference):"]
    width = max((len(f"{c.method} vs {c.reference}") for c in r.comparisons), default=0)
    for c in r.comparisons:
        pair = f"{c.method} vs {c.reference}".ljust(width)
        lines.append(f"  {pair}  {'PASS' if c.passed else 'FAIL'}  max abs error {c.max_abs_error:.3g}, "
                     f"max rel error {c.max_rel_error:.3g}")
        failing = [b for b in c.blocks if not b.passed]
        for b in failing[:MAX_BLOCK_LINES]:
            lines.append(f"      d {b.output} / d {b.input}: worst at {list(b.worst)}: {b.worst_value:.10g} vs "
                         f"{b.worst_reference:.10g} (abs error {b.max_abs_error:.3g})")
        if len(failing) > MAX_BLOCK_LINES:
            lines.append(f"      ... and {len(failing) - MAX_BLOCK_LINES} more failing blocks")
    if r.localized:
        lines += ["", "localisation: each node's local rule against finite differences of that node alone:"]
        shown = [c for c in r.node_checks if not c.passed or not c.checked] or r.node_checks
        for c in shown[:MAX_NODE_LINES]:
            state = "SKIP" if not c.checked else ("PASS" if c.passed else "FAIL")
            line = f"  {state}  node '{c.node}' ({c.op}), operand {c.position} '{c.operand}' from '{c.source}'"
            if c.checked:
                line += f": max abs error {c.max_abs_error:.3g}"
            if c.rule:
                line += f"; rule d/d{c.operand} = {c.rule}"
            lines.append(line)
            if c.detail:
                lines.append(f"        {c.detail}")
        if len(shown) > MAX_NODE_LINES:
            lines.append(f"  ... and {len(shown) - MAX_NODE_LINES} more")
        passed = sum(c.checked and c.passed for c in r.node_checks)
        lines.append(f"  {passed} of {len(r.node_checks)} node rules agree with finite differences")
        if r.suspects:
            lines.append(f"suspects: {', '.join(repr(s) for s in r.suspects)} — the local derivative rule "
                         f"disagrees with finite differences there")
        elif not r.passed:
            lines.append("no single node's rule disagrees: look at how the rules combine, or at non-differentiable "
                         "points (kinks, ties) that finite differences straddle")
    return "\n".join(lines)
