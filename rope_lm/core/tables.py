"""Markdown tables: the one way every report, comparison and benchmark in
rope-lm writes one."""


def markdown_table(header: list, rows: list[list], align: str | None = None) -> str:
    """A GitHub markdown table. Cells are written with str(); `align` has one
    letter per column, "l" (the default) or "r" (numbers)."""
    align = align or "l" * len(header)
    if len(align) != len(header) or any(len(r) != len(header) for r in rows):
        raise ValueError(
            f"a table of {len(header)} columns got an alignment of {len(align)} and rows of "
            f"{sorted({len(r) for r in rows})} cells"
        )
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(str(c) for c in line) + " |" for line in [header] + list(rows)]
    return "\n".join([lines[0], "|" + "|".join(rule) + "|"] + lines[1:])
