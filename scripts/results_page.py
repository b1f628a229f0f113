"""Regenerate the tables of the results pages from the committed CSVs
(rope_lm/compare/results_page.py: the block markers). Settings and examples:
python scripts/results_page.py --help (conf/results_page.yaml)."""

import sys

import hydra

from rope_lm.cli import hydra_task


@hydra.main(config_path="../conf", config_name="results_page", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.compare.results_page import regenerate_pages

    if regenerate_pages(list(cfg.pages), cfg.root, cfg.check) and cfg.check:
        sys.exit(1)


if __name__ == "__main__":
    main()
