"""A perplexity comparison logged to wandb: one summary run (job_type
'compare') in the study's group with the comparison table, a PPL-vs-length
chart per group and the PNG plots."""

import os

from rope_lm.compare.ppl_csv import CSV_COLUMNS


def log_to_wandb(summary: dict, project: str | None = None, group: str | None = None, mode: str = "auto") -> str | None:
    """One summary run (job_type 'compare') in the study's wandb group: the
    comparison table, a PPL-vs-length chart per group and the PNG plots.
    Returns the local run directory when the run was offline (to sync later)."""
    import wandb

    from rope_lm.train.loggers import wandb_mode

    runs = summary["runs"]
    projects = {((r.results.get("config") or {}).get("logger") or {}).get("project") for r in runs} - {None}
    project = project or (projects.pop() if len(projects) == 1 else "rope-lm")
    group = group or summary["study"]
    mode = wandb_mode(mode)
    os.environ.setdefault("WANDB_SILENT", "true")
    run = wandb.init(
        project=project,
        group=group,
        job_type="compare",
        name=f"compare: {group}",
        dir=summary["out_dir"],
        mode=mode,
        reinit="finish_previous",
        tags=["compare"] + sorted({f"L{r.key.train_len}" for r in runs}),
        config={"runs": [r.dir for r in runs], "groups": [g.key.describe() for g in summary["groups"]]},
    )
    try:
        table = wandb.Table(columns=CSV_COLUMNS, data=[[row[c] for c in CSV_COLUMNS] for row in summary["rows"]])
        payload = {"compare/table": table}
        for g, plots in zip(summary["groups"], summary["files"]["plots"]):
            prefix = f"compare/{g.key.slug()}" if len(summary["groups"]) > 1 else "compare"
            series = [s for s in g.series if s.rows]
            payload[f"{prefix}/ppl_vs_length_chart"] = wandb.plot.line_series(
                xs=[sorted(s.rows) for s in series],
                ys=[[s.ppl(L) for L in sorted(s.rows)] for s in series],
                keys=[s.label for s in series],
                title=f"PPL vs evaluation length ({g.key.describe()})",
                xname="length",
            )
            payload[f"{prefix}/ppl_vs_length"] = wandb.Image(plots["ppl_vs_length"])
            payload[f"{prefix}/per_position"] = wandb.Image(plots["per_position"])
        run.log(payload)
        offline_dir = os.path.dirname(run.dir) if mode == "offline" and getattr(run, "dir", None) else None
    finally:
        run.finish()
    return offline_dir
