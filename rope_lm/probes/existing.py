"""`existing=` as the probes that continue in their out= folder read it
(retrieval, long-range probes, search): refuse, or continue what an earlier
run kept there."""

from rope_lm.core.errors import ConfigError


def check_existing(existing, out, held: str, kept: str, earlier: str = "an earlier run") -> None:
    """One paragraph for a value that is not refuse or continue (`held`: what
    an out= folder refused holds; `kept`: what continue goes on with), and for
    continue without out= (`earlier`: what left the folder)."""
    if existing not in ("refuse", "continue"):
        raise ConfigError(
            f"existing={existing!r} is not an option; use refuse (an out= folder holding {held} is refused) or "
            f"continue (go on with {kept} in out=; needs out=)."
        )
    if existing == "continue" and not out:
        raise ConfigError(f"existing=continue goes on in the out= folder of {earlier}: give that folder as out=.")
