"""Print what a model writes after a prompt (or a file's text), greedy or
sampled, under any extrapolation method: a way to read a model past its
training length. Settings and examples: python scripts/generate.py --help
(conf/generate.yaml).

The text goes to standard output, one block per prompt: the prompt's end,
then what the model wrote and why it stopped; progress lines go to standard
error. With out=, the generations are also written as JSON.
"""

import logging
import os

import hydra
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task, log_to_stderr
from rope_lm.core.errors import ConfigError

log = logging.getLogger("rope_lm")


def _prompts(a: dict) -> list[str]:
    """The prompt texts: prompt= (one or a list) or file=, exactly one."""
    from rope_lm.runs.trained import read_text

    if (a["prompt"] is None) == (a["file"] is None):
        raise ConfigError(
            "Give one of prompt= (the text to continue, or a list of texts) and file= (a text file "
            "whose text is the prompt)" + (", not both." if a["prompt"] is not None else ".")
        )
    if a["file"] is not None:
        return [read_text(a["file"])]
    texts = a["prompt"] if isinstance(a["prompt"], list) else [a["prompt"]]
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ConfigError(f"prompt={a['prompt']!r} must be text or a list of texts.")
    return texts


def _cut(ids: list[int], n: int | None, where: str) -> list[int]:
    if n is None:
        return ids
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"prompt_tokens={n!r} must be a whole number of at least 1, or null (the whole prompt).")
    if len(ids) < n:
        raise ConfigError(
            f"prompt_tokens={n}: {where} has only {len(ids)} tokens with this model's tokenizer; "
            f"give a longer text or a smaller prompt_tokens."
        )
    return ids[:n]


@hydra.main(config_path="../conf", config_name="generate", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.core.files import write_json
    from rope_lm.infer.generate import Sampling, check_settings, end_of_text_ids, generate, stop_token_ids
    from rope_lm.runs.trained import open_model

    log_to_stderr()
    a = OmegaConf.to_container(cfg, resolve=True)
    if bool(a["ckpt"]) == bool(a["hf"]):
        raise ConfigError(
            "Give one of ckpt= (a .ckpt file, a run directory, or hf:<model>) and hf= (a transformers "
            "model folder or hub name)" + (", not both." if a["ckpt"] else ".")
        )
    texts = _prompts(a)
    # What can be checked without the model is checked before it is loaded.
    check_settings(a["max_new_tokens"], Sampling(a["temperature"], a["top_k"], a["top_p"], a["seed"]), a["batch_size"])
    if isinstance(a["show_prompt"], bool) or not isinstance(a["show_prompt"], int) or a["show_prompt"] < 0:
        raise ConfigError(f"show_prompt={a['show_prompt']!r} must be a number of characters, 0 or more.")
    # Hydra's command line keeps a backslash as typed: \n and \t are read as the newline and tab they name.
    stops = [
        str(t).replace("\\n", "\n").replace("\\t", "\t")
        for t in (a["stop"] if isinstance(a["stop"], list) else [a["stop"]] if a["stop"] else [])
    ]
    if a["out"] and os.path.exists(a["out"]):
        raise ConfigError(f"out={a['out']} exists; give a new file name (generations are never written over).")
    scaling = a.get("scaling")
    trained = open_model(f"hf:{a['hf']}" if a["hf"] else a["ckpt"], a["device"], scaling)
    model, train_len = trained.model, trained.train_len
    tokenizer = trained.tokenizer()
    where = [f"file={a['file']}" if a["file"] else f"prompt {i}" for i in range(len(texts))]
    prompts = [_cut(tokenizer.encode(t).ids, a["prompt_tokens"], w) for t, w in zip(texts, where)]
    if a["stop_tokens"] == "auto":
        stop_ids = end_of_text_ids(tokenizer)
    else:
        stop_ids = stop_token_ids(
            tokenizer, a["stop_tokens"] if isinstance(a["stop_tokens"], list) else [a["stop_tokens"]]
        )
    method = getattr(model.scaling, "label", model.scaling.name)
    log.info(
        "%s (%s + %s, trained at %d): %s prompt(s) of %s tokens, up to %d new",
        trained.source,
        trained.scheme,
        method,
        train_len,
        len(prompts),
        ", ".join(str(len(p)) for p in prompts),
        a["max_new_tokens"],
    )
    out = generate(
        model,
        prompts,
        a["max_new_tokens"],
        temperature=a["temperature"],
        top_k=a["top_k"],
        top_p=a["top_p"],
        seed=a["seed"],
        stop_tokens=stop_ids,
        stop_strings=stops,
        tokenizer=tokenizer,
        batch_size=a["batch_size"],
    )
    for w, g in zip(where, out):
        n = len(g.prompt)
        why = (
            f"the stop token {tokenizer.id_to_token(g.stop)!r}"
            if g.finish == "token"
            else f"the stop string {g.stop!r}"
            if g.finish == "string"
            else f"max_new_tokens={a['max_new_tokens']}"
        )
        print(f"=== {w}: {n} tokens ({n / train_len:.2g} x L={train_len}); {len(g.ids)} written, stopped by {why}")
        if a["show_prompt"]:
            shown = tokenizer.decode(g.prompt)
            print(("…" if len(shown) > a["show_prompt"] else "") + shown[-a["show_prompt"] :], end="")
            print(" ⟨model⟩ ", end="")
        print(g.text)
    if a["out"]:
        from rope_lm.core.files import from_here

        write_json(
            a["out"],
            {
                "checkpoint": from_here(trained.path),
                "source": trained.source,
                "scheme": trained.scheme,
                "method": method,
                "train_len": train_len,
                "settings": {
                    k: a[k]
                    for k in ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop", "prompt_tokens")
                },
                "stop_tokens": stop_ids,
                "generations": [
                    {"prompt_tokens": len(g.prompt), "ids": g.ids, "text": g.text, "finish": g.finish, "stop": g.stop}
                    for g in out
                ],
            },
        )
        print(f"Generations: {a['out']}")


if __name__ == "__main__":
    main()
