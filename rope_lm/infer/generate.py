"""What a model writes after a prompt: greedy decoding or sampling
(temperature, top-k, top-p, a seed), stopped by tokens, strings or
max_new_tokens, through the KV cache (rope_lm.model.kv_cache).

    out = generate(model, ["Once upon a time"], max_new_tokens=40, tokenizer=tok)
    out[0].text

Each prompt is read once (the prefill), then each step reads only the token
just written; logits are computed for the last position of each step only
(model.hidden, then lm_head on that row), never over prompt x vocabulary.

Prompts of different lengths. Positions are absolute: left-padding would
move every token of a short prompt to other positions, and a length-dependent
method (dynamic NTK, Self-Extend's group: auto, factor: auto) would read a
short prompt at its batch's longest length. So prompts are grouped by
length, and each group (in chunks of batch_size) has its own cache planned
for its prompt length + max_new_tokens: a prompt gets the tokens it would get
alone, whichever prompts share its call. Sampling draws each prompt's tokens
from its own generator (seeded by `seed` and the prompt's index), for the
same reason.

A cache planned for prompt + max_new_tokens evaluates length-dependent
method settings at that length for every step (docs/methods.md, "Decoding
with a KV cache"); for every other method the tokens equal those of the
argmax (or draw) over a full forward of each prefix.
"""

from dataclasses import dataclass
import math
import os

import numpy as np
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.model.kv_cache import KVCache, held_rows


@dataclass
class Sampling:
    """temperature 0: greedy (the argmax; top_k and top_p cannot change it).
    Otherwise logits / temperature, then the top_k largest, then the
    smallest set of most probable tokens whose probability reaches top_p."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    def validate(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ConfigError(
                f"temperature={t!r} must be a finite number of at least 0 (0: greedy decoding, the "
                f"most probable token each step; 1: the model's own distribution; above 1 flatter)."
            )
        k = self.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ConfigError(
                f"top_k={k!r} must be a whole number of at least 1 (the most probable tokens kept "
                f"for sampling), or null for all."
            )
        p = self.top_p
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1):
            raise ConfigError(
                f"top_p={p!r} must be a probability in (0, 1] (sampling keeps the most probable "
                f"tokens until their probability reaches it), or null for all."
            )
        s = self.seed
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ConfigError(f"seed={s!r} must be a whole number of at least 0.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Generation:
    prompt: list[int]  # the prompt's token ids
    ids: list[int]  # the tokens written, a stop token included
    finish: str  # "token" (a stop token), "string" (a stop string), "length" (max_new_tokens)
    stop: int | str | None = None  # the stop token id or stop string that ended it
    text: str | None = None  # with a tokenizer: what the tokens read as, without the stop token or string


def allowed_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """(B, V) logits -> (B, V) sampling probabilities, zero outside the
    tokens temperature, top_k and top_p allow (sampling.temperature > 0)."""
    logits = logits.float() / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sampling.top_p is not None and sampling.top_p < 1:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        # A token stays while the tokens more probable than it hold less than top_p: the first always does.
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before >= sampling.top_p)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def _pick(logits: torch.Tensor, sampling: Sampling, generators: list | None) -> list[int]:
    if sampling.greedy:
        return logits.argmax(-1).tolist()
    probs = allowed_probs(logits, sampling)
    return [int(torch.multinomial(probs[b], 1, generator=g)) for b, g in enumerate(generators)]


def stop_token_ids(tokenizer, names) -> list[int]:
    """Stop tokens given as token strings ('<|endoftext|>') or ids, as ids;
    an unknown token name is refused with the tokenizer's special tokens."""
    ids = []
    for name in names or []:
        if isinstance(name, int) and not isinstance(name, bool):
            ids.append(name)
            continue
        found = tokenizer.token_to_id(name) if tokenizer is not None and isinstance(name, str) else None
        if found is None:
            specials = [t.content for _, t in sorted(tokenizer.get_added_tokens_decoder().items())] if tokenizer else []
            raise ConfigError(
                f"stop token {name!r} is not a token of the model's tokenizer (its special tokens: "
                f"{', '.join(map(repr, specials[:12])) or 'none'}). Give a token of its vocabulary or "
                f"a token id; to stop at a piece of text, use a stop string instead."
            )
        ids.append(found)
    return ids


def end_of_text_ids(tokenizer) -> list[int]:
    """The tokenizer's end-of-document token (the one the token cache
    separates documents with), as a one-element list; [] when it has none."""
    from rope_lm.data.token_cache import EOS_CANDIDATES

    specials = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    return [tokenizer.token_to_id(c) for c in EOS_CANDIDATES if c in specials][:1]


def _prompt_ids(prompts, tokenizer, vocab_size: int) -> list[list[int]]:
    if isinstance(prompts, str):
        prompts = [prompts]
    elif isinstance(prompts, torch.Tensor) and prompts.dim() == 2:  # (B, T) ids, as a forward takes them
        prompts = prompts.tolist()
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ConfigError(f"generate needs a list of prompts (each text or a list of token ids); got {prompts!r}.")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if tokenizer is None:
                raise ConfigError(
                    f"Prompt {i} is text, and no tokenizer was given to encode it; pass the model's "
                    f"tokenizer (tokenizer=) or the prompt's token ids."
                )
            ids = tokenizer.encode(p).ids
        elif isinstance(p, torch.Tensor) and p.dim() == 1:
            ids = p.tolist()
        elif isinstance(p, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            ids = list(p)
        else:
            raise ConfigError(f"Prompt {i} must be text or a list of token ids; got {type(p).__name__} {p!r:.80}.")
        if not ids:
            raise ConfigError(
                f"Prompt {i} is empty{' (its text encodes to no tokens)' if isinstance(p, str) else ''}: "
                f"the first token written needs at least one token to follow. Give a prompt with some "
                f"text, or start it with the tokenizer's end-of-document token to write from nothing."
            )
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ConfigError(
                f"Prompt {i} holds token id(s) {bad[:5]} outside the model's vocabulary of "
                f"{vocab_size}; encode it with the model's own tokenizer."
            )
        out.append(ids)
    return out


def check_settings(max_new_tokens, sampling: Sampling, batch_size: int = 1) -> None:
    """The settings that need no model (an entry point checks them before loading one)."""
    sampling.validate()
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens!r} must be a whole number of at least 1.")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r} must be a whole number of at least 1 (prompts read at once).")


def free_memory_bytes(device: torch.device) -> int | None:
    """What the device can still give: free GPU memory, or the machine's available memory for the CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_cache_fits(model, batch: int, prompt_len: int, max_new_tokens: int) -> None:
    """Refuse, before any work, a plan whose keys and values alone would not fit the device: the
    cache grows as tokens are written, so such a run would die part way, with its tokens lost."""
    cfg = model.cfg
    if not hasattr(cfg, "n_layer"):  # a model that keeps no keys and values (a test's scripted stand-in)
        return
    param = next(model.parameters())
    total = prompt_len + max_new_tokens
    rows = held_rows(model, prompt_len, total)  # sliding-window layers hold about two windows, not every token
    need = 2 * batch * cfg.kv_heads * rows * cfg.head_size * param.element_size()
    free = free_memory_bytes(param.device)
    if free is not None and need > free:
        held = (
            f"{cfg.n_layer} layers"
            if rows == cfg.n_layer * total
            else f"{rows:,} token rows over {cfg.n_layer} layers, the sliding-window ones holding about two windows"
        )
        raise ConfigError(
            f"max_new_tokens={max_new_tokens} with a prompt of {prompt_len} tokens plans a KV cache of "
            f"{total} tokens: its keys and values alone need {need / 2**30:.1f} GiB "
            f"({held} x {batch} sequences x {cfg.kv_heads} key/value heads x {cfg.head_size} "
            f"dimensions), more than the {free / 2**30:.1f} GiB the {param.device.type} has free. Lower "
            f"max_new_tokens (or batch_size)."
        )


def _check(model, prompts, max_new_tokens, sampling, stop_tokens, stop_strings, tokenizer, batch_size):
    """Every input checked, lengths included, before the first forward."""
    check_settings(max_new_tokens, sampling, batch_size)
    vocab = model.cfg.vocab_size
    ids = _prompt_ids(prompts, tokenizer, vocab)
    bad = [t for t in stop_tokens if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab]
    if bad:
        raise ConfigError(f"stop token id(s) {bad} are not tokens of the model's vocabulary (ids 0 to {vocab - 1}).")
    if stop_strings:
        if tokenizer is None:
            raise ConfigError(
                f"Stop strings {list(stop_strings)!r} need the model's tokenizer (tokenizer=) to read "
                f"the written tokens as text; without one, stop at token ids (stop_tokens=)."
            )
        empty = [s for s in stop_strings if not isinstance(s, str) or not s]
        if empty:
            raise ConfigError(
                f"Stop strings must be non-empty text; got {empty!r} (an empty string would stop before the "
                f"first token). For no stop strings give none (the command line: stop=[])."
            )
    for length in sorted({len(p) for p in ids}):
        check_cache_fits(model, min(batch_size, sum(len(p) == length for p in ids)), length, max_new_tokens)
        try:
            model.validate_length(length + max_new_tokens)
        except ConfigError as e:
            raise ConfigError(
                f"A prompt of {length} tokens plus max_new_tokens={max_new_tokens} is "
                f"{length + max_new_tokens} tokens, more than this model serves: {e} Shorten the prompt "
                f"or max_new_tokens, or choose a method that serves that length (scaling=)."
            ) from None
    return ids


def _seed(seed: int, index: int) -> int:
    # One stream per prompt, independent of which prompts share its batch.
    return int(np.random.SeedSequence([seed, index]).generate_state(1, np.uint64)[0] >> 1)


@torch.no_grad()
def generate(
    model,
    prompts,
    max_new_tokens: int = 64,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    stop_tokens=(),
    stop_strings=(),
    tokenizer=None,
    batch_size: int = 8,
) -> list[Generation]:
    """One Generation per prompt (text, needing `tokenizer`, or token ids),
    in the order given. See the module docstring for how batches, positions
    and the cache's planned length work; Sampling for the settings."""
    sampling = Sampling(temperature, top_k, top_p, seed)
    stop_tokens, stop_strings = list(stop_tokens or []), list(stop_strings or [])
    ids = _check(model, prompts, max_new_tokens, sampling, stop_tokens, stop_strings, tokenizer, batch_size)
    device = next(model.parameters()).device
    by_length = {}
    for i, p in enumerate(ids):
        by_length.setdefault(len(p), []).append(i)
    out = [None] * len(ids)
    was_training = model.training
    model.eval()
    try:
        for group in by_length.values():
            for s in range(0, len(group), batch_size):
                chunk = group[s : s + batch_size]
                generators = None
                if not sampling.greedy:
                    generators = [torch.Generator(device=device).manual_seed(_seed(seed, i)) for i in chunk]
                for i, g in zip(
                    chunk,
                    _decode(
                        model,
                        [ids[i] for i in chunk],
                        max_new_tokens,
                        sampling,
                        generators,
                        set(stop_tokens),
                        stop_strings,
                        tokenizer,
                        device,
                    ),
                ):
                    out[i] = g
    finally:
        model.train(was_training)
    return out


def _decode(model, rows, max_new_tokens, sampling, generators, stop_tokens, stop_strings, tokenizer, device):
    """Prompts of one length: prefill, then one token a step until every row
    has stopped or written max_new_tokens."""
    cache = KVCache(planned_len=len(rows[0]) + max_new_tokens)
    written = [[] for _ in rows]
    finished: list[tuple | None] = [None] * len(rows)
    hidden = model.hidden(torch.tensor(rows, device=device), cache=cache)[:, -1]
    for step in range(max_new_tokens):
        picks = _pick(model.lm_head(hidden).float(), sampling, generators)
        for b, token in enumerate(picks):
            if finished[b] is not None:
                continue
            written[b].append(token)
            if token in stop_tokens:
                finished[b] = ("token", token, None)
            elif stop_strings:
                text = tokenizer.decode(written[b])
                hits = [(text.find(s), s) for s in stop_strings if s in text]
                if hits:
                    at, s = min(hits)
                    finished[b] = ("string", s, text[:at])
        if all(f is not None for f in finished) or step == max_new_tokens - 1:
            break
        hidden = model.hidden(torch.tensor(picks, device=device)[:, None], cache=cache)[:, -1]
    out = []
    for prompt, toks, done in zip(rows, written, finished):
        finish, stop, text = done or ("length", None, None)
        if tokenizer is not None and text is None:
            text = tokenizer.decode(toks[:-1] if finish == "token" else toks)
        out.append(Generation(prompt=list(prompt), ids=toks, finish=finish, stop=stop, text=text))
    return out
