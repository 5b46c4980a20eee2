"""Render conversations with a Jinja chat template and find the exact character spans the model must learn.

Masks come from prefix differences, so they are exact for any template without knowing its markup:

    prefix = render(messages[:i], add_generation_prompt=True)   "<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n"
    upto   = render(messages[:i+1])                             prefix + "Hello<|im_end|>\\n"
    span of assistant turn i = [len(prefix), len(upto))         "Hello<|im_end|>\\n"  (content + end of turn)

The full rendering is tokenized once with offsets and exactly the tokens starting inside a span are supervised.
Templates that rewrite earlier turns (so `upto` is not a prefix of the full text) fall back to locating the turn's
content in the full text after the previous span. Other roles' turns (`roles_to_train`) are found the same way from
`render(messages[:i])`, without the generation prompt, starting where their content starts.

A template with `{% generation %}...{% endgeneration %}` blocks says itself what is trained: its spans are the
blocks' output, recorded while rendering exactly as Hugging Face's `return_assistant_tokens_mask` does, and every
token overlapping one is supervised (`generation_spans`).

`strftime_now` reads a pinned date (`template_date`, midnight UTC, `sources.clock`), never the clock, the time zone
or the locale: the same rows render the same text on any day and any machine.
Rendering is sandboxed (no code runs from the template).
"""

from __future__ import annotations

import functools
import json
import re
import threading
from typing import Any, ClassVar, NamedTuple

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from plancc.config.settings import DEFAULT_TEMPLATE_DATE
from plancc.errors import PlanccError, clip
from plancc.scan.sources.clock import strftime_now
from plancc.store import json_rows

ROLE_MAP = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "bot": "assistant",
            "model": "assistant", "system": "system"}


class TemplateProblem(PlanccError):
    """A template failed or rendered a turn inconsistently; the caller adds the row (or, for a template that does
    not compile, its file: `line` is the template's line at fault, when Jinja knows it)."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.line = line


def _raise(message: str):
    raise TemplateProblem(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def has_generation_tags(template: str) -> bool:
    """Whether the template marks what is trained with `{% generation %}` blocks (the test Hugging Face uses)."""
    return _GENERATION_TAG.search(template) is not None


def reads_clock(template: str) -> bool:
    """Whether the template calls `strftime_now` (so its text depends on `template_date`)."""
    return "strftime_now" in template


class _Generation(Extension):
    """`{% generation %}...{% endgeneration %}`: renders its body and records where that output lands in the
    text rendered so far (per thread: two threads render with one compiled template)."""

    tags: ClassVar[set[str]] = {"generation"}

    def __init__(self, environment):
        super().__init__(environment)
        self.state = threading.local()

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

    def _mark(self, caller) -> str:
        text = caller()
        tracked = getattr(self.state, "tracked", None)
        if tracked is not None:
            blocks, spans = tracked
            start = sum(map(len, blocks))
            spans.append((start, start + len(text)))
        return text


@functools.lru_cache(maxsize=8)
def compiled(template: str):
    """The template compiled in the sandbox (as transformers compiles one: `{% generation %}` and loop controls, no
    other extension); one that does not compile is a `TemplateProblem` saying why, on one line, and where."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    try:
        return env.from_string(template)
    except TemplateError as exc:
        raise TemplateProblem(f"chat template does not compile: {clip(exc.message or exc, 300)}",
                              getattr(exc, "lineno", None)) from None
    except RecursionError:
        raise TemplateProblem("chat template does not compile: nested too deeply") from None


class Turn(NamedTuple):
    """Where turn `index` lies in the rendered text: its supervised part [start, content_end) and the end-of-turn
    markup after it, [content_end, end)."""

    index: int
    role: str
    start: int
    content_end: int
    end: int


class Renderer:
    """Renders message lists for one (template, bos, eos, template date)."""

    def __init__(self, template: str, bos_token: str | None, eos_token: str | None,
                 date: str = DEFAULT_TEMPLATE_DATE):
        self.template = compiled(template)
        self.tagged = has_generation_tags(template)
        self.extra = {"bos_token": bos_token or "", "eos_token": eos_token or "", "strftime_now": strftime_now(date)}

    def _blocks(self, messages: list[dict[str, str]], add_generation_prompt: bool):
        try:
            yield from self.template.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                              **self.extra)
        except TemplateProblem:
            raise
        except Exception as exc:  # jinja surfaces template bugs as many exception types
            raise TemplateProblem(f"chat template failed: {type(exc).__name__}: {exc}") from None

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        """The template applied to `messages`; a template error is a `TemplateProblem` naming the template."""
        return "".join(self._blocks(messages, add_generation_prompt))

    def generation_spans(self, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
        """Full rendering and the [start, end) character spans of its `{% generation %}` blocks, in order, less
        those starting inside a turn with `training` false (a prompt's turn, `formats.messages`)."""
        blocks: list[str] = []
        spans: list[tuple[int, int]] = []
        ext = next(e for e in self.template.environment.extensions.values() if isinstance(e, _Generation))
        ext.state.tracked = (blocks, spans)
        try:
            for block in self._blocks(messages, False):
                blocks.append(block)
        finally:
            ext.state.tracked = None
        untrained = self._untrained(messages)
        return "".join(blocks), sorted(s for s in spans if not any(a <= s[0] < b for a, b in untrained))

    def _untrained(self, messages: list[dict[str, str]]) -> list[tuple[int, int]]:
        """The [start, end) character spans of the turns with `training` false: what each one adds to the
        rendering of the turns before it."""
        return [(len(self.render(messages[:i])), len(self.render(messages[: i + 1])))
                for i, m in enumerate(messages) if m.get("training") is False]

    def spans(self, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
        """Full rendering and the [start, end) character spans of every assistant turn (content + end of turn)."""
        full, turns = self.turns(messages, [i for i, m in enumerate(messages) if m["role"] == "assistant"],
                                 split=False)
        return full, [(t.start, t.end) for t in turns if t.end > t.start]

    def turns(self, messages: list[dict[str, str]], which: list[int], split: bool = True) -> tuple[str, list[Turn]]:
        """Full rendering and where each turn of `which` (indices, ascending) lies in it (`split`: where its content
        ends and its end-of-turn markup starts, one more rendering a turn; else `content_end` is its end)."""
        full = self.render(messages)
        out: list[Turn] = []
        cursor = 0
        for i in which:
            out.append(self._turn(messages, i, full, cursor, split))
            cursor = out[-1].end
        return full, out

    def _markup(self, messages: list[dict[str, str]], i: int, turn: str, prefix: str) -> tuple[int, int]:
        """(header, end) lengths of turn i's markup around its content in `turn` (the turn's text after
        `prefix`): what the same turn with empty content keeps at each end. A content that ends as the header does
        (or starts as the end does) lends those characters to the markup."""
        probe = self.render([*messages[:i], {**messages[i], "content": ""}])
        if not probe.startswith(prefix):
            return 0, 0
        probe = probe[len(prefix):]
        tail = min(_common(turn[::-1], probe[::-1]), len(probe))
        head = min(_common(turn, probe), len(probe) - tail)
        return head, tail

    def _turn(self, messages: list[dict[str, str]], i: int, full: str, cursor: int, split: bool) -> Turn:
        """Turn i: an assistant turn from its generation prompt on, any other from its content on."""
        m = messages[i]
        content, assistant = m["content"], m["role"] == "assistant"
        prefix = self.render(messages[:i], add_generation_prompt=assistant)
        upto = self.render(messages[: i + 1])
        if upto.startswith(prefix) and full.startswith(upto) and len(prefix) >= cursor:
            a, b = len(prefix), len(upto)
            head, tail = self._markup(messages, i, upto[a:], prefix) if split else (0, 0)
            return Turn(i, m["role"], a if assistant else a + head, b - tail, b)
        base = self.render(messages[:i])
        gen = prefix[len(base):] if assistant and prefix.startswith(base) else ""  # the generation prompt
        k = full.find(gen + content, cursor) if gen else -1
        a = k + len(gen) if k >= 0 else full.find(content, cursor)
        if a < 0 or not content:
            raise TemplateProblem(f"chat template renders {m['role']} turn {i} inconsistently across prefixes")
        c = b = a + len(content)
        end = upto.rfind(content)  # upto ends with this turn: what follows its content ends the turn
        tail = upto[end + len(content):] if end >= 0 else ""
        if tail and full.startswith(tail, b):
            b += len(tail)
        return Turn(i, m["role"], a, c, b)


def _common(a: str, b: str) -> int:
    """Length of the common prefix of `a` and `b`."""
    n = min(len(a), len(b))
    return next((j for j in range(n) if a[j] != b[j]), n)


MESSAGE_EXTRAS = ("tool_calls", "tool_call_id", "name", "training")  # kept for the template (`training`: spans)


def normalize(conversation: Any, fields: tuple[tuple[str, str], ...] = (),
              roles: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """`[{role, content}]` or ShareGPT `[{from, value}]` into `[{role, content}]` with standard role names.

    `fields` maps `role`/`content` onto other message keys (`--message-fields role=speaker`) and `training` onto the
    key of a per-turn flag (default `training`; "" reads none). `roles` renames roles (None: `ROLE_MAP`; a name it
    does not hold is kept as it is). Every turn must have a string `content` (or `value`), or a list of OpenAI
    content parts whose text parts are joined in order: a turn without one is an error, not an empty turn, unless it
    calls tools (`tool_calls`). `tool_calls` (a list, or JSON text of one), `tool_call_id`, `name` and the flag (as
    `training`, true or false) are kept when set, as the template gets them in transformers (`name` 5 stays a
    number); an object or list where a name belongs is an error."""
    if not isinstance(conversation, list):
        raise TemplateProblem(f"expected a list of messages, got {type(conversation).__name__}")
    names = dict(fields)
    renamed = ROLE_MAP if roles is None else roles
    flag = names.get("training", "training")
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
        message = {"role": renamed.get(role, role), "content": _content(m.get(key), j, role, key, m)}
        message.update((extra, _extra(extra, m[extra], j, role)) for extra in MESSAGE_EXTRAS
                       if extra != "training" and m.get(extra) is not None)
        if flag and m.get(flag) is not None:
            if not isinstance(m[flag], bool):
                raise TemplateProblem(f"message {j} ({role}): field '{flag}' is {type(m[flag]).__name__} "
                                      f"{clip(m[flag], 40)}, expected true or false (whether the turn is trained)")
            message["training"] = m[flag]
        out.append(message)
    return out


def _extra(name: str, value: Any, j: int, role: str) -> Any:
    """A message's field kept for the template: tool calls parsed when given as JSON text; a `name` or
    `tool_call_id` a string or number (an object or list there would be printed into the text as Python writes
    it)."""
    if name == "tool_calls":
        return _tool_calls(value, j, role)
    if name in ("name", "tool_call_id") and not isinstance(value, (str, int, float)):
        raise TemplateProblem(f"message {j} ({role}): field '{name}' is {type(value).__name__} {clip(value, 40)}, "
                              "expected a string")
    return value


def _tool_calls(calls: Any, j: int, role: str) -> Any:
    """A message's tool calls; JSON text of them (as some datasets keep them) parsed, once it is known to nest no
    deeper than a file may."""
    if not isinstance(calls, str):
        return calls
    if json_rows.too_deep(calls.encode("utf-8", "surrogatepass")) >= 0:
        raise TemplateProblem(f"message {j} ({role}): field 'tool_calls' is JSON text nested deeper than "
                              f"{json_rows.MAX_DEPTH} levels")
    try:
        return json.loads(calls)
    except ValueError as exc:  # JSONDecodeError, or an integer of too many digits
        raise TemplateProblem(f"message {j} ({role}): field 'tool_calls' is a string that does not parse as JSON "
                              f"({clip(exc.msg if isinstance(exc, json.JSONDecodeError) else exc, 80)})") from None


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
            if kind == "text" and not isinstance(part.get("text"), str):
                text = part.get("text")
                got = "missing (null)" if text is None else f"{type(text).__name__} {clip(text, 40)}"
                raise TemplateProblem(f"message {j} ({role}): content part {k} (type 'text'): field 'text' is "
                                      f"{got}, expected a string")
            if kind != "text":
                what = f"type {kind!r}" if kind is not None else f"{type(part).__name__} {clip(part, 40)}"
                raise TemplateProblem(f"message {j} ({role}): content part {k} has {what}; plancc reads text "
                                      "only (parts {type: text, text}); drop the other parts from the row")
            texts.append(part["text"])
        return "".join(texts)
    got = "missing" if content is None else f"{type(content).__name__} {clip(content, 60)}"
    raise TemplateProblem(f"message {j} ({role}): field '{key}' is {got}, expected a string (or a list of "
                          "{type: text, text} parts)")
