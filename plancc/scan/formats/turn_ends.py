"""`end_of_turn tokens`: a chat turn's end is a token found after its content, as Axolotl's chat_template strategy
finds it, not the template's markup.

Per turn looked at (those trained, and every one when an end of turn is trained for all):

    tokens   ... | H  e  l  l  o | <|eot_id|>  \\n | <|start_header_id|> ...
    content      [s ............ e)                  tokens overlapping the content's characters, trained when the
                                                     turn is
    window       e, e+1, e+2, e+3                    the first eos in it is the turn's eos, the first of `eot_tokens`
                                                     (default: the eos) its end of turn

`train_on_eos` then trains the eos found (`turn`: a trained turn's, `all`: every one found, `last`: the last one
found, `none`: none), `train_on_eot` (default: as `train_on_eos`) the end of turn likewise. A template whose turns
end in a token that is neither (a base tokenizer's eos `<|end_of_text|>` under llama3's `<|eot_id|>`) trains no
end of turn: that is what Axolotl trains, and the scan says so.

`check` is Axolotl's validation of `eot_tokens` against the template and tokenizer (refusals, warnings), `end_ids`
the ids the window looks for, `labels` the token-level rule over a batch of encoded rows.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from plancc.config.settings import ScanOptions
from plancc.core.plan_arrays import IGNORE_INDEX
from plancc.errors import SettingsError
from plancc.scan.sources.tokenizer import Tok

WINDOW = 4  # the end-of-turn token is looked for in the content's end token and the 3 after it (Axolotl's distance)


class EndIds(NamedTuple):
    """The ids that end a turn: the eos, and the end-of-turn tokens."""

    eos: frozenset[int]
    eot: frozenset[int]


def eot_rule(options: ScanOptions) -> str:
    """`train_on_eot`, or `train_on_eos` when it is unset."""
    return str(options.train_on_eot or options.train_on_eos)


def _tokens(tok: Tok, options: ScanOptions) -> tuple[str, ...]:
    """The end-of-turn tokens: `eot_tokens`, or the eos."""
    return options.eot_tokens or ((tok.eos_token,) if tok.eos_token else ())


def _ids(tok: Tok, token: str) -> list[int]:
    return tok.tokenizer.encode(token, add_special_tokens=False).ids


def _kept(tok: Tok, template: str, options: ScanOptions) -> tuple[str, ...]:
    """The end-of-turn tokens the template holds (Axolotl leaves out one it does not hold; the eos alone is kept)."""
    tokens = _tokens(tok, options)
    if tokens == (tok.eos_token,):
        return tokens
    return tuple(t for t in tokens if t in template)


def check(tok: Tok, template: str, template_name: str, options: ScanOptions) -> list[str]:
    """The warnings `end_of_turn tokens` gives for this tokenizer and template; a SettingsError for what Axolotl
    refuses (an end-of-turn token of several tokens; train_on_eos and train_on_eot differing on the eos)."""
    if options.end_of_turn != "tokens":
        return []
    tokens = _tokens(tok, options)
    if tokens == (tok.eos_token,):
        if tok.eos_token not in template and "eos_token" not in template:
            return [f"chat template {template_name} never writes the eos {tok.eos_token}: no end of turn is trained "
                    "(as Axolotl does); name the template's end-of-turn token with eot_tokens to train it"]
        return []
    warnings = [f"eot_tokens: {t} is not in chat template {template_name}: left out (as Axolotl does)"
                for t in tokens if t not in template]
    for token in _kept(tok, template, options):
        ids = _ids(tok, token)
        if len(ids) != 1:
            raise SettingsError(f"eot_tokens: {token} is {len(ids)} tokens of tokenizer {tok.name}, not one; add it "
                                "as a token (added_special_tokens) or name the template's own", "eot_tokens")
    if tok.eos_token in _kept(tok, template, options) and str(options.train_on_eos) != eot_rule(options):
        raise SettingsError(f"eot_tokens holds the eos {tok.eos_token}, so train_on_eos {options.train_on_eos} and "
                            f"train_on_eot {eot_rule(options)} cannot both hold; give them the same value",
                            "train_on_eot")
    return warnings


def end_ids(tok: Tok, template: str, options: ScanOptions) -> EndIds:
    """The eos id and the end-of-turn ids the window looks for (a token of several ids is never found)."""
    eot = frozenset(ids[0] for t in _kept(tok, template, options) if len(ids := _ids(tok, t)) == 1)
    return EndIds(frozenset({tok.eos_id} if tok.eos_id is not None else ()), eot)


def labels(ids: np.ndarray, offsets: np.ndarray, encodings, marks: list[list[tuple[int, int, bool]]],
           ends: EndIds, options: ScanOptions) -> np.ndarray:
    """Labels of rows encoded with character offsets: per row, its marks (content start, content end, trained) in
    turn order, by the module docstring's rule."""
    out = np.full(len(ids), IGNORE_INDEX, np.int32)
    rules = (("eot", ends.eot, eot_rule(options)), ("eos", ends.eos, str(options.train_on_eos)))
    for i, (enc, row) in enumerate(zip(encodings, marks, strict=True)):
        if not row:
            continue
        o = int(offsets[i])
        seg = ids[o:int(offsets[i + 1])]
        bounds = np.array(enc.offsets, dtype=np.int64).reshape(-1, 2)
        starts, stops = bounds[:, 0], bounds[:, 1]
        last = {"eot": -1, "eos": -1}
        for start, end, train in row:
            s = int(np.searchsorted(stops, start, side="right"))  # the first token ending past the content's start
            e = int(np.searchsorted(starts, end, side="left"))  # the first token starting at its end or later
            if e <= s:  # no token of its own: Axolotl finds no span, and no end of turn
                continue
            if train:
                out[o + s:o + e] = seg[s:e]
            window = seg[e:e + WINDOW]
            for kind, wanted, rule in rules:
                hit = next((k for k, t in enumerate(window.tolist()) if t in wanted), None)
                if hit is None:
                    continue
                last[kind] = e + hit
                if rule == "all" or (rule == "turn" and train):
                    out[o + e + hit] = seg[e + hit]
        for kind, _, rule in rules:
            if rule == "last" and last[kind] >= 0:
                out[o + last[kind]] = seg[last[kind]]
    return out
