"""Render conversations with a Jinja chat template and find the exact character spans the model must learn.

Masks come from prefix differences, so they are exact for any template without knowing its markup:

    prefix = render(messages[:i], add_generation_prompt=True)   "<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n"
    upto   = render(messages[:i+1])                             prefix + "Hello<|im_end|>\\n"
    span of assistant turn i = [len(prefix), len(upto))         "Hello<|im_end|>\\n"  (content + end of turn)

The full rendering is tokenized once with offsets and exactly the tokens starting inside a span are supervised.
Templates that rewrite earlier turns (so `upto` is not a prefix of the full text) fall back to locating the turn's
content in the full text after the previous span. Rendering is sandboxed (no code runs from the template).
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from plancc.errors import clip

ROLE_MAP = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "bot": "assistant",
            "model": "assistant", "system": "system"}


class TemplateProblem(Exception):
    """A template failed or rendered a turn inconsistently; the caller adds the row."""


def _raise(message: str):
    raise TemplateProblem(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    import json

    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@functools.lru_cache(maxsize=8)
def _compile(template: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except TemplateError as exc:
        raise TemplateProblem(f"chat template does not compile: {exc}") from None


class Renderer:
    """Renders message lists for one (template, bos, eos)."""

    def __init__(self, template: str, bos_token: str | None, eos_token: str | None):
        self.template = _compile(template)
        self.extra = {"bos_token": bos_token or "", "eos_token": eos_token or ""}

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        """The template applied to `messages`; a template error is a `TemplateProblem` naming the template."""
        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        **self.extra)
        except TemplateProblem:
            raise
        except Exception as exc:  # jinja surfaces template bugs as many exception types
            raise TemplateProblem(f"chat template failed: {type(exc).__name__}: {exc}") from None

    def spans(self, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
        """Full rendering and the [start, end) character spans of every assistant turn (content + end of turn)."""
        full = self.render(messages)
        spans: list[tuple[int, int]] = []
        cursor = 0
        for i, m in enumerate(messages):
            if m["role"] != "assistant" or m.get("training") is False:  # False: a prompt's turn (`detect`)
                continue
            prefix = self.render(messages[:i], add_generation_prompt=True)
            upto = self.render(messages[: i + 1])
            if upto.startswith(prefix) and full.startswith(upto) and len(prefix) >= cursor:
                a, b = len(prefix), len(upto)
            else:
                base = self.render(messages[:i])
                gen = prefix[len(base):] if prefix.startswith(base) else ""  # the generation prompt
                k = full.find(gen + m["content"], cursor) if gen else -1
                a = k + len(gen) if k >= 0 else full.find(m["content"], cursor)
                if a < 0 or not m["content"]:
                    raise TemplateProblem(f"chat template renders assistant turn {i} inconsistently across prefixes")
                b = a + len(m["content"])
                end = upto.rfind(m["content"])  # upto ends with this turn: what follows its content ends the turn
                tail = upto[end + len(m["content"]):] if end >= 0 else ""
                if tail and full.startswith(tail, b):
                    b += len(tail)
            if b > a:
                spans.append((a, b))
            cursor = b
        return full, spans


MESSAGE_EXTRAS = ("tool_calls", "tool_call_id", "name", "training")  # kept for the template (`training`: spans)


def normalize(conversation: Any, fields: tuple[tuple[str, str], ...] = ()) -> list[dict[str, Any]]:
    """`[{role, content}]` or ShareGPT `[{from, value}]` into `[{role, content}]` with standard role names.

    `fields` maps `role`/`content` onto other message keys (`--message-fields role=speaker`). Every turn must have
    a string `content` (or `value`), or a list of OpenAI content parts whose text parts are joined in order: a turn
    without one is an error, not an empty turn, unless it calls tools (`tool_calls`). `tool_calls` (a JSON string
    in a canonical table, see `detect`), `tool_call_id`, `name` and `training` are kept when set."""
    if not isinstance(conversation, list):
        raise TemplateProblem(f"expected a list of messages, got {type(conversation).__name__}")
    names = dict(fields)
    out = []
    for j, m in enumerate(conversation):
        if not isinstance(m, dict):
            raise TemplateProblem(f"message {j} is {type(m).__name__}, expected an object with role and content")
        key = names["content"] if names.get("content") in m else (
            "content" if m.get("content") is not None or "value" not in m else "value")
        role = m[names["role"]] if names.get("role") in m else m.get("role", m.get("from"))
        if not isinstance(role, str):
            raise TemplateProblem(f"message {j}: field '{names.get('role', 'role')}' (or 'from') is "
                                  f"{'missing' if role is None else type(role).__name__}, expected a string")
        message = {"role": ROLE_MAP.get(role, role), "content": _content(m.get(key), j, role, key, m)}
        for extra in MESSAGE_EXTRAS:
            if m.get(extra) is not None:
                value = m[extra]
                message[extra] = json.loads(value) if extra == "tool_calls" and isinstance(value, str) else value
        out.append(message)
    return out


def _content(content: Any, j: int, role: str, key: str, message: dict) -> str:
    """A message's text: a string, the text parts of a content list joined in order, or "" beside tool calls."""
    if isinstance(content, str):
        return content
    if content is None and message.get("tool_calls"):
        return ""
    if isinstance(content, list) and content:
        texts = []
        for k, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                what = f"type {kind!r}" if kind is not None else f"{type(part).__name__} {clip(part, 40)}"
                raise TemplateProblem(f"message {j} ({role}): content part {k} has {what}; plancc reads text "
                                      "only (parts {type: text, text}); drop the other parts from the row")
            texts.append(part["text"])
        return "".join(texts)
    got = "missing" if content is None else f"{type(content).__name__} {clip(content, 60)}"
    raise TemplateProblem(f"message {j} ({role}): field '{key}' is {got}, expected a string (or a list of "
                          "{type: text, text} parts)")
