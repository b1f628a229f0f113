"""Build the token cache of a data preset ahead of training, and print where it is.

    python scripts/prepare_data.py data=pg19 data.path=../shared/data/pg19-sample data.num_proc=16
    python scripts/prepare_data.py data=local_files data.path=corpus/ data.tokenizer=meta-llama/Llama-2-7b-hf

train.py with the same data.* settings then finds the cache (without reading
the text again) and every rank of a multi-node run memory-maps it; see
docs/data.md. Usage: python scripts/prepare_data.py --help.
"""

import json

import hydra
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task, log_to_stderr


@hydra.main(config_path="../conf", config_name="prepare_data", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.data.split import split_data
    from rope_lm.data.token_cache import prepare

    log_to_stderr()
    data, source = split_data(OmegaConf.to_container(cfg.data, resolve=True))
    cache = prepare(data, source)
    print(
        json.dumps(
            {
                "cache": cache.dir,
                "tokens": cache.meta["tokens"],
                "vocab_size": cache.vocab_size,
                "eos_token": cache.meta.get("eos_token"),
                "corpus": cache.corpus,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
