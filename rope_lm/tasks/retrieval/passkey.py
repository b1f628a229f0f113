"""passkey: one needle, the passkey sentence of rope_lm.tasks.passkey_text."""

from rope_lm.tasks.passkey_text import KEY_SENTENCE
from rope_lm.tasks.passkey_text import QUESTION as PASSKEY_QUESTION
from rope_lm.tasks.retrieval.base import RETRIEVAL_TASKS, Instance, Needle, RetrievalTask, number


@RETRIEVAL_TASKS.register("passkey")
class Passkey(RetrievalTask):
    battery_order = 10

    def instance(self, rng, depth):
        key = number(rng)
        return Instance([Needle(KEY_SENTENCE.format(key=key), depth)], PASSKEY_QUESTION, [key])
