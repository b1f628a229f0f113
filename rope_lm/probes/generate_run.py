"""What a model writes after a prompt (or a file's text), greedy or sampled,
under any extrapolation method: scripts/generate.py's work, a way to read a
model past its training length.

The text goes to standard output, one block per prompt: the prompt's end,
then what the model wrote and why it stopped; progress lines go to the
rope_lm logger. With out=, the generations are also written as JSON.
"""

from dataclasses import dataclass, field
import logging
import os

from rope_lm.core.errors import ConfigError

log = logging.getLogger("rope_lm")


@dataclass
class GenerateSettings:
    """conf/generate.yaml's settings, as plain values."""

    ckpt: str | None = None
    hf: str | None = None
    scaling: dict | None = None
    prompt: str | list | None = None
    file: str | None = None
    prompt_tokens: int | None = None
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    stop: str | list = field(default_factory=list)
    stop_tokens: str | int | list = "auto"
    batch_size: int = 8
    show_prompt: int = 300
    device: str = "auto"
    out: str | None = None


def _prompts(s: "GenerateSettings") -> list[str]:
    """The prompt texts: prompt= (one or a list) or file=, exactly one."""
    from rope_lm.runs.trained import read_text

    if (s.prompt is None) == (s.file is None):
        raise ConfigError(
            "Give one of prompt= (the text to continue, or a list of texts) and file= (a text file "
            "whose text is the prompt)" + (", not both." if s.prompt is not None else ".")
        )
    if s.file is not None:
        return [read_text(s.file)]
    texts = s.prompt if isinstance(s.prompt, list) else [s.prompt]
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ConfigError(f"prompt={s.prompt!r} must be text or a list of texts.")
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


def generate_from(s: GenerateSettings) -> list:
    """Open the model of s.ckpt (or s.hf), continue each prompt, print the
    continuations (and write them to s.out); returns the generations."""
    from rope_lm.core.files import write_json
    from rope_lm.infer.generate import Sampling, check_settings, end_of_text_ids, generate, stop_token_ids
    from rope_lm.runs.trained import open_model

    if bool(s.ckpt) == bool(s.hf):
        raise ConfigError(
            "Give one of ckpt= (a .ckpt file, a run directory, or hf:<model>) and hf= (a transformers "
            "model folder or hub name)" + (", not both." if s.ckpt else ".")
        )
    texts = _prompts(s)
    # What can be checked without the model is checked before it is loaded.
    check_settings(s.max_new_tokens, Sampling(s.temperature, s.top_k, s.top_p, s.seed), s.batch_size)
    if isinstance(s.show_prompt, bool) or not isinstance(s.show_prompt, int) or s.show_prompt < 0:
        raise ConfigError(f"show_prompt={s.show_prompt!r} must be a number of characters, 0 or more.")
    # Hydra's command line keeps a backslash as typed: \n and \t are read as the newline and tab they name.
    stops = [
        str(t).replace("\\n", "\n").replace("\\t", "\t")
        # stop="" is the empty stop string, refused as stop=[''] is (stop=[] means none).
        for t in (s.stop if isinstance(s.stop, list) else [] if s.stop is None else [s.stop])
    ]
    if s.out and os.path.exists(s.out):
        raise ConfigError(f"out={s.out} exists; give a new file name (generations are never written over).")
    if s.out:  # a read-only place is refused before the model is read
        from rope_lm.runs.run_folder import check_writable

        check_writable(os.path.dirname(os.path.abspath(s.out)), "out=")
    trained = open_model(f"hf:{s.hf}" if s.hf else s.ckpt, s.device, s.scaling)
    model, train_len = trained.model, trained.train_len
    tokenizer = trained.tokenizer()
    where = [f"file={s.file}" if s.file else f"prompt {i}" for i in range(len(texts))]
    prompts = [_cut(tokenizer.encode(t).ids, s.prompt_tokens, w) for t, w in zip(texts, where)]
    if s.stop_tokens == "auto":
        stop_ids = end_of_text_ids(tokenizer)
    else:
        stop_ids = stop_token_ids(tokenizer, s.stop_tokens if isinstance(s.stop_tokens, list) else [s.stop_tokens])
    method = getattr(model.scaling, "label", model.scaling.name)
    log.info(
        "%s (%s + %s, trained at %d): %s prompt(s) of %s tokens, up to %d new",
        trained.source,
        trained.scheme,
        method,
        train_len,
        len(prompts),
        ", ".join(str(len(p)) for p in prompts),
        s.max_new_tokens,
    )
    out = generate(
        model,
        prompts,
        s.max_new_tokens,
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        seed=s.seed,
        stop_tokens=stop_ids,
        stop_strings=stops,
        tokenizer=tokenizer,
        batch_size=s.batch_size,
    )
    for w, g in zip(where, out):
        n = len(g.prompt)
        why = (
            f"the stop token {tokenizer.id_to_token(g.stop)!r}"
            if g.finish == "token"
            else f"the stop string {g.stop!r}"
            if g.finish == "string"
            else f"max_new_tokens={s.max_new_tokens}"
        )
        print(f"=== {w}: {n} tokens ({n / train_len:.2g} x L={train_len}); {len(g.ids)} written, stopped by {why}")
        if s.show_prompt:
            shown = tokenizer.decode(g.prompt)
            print(("…" if len(shown) > s.show_prompt else "") + shown[-s.show_prompt :], end="")
            print(" ⟨model⟩ ", end="")
        print(g.text)
    if s.out:
        from rope_lm.core.errors import OutputError
        from rope_lm.core.files import from_here

        try:
            write_json(
                s.out,
                {
                    "checkpoint": from_here(trained.path),
                    "source": trained.source,
                    "scheme": trained.scheme,
                    "method": method,
                    "train_len": train_len,
                    "settings": {
                        k: getattr(s, k)
                        for k in ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop", "prompt_tokens")
                    },
                    "stop_tokens": stop_ids,
                    "generations": [
                        {
                            "prompt_tokens": len(g.prompt),
                            "ids": g.ids,
                            "text": g.text,
                            "finish": g.finish,
                            "stop": g.stop,
                        }
                        for g in out
                    ],
                },
            )
        except OutputError as e:  # a full disk: the generations are on standard output already
            raise e.reworded(setting="out=", kept="The generations are printed above.") from None
        print(f"Generations: {s.out}")
    return out
