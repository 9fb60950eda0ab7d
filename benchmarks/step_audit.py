"""The step audits, sound and deliberately broken, with each design's power: a markdown table.

    python benchmarks/step_audit.py              # 1,000 runs per table (8,000 for selection)
    python benchmarks/step_audit.py --runs 400   # what tests/unit/test_step_audit.py runs

Each design (medrelease/evidence/step_audit.py) isolates one step of ``ipa`` or DiffGen with
test-only parameters, runs the real mechanism code on two neighbouring count tables, and bounds
the step's own claim from below; the broken variant must be flagged, the sound one must not.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from medrelease.evidence.step_audit import designs, misreported, run_design

    print("| design (step) | variant | runs per table | event A / B | lower bound | claim | "
          "verdict | power: smallest violation flagged | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for design in designs(args.runs):
        for variant in ("sound", "broken"):
            started = time.perf_counter()
            result = run_design(design, variant, args.seed)
            rows = [result]
            if variant == "sound" and design.kind == "delta":
                rows.append(misreported(design, result))
            for row in rows:
                verdict = "**VIOLATION**" if row.violated else "within its claim"
                print(f"| {design.name} ({design.step}) | {row.variant} | {row.runs} | "
                      f"{row.hits_a} / {row.hits_b} | {row.bound:.4f} | {row.claim:g} "
                      f"({design.kind}) | {verdict} | {row.power} | "
                      f"{time.perf_counter() - started:.1f} |", flush=True)


if __name__ == "__main__":
    main()
