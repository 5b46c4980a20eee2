"""Sources: read files or Hub datasets, detect their format, tokenize, mask, count labels and hash tokens.

One job per module: `read` (files → Arrow), `detect` (format + column checks), `tokenizer` (load tokenizers and
templates), `chat` (template rendering and assistant spans), `encode` (rows → flat token/label arrays),
`parallel` (process pool), `samples` (long policy, counts, drops, hashes → samples table). `plancc.scan.scanner` ties
them together and caches the result.
"""
