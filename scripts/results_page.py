"""Regenerate the tables of the results pages from the committed CSVs
(rope_lm/compare/results_page.py: the block markers). Settings and examples:
python scripts/results_page.py --help (conf/results_page.yaml)."""

import sys

import hydra
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task


@hydra.main(config_path="../conf", config_name="results_page", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.compare.results_page import regenerate
    from rope_lm.core.files import atomic_write

    a = OmegaConf.to_container(cfg, resolve=True)
    stale = {}
    for page in a["pages"]:
        with open(page) as f:
            text = f.read()
        new, changed = regenerate(text, a["root"])
        if changed:
            stale[page] = changed
            if not a["check"]:
                atomic_write(page, new)
    for page, changed in stale.items():
        verb = "stale" if a["check"] else "regenerated"
        print(f"{page}: {len(changed)} block(s) {verb}: " + "; ".join(changed))
    if not stale:
        print("Every generated block is current: " + ", ".join(a["pages"]))
    if a["check"] and stale:
        sys.exit(1)


if __name__ == "__main__":
    main()
