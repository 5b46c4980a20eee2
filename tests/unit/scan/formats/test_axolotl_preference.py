"""`axolotl_preference`: Axolotl's `chat_template.default` DPO strings (the prompt rendered with the generation
prompt; each reply rendered after a dummy user turn, from its content on, trailing space stripped) tokenized as
TRL's string pairs, the prompt masked; a pair kept by Axolotl's length rule and cut to `sequence_len`.
(`tests/integration/test_axolotl_preference.py` holds it to Axolotl's own pipeline.)"""

from __future__ import annotations

import pytest

import plancc
from plancc.errors import InputError
from plancc.scan.sources.tokenizer import load_tokenizer
from plancc.store.token_store import open_store
from tests.support.sources import write_rows

ROWS = [{"messages": "Name a colour.", "chosen": "Blue.", "rejected": {"role": "assistant", "content": "Dark red"}},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
         "chosen": [{"role": "user", "content": "ignored"}, {"role": "assistant", "content": "4"}],
         "rejected": "5"}]


def _sequences(tmp_path, rows, **settings) -> list[tuple[str, str]]:
    """(text, trained text) of each sequence the plan holds, in sample order."""
    src = write_rows(tmp_path / "rows.jsonl", rows)
    plan = plancc.compile(src, tmp_path / "plan", format="axolotl_preference", tokenizer="builtin",
                          chat_template="chatml", cache_dir=tmp_path / "cache", overwrite=True,
                          **{"sequence_len": 256, **settings})
    tok = load_tokenizer("builtin").tokenizer
    store = open_store(plan.path / "tokens")
    out = []
    for i in sorted(plan.samples_table().column("sample_id").to_pylist()):
        ids, labels = (a[store.offsets[i]:store.offsets[i + 1]].tolist() for a in (store.input_ids, store.labels))
        out.append((tok.decode(ids, skip_special_tokens=False),
                    tok.decode([t for t in labels if t != -100], skip_special_tokens=False)))
    return out


def test_replies_are_rendered_and_trained_as_axolotl_renders_them(tmp_path):
    got = _sequences(tmp_path, ROWS)
    colour = "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n"
    sums = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert got == [(colour + "Blue.<|im_end|><|eos|>", "Blue.<|im_end|><|eos|>"),
                   (colour + "Dark red<|im_end|><|eos|>", "Dark red<|im_end|><|eos|>"),
                   (sums + "4<|im_end|><|eos|>", "4<|im_end|><|eos|>"),
                   (sums + "5<|im_end|><|eos|>", "5<|im_end|><|eos|>")]


def test_a_pair_within_axolotls_length_is_cut_and_one_beyond_is_dropped(tmp_path):
    whole = _sequences(tmp_path, ROWS[:1])
    longest = max(len(load_tokenizer("builtin").tokenizer.encode(text).ids) for text, _ in whole)
    # Axolotl counts the prompt and the reply without the eos TRL appends: one token over is kept, then cut
    cut = _sequences(tmp_path, ROWS[:1], sequence_len=longest - 1)
    assert cut == [whole[0], (whole[1][0].removesuffix("<|eos|>"), whole[1][1].removesuffix("<|eos|>"))]
    with pytest.raises(InputError, match="1 are longer than --sequence-len"):
        _sequences(tmp_path, ROWS[:1], sequence_len=longest - 2)


@pytest.mark.parametrize(("messages", "says"), [
    ([{"role": "human", "content": "hi"}], "column 'messages', message 0: role 'human' is not one Axolotl's DPO strategy reads"),
    ([{"from": "human", "value": "hi"}], "column 'messages', message 0: needs string fields 'role' and 'content'"),
    (5, "column 'messages' is int, expected a string or a list of messages"),
])
def test_a_row_axolotl_cannot_read_is_named(tmp_path, messages, says):
    with pytest.raises(InputError, match=r"row 1 \(line 2\): " + says):
        _sequences(tmp_path, [ROWS[0], {**ROWS[0], "messages": messages}])
