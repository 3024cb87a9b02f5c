"""Plain-text tables for the command line and the demo."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["format_table"]


def format_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[str] = ()
) -> list[str]:
    """Lines of a plain-text table: each column as wide as its widest cell (header
    included), two spaces apart; the columns named in ``right`` right-aligned."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
    lines = []
    for row in (header, *rows):
        cells = [
            str(c).rjust(w) if name in right else str(c).ljust(w)
            for name, c, w in zip(header, row, widths, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines
