"""Text to tokens: corpus sources and their split, the tokenizer and token cache, the loaders."""
