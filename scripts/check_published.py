"""Published findings vs ours: each claim of conf/published.yaml checked
against the studies' results by its rule (rope_lm/compare/published.py).
Settings and examples: python scripts/check_published.py --help
(conf/check_published.yaml)."""

import os

import hydra
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task


@hydra.main(config_path="../conf", config_name="check_published", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.compare.published import check_claims, markdown, to_json
    from rope_lm.core.files import atomic_write

    a = OmegaConf.to_container(cfg, resolve=True)
    rows = check_claims(a["claims"], a["studies"])
    md = markdown(rows)
    if a["out"]:
        os.makedirs(a["out"], exist_ok=True)
        atomic_write(os.path.join(a["out"], "check_published.md"), md)
        atomic_write(os.path.join(a["out"], "check_published.json"), to_json(rows))
        print(f"Written: {a['out']}/check_published.md, check_published.json\n")
    print(md, end="")  # last: its final line is the count per claim, "claims matched: K of N"


if __name__ == "__main__":
    main()
