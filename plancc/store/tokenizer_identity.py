"""A tokenizer's identity by content: what decides the token ids of a plan, whatever file it was saved in.

Every Hugging Face checkpoint holds a copy of its tokenizer that `save_pretrained` rewrote: merges as pairs instead of
"a b" strings, defaults spelled out (`ignore_merges: false`), keys reordered, a `tokenizer_config.json` added. The
ids it gives are the plan's, so it must pass the trainer's check; a tokenizer with one more special token, another
merge or another eos must not. The identity is therefore a canonical form of the parts that decide ids:

    model           type, vocab, merges (as pairs), and its other settings less those at their default (none/false)
    added_tokens    every added token with its flags (special, normalized, lstrip, rstrip, single_word), by id
    normalizer, pre_tokenizer, post_processor   as written (a post-processor that adds no token counts as none)
    eos, bos        the end and begin tokens (compile appends that eos to completions)

Left out, because they change no id of a plan: the decoder, truncation and padding settings, the pad token (the
runtime pads with ignored labels), `model_max_length`. `identity_difference` names the first part that differs,
so a refusal says what changed ("added token '<|x|>' (special) only in the tokenizer given").

Plans compiled before this identity recorded a digest of the tokenizer file's bytes (`file_fingerprint`); the checks
accept that digest too, so such plans keep working with their own tokenizer files.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from plancc.core.hashing import canonical_hash

PARTS = ("model", "added_tokens", "normalizer", "pre_tokenizer", "post_processor", "eos", "bos")
ADDED_FLAGS = ("special", "normalized", "lstrip", "rstrip", "single_word")


def _model(model: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in model.items() if v not in (None, False, "") and k not in ("vocab", "merges")}
    out["vocab"] = model.get("vocab")
    merges = model.get("merges")
    if merges is not None:
        out["merges"] = [m.split(" ", 1) if isinstance(m, str) else list(m) for m in merges]
    return out


def _adds_tokens(post: Any) -> bool:
    """Whether a post-processor can add a token: a TemplateProcessing without special tokens adds none."""
    if not isinstance(post, dict):
        return False
    if post.get("type") == "TemplateProcessing":
        return bool(post.get("special_tokens"))
    if post.get("type") == "Sequence":
        return any(_adds_tokens(p) for p in post.get("processors") or [])
    return True


def _post_processor(post: Any) -> Any:
    if isinstance(post, dict) and post.get("type") == "Sequence":
        kept = [p for p in post.get("processors") or [] if p.get("type") != "TemplateProcessing" or _adds_tokens(p)]
        return {**post, "processors": kept}
    return post if post is None or post.get("type") != "TemplateProcessing" or _adds_tokens(post) else None


def tokenizer_identity(tokenizer_json: bytes | str, eos: str | None, bos: str | None) -> dict[str, Any]:
    """The canonical parts of a tokenizer (see the module docstring) from its `tokenizer.json` text and eos/bos."""
    doc = orjson.loads(tokenizer_json)
    added = sorted(({"id": t.get("id"), "content": t.get("content"), **{f: bool(t.get(f)) for f in ADDED_FLAGS}}
                    for t in doc.get("added_tokens") or []), key=lambda t: (t["id"], t["content"]))
    return {"model": _model(doc.get("model") or {}), "added_tokens": added, "normalizer": doc.get("normalizer"),
            "pre_tokenizer": doc.get("pre_tokenizer"), "post_processor": _post_processor(doc.get("post_processor")),
            "eos": eos, "bos": bos}


def identity_fingerprint(identity: dict[str, Any]) -> str:
    """The digest a plan records of its tokenizer: over the canonical parts, keys sorted."""
    return canonical_hash({"tokenizer": {part: canonical_hash({part: identity[part]}) for part in PARTS}})


def file_fingerprint(tokenizer_json: bytes, eos: str | None, bos: str | None) -> str:
    """The digest plans recorded before content identity: the tokenizer file's bytes and the eos/bos tokens."""
    h = hashlib.blake2b(digest_size=16)
    for part in (tokenizer_json, (eos or "").encode(), (bos or "").encode()):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def _added_difference(theirs: list[dict], ours: list[dict]) -> str:
    by_id = {t["id"]: t for t in theirs}
    for t in ours:
        if t["id"] not in by_id:
            kind = " (special)" if t["special"] else ""
            return f"added token {t['content']!r}{kind} (id {t['id']}) only in the tokenizer given"
        if by_id[t["id"]] != t:
            was = by_id[t["id"]]
            changed = ", ".join(f"{k} {was[k]!r} -> {t[k]!r}" for k in t if t[k] != was[k])
            return f"added token id {t['id']}: {changed}"
    mine = {t["id"] for t in ours}
    gone = next(t for t in theirs if t["id"] not in mine)
    return f"added token {gone['content']!r} (id {gone['id']}) missing from the tokenizer given"


def identity_difference(recorded: dict[str, Any], given: dict[str, Any]) -> str | None:
    """One line naming the first part where tokenizer `given` differs from `recorded`; None when none does."""
    for part in PARTS:
        a, b = recorded[part], given[part]
        if a == b:
            continue
        if part == "added_tokens":
            return _added_difference(a, b)
        if part in ("eos", "bos"):
            return f"{part} token {a!r} -> {b!r}"
        if part == "model":
            if a.get("vocab") != b.get("vocab"):
                return f"vocabulary of {len(a.get('vocab') or {}):,} -> {len(b.get('vocab') or {}):,} entries"
            if a.get("merges") != b.get("merges"):
                return f"merges ({len(a.get('merges') or []):,} -> {len(b.get('merges') or []):,})"
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            return "model " + ", ".join(f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in keys)
        return f"{part} differs"
    return None
