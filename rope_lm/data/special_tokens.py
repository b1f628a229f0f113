"""What a tokenizer puts around a whole text, and text pieces encoded without it.

A tokenizer may add special tokens to every text it encodes (Gemma's `<bos>`; none for rope-lm's own
byte-level tokenizers or SmolLM2's). The token cache gives them to each document's first piece
(rope_lm/data/encode.py), so a document reads as the model was trained on it. Text cut from the middle of
a document, or a prompt assembled from pieces, has them only where it is made to: `text_prefix` is what to
put first, `encode_piece` a piece without them (a `<bos>` before every needle and before the answer would
be read by no model as the text it stands in)."""


def encode_piece(tokenizer, text: str) -> list[int]:
    """The ids of a piece of a longer text: without the special tokens the tokenizer puts around a text."""
    return tokenizer.encode(text, add_special_tokens=False).ids


def text_prefix(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts before a text (Gemma's [<bos>]; [] where it puts none)."""
    plain = encode_piece(tokenizer, "a")
    full = tokenizer.encode("a").ids
    for i in range(len(full) - len(plain) + 1):
        if full[i : i + len(plain)] == plain:
            return full[:i]
    return []


def mid_text_warning(tokenizer, what: str) -> str | None:
    """A warning where `what` reads text cut from the middle of documents for a model whose tokenizer puts
    tokens before a text (Gemma 3: its PPL on the tokens 512-1,024 of a window is about 20% higher
    without its <bos>, 16.9 against 14.1 on a PG-19 book); None where the tokenizer puts none."""
    prefix = text_prefix(tokenizer)
    if not prefix:
        return None
    shown = ", ".join(repr(tokenizer.id_to_token(i)) for i in prefix)
    return (
        f"{what} starts windows in the middle of documents, without the {shown} this model's tokenizer puts "
        f"before a text and the model was trained to read first, so its losses there are those of text without "
        f"it (Gemma 3 270M: about 20% higher PPL far into a window). eval.protocol=documents reads each "
        f"document from its start, {shown} included."
    )
