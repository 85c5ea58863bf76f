"""The 'median [min-max]' text every generated table uses for a figure measured several times."""
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
