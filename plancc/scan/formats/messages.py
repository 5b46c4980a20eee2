"""`messages`: conversations rendered with a chat template, the turns of `roles_to_train` supervised (Axolotl's
`type: chat_template`, TRL's conversational datasets).

    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
        ->  "<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n" | "Hello<|im_end|>" "\\n"   (chatml)

Read from a `messages` or `conversations` column: `{role, content}` or ShareGPT `{from, value}` turns (other keys
with `--message-fields`), OpenAI content parts (text parts joined), tool calls; or TRL's conversational
prompt/completion (`prompt` and `completion` both lists of messages: the prompt's turns are context, never
trained). `plancc.scan.sources.chat` renders and finds each turn's span; a template with `{% generation %}`
blocks says itself what is trained. `train_on = all_tokens` trains every token, markup too (TRL's loss when
`assistant_only_loss` is off): of a conversational prompt/completion, the tokens after the prompt rendered with
its generation prompt (from where the two tokenizations part, as TRL counts), or every one with `train_on_inputs`.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from plancc.config.formats import BY_NAME
from plancc.config.settings import ScanOptions
from plancc.core.plan_arrays import IGNORE_INDEX
from plancc.errors import InputError, clip
from plancc.scan.formats import columns, turn_ends
from plancc.scan.formats.base import Encoded, Encoding, RowError, RowFormat
from plancc.scan.formats.tokens import flat, heads
from plancc.scan.sources.chat import Renderer, TemplateProblem, Turn, normalize
from plancc.scan.sources.read import Source

PLAIN_MESSAGE = {"role", "content", "from", "value"}


def _conversational(src: Source) -> bool:
    """TRL's conversational prompt/completion: `prompt` and `completion` both lists of messages."""
    def is_list(name: str) -> bool:
        if name in src.loose:
            return any(isinstance(v, list) for v in src.loose[name])
        if name not in src.table.column_names:
            return False
        t = src.table.column(name).type
        return pa.types.is_list(t) or pa.types.is_large_list(t)

    return is_list("prompt") and is_list("completion")


def _arrow_messages(src: Source, name: str) -> pa.ChunkedArray | None:
    """Column `name` as it is when it is a list of plain `{role, content}` (or `{from, value}`) string structs,
    checked; None when its rows must be normalized one by one."""
    arr = src.table.column(name)
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)) or not (
        pa.types.is_struct(arr.type.value_type)
    ):
        raise InputError(f"{src.where(0)}: column '{name}' has type {clip(arr.type)}, expected a list of "
                         "{role, content} (or {from, value}) objects")
    fields = {f.name: f.type for f in arr.type.value_type}
    if not ({"role", "content"} <= set(fields) or {"from", "value"} <= set(fields)):
        raise InputError(f"{src.where(0)}: column '{name}' messages have fields {clip(sorted(fields))}, expected "
                         "role+content or from+value")
    columns.first_null(src, name, arr, "a list of messages")
    if set(fields) <= PLAIN_MESSAGE and all(pa.types.is_string(t) or pa.types.is_large_string(t)
                                              for t in fields.values()):
        columns.valid_strings(src, name, arr)
        return arr
    return None


def _cleaned(calls: Any) -> Any:
    """A message's tool calls less their null arguments: reading JSON lines into Arrow gave each call every argument
    name of its file, as null."""
    def clean(call: Any) -> Any:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), dict):
            arguments = {k: v for k, v in function["arguments"].items() if v is not None}
            return {**call, "function": {**function, "arguments": arguments}}
        return call

    return [clean(c) for c in calls] if isinstance(calls, list) else calls


def _stored(message: dict[str, Any], j: int) -> dict[str, Any]:
    """Message `j`, normalized, as the canonical table keeps it: role, content, and its other fields (`tool_calls`,
    `name`, ...) as one JSON text, `extras`, so that Arrow need not give a field one type in every row (a `name` 5
    in one row and "weather" in another) nor each tool call every other call's argument names."""
    role, content = message["role"], message["content"]
    extras = {k: _cleaned(v) if k == "tool_calls" else v for k, v in message.items() if k not in ("role", "content")}
    if not extras:
        return {"role": role, "content": content}
    try:
        return {"role": role, "content": content, "extras": json.dumps(extras)}
    except (TypeError, ValueError) as exc:  # a Parquet value JSON has no type for
        raise TemplateProblem(f"message {j} ({role}): {exc}") from None


def _normalized(src: Source, name: str | None, message_fields: tuple[tuple[str, str], ...]) -> pa.Table:
    """Every row normalized (`chat.normalize`: other field names, content parts, tool calls, the per-turn flag; TRL's
    conversational prompt + completion when `name` is None, whose prompt's turns get `training` false), roles as the
    source names them (`encode` renames them, once)."""
    rows = columns.column_values(src, name) if name is not None else zip(
        columns.column_values(src, "prompt"), columns.column_values(src, "completion"), strict=True)
    normalized = []
    for i, value in enumerate(rows):
        try:
            if name is None:
                prompt = [{**m, "training": False} for m in normalize(value[0], message_fields, {})]
                turns = prompt + normalize(value[1], message_fields, {})
            else:
                turns = normalize(value, message_fields, {})
            normalized.append([_stored(m, j) for j, m in enumerate(turns)])
        except TemplateProblem as exc:
            raise InputError(f"{src.where(i)}: column '{name or 'prompt/completion'}', {exc}") from None
    return pa.table({"messages": pa.array(normalized)})


def conversation(stored: list[dict[str, Any]], options: ScanOptions) -> list[dict[str, Any]]:
    """A canonical row's messages as the template gets them: their `extras` put back, roles renamed (`roles`, else
    `chat.ROLE_MAP`), the leading system turn left out with `drop_system_message` (Axolotl's rule: only a first
    turn)."""
    renamed = normalize(stored, (), dict(options.roles) if options.roles else None)
    messages = [{**m, **json.loads(kept["extras"])} if kept.get("extras") else m
                for m, kept in zip(renamed, stored, strict=True)]
    if options.drop_system_message and messages and messages[0]["role"] == "system":
        messages = messages[1:]
    return messages


def trained_turns(messages: list[dict[str, Any]], options: ScanOptions) -> list[bool]:
    """Whether each turn is trained: its flag (`training`) when it has one, else `train_on_inputs` (every turn) or
    its role in `roles_to_train`; with `train_on = last_turn`, only the last of those."""
    roles = set(options.roles_to_train)
    train = [m["training"] if m.get("training") is not None else options.train_on_inputs or m["role"] in roles
             for m in messages]
    if options.train_on == "last_turn" and any(train):
        last = max(i for i, t in enumerate(train) if t)
        train = [i == last for i in range(len(train))]
    return train


def _renders_nothing(renderer: Renderer, messages: list[dict[str, str]], text: str, turn: Turn) -> bool:
    """Whether `turn`'s text renders to nothing (no content, or whitespace a template trims): Axolotl finds no span
    for such a turn and trains neither it nor its end of turn; so does plancc (counted: `blank_turns`)."""
    m = messages[turn.index]
    if m["content"].strip() or m.get("tool_calls"):  # a tool call is text to train, content or not
        return False
    return not m["content"] or renderer.render(
        [*messages[:turn.index], {**m, "content": ""}, *messages[turn.index + 1:]]) == text


def _turn_spans(renderer: Renderer, messages: list[dict[str, str]], options: ScanOptions
                ) -> tuple[str, list[tuple[int, int]], bool, bool]:
    """Rendered text, the character spans trained (tokens starting inside one are supervised), whether the
    trained turns' content is empty (only end-of-turn markup is trained) and whether a turn to train was left out
    because its text renders to nothing (`_renders_nothing`). Ends are the template's markup (`end_of_turn
    markup`)."""
    eos = options.train_on_eos
    train = trained_turns(messages, options)
    chosen = [i for i, t in enumerate(train) if t]
    located = [i for i, m in enumerate(messages) if m.get("training") is not False] if eos == "all" else chosen
    split = eos != "turn" or any(messages[i]["role"] != "assistant" for i in located)
    text, turns = renderer.turns(messages, located, split=split)
    trained = [t for t in turns if train[t.index] and not _renders_nothing(renderer, messages, text, t)]
    spans = [(t.start, t.content_end) for t in trained]
    ends = {"turn": trained, "last": trained[-1:], "all": turns, "none": []}[eos]
    spans += [(t.content_end, t.end) for t in ends]
    empty = all(not messages[t.index]["content"].strip() for t in trained)
    return text, spans, empty, len(trained) < len(chosen)


def _turn_marks(renderer: Renderer, messages: list[dict[str, str]], options: ScanOptions
                ) -> tuple[str, list[tuple[int, int, bool]], bool, bool]:
    """Rendered text and, for `end_of_turn tokens` (`turn_ends`), each turn looked at as (content start, content
    end, trained): the trained ones, and every one when an end of turn is trained for all; whether the trained
    turns' content is empty, and whether a turn to train renders to nothing (left out, as Axolotl leaves it)."""
    train = trained_turns(messages, options)
    every = "all" in (options.train_on_eos, turn_ends.eot_rule(options))
    text, turns = renderer.turns(messages, [i for i, t in enumerate(train) if t or every], split=True)
    shown = [t for t in turns if not _renders_nothing(renderer, messages, text, t)]
    trained = [t for t in shown if train[t.index]]
    empty = all(not messages[t.index]["content"].strip() for t in trained)
    return text, [(t.start, t.content_end, train[t.index]) for t in shown], empty, len(trained) < sum(train)


def _tagged_spans(renderer: Renderer, messages: list[dict[str, str]], options: ScanOptions
                  ) -> tuple[str, list[tuple[int, int]], bool]:
    """Rendered text, the `{% generation %}` blocks' spans (tokens overlapping one are supervised) and whether
    the assistant turns they train have empty content."""
    text, spans = renderer.generation_spans(messages)
    replies = [m for m in messages if m["role"] == "assistant" and m.get("training") is not False]
    if options.train_on == "last_turn":
        spans, replies = spans[-1:], replies[-1:]
    return text, spans, all(not m["content"].strip() for m in replies), False


def _all_tokens(renderer: Renderer, messages: list[dict[str, str]], options: ScanOptions
                ) -> tuple[str, str | None, bool, bool]:
    """`train_on = all_tokens`: the rendered text, the rendering of what is not trained (a conversational prompt:
    the turns flagged untrained at its head, with the generation prompt; None: nothing, as with `train_on_inputs`)
    and whether the trained turns' content is empty."""
    head = next((i for i, m in enumerate(messages) if m.get("training") is not False), len(messages))
    late = next((i for i, m in enumerate(messages[head:], head) if m.get("training") is False), None)
    if late is not None:
        raise TemplateProblem(f"turn {late} is flagged untrained after a trained one: train_on all_tokens trains "
                              "every token after the conversation's leading untrained turns (its prompt)")
    prompt = None if options.train_on_inputs or head == 0 else renderer.render(messages[:head], True)
    trained = messages if prompt is None else messages[head:]
    return renderer.render(messages), prompt, all(not m["content"].strip() for m in trained), False


def _after_prompts(tokenizer, ids: np.ndarray, offsets: np.ndarray, prompts: list[str | None]) -> np.ndarray:
    """Labels of `train_on = all_tokens`: every token, less each row's leading tokens that its prompt's own
    tokenization shares (TRL's rule: the completion starts where the two part)."""
    labels = ids.copy()
    given = [i for i, p in enumerate(prompts) if p is not None]
    for i, enc in zip(given, tokenizer.encode_batch([prompts[i] for i in given], add_special_tokens=False),
                      strict=True):
        row, prompt = ids[offsets[i]:offsets[i + 1]], np.asarray(enc.ids, dtype=ids.dtype)
        n = min(len(row), len(prompt))
        parted = np.flatnonzero(row[:n] != prompt[:n])
        labels[offsets[i]:offsets[i] + (int(parted[0]) if len(parted) else n)] = IGNORE_INDEX
    return labels


def _mask(ids: np.ndarray, offsets: np.ndarray, encodings, spans: list, overlap: bool) -> np.ndarray:
    """Labels: each row's tokens that start inside one of its spans (`overlap`: that overlap one) keep their id."""
    labels = np.full(len(ids), IGNORE_INDEX, np.int32)
    for i, (enc, sp) in enumerate(zip(encodings, spans, strict=True)):
        if not sp:
            continue
        if overlap:
            bounds = np.array(enc.offsets, dtype=np.int64).reshape(-1, 2)
            starts, ends = bounds[:, 0], bounds[:, 1]
        else:
            starts = np.fromiter((s for s, _ in enc.offsets), dtype=np.int64, count=len(enc))
        chosen = np.zeros(len(starts), bool)
        for a, b in sp:
            chosen |= (starts < b) & (ends > a) if overlap else (starts >= a) & (starts < b)
        o = offsets[i]
        seg = ids[o:o + len(starts)]
        labels[o:o + len(starts)][chosen] = seg[chosen]
    return labels


class Messages(RowFormat):
    """Rows of one conversation each."""

    named = BY_NAME["messages"]
    detected_by = "messages/conversations"
    chat: ClassVar[bool] = True
    shaping: ClassVar[tuple[str, ...]] = ("message_fields", "roles", "drop_system_message")

    def detects(self, src: Source) -> bool:
        """A `messages` or `conversations` column, or `prompt` and `completion` both lists of messages."""
        cols = set(src.column_names)
        return "messages" in cols or "conversations" in cols or _conversational(src)

    def canonical(self, src: Source, options: ScanOptions) -> pa.Table:
        """One `messages` column of `{role, content}` lists: read as Arrow when it is one already, else every
        row normalized (`chat.normalize`)."""
        cols = set(src.column_names)
        name = "messages" if "messages" in cols else "conversations" if "conversations" in cols else None
        if name is None and not _conversational(src):
            raise columns.missing(src, self.name, "messages")
        if name is not None and name not in src.loose and not options.message_fields:
            arr = _arrow_messages(src, name)
            if arr is not None:
                return pa.table({"messages": arr})
        return _normalized(src, name, options.message_fields)

    def encode(self, table: pa.Table, how: Encoding, row0: int = 0) -> Encoded:
        """Each conversation rendered, tokenized once with offsets, its trained spans' tokens supervised."""
        if how.template is None:
            raise ValueError("messages need a chat template")
        options = how.options
        renderer = Renderer(how.template, how.tok.bos_token, how.tok.eos_token, options.template_date)
        everything = options.train_on == "all_tokens"
        by_tokens = options.end_of_turn == "tokens" and not renderer.tagged and not everything
        locate = (_all_tokens if everything else _tagged_spans if renderer.tagged else _turn_marks if by_tokens
                  else _turn_spans)
        texts, spans, empty, blank = [], [], [], []
        for i, conv in enumerate(table.column("messages").to_pylist()):
            try:
                messages = conversation(conv, options)
            except TemplateProblem as exc:
                raise RowError(row0 + i, f"column 'messages', {exc}") from None
            try:
                text, sp, ends_only, skipped = locate(renderer, messages, options)
            except TemplateProblem as exc:
                raise RowError(row0 + i, str(exc)) from None
            texts.append(text)
            spans.append(sp)
            empty.append(ends_only)
            blank.append(skipped)
        texts = heads(how.tok, texts, False, how.keep)  # spans past a cut select no token
        encodings = how.tok.tokenizer.encode_batch(texts, add_special_tokens=False)
        ids, offsets = flat(encodings)
        if everything:
            labels = _after_prompts(how.tok.tokenizer, ids, offsets, spans)
        elif by_tokens:
            labels = turn_ends.labels(ids, offsets, encodings, spans, turn_ends.end_ids(how.tok, how.template,
                                                                                        options), options)
        else:
            labels = _mask(ids, offsets, encodings, spans, renderer.tagged)
        return Encoded(ids, labels, offsets, np.array(empty, dtype=bool), {"blank": np.array(blank, dtype=bool)})

    def trained(self, options: ScanOptions, *, generation: bool = False) -> str:
        """The template's `{% generation %}` blocks, or `roles_to_train` and `train_on_eos`; and `train_on`."""
        if options.train_on == "all_tokens":
            return f"every token, markup too (train_on all_tokens), train_on_inputs {str(options.train_on_inputs).lower()}"
        if generation:
            return f"the chat template's {{% generation %}} blocks, train_on {options.train_on}"
        return (f"roles_to_train {','.join(options.roles_to_train)}, train_on_eos {options.train_on_eos}, "
                f"train_on {options.train_on}")


FORMAT = Messages()
