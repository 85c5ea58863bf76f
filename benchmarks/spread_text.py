"""The texts every generated table uses for a figure measured several times: 'median [min-max]'
over rounds, 'mean ± std' over seeds."""
import math
import statistics


def spread(values, digits=2):
    """'median [min-max]' of a list of numbers (None ignored), the one value when all are equal
    at that precision, '-' when there is none."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    middle, low, high = statistics.median(values), min(values), max(values)
    text = f"{middle:.{digits}f}"
    if f"{low:.{digits}f}" != f"{high:.{digits}f}":
        text += f" [{low:.{digits}f}–{high:.{digits}f}]"
    return text


def mean_std(values, digits):
    """"mean ± std" of the finite values; a run that ended at NaN or ±Inf (a diverged loss) is
    said, not averaged in."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return f"non-finite in all {len(values)} runs"
    mean = statistics.fmean(finite)
    std = statistics.stdev(finite) if len(finite) > 1 else 0.0
    text = f"{mean:.{digits}f} ± {std:.{digits}f}"
    if len(finite) < len(values):
        text += f" ({len(values) - len(finite)} of {len(values)} runs non-finite, not counted)"
    return text
