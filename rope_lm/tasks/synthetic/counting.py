"""CoPE's counting task (Golovneva et al., 2024; the generator of
facebookresearch/RAM projects/cope/scripts/count_data_gen.py): a program of
statements on a few variables, then a question for one variable's value.

    a = 0 ;   pass;   b = 0 ;   a ++;   pass;   pass;   a ++;   print a   ->  2

Each statement is drawn with the paper's weights: set a variable to 0 (1),
``pass;`` (50), increment a variable already set (7; redrawn where none is
set, or where the value would pass 10). The question asks for a variable that
has been set; a program in which none was set is drawn again, as the paper's
generator does. The answer is the count of increments of that variable since
its last reset: the model must count the few statements that matter among
the many ``pass;``.

size = the number of statements (the paper draws 3..512 of them per
program; here each size is its own test). Symbols follow the paper's
whitespace tokens, one token each: ``a`` ``=`` ``0`` ``;`` for a reset,
``a`` ``++;`` for an increment, ``pass;``, then ``print`` ``a``; the answer
is one token, ``0`` .. ``10``.
"""

from rope_lm.core.errors import ConfigError
from rope_lm.tasks.synthetic.base import SYNTHETIC_TASKS, Task

MAX_VALUE = 10  # the paper's MAX_VAL: an increment past it is redrawn
WEIGHTS = (("set", 1), ("pass", 50), ("increment", 7))  # the paper's OP_WEIGHTS
VARIABLES = tuple("abcdefghijklmnopqrstuvwxyz")


@SYNTHETIC_TASKS.register("counting")
class Counting(Task):
    def __init__(self, variables: int = 3):
        if not 1 <= variables <= len(VARIABLES):
            raise ConfigError(
                f"task.variables={variables} must be within [1, {len(VARIABLES)}] (the paper uses 3 and 5)."
            )
        self.names = VARIABLES[:variables]
        values = tuple(str(n) for n in range(MAX_VALUE + 1))
        self.symbols = (*self.names, "=", ";", "++;", "pass;", "print", *values)

    def max_tokens(self, size: int) -> int:
        # A reset is the longest statement (4 tokens); then print, the variable, the answer, and
        # <bos>, <sep>, <eos>.
        return 4 * size + 6

    def instance(self, rng, size):
        while True:
            prompt, values = self._program(rng, size)
            if values:
                name = rng.choice(sorted(values))
                return [*prompt, "print", name], [str(values[name])]

    def _program(self, rng, size):
        ops, weights = zip(*WEIGHTS)
        prompt, values = [], {}
        for _ in range(size):
            while True:
                op = rng.choices(ops, weights)[0]
                if op == "set":
                    name = rng.choice(self.names)
                    values[name] = 0
                    prompt += [name, "=", "0", ";"]
                elif op == "pass":
                    prompt.append("pass;")
                else:
                    if not values:
                        continue
                    name = rng.choice(sorted(values))
                    if values[name] + 1 > MAX_VALUE:
                        continue
                    values[name] += 1
                    prompt += [name, "++;"]
                break
        return prompt, values
