"""The decoder-only transformer and what a block is made of: layouts, norms, experts, softmax options, the KV cache, the chunked head."""
