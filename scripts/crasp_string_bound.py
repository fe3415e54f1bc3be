"""An upper bound on the best per-string accuracy of a depth-1 model without positions on L_4.

probes/data/crasp_cap.py finds a threshold rule by coordinate ascent (a lower bound: the rule
exists). Every rule is dominated by a threshold rule c(#a) (see that module), and a string
a^p b^q a^r b^s is right iff c(p + r) <= q <= c(p); with u(A, v) = [c(A) >= v] that is
u(p, q) = 1 and u(p + r, q + 1) = 0. This script states that as a mixed-integer program
(maximise the weight of the strings right; u monotone in v; one variable per string, at most
each of its two conditions) and hands it to HiGHS through scipy: the solver's dual bound is an
upper bound on the optimum, its incumbent another rule that exists.

    .venv/bin/python scripts/crasp_string_bound.py --lo 32 --hi 64 --relax   # 0.5050, 14 CPU-seconds

The linear relaxation (``--relax``) gives a bound in seconds; the integer program's own bound
tightens with time (``--time-limit``, wall seconds) but on loaded cores may not get past its root.

Needs scipy (installed with sentence-transformers); not part of the package.
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_matrix

from depthprobe.probes.data.crasp_cap import l4_weights, string_cap_l4


def bound(lo: int, hi: int, time_limit: float, relax: bool = False) -> tuple[float, float]:
    """(the solver's best rule's accuracy, its upper bound on the optimum); ``relax``: solve the
    linear relaxation only (no rule; its optimum is the bound)."""
    w = l4_weights(lo, hi)
    strings = np.argwhere(w > 0)  # [m, 3]: p, q, r
    u = {(a, v): i for i, (a, v) in enumerate((a, v) for a in range(1, hi) for v in range(1, hi + 1))}
    first, n = len(u), len(u) + len(strings)
    rows = lil_matrix((len(u) + 2 * len(strings), n))
    lower, upper, i = [], [], 0
    for a in range(1, hi):  # u(a, v) >= u(a, v + 1)
        for v in range(1, hi):
            rows[i, u[(a, v)]], rows[i, u[(a, v + 1)]] = 1, -1
            lower.append(0), upper.append(np.inf)
            i += 1
    for j, (p, q, r) in enumerate(strings.tolist()):
        rows[i, first + j], rows[i, u[(p, q)]] = 1, -1  # right only if q <= c(p)
        lower.append(-np.inf), upper.append(0)
        i += 1
        if (p + r, q + 1) in u:  # right only if c(p + r) <= q
            rows[i, first + j], rows[i, u[(p + r, q + 1)]] = 1, 1
            lower.append(-np.inf), upper.append(1)
            i += 1
    cost = np.concatenate([np.zeros(first), -w[tuple(strings.T)]])
    integral = np.concatenate([np.ones(first), np.zeros(len(strings))]) * (not relax)
    res = milp(
        cost,
        constraints=LinearConstraint(rows[:i].tocsr(), lower, upper),
        integrality=integral,
        bounds=Bounds(0, 1),
        options={"time_limit": time_limit},
    )
    if relax:
        return float("nan"), -float(res.fun)
    return -float(res.fun), -float(res.mip_dual_bound)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lo", type=int, default=32)
    ap.add_argument("--hi", type=int, default=64)
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds of wall time for the solver")
    ap.add_argument("--relax", action="store_true", help="the linear relaxation only: a bound, no rule")
    args = ap.parse_args()
    found, _ = string_cap_l4(args.lo, args.hi)
    incumbent, upper = bound(args.lo, args.hi, args.time_limit, args.relax)
    print(
        f"L_4, lengths {args.lo}-{args.hi}: coordinate ascent {found:.4f}; solver's rule {incumbent:.4f}; "
        f"upper bound {upper:.4f}"
    )


if __name__ == "__main__":
    main()
