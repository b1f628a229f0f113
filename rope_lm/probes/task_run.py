"""Train a model from scratch on a synthetic task at sizes <= L, test it up to k x L.

One run = one task x one positional scheme (x one extrapolation method, for
evaluation only). The settings (scripts/task.py, conf/task_run.yaml) are
checked here with the same typed mechanism as train.py's before any instance
is drawn, including whether the scheme can serve the longest test sequence.

Data: a fixed training set of `train.examples` instances with sizes drawn
uniformly from [sizes.train_min, sizes.train_max], and for every size from
sizes.train_min to sizes.test_factor x sizes.train_max its own test
instances; all of it is a function of `seed`, so two schemes see the same
instances. Test instances that also occur in the training set are redrawn
(a few tries; the count left is reported: at tiny sizes the space is too
small to avoid them).

A stop (SIGTERM, Ctrl-C) says where it was and what is kept: nothing of the
results (model.pt, task_results.json/.md and the plot are written together
at the end, so a stop leaves none of them), only the folder's record of its
settings; the same command with existing=continue (and hydra.run.dir= that
folder) starts the run over there, a task run being short.

Score: exact match of the answer and its <eos> under teacher forcing. For a
causal model this is the same verdict as greedy decoding: greedy reproduces
the answer exactly iff the argmax is right at every answer position, and the
first wrong argmax is where greedy would go wrong. Accuracy is reported per
size bucket with a 95% bootstrap interval over instances.
"""

from dataclasses import dataclass, field
import logging
import math
import os
import random
import re
import time
import typing

import torch
import torch.nn.functional as F

from rope_lm.core.devices import resolve_device
from rope_lm.core.errors import ConfigError, Interrupted
from rope_lm.core.files import atomic_write, replaced_atomically, save_figure, write_json, written_together
from rope_lm.core.stops import rerun_command, signal_status, signals_stop
from rope_lm.core.tables import markdown_table
from rope_lm.core.typed import dataclass_annotations, typed, typed_component, typed_dataclass
from rope_lm.eval import bootstrap
from rope_lm.infer.generate import generate
from rope_lm.model.layout import scheme_label
from rope_lm.model.transformer import ModelConfig, build_model, check_fit
from rope_lm.positional import SCHEMES
from rope_lm.runs.config import DERIVED_MODEL_KEYS, EXISTING
from rope_lm.runs.run_folder import RUN_CONFIG, RunFolder, Status
from rope_lm.runs.run_settings import TASK_BOOKKEEPING
from rope_lm.scaling import METHODS
from rope_lm.tasks.synthetic import SYNTHETIC_TASKS, build_task
from rope_lm.tasks.synthetic.base import EOS
from rope_lm.train.lit import OptimConfig, build_optimizer

log = logging.getLogger("rope_lm")

TASK_JSON, TASK_MD, TASK_PNG = "task_results.json", "task_results.md", "accuracy_vs_length.png"
MODEL_FILE = "model.pt"
SECTIONS = (
    "model",
    "pos",
    "scaling",
    "task",
    "sizes",
    "train",
    "eval",
    "optim",
    "logger",
    "seed",
    "device",
    "threads",
    "run_name",
    "existing",
)


@dataclass
class Sizes:
    train_min: int = 1
    train_max: int = 8  # L: the largest instance size trained on
    test_factor: float = 3.0  # test sizes go up to test_factor x train_max
    bucket: int = 4  # consecutive sizes reported as one bucket

    @property
    def test_max(self) -> int:
        return int(math.floor(self.test_factor * self.train_max))

    def validate(self):
        if self.train_min < 1 or self.train_max < self.train_min:
            raise ConfigError(
                f"sizes.train_min={self.train_min} and sizes.train_max={self.train_max} must satisfy "
                f"1 <= train_min <= train_max."
            )
        if self.test_factor < 1:
            raise ConfigError(
                f"sizes.test_factor={self.test_factor} must be at least 1 (test sizes reach test_factor x train_max)."
            )
        if self.bucket < 1:
            raise ConfigError(f"sizes.bucket={self.bucket} must be a positive number of sizes.")


@dataclass
class TrainSettings:
    steps: int = 1000
    batch_size: int = 32
    examples: int = 20000  # the fixed training set
    clip: float = 1.0  # gradient norm clip; 0: none
    log_every: int = 50

    def validate(self):
        for k in ("steps", "batch_size", "examples", "log_every"):
            if getattr(self, k) < 1:
                raise ConfigError(f"train.{k}={getattr(self, k)} must be a positive integer.")
        if self.clip < 0:
            raise ConfigError(f"train.clip={self.clip} must be 0 (off) or positive.")


@dataclass
class TaskEval:
    samples: int = 64  # test instances per size
    batch_size: int = 128
    bootstrap: int = 1000  # resamples for the 95% intervals; 0: none
    examples: int = 2  # failed instances kept per bucket in the JSON, for reading
    # task -> split name -> overrides of the task's settings for another test set at the same sizes (CoPE's
    # dense and sparse selective copy: the trained count of symbols among fewer or more blanks); a run uses
    # its own task's entry, so one sweep over tasks can name each task's splits
    splits: dict = field(default_factory=dict)

    def validate(self):
        for k in ("samples", "batch_size"):
            if getattr(self, k) < 1:
                raise ConfigError(f"eval.{k}={getattr(self, k)} must be a positive integer.")
        if self.bootstrap < 0 or self.examples < 0:
            raise ConfigError(f"eval.bootstrap={self.bootstrap} and eval.examples={self.examples} must be 0 or more.")


@dataclass
class TaskRun:
    model: dict
    pos: dict
    scaling: dict
    task: dict
    sizes: Sizes
    train: TrainSettings
    eval: TaskEval
    optim: OptimConfig
    logger: dict
    seed: int
    device: str
    threads: int | None
    run_name: str | None
    raw: dict
    existing: str = "refuse"


def resolve_task_run(cfg: dict) -> TaskRun:
    """Every setting checked, the task built and the scheme asked whether it
    serves the longest test sequence: nothing is drawn or trained yet."""
    unknown = sorted(set(cfg) - set(SECTIONS))
    if unknown:
        raise ConfigError(
            f"Unknown setting(s) {', '.join(unknown)} for a task run; valid ones are {', '.join(SECTIONS)}."
        )
    top = typed(
        {k: cfg[k] for k in ("seed", "device", "threads", "run_name", "existing") if k in cfg},
        {
            "seed": int,
            "device": str,
            "threads": int | None,
            "run_name": str | None,
            "existing": typing.Literal[EXISTING],
        },
        "",
        "task run",
    )
    if top.get("threads") is not None and top["threads"] < 1:
        raise ConfigError(
            f"threads={top['threads']} must be a positive number of CPU threads, or null (torch's default)."
        )
    if top.get("device", "cpu") not in ("cpu", "cuda", "auto"):
        raise ConfigError(f"device={top['device']!r} must be cpu, cuda or auto.")
    cfg = own_splits(cfg)
    run = TaskRun(
        model=typed(
            cfg.get("model") or {},
            dataclass_annotations(ModelConfig, DERIVED_MODEL_KEYS),
            "model.",
            "model",
            free={"name"},
        ),
        pos=typed_component(SCHEMES, cfg.get("pos") or {}, "pos"),
        scaling=typed_component(METHODS, cfg.get("scaling") or {"name": "none"}, "scaling"),
        task=typed_component(SYNTHETIC_TASKS, cfg.get("task") or {}, "task"),
        sizes=typed_dataclass(Sizes, cfg.get("sizes") or {}, "sizes.", "sizes"),
        train=typed_dataclass(TrainSettings, cfg.get("train") or {}, "train.", "train"),
        eval=typed_dataclass(TaskEval, cfg.get("eval") or {}, "eval.", "eval"),
        optim=typed_dataclass(OptimConfig, cfg.get("optim") or {}, "optim.", "optim"),
        logger=cfg.get("logger") or {"name": "none"},
        seed=top.get("seed", 0),
        device=top.get("device", "cpu"),
        threads=top.get("threads"),
        run_name=top.get("run_name"),
        raw=cfg,
        existing=top.get("existing", "refuse"),
    )
    task = build_task(run.task)
    task.check_size(run.sizes.train_min, "sizes.train_min")
    mcfg = model_config(run, len(task.vocabulary()), task.max_tokens(run.sizes.train_max))
    mcfg.validate()
    check_fit(mcfg, run.pos, run.scaling, task.max_tokens(run.sizes.test_max))
    for name, overrides in run.eval.splits.items():
        split = split_task(run.task, name, overrides, f"eval.splits.{task.name}.{name}")
        check_fit(mcfg, run.pos, run.scaling, split.max_tokens(run.sizes.test_max))
    return run


SPLIT_NAME = re.compile(r"[a-z0-9_]+")


def own_splits(cfg: dict) -> dict:
    """cfg with eval.splits narrowed to the run's own task's splits ({split: overrides}): what the
    run records, so a run is the same run whatever splits a sweep names for other tasks. Every
    task's entry is checked first."""
    splits = (cfg.get("eval") or {}).get("splits") or {}
    if not isinstance(splits, dict):
        raise ConfigError(
            f"eval.splits={splits!r} must map a task to its test splits, e.g. "
            f"{{selective_copy: {{sparse: {{blanks: 2.0}}}}}} (CoPE's sparse split)."
        )
    for task, named in splits.items():
        if task not in SYNTHETIC_TASKS.names():
            raise ConfigError(
                f"eval.splits.{task}: {task!r} is not a task; the keys of eval.splits are task names "
                f"({', '.join(SYNTHETIC_TASKS.names())}), each mapping split names to that task's settings."
            )
        if not isinstance(named, dict) or not named:
            raise ConfigError(
                f"eval.splits.{task}={named!r} must map split names to settings of {task}, e.g. "
                f"{{sparse: {{blanks: 2.0}}}}."
            )
        trained = cfg.get("task") if (cfg.get("task") or {}).get("name") == task else {"name": task}
        symbols = build_task(typed_component(SYNTHETIC_TASKS, trained, "task")).vocabulary().symbols
        for name, overrides in named.items():
            split = split_task(trained, name, overrides, f"eval.splits.{task}.{name}").vocabulary().symbols
            if split != symbols:
                raise ConfigError(
                    f"eval.splits.{task}.{name} changes the task's symbols ({', '.join(split)} against "
                    f"{', '.join(symbols)}), which the trained model has no embedding for; a split may change only "
                    f"how instances are drawn (selective_copy's blanks, flip_flop's ignore)."
                )
    own = splits.get((cfg.get("task") or {}).get("name"), {})
    return {**cfg, "eval": {**(cfg.get("eval") or {}), "splits": own}}


def split_task(task: dict, name: str, overrides, where: str):
    """The task of a test split: the task's settings with the split's overrides, checked."""
    if not isinstance(name, str) or not SPLIT_NAME.fullmatch(name):
        raise ConfigError(
            f"{where}: split name {name!r} must be lowercase letters, digits and _ (it names the split's rows, "
            f"e.g. selective_copy@sparse)."
        )
    if not isinstance(overrides, dict) or not overrides or "name" in overrides:
        raise ConfigError(
            f"{where}={overrides!r} must be a mapping of the task's own settings to test at, e.g. "
            f"{{blanks: 2.0}} for selective_copy (CoPE's sparse split); not empty, and not the task's name."
        )
    return build_task(typed_component(SYNTHETIC_TASKS, {**task, **overrides}, where))


def model_config(run: TaskRun, vocab_size: int, train_len: int) -> ModelConfig:
    return ModelConfig(
        vocab_size=vocab_size, train_len=train_len, **{k: v for k, v in run.model.items() if k != "name"}
    )


# --- data -------------------------------------------------------------------------


def training_set(task, sizes: Sizes, n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    rng = random.Random(f"task-train:{task.name}:{seed}")
    return [task.instance(rng, rng.randint(sizes.train_min, sizes.train_max)) for _ in range(n)]


def test_set(task, size: int, n: int, seed: int, seen: set, tries: int = 20, split: str = "") -> tuple[list, int]:
    """n instances of one size (independent of every other size's and split's),
    redrawn while they occur in the training set; returns (instances, overlaps left)."""
    rng = random.Random(f"task-test:{task.name}:{seed}:{size}" + (f":{split}" if split else ""))
    out, overlaps = [], 0
    for _ in range(n):
        for _ in range(tries):
            inst = task.instance(rng, size)
            if _key(inst) not in seen:
                break
        else:
            overlaps += 1
        out.append(inst)
    return out, overlaps


def _key(inst) -> tuple:
    return tuple(inst[0]), tuple(inst[1])


def encode_batch(task, vocab, instances, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs (B, T), targets (B, T)): next-token pairs of <bos> prompt <sep>
    answer <eos>, right-padded; targets are -100 except on the answer and
    <eos> (the loss and the score read nothing else)."""
    seqs, starts = [], []
    for prompt, answer in instances:
        seqs.append(vocab.encode(task.sequence(prompt, answer)))
        starts.append(len(prompt) + 2)  # index of the first answer token
    T = max(len(s) for s in seqs) - 1
    x = torch.full((len(seqs), T), vocab.pad, dtype=torch.long)
    y = torch.full((len(seqs), T), -100, dtype=torch.long)
    for i, (s, a) in enumerate(zip(seqs, starts)):
        ids = torch.tensor(s)
        x[i, : len(s) - 1] = ids[:-1]
        y[i, a - 1 : len(s) - 1] = ids[a:]
    return x.to(device), y.to(device)


def exact_match(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-instance exact match (B,) bool, per-instance share of answer tokens right (B,))."""
    scored = targets != -100
    hit = (logits.argmax(-1) == targets) & scored
    n = scored.sum(1)
    return hit.sum(1) == n, hit.sum(1).float() / n.clamp(min=1).float()


# --- the run ----------------------------------------------------------------------


def _device(name: str) -> str:
    return resolve_device(name)


def train_model(
    run: TaskRun, task, vocab, train_set, device, logger=None, progress: dict | None = None
) -> tuple[torch.nn.Module, dict]:
    torch.manual_seed(run.seed)
    model = build_model(run.model, run.pos, run.scaling, len(vocab), task.max_tokens(run.sizes.train_max)).to(device)
    opt, sched = build_optimizer(model, run.optim, run.train.steps)
    rng = random.Random(f"task-batches:{run.seed}")
    model.train()
    start, losses = time.perf_counter(), []
    for step in range(run.train.steps):
        batch = [train_set[rng.randrange(len(train_set))] for _ in range(run.train.batch_size)]
        x, y = encode_batch(task, vocab, batch, device)
        logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)
        if not torch.isfinite(loss):
            raise ConfigError(
                f"The training loss became {float(loss)} at step {step}; lower optim.lr or raise optim.warmup_steps."
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if run.train.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), run.train.clip)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if progress is not None:
            progress["step"] = step + 1
        if (step + 1) % run.train.log_every == 0 or step + 1 == run.train.steps:
            recent = sum(losses[-run.train.log_every :]) / len(losses[-run.train.log_every :])
            log.info("step %d/%d: answer loss %.4f", step + 1, run.train.steps, recent)
            if logger is not None:
                logger.log_metrics({"train/loss": recent, "train/lr": sched.get_last_lr()[0]}, step=step + 1)
    tail = losses[-max(1, run.train.steps // 10) :]
    return model, {
        "steps": run.train.steps,
        "final_loss": sum(tail) / len(tail),
        "seconds": round(time.perf_counter() - start, 2),
    }


@torch.no_grad()
def evaluate_sizes(
    model, task, vocab, tests: dict[int, list], batch_size: int, device, progress: dict | None = None
) -> dict[int, dict]:
    """size -> {correct: [bool], token_accuracy: [float], predictions: [[symbol]]}."""
    model.eval()
    out = {}
    for size, instances in tests.items():
        if progress is not None:
            progress["sizes"] = len(out)
        correct, token_acc, preds = [], [], []
        for s in range(0, len(instances), batch_size):
            chunk = instances[s : s + batch_size]
            x, y = encode_batch(task, vocab, chunk, device)
            logits = model(x)
            ok, acc = exact_match(logits, y)
            correct += ok.tolist()
            token_acc += acc.tolist()
            argmax = logits.argmax(-1)
            for i, (prompt, answer) in enumerate(chunk):
                a = len(prompt) + 1  # the input position that predicts the first answer token
                preds.append(vocab.decode(argmax[i, a : a + len(answer) + 1].tolist()))
        out[size] = {"correct": correct, "token_accuracy": token_acc, "predictions": preds}
    return out


@torch.no_grad()
def greedy_answers(model, task, vocab, instances, batch_size: int, device) -> list[list[str]]:
    """What the model writes after <bos> prompt <sep>, greedy through
    rope_lm.infer.generate, up to <eos> (kept) or as many tokens as the answer and
    its <eos>: the text behind a teacher-forced verdict."""
    prompts = [vocab.encode(task.sequence(prompt, answer)[: len(prompt) + 2]) for prompt, answer in instances]
    most = max(len(answer) for _, answer in instances) + 1
    out = generate(model, prompts, most, stop_tokens=[vocab.index[EOS]], batch_size=batch_size)
    return [vocab.decode(g.ids[: len(answer) + 1]) for g, (_, answer) in zip(out, instances)]


def buckets(sizes: Sizes) -> list[tuple[int, int]]:
    """Consecutive size ranges of sizes.bucket sizes, never straddling train_max."""
    out = []
    for lo_edge, hi_edge in ((sizes.train_min, sizes.train_max), (sizes.train_max + 1, sizes.test_max)):
        lo = lo_edge
        while lo <= hi_edge:
            hi = min(hi_edge, lo + sizes.bucket - 1)
            out.append((lo, hi))
            lo = hi + 1
    return out


def _interval_fields(values, resamples, seed, salt) -> dict:
    lo, hi = bootstrap.mean_interval(values, resamples, seed, *salt)
    return {
        "accuracy": sum(values) / len(values) if values else None,
        "accuracy_lo": lo,
        "accuracy_hi": hi,
        "n": len(values),
    }


def score(
    sizes: Sizes, task, tests: dict, scored: dict, resamples: int, seed: int, n_examples: int, write=None
) -> dict:
    """Per-bucket and pooled (inside / beyond the training sizes) accuracy
    with intervals; `write(instances)`, when given, is what the model
    writes for the failed examples kept (greedy_answers)."""
    rows = []
    for i, (lo, hi) in enumerate(buckets(sizes)):
        correct = [c for s in range(lo, hi + 1) for c in scored[s]["correct"]]
        tok = [t for s in range(lo, hi + 1) for t in scored[s]["token_accuracy"]]
        failed = [
            {"prompt": " ".join(p), "answer": " ".join(a), "predicted (teacher-forced argmax)": " ".join(pred)}
            for s in range(lo, hi + 1)
            for (p, a), ok, pred in zip(tests[s], scored[s]["correct"], scored[s]["predictions"])
            if not ok
        ]
        failed = failed[:n_examples]
        if write is not None and failed:
            kept = [(p, a) for s in range(lo, hi + 1) for (p, a), ok in zip(tests[s], scored[s]["correct"]) if not ok][
                :n_examples
            ]
            for example, written in zip(failed, write(kept)):
                example["generated (greedy)"] = " ".join(written)
        rows.append(
            {
                "sizes": [lo, hi],
                "label": f"{lo}" if lo == hi else f"{lo}-{hi}",
                "inside": hi <= sizes.train_max,
                "max_tokens": task.max_tokens(hi),
                **_interval_fields([float(c) for c in correct], resamples, seed, (i,)),
                "token_accuracy": sum(tok) / len(tok),
                "failed_examples": failed,
            }
        )
    pooled = {}
    for name, keep in (("inside", lambda s: s <= sizes.train_max), ("beyond", lambda s: s > sizes.train_max)):
        values = [float(c) for s in scored if keep(s) for c in scored[s]["correct"]]
        if values:
            pooled[name] = _interval_fields(values, resamples, seed, (1000 + len(pooled),))
    return {"buckets": rows, **pooled}


def claim(run: TaskRun, out_dir: str):
    """(the task run's folder, what to do there: Start or Skip), the one
    run-folder rule (run_folder.RunFolder.claim): a folder holding a task
    run's results is refused, or with existing=continue skipped when they
    are complete (a task run is short: one that stopped part-way starts over)."""
    folder = RunFolder(out_dir, results=TASK_JSON, bookkeeping=TASK_BOOKKEEPING, checkpoints=False)
    return folder, folder.claim(run.raw, run.existing, what="task")


def run_task(run: TaskRun, out_dir: str, logger=None, progress: dict | None = None) -> dict:
    """Train, test, write task_results.json/.md/.png (and model.pt) to out_dir. `progress`, when
    given, is kept up to date (phase, step, sizes scored) for a stop to say where it was."""
    progress = {} if progress is None else progress
    from rope_lm.scaling import method_label

    device = _device(run.device)
    if run.threads:
        torch.set_num_threads(run.threads)
    task = build_task(run.task)
    vocab = task.vocabulary()
    t0 = time.perf_counter()
    progress["phase"] = "drawing the data"
    train_set = training_set(task, run.sizes, run.train.examples, run.seed)
    seen = {_key(i) for i in train_set}
    tests, overlaps = {}, {}
    for size in range(run.sizes.train_min, run.sizes.test_max + 1):
        tests[size], overlaps[size] = test_set(task, size, run.eval.samples, run.seed, seen)
    if logger is not None:
        logger.log_hyperparams(run.raw)
    progress.update(phase="training", step=0)
    model, trained = train_model(run, task, vocab, train_set, device, logger, progress)
    t1 = time.perf_counter()
    progress.update(phase="scoring", sizes=0, of=len(tests))
    scored = evaluate_sizes(model, task, vocab, tests, run.eval.batch_size, device, progress)
    progress["phase"] = "writing the results"
    results = {
        "kind": "task",
        "task": task.name,
        "task_options": {k: v for k, v in run.task.items() if k != "name"},
        "scheme": scheme_label(run.pos, run.model),
        "method": method_label(run.scaling),
        "seed": run.seed,
        "train_sizes": [run.sizes.train_min, run.sizes.train_max],
        "test_max": run.sizes.test_max,
        "train_len": task.max_tokens(run.sizes.train_max),
        "vocab": vocab.symbols,
        "score": "exact match of answer + <eos>, teacher-forced (= greedy decoding's verdict)",
        "train": trained,
        "eval_seconds": round(time.perf_counter() - t1, 2),
        "seconds": round(time.perf_counter() - t0, 2),
        "train_overlap": {str(s): n for s, n in overlaps.items() if n},
        **scored_with_examples(run, model, task, vocab, tests, scored, device),
        "config": run.raw,
        "status": Status.COMPLETE,
    }
    if run.eval.splits:
        results["splits"] = score_splits(run, model, vocab, seen, device, progress)
        results["seconds"] = round(time.perf_counter() - t0, 2)
    # One set, the record of a complete run last: a full disk part-way leaves none of them, never a
    # "complete" task_results.json beside a missing or cut-short model.pt.
    with written_together(out_dir, "hydra.run.dir", "task run's results"):
        with replaced_atomically(os.path.join(out_dir, MODEL_FILE), errors=(OSError, RuntimeError)) as tmp:
            torch.save({"state_dict": model.state_dict(), "vocab": vocab.symbols, "config": run.raw}, tmp)
        plot_accuracy([results], os.path.join(out_dir, TASK_PNG))
        atomic_write(os.path.join(out_dir, TASK_MD), markdown(results))
        write_json(os.path.join(out_dir, TASK_JSON), results)
    if logger is not None:
        log_metrics(logger, results, out_dir)
    return results


def score_splits(run: TaskRun, model, vocab, seen: set, device, progress: dict) -> dict:
    """name -> {task_options, buckets, inside, beyond} for each test split of eval.splits: the
    same sizes and scoring as the main test set, its instances drawn under the split's settings."""
    out = {}
    for name, overrides in run.eval.splits.items():
        progress["phase"] = f"scoring split {name}"
        task = split_task(run.task, name, overrides, f"eval.splits.{run.task['name']}.{name}")
        tests = {
            size: test_set(task, size, run.eval.samples, run.seed, seen, split=name)[0]
            for size in range(run.sizes.train_min, run.sizes.test_max + 1)
        }
        scored = evaluate_sizes(model, task, vocab, tests, run.eval.batch_size, device)
        out[name] = {
            "task_options": dict(overrides),
            **scored_with_examples(run, model, task, vocab, tests, scored, device),
        }
    return out


def scored_with_examples(run: TaskRun, model, task, vocab, tests: dict, scored: dict, device) -> dict:
    """score() of one test set under the run's settings, the failed examples it keeps written out
    by greedy decoding."""
    return score(
        run.sizes,
        task,
        tests,
        scored,
        run.eval.bootstrap,
        run.seed,
        run.eval.examples,
        write=lambda kept: greedy_answers(model, task, vocab, kept, run.eval.batch_size, device),
    )


# --- views ------------------------------------------------------------------------


def fmt_acc(row: dict | None) -> str:
    if not row or row.get("accuracy") is None:
        return "—"
    if row.get("accuracy_lo") is None:
        return f"{row['accuracy']:.0%}"
    return f"{row['accuracy']:.0%} [{row['accuracy_lo']:.0%}, {row['accuracy_hi']:.0%}]"


def markdown(results: dict) -> str:
    lo, hi = results["train_sizes"]
    lines = [
        f"## {results['task']} — {results['scheme']} + {results['method']}",
        "",
        f"Trained on sizes {lo}-{hi} ({results['train']['steps']} steps, final answer loss "
        f"{results['train']['final_loss']:.3f}); tested up to size {results['test_max']}. "
        f"Exact match of the whole answer, 95% bootstrap interval over instances.",
        "",
    ] + _bucket_lines(results)
    for name, split in (results.get("splits") or {}).items():
        options = ", ".join(f"{k}={v}" for k, v in split["task_options"].items())
        lines += [
            f"### Split {name} ({options})",
            "",
            f"The same sizes, drawn with {options} (eval.splits.{results['task']}.{name}).",
            "",
        ] + _bucket_lines(split, inside="inside")
    return "\n".join(lines)


def _bucket_lines(results: dict, inside: str = "train") -> list[str]:
    """The sizes table; `inside` labels the trained sizes (a split draws them at its own settings, so not "train")."""
    return [
        markdown_table(
            ["sizes", "where", "tokens ≤", "n", "exact match", "token accuracy"],
            [
                [
                    b["label"],
                    inside if b["inside"] else "beyond",
                    b["max_tokens"],
                    b["n"],
                    fmt_acc(b),
                    f"{b['token_accuracy']:.0%}",
                ]
                for b in results["buckets"]
            ],
        ),
        "",
        f"Inside the training sizes: {fmt_acc(results.get('inside'))}; beyond: {fmt_acc(results.get('beyond'))}.",
        "",
    ]


def plot_accuracy(runs: list[dict], path: str, title: str | None = None):
    """Exact match vs instance size, one line per run, interval band, the
    largest training size dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for r in runs:
        mids = [(b["sizes"][0] + b["sizes"][1]) / 2 for b in r["buckets"]]
        acc = [b["accuracy"] for b in r["buckets"]]
        (line,) = ax.plot(
            mids, acc, marker="o", label=(r.get("label") or f"{r['scheme']} + {r['method']}") if len(runs) > 1 else None
        )
        lo = [b["accuracy_lo"] if b["accuracy_lo"] is not None else b["accuracy"] for b in r["buckets"]]
        hi = [b["accuracy_hi"] if b["accuracy_hi"] is not None else b["accuracy"] for b in r["buckets"]]
        ax.fill_between(mids, lo, hi, color=line.get_color(), alpha=0.15)
    ax.axvline(runs[0]["train_sizes"][1] + 0.5, color="black", linestyle="--", linewidth=1, label="largest train size")
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("instance size (bucket midpoint)")
    ax.set_ylabel("exact match")
    ax.set_title(
        title or f"{runs[0]['task']}: exact match vs size ({runs[0]['scheme']} + {runs[0]['method']})", fontsize=9
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def log_metrics(logger, results: dict, out_dir: str):
    """Accuracy per bucket and pooled through the run's logger; on wandb also
    the table and the PNG."""
    metrics = {f"task/accuracy@{b['label']}": b["accuracy"] for b in results["buckets"]}
    for name in ("inside", "beyond"):
        if results.get(name):
            metrics[f"task/accuracy_{name}"] = results[name]["accuracy"]
    logger.log_metrics(metrics, step=results["train"]["steps"])
    if logger.__class__.__name__ == "WandbLogger":
        import wandb

        cols = ["label", "inside", "max_tokens", "n", "accuracy", "accuracy_lo", "accuracy_hi", "token_accuracy"]
        logger.experiment.log(
            {
                "task/table": wandb.Table(columns=cols, data=[[b[c] for c in cols] for b in results["buckets"]]),
                "task/accuracy_vs_length": wandb.Image(os.path.join(out_dir, TASK_PNG)),
            }
        )


def task_in_folder(config: dict, out_dir: str, where: str, command: list[str] | None = None) -> dict:
    """scripts/task.py's work for one job: the settings checked (the scheme at the longest test
    size too) before any work, the folder claimed (two shells or machines sharing a study train
    each run once), the task trained and scored, the table printed. A stop (SIGTERM, Ctrl-C)
    raises Interrupted saying what is kept and, from `command` (the command line's arguments,
    a sweep's with -m), the command that finishes it."""
    from rope_lm.runs.run_folder import Skip, check_writable, describe
    from rope_lm.train.loggers import build_logger, finish

    run = resolve_task_run(config)
    check_writable(out_dir)
    progress: dict = {"phase": "claiming its folder"}
    try:
        with signals_stop():
            folder, start = claim(run, out_dir)
            if isinstance(start, Skip):
                print(f"rope-lm: {where}: {describe(start)} (existing=continue).")
                return {"skipped": start.reason}
            try:
                logger = build_logger(run.logger, out_dir, run.run_name or where, config={**config, "data": {}})
                try:
                    results = run_task(run, out_dir, logger, progress)
                finally:
                    if logger is not None and hasattr(logger, "save"):
                        try:
                            logger.save()
                        except (
                            OSError
                        ) as e:  # a full disk: the metrics log is a side record, and must not hide the error
                            log.warning("Could not write the run's metrics log in %s (%s).", out_dir, e.strerror or e)
                    finish(logger)
            finally:
                folder.release()
    except KeyboardInterrupt as e:
        raise Interrupted(stopped_task(run, out_dir, progress, command), signal_status(e)) from None
    print("\n" + markdown(results))
    print(f"Task results: {out_dir}/ (task_results.json, task_results.md, accuracy_vs_length.png, model.pt)")
    return results


def finish_command(out_dir: str, command: list[str] | None) -> str:
    """The same command with existing=continue, in the same folder (a sweep: the same sweep folder, whose
    complete runs are skipped)."""
    command = command or []
    if any(a in ("-m", "--multirun") for a in command):
        where = ("hydra.sweep.dir", os.path.dirname(os.path.abspath(out_dir)))
    else:
        where = ("hydra.run.dir", out_dir)
    replaced = ("existing", "hydra.run.dir", "hydra.sweep.dir")
    return rerun_command("task.py", command, replaced, [f"{where[0]}={where[1]}", "existing=continue"])


def stopped_task(run: TaskRun, out_dir: str, progress: dict, command: list[str] | None) -> str:
    phase = progress.get("phase", "claiming its folder")
    if phase == "training":
        at = f"while training (step {progress.get('step', 0)} of {run.train.steps})"
    elif phase == "scoring":
        at = f"while scoring the test sizes ({progress.get('sizes', 0)} of {progress.get('of', '?')} sizes scored)"
    else:
        at = f"while {phase}"
    if phase == "claiming its folder":
        return f"Stopped by a signal {at}: nothing was written. Run it with: {finish_command(out_dir, command)}"
    kept = (
        f"nothing of the task run's results was written ({MODEL_FILE}, {TASK_JSON}, {TASK_MD} and {TASK_PNG} are "
        f"written together once the sizes are scored; the model and the scores so far are not kept), and "
        f"{out_dir} holds only the record of its settings ({RUN_CONFIG})"
    )
    return (
        f"Stopped by a signal {at}: {kept}. The run starts over there, training included (a task run is short); "
        f"finish it with: {finish_command(out_dir, command)}"
    )
