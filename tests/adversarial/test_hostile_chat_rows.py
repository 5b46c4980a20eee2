"""Hostile chat rows, templates and tokenized rows: a template that reads the clock gives the same plan in every
time zone; a template that does not compile, tool calls given as JSON text that does not parse or nests without
end, a message field of an object type, a content part without text and a float among token ids are each one
`error:` line naming the file and row (or the template's line) and the field, exit 2, never a traceback; message
fields of different types across rows reach the template as they are, as transformers gives them."""

from __future__ import annotations

import contextlib
import json
import locale
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import plancc
from plancc.cli import app
from plancc.errors import InputError, PlanccError
from plancc.scan.sources.chat import Renderer
from plancc.scan.sources.clock import strftime_now
from plancc.scan.sources.tokenizer import load_tokenizer
from plancc.store import token_store
from tests.support.sources import DEEPSEEK_JSON, write_rows, write_template

runner = CliRunner()
TOK = load_tokenizer("builtin")
ZONES = ("UTC", "America/New_York", "Asia/Kolkata")


def refused(*args) -> str:
    """The one error line of a command that must fail with exit 2."""
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    return lines[0]


def chat_rows(n: int = 4) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"Hi {i}"}, {"role": "assistant", "content": f"Hello {i}"}]}
            for i in range(n)]


def compile_chat(source: Path, tmp_path: Path, *extra) -> list[str]:
    return ["compile", source, "-o", tmp_path / "plan", "--tokenizer", "builtin", "-q",
            "--cache-dir", tmp_path / "cache", *extra]


@contextlib.contextmanager
def time_zone(name: str) -> Iterator[None]:
    """The process in time zone `name` (TZ and tzset), as a machine elsewhere is; restored afterwards."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = name
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = before
        time.tzset()


# ---------------------------------------------------------------- the template clock

CLOCK_TEMPLATE = ("{{ '<|im_start|>system\\n' + strftime_now('%s|%c|%Z|%z|%A %B|%x %X %p') + '<|im_end|>\\n' }}"
                  "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
                  "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_strftime_now_renders_the_same_text_in_every_time_zone():
    """`%s` read the machine's time zone: New York and Kolkata gave other seconds than UTC for one date."""
    texts = set()
    for zone in ZONES:
        with time_zone(zone):
            texts.add(Renderer(CLOCK_TEMPLATE, None, None, "2024-01-01").render(chat_rows(1)[0]["messages"]))
    assert texts == {"<|im_start|>system\n1704067200|Mon Jan  1 00:00:00 2024|UTC|+0000|Monday January|"
                     "01/01/24 00:00:00 AM<|im_end|>\n<|im_start|>user\nHi 0<|im_end|>\n"
                     "<|im_start|>assistant\nHello 0<|im_end|>\n"}


DIRECTIVES = "aAbhBcCdDeFgGHIjklmMnprRsStTuUVwWxXyYf%"


@given(st.dates(min_value=datetime(1900, 1, 1).date(), max_value=datetime(2999, 12, 31).date()),
       st.lists(st.tuples(st.sampled_from(["", "-", "_", "0", "^", "#"]), st.sampled_from(DIRECTIVES)),
                min_size=1, max_size=6), st.text("xy :/-", max_size=3))
def test_the_template_clock_formats_as_the_c_library_does_in_utc(day, directives, glue):
    """Every directive and flag gives what glibc's strftime gives in the C locale for that day's midnight in UTC,
    whatever the machine's own zone and locale."""
    fmt = glue.join(f"%{flag}{name}" for flag, name in directives if not (flag and name == "f"))
    pinned = datetime(day.year, day.month, day.day, tzinfo=UTC)
    saved = locale.setlocale(locale.LC_TIME)
    try:
        locale.setlocale(locale.LC_TIME, "C")
        with time_zone("UTC"):
            expected = pinned.strftime(fmt)
    finally:
        locale.setlocale(locale.LC_TIME, saved)
    with time_zone("Asia/Kolkata"):
        assert strftime_now(day.isoformat())(fmt) == expected


def test_unknown_directives_are_kept_as_written():
    assert strftime_now("2024-01-01")("%Q %Ey %Od %5d %") == "%Q 24 01 %5d %"


def test_a_plan_of_a_template_reading_the_clock_is_the_same_in_every_time_zone(tmp_path):
    """Three time zones gave three dataset fingerprints, even with --template-date; the scan cache, keyed without
    the zone, handed one zone's text to the next."""
    source = write_rows(tmp_path / "chat.jsonl", chat_rows(12))
    template = write_template(tmp_path, "clock", CLOCK_TEMPLATE)
    plans, keys = set(), set()
    for k, zone in enumerate(ZONES):
        out = tmp_path / f"plan-{k}"
        with time_zone(zone):
            r = runner.invoke(app, ["compile", str(source), "-o", str(out), "--tokenizer", "builtin", "-q",
                                    "--chat-template", str(template), "--template-date", "2024-01-01",
                                    "--cache-dir", str(tmp_path / f"cache-{k}")])
        assert r.exit_code == 0, r.output
        plan = plancc.open_plan(out)
        plans.add(((out / "plan.parquet").read_bytes(), plan.fingerprints["dataset"]))
        keys.add(plan.scan_record.key)
    assert len(plans) == 1 and len(keys) == 1


# ---------------------------------------------------------------- templates that do not compile

@pytest.mark.parametrize(("text", "line", "says"), [
    ("{% for m in messages %}\n{{ m.content }}\n", 2, "Unexpected end of template. Jinja was looking for the "
                                                   "following tags: 'endfor' or 'else'."),
    ("{% for m in messages %}{% generation %}\n{{ m.content }}\n{% endfor %}", 3, "Encountered unknown tag "
                                                                                  "'endfor'."),
    ("{% for m in messages %}{% generation %}{{ m.content }}{% endfor %}", 1, "Encountered unknown tag 'endfor'."),
    ("hello\n{% do messages.append(1) %}", 2, "Encountered unknown tag 'do'."),
    ("{% for m in messages %}\n\n{{ m.content | shout }}{% endfor %}", 3, "No filter named 'shout'."),
])
def test_a_template_that_does_not_compile_names_its_file_and_line(tmp_path, text, line, says):
    source = write_rows(tmp_path / "chat.jsonl", chat_rows())
    template = write_template(tmp_path, "broken", text)
    got = refused(*compile_chat(source, tmp_path, "--chat-template", template))
    assert got.startswith(f"error: {template.resolve()} line {line}: chat template does not compile: {says}"), got
    with pytest.raises(InputError, match=f"line {line}: chat template does not compile"):
        plancc.compile(str(source), tmp_path / "api-plan", tokenizer="builtin", chat_template=str(template),
                       cache_dir=tmp_path / "cache")


def test_a_tokenizer_configs_template_that_does_not_compile_names_the_config(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_bytes(DEEPSEEK_JSON.read_bytes())
    (tok / "tokenizer_config.json").write_bytes(orjson.dumps(
        {"eos_token": "<｜end▁of▁sentence｜>", "chat_template": "{% for m in messages %}\n{{ m.content }"}))
    source = write_rows(tmp_path / "chat.jsonl", chat_rows())
    got = refused("compile", source, "-o", tmp_path / "plan", "--tokenizer", tok, "-q",
                  "--cache-dir", tmp_path / "cache")
    assert got.startswith(f"error: {(tok / 'tokenizer_config.json').resolve()}: chat_template line 2: chat template "
                          "does not compile: unexpected '}'"), got


def test_a_template_nested_past_the_parsers_depth_is_one_line(tmp_path):
    source = write_rows(tmp_path / "chat.jsonl", chat_rows())
    template = write_template(tmp_path, "deep", "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}")
    assert refused(*compile_chat(source, tmp_path, "--chat-template", template)) == (
        f"error: {template.resolve()}: chat template does not compile: nested too deeply")


def test_a_template_error_is_a_plancc_error_in_the_api(tmp_path):
    source = write_rows(tmp_path / "chat.jsonl", chat_rows())
    template = write_template(tmp_path, "broken", "{% if %}")
    with pytest.raises(PlanccError):
        plancc.api.scan(str(source), tmp_path / "scan", tokenizer="builtin", chat_template=str(template),
                        cache_dir=tmp_path / "cache")


# ---------------------------------------------------------------- tool calls given as JSON text

TOOL_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}{% if m.name %} ({{ m.name }}){% endif %}"
                 "{% if m.tool_call_id %} [{{ m.tool_call_id }}]{% endif %}{{ '\\n' }}"
                 "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }}</tool_call>"
                 "{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def with_turn(rows: list[dict], row: int, **message) -> list[dict]:
    """`rows` with one more message, `{role: tool, content: "18C", **message}` or an assistant's tool call, in row
    `row`."""
    turn = {"role": "tool", "content": "18C", **message} if "tool_calls" not in message else {
        "role": "assistant", "content": None, **message}
    rows[row]["messages"].append(turn)
    return rows


@pytest.mark.parametrize(("calls", "says"), [
    ('{"function": {"name": "weather"', "field 'tool_calls' is a string that does not parse as JSON"),
    ("[" * 3000 + "]" * 3000, "field 'tool_calls' is JSON text nested deeper than 100 levels"),
    ("1" * 5000, "field 'tool_calls' is a string that does not parse as JSON"),
])
@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_tool_calls_text_that_does_not_parse_names_file_row_and_field(tmp_path, calls, says, suffix):
    """A JSONDecodeError, a RecursionError (the depth bound ran on the file's bytes, not on JSON inside a
    string) and a ValueError for 5,000 digits were tracebacks."""
    source = write_rows(tmp_path / f"chat{suffix}", with_turn(chat_rows(), 2, tool_calls=calls))
    got = refused(*compile_chat(source, tmp_path, "--chat-template", write_template(tmp_path, "t", TOOL_TEMPLATE)))
    line = " (line 3)" if suffix == ".jsonl" else ""
    assert got.startswith(f"error: {source} row 2{line}: column 'messages', message 2 (assistant): {says}"), got


def test_tool_calls_given_as_json_text_reach_the_template(tmp_path):
    calls = json.dumps([{"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}])
    rows = with_turn(chat_rows(), 1, tool_calls=calls)
    assert "<tool_call>weather</tool_call>" in texts(tmp_path, rows)[1]


# ---------------------------------------------------------------- message fields of mixed types

def texts(tmp_path: Path, rows: list[dict], source: str = "chat.jsonl") -> list[str]:
    """Each row's rendered text, as the scan tokenized it."""
    src = write_rows(tmp_path / source, rows)
    scan_dir = tmp_path / "scan"
    r = runner.invoke(app, ["scan", str(src), "-o", str(scan_dir), "--tokenizer", "builtin", "--chat-template",
                            str(write_template(tmp_path, "t", TOOL_TEMPLATE)), "-q", "--overwrite",
                            "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 0, r.output
    return [TOK.tokenizer.decode(row["input_ids"], skip_special_tokens=False)
            for row in token_store.to_table(scan_dir / "tokens").to_pylist()]


def test_message_fields_of_different_types_across_rows_reach_the_template_as_they_are(tmp_path):
    """`name` 5 in one row and "weather" in another (and a number and a string `tool_call_id`) was an
    ArrowInvalid traceback; transformers gives the template each value as it is, and so does plancc."""
    rows = with_turn(with_turn(chat_rows(), 1, name=5, tool_call_id=7), 3, name="weather", tool_call_id="c1")
    got = texts(tmp_path, rows)
    assert "<|im_start|>tool (5) [7]\n18C<|im_end|>" in got[1]
    assert "<|im_start|>tool (weather) [c1]\n18C<|im_end|>" in got[3]


@pytest.mark.parametrize(("field", "value", "says"), [
    ("tool_call_id", {"id": "c1"}, "field 'tool_call_id' is dict {'id': 'c1'}, expected a string"),
    ("name", ["weather"], "field 'name' is list ['weather'], expected a string"),
])
def test_an_object_where_a_name_belongs_names_file_row_and_field(tmp_path, field, value, says):
    """An object `tool_call_id` beside a string one in another row was an ArrowInvalid traceback; alone it would
    print a Python dict into the training text."""
    rows = with_turn(with_turn(chat_rows(), 1, **{field: "c0"}), 2, **{field: value})
    source = write_rows(tmp_path / "chat.jsonl", rows)
    got = refused(*compile_chat(source, tmp_path, "--chat-template", write_template(tmp_path, "t", TOOL_TEMPLATE)))
    assert got == f"error: {source} row 2 (line 3): column 'messages', message 2 (tool): {says}"


# ---------------------------------------------------------------- content parts

@pytest.mark.parametrize(("text", "says"), [(None, "missing (null)"), (["Hi"], "list ['Hi']"), (3, "int 3")])
def test_a_content_part_whose_text_is_not_a_string_names_its_text(tmp_path, text, says):
    """It was blamed on the part's type ('text'), which was right."""
    rows = chat_rows()
    rows[2]["messages"][0]["content"] = [{"type": "text", "text": "Look: "}, {"type": "text", "text": text}]
    source = write_rows(tmp_path / "chat.jsonl", rows)
    got = refused(*compile_chat(source, tmp_path, "--chat-template", "chatml"))
    assert got == (f"error: {source} row 2 (line 3): column 'messages', message 0 (user): content part 1 (type "
                   f"'text'): field 'text' is {says}, expected a string")


# ---------------------------------------------------------------- tokenized rows: the row to blame

@pytest.mark.parametrize(("value", "shown"), [("2.0", "2.0"), ("99999999999999999999", "1e+20"), ("7e0", "7.0")])
@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_whole_float_in_a_tokenized_json_file_names_its_row(tmp_path, value, shown, suffix):
    """Arrow reads the column as floats in every row when one row writes `2.0`: the first row (line 1) was
    blamed."""
    rows = ['{"input_ids": [1, 2, 3]}', '{"input_ids": [4, 5]}', f'{{"input_ids": [1, {value}, 3]}}',
            '{"input_ids": [6]}']
    source = tmp_path / f"t{suffix}"
    source.write_text("\n".join(rows) + "\n" if suffix == ".jsonl" else "[" + ",\n".join(rows) + "]")
    got = refused("compile", source, "-o", tmp_path / "plan", "-q", "--cache-dir", tmp_path / "cache")
    where = "row 2 (line 3)" if suffix == ".jsonl" else "row 2"
    assert got == (f"error: {source} {where}: column 'input_ids' has a list holding float {shown} at position 1, "
                   "expected a list of integers")


def test_a_whole_float_in_a_renamed_column_names_its_row(tmp_path):
    source = tmp_path / "t.jsonl"
    source.write_text('{"ids": [1, 2]}\n\n{"ids": [3, 4.0]}\n')
    got = refused("compile", source, "-o", tmp_path / "plan", "-q", "--format", "tokenized", "--columns",
                  "input_ids=ids", "--cache-dir", tmp_path / "cache")
    assert got == (f"error: {source} row 1 (line 3): column 'input_ids' has a list holding float 4.0 at position 1, "
                   "expected a list of integers")


def test_a_float_column_in_parquet_is_blamed_on_its_type(tmp_path):
    """A Parquet file types the column itself: its first row is the one to name."""
    source = tmp_path / "t.parquet"
    pq.write_table(pa.table({"input_ids": pa.array([[1.0, 2.0], [3.0]], pa.list_(pa.float64()))}), source)
    got = refused("compile", source, "-o", tmp_path / "plan", "-q", "--cache-dir", tmp_path / "cache")
    assert got == (f"error: {source} row 0: column 'input_ids' has type list<element: double>, expected a list of "
                   "integers")
