"""Published findings vs ours: each claim of conf/published.yaml checked
against the studies' results by its rule (rope_lm/compare/published_rules.py;
the table written by rope_lm/compare/published.py). Settings and examples:
python scripts/check_published.py --help (conf/check_published.yaml)."""

import hydra
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task


@hydra.main(config_path="../conf", config_name="check_published", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.compare.published import check_and_write

    a = OmegaConf.to_container(cfg, resolve=True)
    check_and_write(a["claims"], a["studies"], a["out"])


if __name__ == "__main__":
    main()
