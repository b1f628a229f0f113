"""rope-lm as a model of lm-evaluation-harness (lm-eval 0.4.x): any lm-eval
task on any checkpoint or imported model, under any extrapolation method.

    python scripts/lm_eval_harness.py --model rope-lm --tasks <task> \\
        --model_args ckpt=<run folder or hf:...>,scaling=yarn,scaling.factor=4,max_length=512

Importing this module registers the model as "rope-lm" (lm-eval finds no
model outside its own package by itself; scripts/lm_eval_harness.py imports this and
runs lm-eval's command line). From Python: RopeLM(ckpt=..., scaling={"name":
"yarn", "factor": 4}) is an lm-eval LM to hand to lm_eval.simple_evaluate.

Every request is read as a document of rope-lm's token cache: its text
encoded without special tokens, after one prefix token (the BOS the
tokenizer adds, else the end-of-document token that precedes every document
in the cache), which is also what an empty context reads.

max_length (default: the checkpoint's training length L) is the longest
sequence one forward reads:
* loglikelihood_rolling cuts a text as rope-lm's stream protocol cuts the
  evaluation split (rope_lm/eval/evaluation.py): non-overlapping windows of
  max_length inputs, each read fresh, the last one shorter, so its total
  equals rope-lm's own stream NLL on that text. (lm-eval's own models give
  the last window a full window of context instead; here a token at window
  position p is always read at position p, as the PPL-by-position curves
  measure it.)
* loglikelihood and generate_until keep the last max_length tokens of a
  longer context (generate_until: max_length minus max_gen_toks), as
  lm-eval's own models do, and say how many they cut.
A max_length the method cannot serve is refused when the model is opened.

Positions are absolute and some methods depend on the sequence length
(dynamic NTK, YaRN with factor auto), so a batch never pads: requests of
one input length are read together, batch_size at a time.
"""

import json
import logging

import torch

from rope_lm.core.errors import ConfigError
from rope_lm.data.special_tokens import encode_piece

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError:  # pragma: no cover - the optional extra
    raise ConfigError(
        "lm-eval is not installed; install rope-lm's lm-eval extra (pip install -e '.[lm-eval]')."
    ) from None

log = logging.getLogger("rope_lm")

OWN = object()  # scaling not given: the method the checkpoint was trained with
ARGS = ("ckpt", "scaling", "scaling.<key>", "max_length", "batch_size", "device", "seed")
GEN_KWARGS = ("until", "max_gen_toks", "max_new_tokens", "do_sample", "temperature", "top_k", "top_p")


@register_model("rope-lm")
class RopeLM(LM):
    # (method name, {key: value}) -> the method's options. scripts/lm_eval_harness.py sets it to compose
    # `scaling=<name> scaling.<key>=v` from the scaling config group, as the other scripts do;
    # the library reads no config files, so without it a method is given as a dict.
    compose_scaling = None

    def __init__(
        self,
        ckpt: str | None = None,
        scaling=OWN,
        max_length: int | None = None,
        batch_size=8,
        device: str | None = None,
        seed: int = 0,
        max_batch_size=None,
        **settings,
    ):
        # max_batch_size: lm-eval passes it for batch_size=auto, which this model does not offer.
        super().__init__()
        from rope_lm.core.typed import typed_component
        from rope_lm.infer.generate import end_of_text_ids
        from rope_lm.runs.trained import open_model
        from rope_lm.scaling import METHODS

        options = self._scaling(scaling, settings)
        if options is not None:
            options = typed_component(METHODS, options, "scaling")
        self.batch_size = _whole(batch_size, "batch_size", "sequences read in one forward (--batch_size 16)")
        self.seed = _whole(seed, "seed", "the sampling seed", least=0)
        # lm-eval's command line asks for cuda:0 when --device is not given; its own models then take the CPU.
        no_cuda = device is not None and str(device).startswith("cuda") and not torch.cuda.is_available()
        self.trained = open_model(ckpt, "cpu" if no_cuda else device or "auto", options)
        self.scaling = options or self.trained.hparams.get("scaling")
        if no_cuda:
            log.warning("device=%s: this machine has no CUDA device; the model runs on the CPU", device)
        self.model = self.trained.model
        self._device = next(self.model.parameters()).device
        self.tokenizer = self.trained.tokenizer()
        self.train_len = self.trained.train_len
        self.max_length = (
            self.train_len
            if max_length is None
            else _whole(
                max_length, "max_length", "the longest sequence one forward reads (default: the training length)"
            )
        )
        try:
            self.model.validate_length(self.max_length)
        except ConfigError as e:
            raise ConfigError(
                f"max_length={self.max_length} is more than {self.method} serves on this model: {e} "
                f"Give a smaller max_length= (the training length is {self.train_len}), or a method "
                f"that serves it (scaling=)."
            ) from None
        self.stop_ids = end_of_text_ids(self.tokenizer)
        self.prefix_id = self._prefix_token()
        log.info(
            "lm-eval model: %s (%s + %s, trained at %d), windows of max_length=%d, batch_size=%d",
            self.trained.source,
            self.model.pos_scheme.name,
            self.method,
            self.train_len,
            self.max_length,
            self.batch_size,
        )

    # --- settings -----------------------------------------------------------------

    def _scaling(self, scaling, settings: dict) -> dict | None:
        dotted = {k[len("scaling.") :]: v for k, v in settings.items() if k.startswith("scaling.")}
        unknown = sorted(k for k in settings if not k.startswith("scaling."))
        if unknown:
            raise ConfigError(
                f"Unknown model_args {', '.join(unknown)} of the rope-lm model; it takes "
                f"{', '.join(ARGS)} (batch_size and device also as --batch_size, --device)."
            )
        if scaling is OWN:
            if dotted:
                raise ConfigError(
                    f"scaling.{next(iter(dotted))}= sets a method's setting, but no method is chosen; "
                    f"give scaling=<method> too (e.g. scaling=yarn,scaling.factor=4)."
                )
            return None
        if isinstance(scaling, dict):
            return {**scaling, **dotted}
        # lm-eval reads the value `none` as None: here it names the method none (positions as they are).
        name = "none" if scaling is None else str(scaling)
        if type(self).compose_scaling is None:
            raise ConfigError(
                f"scaling={name!r} names a method of rope-lm's scaling config group, which "
                f"python scripts/lm_eval_harness.py reads; from Python, give the method's options as "
                f"a dict, e.g. scaling={{'name': 'yarn', 'factor': 4}}."
            )
        return type(self).compose_scaling(name, dotted)

    @property
    def method(self) -> str:
        return getattr(self.model.scaling, "label", self.model.scaling.name)

    def _prefix_token(self) -> int | None:
        """The BOS the tokenizer puts before a text, else its end-of-document token."""
        plain = self.tokenizer.encode("a", add_special_tokens=False).ids
        full = self.tokenizer.encode("a", add_special_tokens=True).ids
        if len(full) > len(plain) and full[len(full) - len(plain) :] == plain:
            return full[0]
        return self.stop_ids[0] if self.stop_ids else None

    def _prefix(self) -> list[int]:
        if self.prefix_id is None:
            raise ConfigError(
                f"The tokenizer of {self.trained.source} adds no BOS and has no end-of-document "
                f"token, so the first token of a text has nothing to be read after; use a model "
                f"whose tokenizer has one (rope-lm's token cache needs one too)."
            )
        return [self.prefix_id]

    def _encode(self, text: str) -> list[int]:
        return encode_piece(self.tokenizer, text) if text else []

    def get_model_info(self) -> dict:
        """What lm-eval records in its results' config."""
        return {
            "rope_lm": {
                "checkpoint": self.trained.path,
                "step": self.trained.step,  # the training step of the weights read (None for an imported model)
                "scheme": self.model.pos_scheme.name,
                "method": self.method,
                "scaling": self.scaling,
                "train_len": self.train_len,
                "max_length": self.max_length,
            }
        }

    @property
    def tokenizer_name(self) -> str:
        return self.trained.path

    # --- loglikelihood ------------------------------------------------------------

    def _split(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(prefix + context ids, continuation ids). The continuation's ids are
        those of the text read whole where the context's ids begin it (a
        trailing space of the context belongs to the next word's token)."""
        cut = len(context) - len(context.rstrip())
        if cut:
            context, continuation = context[:-cut], context[-cut:] + continuation
        ctx = self._encode(context)
        whole = self._encode(context + continuation)
        cont = whole[len(ctx) :] if whole[: len(ctx)] == ctx else self._encode(continuation)
        return self._prefix() + ctx, cont

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [self._split(*r.args) for r in requests]
        out = self._score(pairs, disable_tqdm)
        for r, res in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood", r.args, res)
        return out

    @torch.no_grad()
    def _score(self, pairs, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """(sum of log p(continuation token), every one the argmax) per pair."""
        from tqdm.auto import tqdm

        from rope_lm.eval.evaluation import autocast_for

        rows, cut = [], 0
        for i, (ctx, cont) in enumerate(pairs):
            if len(cont) > self.max_length:
                raise ConfigError(
                    f"A continuation of {len(cont)} tokens is longer than max_length="
                    f"{self.max_length}, the longest sequence one forward reads; give a larger "
                    f"max_length= (and a method that serves it, scaling=)."
                )
            tokens = (ctx + cont)[:-1]
            cut += len(tokens) > self.max_length
            rows.append((tokens[-self.max_length :], cont))
        if cut:
            self._warn_cut(cut, len(pairs), self.max_length)
        out: list = [None] * len(pairs)
        bar = tqdm(total=len(pairs), desc="rope-lm loglikelihood", disable=disable_tqdm)
        for batch in self._batches(rows, lambda row: len(row[0])):
            x = torch.tensor([rows[i][0] for i in batch], device=self._device)
            with autocast_for(self._device):
                hidden = self.model.hidden(x)
                for b, i in enumerate(batch):
                    cont = torch.tensor(rows[i][1], device=self._device)
                    if not len(cont):
                        out[i] = (0.0, True)
                        continue
                    # Logits of the continuation's positions only, never context x vocabulary.
                    logits = self.model.lm_head(hidden[b, -len(cont) :]).float()
                    logp = torch.log_softmax(logits, dim=-1).gather(1, cont[:, None])
                    out[i] = (float(logp.double().sum()), bool((logits.argmax(-1) == cont).all()))
            bar.update(len(batch))
        bar.close()
        return out

    def _batches(self, rows, length):
        """Indices of rows, batch_size at a time among rows of one length, longest first."""
        by_length = {}
        for i, row in enumerate(rows):
            by_length.setdefault(length(row), []).append(i)
        for n in sorted(by_length, reverse=True):
            group = by_length[n]
            for s in range(0, len(group), self.batch_size):
                yield group[s : s + self.batch_size]

    def _warn_cut(self, cut: int, total: int, room: int):
        log.warning(
            "%d of %d contexts are longer than the %d tokens max_length=%d leaves them and lost their first "
            "tokens (lm-eval's convention); give a larger max_length= (with a method that serves it, "
            "scaling=) to read them whole",
            cut,
            total,
            room,
            self.max_length,
        )

    # --- loglikelihood_rolling ----------------------------------------------------

    @torch.no_grad()
    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from tqdm.auto import tqdm

        from rope_lm.eval.evaluation import token_losses

        W = self.max_length
        windows = []  # (request, first input index into its stream, width)
        streams = []
        for r, req in enumerate(requests):
            ids = self._encode(req.args[0])
            streams.append(torch.tensor(self._prefix() + ids, dtype=torch.long))
            windows += [(r, s, min(W, len(ids) - s)) for s in range(0, len(ids), W)]
        totals = [0.0] * len(requests)
        # closed on a stop too, so that its line comes before the stop's message, not after it
        with tqdm(total=len(windows), desc="rope-lm loglikelihood_rolling", unit="window", disable=disable_tqdm) as bar:
            for batch in self._batches(windows, lambda w: w[2]):
                width = windows[batch[0]][2]
                x = torch.stack([streams[r][s : s + width] for r, s, _ in (windows[i] for i in batch)])
                y = torch.stack([streams[r][s + 1 : s + width + 1] for r, s, _ in (windows[i] for i in batch)])
                losses = token_losses(self.model, x, y, len(batch) * width).double().sum(1)
                for i, loss in zip(batch, losses.tolist()):
                    totals[windows[i][0]] -= loss
                bar.update(len(batch))
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # --- generate_until -----------------------------------------------------------

    def _gen_settings(self, kwargs: dict) -> dict:
        kwargs = dict(kwargs or {})
        unknown = sorted(set(kwargs) - set(GEN_KWARGS))
        if unknown:
            raise ConfigError(
                f"Generation setting(s) {', '.join(unknown)} are not read by the rope-lm model (it "
                f"decodes through rope_lm.infer.generate); it takes {', '.join(GEN_KWARGS)}."
            )
        until = kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        max_new = kwargs.get("max_gen_toks", kwargs.get("max_new_tokens", 256))
        max_new = _whole(max_new, "max_gen_toks", "tokens written at most")
        if max_new >= self.max_length:
            raise ConfigError(
                f"max_gen_toks={max_new} leaves no room for a context within max_length="
                f"{self.max_length}; give a larger max_length= or a smaller max_gen_toks."
            )
        # As transformers' generate: greedy unless do_sample, whatever the temperature.
        temperature = kwargs.get("temperature")
        temperature = (1.0 if temperature is None else temperature) if kwargs.get("do_sample") else 0.0
        return {
            "until": [s for s in until if s],
            "max_new_tokens": max_new,
            "temperature": temperature,
            "top_k": kwargs.get("top_k"),
            "top_p": kwargs.get("top_p"),
        }

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from tqdm.auto import tqdm

        from rope_lm.infer.generate import generate

        groups = {}
        for i, req in enumerate(requests):
            context, kwargs = req.args
            groups.setdefault(json.dumps(kwargs or {}, sort_keys=True, default=str), []).append(i)
        out: list = [None] * len(requests)
        bar = tqdm(total=len(requests), desc="rope-lm generate_until", disable=disable_tqdm)
        for members in groups.values():
            g = self._gen_settings(requests[members[0]].args[1])
            room = self.max_length - g["max_new_tokens"]
            prompts = {i: self._prefix() + self._encode(requests[i].args[0]) for i in members}
            cut = sum(len(p) > room for p in prompts.values())
            if cut:
                self._warn_cut(cut, len(members), room)
            prompts = {i: p[-room:] for i, p in prompts.items()}
            # Sorted by length, so that a chunk holds prompts generate can read together.
            order = sorted(members, key=lambda i: len(prompts[i]))
            for s in range(0, len(order), self.batch_size):
                chunk = order[s : s + self.batch_size]
                written = generate(
                    self.model,
                    [prompts[i] for i in chunk],
                    g["max_new_tokens"],
                    temperature=g["temperature"],
                    top_k=g["top_k"],
                    top_p=g["top_p"],
                    seed=self.seed,
                    stop_tokens=self.stop_ids,
                    stop_strings=g["until"],
                    tokenizer=self.tokenizer,
                    batch_size=self.batch_size,
                )
                for i, w in zip(chunk, written):
                    out[i] = w.text
                    self.cache_hook.add_partial("generate_until", requests[i].args, w.text)
                bar.update(len(chunk))
        bar.close()
        return out


def _whole(value, setting: str, what: str, least: int = 1) -> int:
    """A whole number of at least `least`; lm-eval may hand numbers over as text."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{setting}={value!r} must be a whole number of at least {least}: {what}.")
    return value


# --- a stop -----------------------------------------------------------------------


def _option(argv: list[str], *names: str, bare: str | None = None) -> str | None:
    """The value of an lm-eval command-line option (`--name value` or `--name=value`); `bare`: the
    value of a flag given without one (nargs="?"); None where it is not given."""
    found = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name:
                following = argv[i + 1] if i + 1 < len(argv) else None
                found = following if following is not None and not following.startswith("-") else bare
            elif arg.startswith(name + "="):
                found = arg[len(name) + 1 :]
    return found


def lm_eval_stopped(argv: list[str], error: KeyboardInterrupt):
    """scripts/lm_eval_harness.py stopped by SIGTERM or Ctrl-C: lm-eval runs its own loop and writes
    its results (--output_path) only once every task is scored, so what is kept is only what its
    caches hold; the message names them and the command to run again."""
    import os
    import shlex

    from rope_lm.core.errors import Interrupted
    from rope_lm.core.stops import signal_status

    command = "python scripts/lm_eval_harness.py " + shlex.join(argv)
    use_cache = _option(argv, "--use_cache", "-c")
    requests = _option(argv, "--cache_requests", bare="true")
    kept = []
    if use_cache:
        db = f"{use_cache}_rank{os.environ.get('LOCAL_RANK', '0')}.db"
        kept.append(
            f"the model's answers recorded before the stop are kept in lm-eval's response cache {db} (--use_cache: "
            f"rope-lm's model records its loglikelihood and loglikelihood_rolling answers once all of that kind "
            f"are scored, its generate_until answers batch by batch), which the same command reads again, "
            f"scoring only the rest"
        )
    if requests in ("true", "refresh"):
        from lm_eval.caching.cache import PATH

        kept.append(
            f"the prompts lm-eval built are kept in its request cache {PATH} (--cache_requests), the model's "
            f"answers not"
        )
    if kept:
        said = "; ".join(kept)
        message = (
            f"Stopped by a signal: lm-eval runs its own loop and writes its results only once every task is scored, "
            f"so none were written; {said}. Run the same command again: {command}"
        )
    else:
        message = (
            f"Stopped by a signal: lm-eval runs its own loop and keeps no partial results (its results, and "
            f"--output_path's files, are written only once every task is scored), so nothing of this evaluation "
            f"was kept. Run the same command again: {command} (with --use_cache <path>, a run stopped part-way "
            f"keeps the model's answers scored so far, and the next one reads them)"
        )
    return Interrupted(message, signal_status(error))
