"""LongRoPE's evolutionary search of per-pair rescale factors (Ding et al.,
2024, Algorithm 1), for rope_lm/scaling/longrope.py's `long_factor`.

A candidate is lambda (rot_dim/2 factors; pair i's inverse frequency is
divided by lambda_i beyond the training length). The first population holds
PI's factors (all s), NTK-aware's (s^(2i/(d-2))) and YaRN's (the NTK-by-parts
ramp), then mutations of them. Each generation keeps the `parents` lowest
validation PPLs and breeds the next population from them: a child is a
crossover of two parents (each factor from either, equally likely) with
probability `crossover`, else a mutation of one (each factor, with
probability `mutation`, times exp(N(0, step^2))). Every candidate is held to
the paper's constraints: 1 <= lambda_i <= max_scale * s and the monotone
constraint lambda_0 <= lambda_1 <= ... (a lower frequency is never
interpolated less than a higher one), enforced by a running maximum and
clipping. Each distinct candidate is evaluated once.

A stopped search continues exactly: the evolution's draws depend only on the
seed, the settings and the PPLs of the candidates before them, so replaying it
with the recorded candidates' PPLs (`done`, trials.json) meets those same
candidates in the same order, evaluating none of them again, and goes on from
the first one not recorded, as the uninterrupted search would have.
"""

from dataclasses import dataclass
import math

import numpy as np

from rope_lm.core.errors import ConfigError
from rope_lm.positional import frequencies as F


@dataclass
class Evolution:
    population: int = 16
    generations: int = 4
    parents: int = 4
    mutation: float = 0.3  # probability that a mutation changes one factor
    step: float = 0.2  # sd of the log-normal multiplier of a changed factor
    crossover: float = 0.5  # share of children bred by crossover
    max_scale: float = 1.25  # factors stay within [1, max_scale * s]

    def validate(self):
        for key in ("population", "generations", "parents"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"longrope.{key}={value!r} must be a positive integer.")
        if self.parents > self.population:
            raise ConfigError(f"longrope.parents={self.parents} must not exceed longrope.population={self.population}.")
        for key in ("mutation", "crossover"):
            if not 0 <= getattr(self, key) <= 1:
                raise ConfigError(f"longrope.{key}={getattr(self, key)!r} is a probability: it must be within [0, 1].")
        if not self.step > 0 or not self.max_scale >= 1:
            raise ConfigError(
                f"longrope.step={self.step!r} must be positive and longrope.max_scale={self.max_scale!r} at least 1."
            )


def constrain(lam: np.ndarray, s: float, max_scale: float) -> np.ndarray:
    """The monotone, bounded candidate nearest in spirit to lam: a running maximum, then [1, max_scale s]."""
    return np.clip(np.maximum.accumulate(lam), 1.0, max_scale * s)


def seeds(rot_dim: int, base: float, train_len: int, target: int) -> dict[str, np.ndarray]:
    """PI's, NTK-aware's and YaRN's factors at the target, as lambda = theta / theta'."""
    theta = F.plain_inv_freq(rot_dim, base).numpy()
    s = target / train_len
    out = {"pi": np.full(rot_dim // 2, s)}
    for name, (inv, _) in (
        ("ntk", F.ntk_aware(rot_dim, base, train_len, target)),
        ("yarn", F.yarn(rot_dim, base, train_len, target)),
    ):
        out[name] = theta / inv.double().numpy()
    return out


def evolve(
    evaluate,
    rot_dim: int,
    base: float,
    train_len: int,
    target: int,
    settings: Evolution,
    seed: int,
    on_candidate=None,
    done: list[dict] = (),
) -> list[dict]:
    """The history of the search: one record per distinct candidate (generation, origin, factors, ppl).
    evaluate(factors list) -> PPL, or raises ConfigError (recorded as refused). `done`: the records of
    a stopped search of the same settings and seed, replayed (not evaluated, not reported again)."""
    settings.validate()
    rng = np.random.default_rng(seed)
    s = target / train_len
    seen, history = {}, []
    recorded = {_key(np.asarray(r["factors"], dtype=float)): r for r in done}

    def score(lam, generation, origin):
        lam = constrain(lam, s, settings.max_scale)
        key = _key(lam)
        if key in seen:
            return seen[key]
        if key in recorded:  # met again by the replay of a stopped search: its record, as measured then
            record = recorded.pop(key)
            history.append(record)
            seen[key] = record
            return record
        if recorded:  # a new candidate while recorded ones are still to be met: the replay went elsewhere
            raise ConfigError(
                f"The replay of the stopped search met candidate #{len(history)} ({origin}), which it had not "
                f"recorded, before {len(recorded)} of its {len(done)} recorded candidate(s) (the evolution's draws "
                f"differ here: another numpy?), so it cannot be continued exactly; start a new search in a new "
                f"out= folder."
            )
        record = {
            "number": len(history),
            "generation": generation,
            "origin": origin,
            "factors": [float(v) for v in lam],
            "ppl": None,
        }
        try:
            record["ppl"] = float(evaluate(record["factors"]))
        except ConfigError as e:
            record["refused"] = str(e)
        history.append(record)
        seen[key] = record
        if on_candidate:
            on_candidate(record)
        return record

    def mutate(lam):
        change = rng.random(lam.shape) < settings.mutation
        return lam * np.where(change, np.exp(rng.normal(0.0, settings.step, lam.shape)), 1.0)

    start = seeds(rot_dim, base, train_len, target)
    for name, lam in start.items():
        score(lam, 0, name)
    for i in range(settings.population - len(start)):
        name = list(start)[i % len(start)]
        score(mutate(start[name]), 0, f"mutation of {name}")
    for generation in range(1, settings.generations + 1):
        parents = ranked(history)[: settings.parents]
        if not parents:
            break
        for _ in range(settings.population):
            if len(parents) > 1 and rng.random() < settings.crossover:
                a, b = (parents[i] for i in rng.choice(len(parents), size=2, replace=False))
                lam = np.where(rng.random(len(a["factors"])) < 0.5, a["factors"], b["factors"])
                score(lam, generation, f"crossover of #{a['number']} and #{b['number']}")
            else:
                p = parents[rng.integers(len(parents))]
                score(mutate(np.asarray(p["factors"])), generation, f"mutation of #{p['number']}")
    if recorded:
        raise ConfigError(
            f"The replay of the stopped search did not meet {len(recorded)} of its {len(done)} recorded "
            f"candidate(s) again (the evolution's draws differ here: another numpy?), so it cannot be "
            f"continued exactly; start a new search in a new out= folder."
        )
    return history


def _key(lam: np.ndarray) -> tuple:
    return tuple(np.round(lam, 6))


def ranked(history: list[dict]) -> list[dict]:
    return sorted((r for r in history if r["ppl"] is not None and math.isfinite(r["ppl"])), key=lambda r: r["ppl"])
