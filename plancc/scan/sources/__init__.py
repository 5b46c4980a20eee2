"""Sources: read files or Hub datasets, load tokenizers and chat templates, render chat, encode in parallel, and
turn encoded rows into the samples table.

One job per module: `read` (a SOURCE located and read → Arrow), `rows` (a source by row range, a shard at a time),
`tokenizer` (load tokenizers), `templates` (which chat template), `chat` (template rendering and turn spans),
`parallel` (process pool), `samples` (long policy, counts, drops, hashes → samples table). The row formats
(detect, check, encode, describe) are `plancc.scan.formats`; `plancc.scan.scanner` ties them together and caches
the result.
"""
