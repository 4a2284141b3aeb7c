"""Where a load curve bends: the knee of throughput against concurrency.

A server with S slots (cards x max-num-seqs) answers each caller at its low-load pace until every slot is
taken; from then on more callers only wait. Its throughput X(C) against concurrency C is then two straight
lines: X = a*C (each caller adds a/1 requests per second) and X = X_max (saturated). The knee is where they
meet, C* = X_max / a. It is found here by fitting those two lines to the measured points (a segmented
least-squares fit: every split of the points into a rising part and a flat part is tried, the rising part
fitted with a line through the origin, the flat part with its mean; the split with the smallest squared error
whose lines meet between its two parts wins). With S slots and no other bottleneck, C* = S.

The knee needs points on both sides: fewer than two on the flat part, or a flat part still rising at more
than `rising` of the rising line's slope, and the curve has no knee within the sweep (`concurrency` None).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Knee:
    concurrency: float | None          # C* (None: not within the sweep)
    slope: float | None = None         # a: requests/s each caller adds below the knee
    plateau: float | None = None       # X_max: requests/s at saturation
    rising: list[float] = field(default_factory=list)   # the concurrencies fitted by the rising line
    flat: list[float] = field(default_factory=list)     # ... and by the flat one
    reason: str = ""

    def as_dict(self) -> dict:
        return {"concurrency": None if self.concurrency is None else round(self.concurrency, 2),
                "slope_rps_per_caller": None if self.slope is None else round(self.slope, 4),
                "plateau_rps": None if self.plateau is None else round(self.plateau, 3),
                "rising_levels": self.rising, "flat_levels": self.flat, "reason": self.reason,
                "definition": DEFINITION}


DEFINITION = ("the concurrency where the two straight lines that best fit throughput against concurrency meet: "
              "the rising line through the origin (each caller adds its low-load rate) and the flat line of the "
              "saturated throughput (more callers only wait)")


def find_knee(points: list[tuple[float, float]], min_flat: int = 2, rising: float = 0.25) -> Knee:
    """points: (concurrency, throughput). Returns the knee of the segmented fit, or why there is none."""
    pts = sorted((float(c), float(x)) for c, x in points if c > 0)
    if len(pts) < 1 + min_flat:
        return Knee(None, reason=f"{len(pts)} levels measured: need at least {1 + min_flat}")
    best = None
    for split in range(1, len(pts) - min_flat + 1):
        up, flat = pts[:split], pts[split:]
        slope = sum(c * x for c, x in up) / sum(c * c for c, _ in up)
        plateau = sum(x for _, x in flat) / len(flat)
        if slope <= 0:
            continue
        knee = plateau / slope
        sse = sum((x - slope * c) ** 2 for c, x in up) + sum((x - plateau) ** 2 for _, x in flat)
        consistent = up[-1][0] <= knee <= flat[0][0] * 1.0001
        key = (not consistent, sse)
        if best is None or key < best[0]:
            best = (key, Knee(knee, slope, plateau, [c for c, _ in up], [c for c, _ in flat]))
    if best is None:
        return Knee(None, reason="throughput does not rise with concurrency")
    knee = best[1]
    flat = [p for p in pts if p[0] in knee.flat]
    # A "flat" part that keeps climbing is not saturated: the knee lies beyond the sweep.
    if len(flat) >= 2:
        (c0, x0), (c1, x1) = flat[0], flat[-1]
        growth = (x1 - x0) / (c1 - c0) if c1 > c0 else 0.0
        if growth > rising * knee.slope:
            return Knee(None, knee.slope, None, [c for c, _ in pts], [],
                        reason=f"throughput still rises at {c1:g} callers ({growth:.3g} req/s per caller, "
                               f"{growth / knee.slope:.0%} of the low-load rate): the knee is beyond the sweep")
    return knee


def low_load(levels: list[dict], key: str) -> float | None:
    """The metric `key` at the lowest concurrency measured (the low-load reference)."""
    rows = [lv for lv in sorted(levels, key=lambda lv: lv["concurrency"]) if lv.get(key) is not None]
    return rows[0][key] if rows else None
