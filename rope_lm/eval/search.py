"""Searching an extrapolation method's settings for a trained model and a
target length: the settings that minimise perplexity on the validation split
at that length (never the test split, which only scores the winner).

YaRN, Self-Extend and NTK are searched with Optuna's TPE sampler over the
spaces below, the method's own defaults enqueued as the first trial (so the
winner is never worse than them on validation); LongRoPE's per-pair factors
with the paper's evolutionary search (rope_lm/eval/longrope_search.py). A space is
one entry of SEARCHES: a new searchable method is one function here.
"""

from dataclasses import dataclass, replace
import logging
import math

import numpy as np

from rope_lm.core.errors import ConfigError
from rope_lm.eval.evaluation import EvalConfig, evaluate_lengths

log = logging.getLogger("rope_lm")


@dataclass
class Objective:
    """Validation PPL of `model` at `target` tokens under a method's settings."""

    model: object  # a TransformerLM
    stream: np.ndarray  # the validation split's tokens
    target: int
    eval_cfg: EvalConfig  # lengths=[target], no bootstrap

    @property
    def train_len(self) -> int:
        return self.model.cfg.train_len

    @property
    def ratio(self) -> float:
        return self.target / self.train_len

    def __call__(self, options: dict) -> float:
        """The PPL, or ConfigError where the model refuses the settings at the target."""
        self.model.set_scaling(options)
        self.model.validate_length(self.target)
        return float(evaluate_lengths(self.model, self.stream, self.eval_cfg, self.train_len)[0]["ppl"])


def objective(model, stream: np.ndarray, target: int, tokens: int, batch_tokens: int) -> Objective:
    cfg = EvalConfig(
        lengths=[target], token_budget=tokens, batch_tokens=batch_tokens, split="valid", bootstrap=0, position_buckets=1
    )
    cfg.validate()
    return Objective(model, stream, target, cfg)


# --- Optuna spaces: (trial, objective) -> scaling options --------------------------


def yarn_space(trial, obj: Objective) -> dict:
    # beta_fast's range sits above beta_slow's: the ramp runs from the fast pairs to the slow ones.
    return {
        "name": "yarn",
        "factor": trial.suggest_float("factor", 1.0, 2.0 * obj.ratio, log=True),
        "beta_fast": trial.suggest_float("beta_fast", 4.0, 128.0, log=True),
        "beta_slow": trial.suggest_float("beta_slow", 0.25, 4.0, log=True),
        "attention_factor": trial.suggest_float("attention_factor", 0.8, 1.6),
    }


def yarn_defaults(obj: Objective) -> dict:
    """conf/scaling/yarn.yaml's settings as values of the space, at the target."""
    return {
        "factor": obj.ratio,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "attention_factor": 0.1 * math.log(obj.ratio) + 1.0,
    }


def self_extend_space(trial, obj: Objective) -> dict:
    return {
        "name": "self_extend",
        "window": trial.suggest_int("window", max(1, obj.train_len // 16), obj.train_len - 1, log=True),
        "group": trial.suggest_int("group", 2, max(3, int(round(8 * obj.ratio))), log=True),
    }


def self_extend_defaults(obj: Objective) -> dict:
    """conf/scaling/self_extend.yaml's auto settings (W = L/2, the smallest G keeping every relative
    position below L) at the target."""
    w = max(1, obj.train_len // 2)
    G = 1
    while G < obj.target and (obj.target - 1) // G + w - w // G > obj.train_len - 1:
        G += 1
    return {"window": w, "group": G}


def ntk_space(trial, obj: Objective) -> dict:
    # NTK's one knob: the scale s in base -> base s^(d/(d-2)), searched past the length ratio.
    return {"name": "ntk", "factor": trial.suggest_float("factor", 1.0, 4.0 * obj.ratio, log=True)}


def ntk_defaults(obj: Objective) -> dict:
    return {"factor": obj.ratio}


@dataclass(frozen=True)
class Space:
    suggest: object  # (trial, objective) -> options
    defaults: object  # objective -> the method's default settings as trial params
    reference: str  # the conf/scaling option the winner is reported against on the test split


SEARCHES = {
    "yarn": Space(yarn_space, yarn_defaults, "yarn"),
    "self_extend": Space(self_extend_space, self_extend_defaults, "self_extend"),
    "ntk": Space(ntk_space, ntk_defaults, "ntk"),
    # LongRoPE has no default factors; its search starts from YaRN's (and PI's, NTK's) and is reported
    # against YaRN's defaults, as in the paper's comparison.
    "longrope": None,
}


def reference_of(method: str) -> str:
    check_method(method)
    return "yarn" if method == "longrope" else SEARCHES[method].reference


def check_method(method: str) -> None:
    if method not in SEARCHES:
        raise ConfigError(f"method={method!r} cannot be searched; searchable methods are {', '.join(SEARCHES)}.")


def optuna_search(
    method: str, obj: Objective, trials: int, seed: int, on_trial=None, done: list[dict] = ()
) -> list[dict]:
    """Runs `trials` TPE trials (the defaults first); returns the history,
    one record per trial: number, params, distributions, options, ppl (None
    where refused). `done`: the records of a stopped search of the same
    settings (its trials.json), added to the study as it recorded them (a
    refused or non-finite trial as pruned) before the trials left are run:
    the sampler reads them as it read them then."""
    import optuna

    space = SEARCHES[method]
    # ERROR: a stop (SIGTERM, Ctrl-C) mid-trial would be logged as a failed trial with its traceback.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
    history = [recorded_trial(study, r) for r in done]
    if not history:
        study.enqueue_trial(space.defaults(obj), user_attrs={"origin": "defaults"})

    def run(trial):
        options = space.suggest(trial, obj)
        record = {
            "number": trial.number,
            "origin": trial.user_attrs.get("origin", "tpe"),
            "params": dict(trial.params),
            "distributions": {k: optuna.distributions.distribution_to_json(d) for k, d in trial.distributions.items()},
            "options": options,
            "ppl": None,
        }
        # A stop mid-trial (SIGTERM, Ctrl-C) records nothing of it: only a trial measured or refused is kept.
        try:
            record["ppl"] = obj(options)
        except ConfigError as e:  # settings the model refuses at the target: recorded, never chosen
            record["refused"] = str(e)
            history.append(record)
            if on_trial:
                on_trial(record)
            raise optuna.TrialPruned(str(e)) from None
        history.append(record)
        if on_trial:
            on_trial(record)
        if not math.isfinite(record["ppl"]):
            raise optuna.TrialPruned("non-finite perplexity")
        return record["ppl"]

    left = trials - len(history)
    if left > 0:
        study.optimize(run, n_trials=left)
    return history


def recorded_trial(study, record: dict) -> dict:
    """A trial of trials.json added to `study` as it ended: complete with its PPL, or pruned (refused,
    or a non-finite PPL, which JSON keeps as null)."""
    import optuna

    if "distributions" not in record:
        raise ConfigError(
            f"Trial {record.get('number')} of the stopped search records no distributions (a trials.json from "
            f"before searches could be continued), so Optuna cannot be given it; start a new search in a new out= "
            f"folder."
        )
    ppl = record.get("ppl")
    scored = ppl is not None and math.isfinite(ppl)
    study.add_trial(
        optuna.trial.create_trial(
            params=record["params"],
            distributions={k: optuna.distributions.json_to_distribution(d) for k, d in record["distributions"].items()},
            value=ppl if scored else None,
            state=optuna.trial.TrialState.COMPLETE if scored else optuna.trial.TrialState.PRUNED,
            user_attrs={"origin": record.get("origin", "tpe")},
        )
    )
    return record


def best_of(history: list[dict]) -> dict:
    scored = [r for r in history if r["ppl"] is not None and math.isfinite(r["ppl"])]
    if not scored:
        raise ConfigError(
            "No trial of the search gave a finite validation perplexity: every setting tried was "
            "refused at the target length or diverged; widen the search or pick another target."
        )
    return min(scored, key=lambda r: r["ppl"])


def final_config(cfg: EvalConfig, tokens: int, bootstrap: int, seed: int) -> EvalConfig:
    out = replace(cfg, split="test", token_budget=tokens, bootstrap=bootstrap, seed=seed, position_buckets=8)
    out.validate()
    return out


def paired_ratios(rows: dict, units: dict, resamples: int, seed: int, target: int) -> dict:
    """ "<a> / <b>": {ratio, lo, hi} of test PPLs for each later setting a
    against each earlier b (none, defaults, searched), the interval from the
    paired bootstrap over the windows both were scored on (bootstrap.paired_ratio):
    two settings whose own intervals overlap can still differ beyond the noise of
    the difference."""
    from rope_lm.eval import bootstrap

    labels, out = list(rows), {}
    for i, a in enumerate(labels):
        for b in labels[:i]:
            r = bootstrap.paired_ratio(units[a], units[b], rows[a]["ppl"], rows[b]["ppl"], resamples, seed, target)
            out[f"{a} / {b}"] = {k: r[k] for k in ("ratio", "lo", "hi")}
    return out
