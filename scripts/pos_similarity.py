"""Cosine similarity between the position vectors of an absolute encoding, as
a heatmap: a checkpoint's learned table (or its sinusoidal encoding), or the
sinusoidal formula on its own. Settings and examples:
python scripts/pos_similarity.py --help (conf/pos_similarity.yaml).

With ckpt=, the vectors are what the scheme's embed hook adds at each
position (a learned table's rows; past the training length they were never
trained), next to the sinusoidal formula at the model's width. Writes
pos_similarity.png and .json to out= (default: a new
outputs/diagnostics/pos_similarity, or <run dir>/diagnostics/pos_similarity).
"""

import hydra

from rope_lm.cli import hydra_task, script_settings


@hydra.main(config_path="../conf", config_name="pos_similarity", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.probes.diagnostic_runs import PosSimilaritySettings, pos_similarity

    pos_similarity(script_settings(cfg, PosSimilaritySettings))


if __name__ == "__main__":
    main()
