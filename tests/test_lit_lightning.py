"""What rope-lm takes from Lightning beyond its public API, pinned: the step
a training step's metrics are logged under (lit.logged_step), which a
checkpoint carries so that a resume can restore a row a kill lost; and the
keywords WandbLogger hands wandb.init (loggers.drop_anonymous)."""

import csv
import glob
import os

import lightning as L
import torch

from rope_lm.train.lit import LitLM, logged_step
from tests.conftest import TINY_MODEL


class Steps(L.Callback):
    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen.append(pl_module._pending_row[0])


def test_logged_step_is_the_step_lightning_logs_under(tmp_path):
    torch.manual_seed(0)
    x = torch.randint(0, 64, (24, 17))
    batches = torch.utils.data.DataLoader(list(zip(x[:, :-1], x[:, 1:])), batch_size=4)
    lit = LitLM(
        model=TINY_MODEL,
        pos={"name": "rope"},
        scaling={"name": "none"},
        optim={"warmup_steps": 1},
        vocab_size=64,
        train_len=16,
        max_steps=5,
    )
    steps = Steps()
    trainer = L.Trainer(
        max_steps=5,
        logger=L.pytorch.loggers.CSVLogger(str(tmp_path)),
        log_every_n_steps=1,
        callbacks=[steps],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(lit, batches)
    [path] = glob.glob(os.path.join(tmp_path, "**", "metrics.csv"), recursive=True)
    with open(path, newline="") as f:
        logged = [int(r["step"]) for r in csv.DictReader(f) if r.get("train/loss")]
    assert steps.seen == logged == list(range(5))
    assert logged_step(trainer) == 5


def test_wandb_logger_keeps_its_init_keywords_where_drop_anonymous_reads_them(tmp_path):
    from lightning.pytorch.loggers import WandbLogger

    from rope_lm.train.loggers import drop_anonymous

    logger = WandbLogger(save_dir=str(tmp_path), mode="offline")
    assert isinstance(logger._wandb_init, dict) and "anonymous" in logger._wandb_init
    drop_anonymous(logger)
    assert "anonymous" not in logger._wandb_init
