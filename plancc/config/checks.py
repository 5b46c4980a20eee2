"""The checks a setting's value passes: each validates one value, returns its normal form (an enum member, sorted
pairs, a date as text) and raises a SettingsError naming the flag. A `Setting` holds one (`plancc.config.fields`);
`cli` is the type its flag parses, `choices` the values it takes (for a named-choice setting)."""

from __future__ import annotations

import datetime as dt
import string
from dataclasses import dataclass
from typing import Any, ClassVar

from plancc.config.fields import did_you_mean, flag
from plancc.core.choices import ChatRole, Choice
from plancc.errors import SettingsError


class Check:
    """A setting's check: `check(name, value)` is the value's normal form, or a SettingsError naming the flag."""

    cli: ClassVar[type] = str

    def __call__(self, name: str, value: Any) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class Positive(Check):
    """A whole number in [1, most] (None too when `optional`): beyond `most`, arrays sized by it overflow or
    exhaust memory."""

    most: int
    optional: bool = False
    cli: ClassVar[type] = int

    def __call__(self, name: str, value: Any) -> Any:
        if value is None and self.optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise SettingsError(f"{flag(name)} must be a positive integer, got {value!r}", name)
        if value > self.most:
            raise SettingsError(f"{flag(name)} must be an integer in [1, {self.most:,}], got {value:,}", name)
        return value


@dataclass(frozen=True)
class OneOf(Check):
    """One of named values: a `Choice` enum (the value becomes its member) or a tuple of strings."""

    values: type[Choice] | tuple[str, ...]
    optional: bool = False  # None too (unset: another setting decides)

    @property
    def choices(self) -> tuple[str, ...]:
        """The values it takes, as text."""
        return tuple(str(v) for v in self.values)

    def __call__(self, name: str, value: Any) -> Any:
        if value is None and self.optional:
            return None
        if not isinstance(value, str) or value not in self.choices:
            raise SettingsError(f"{flag(name)} must be one of {', '.join(self.choices)}; got {value!r}", name)
        return value if isinstance(self.values, tuple) else self.values(value)


@dataclass(frozen=True)
class Switch(Check):
    """True or false: a config file's `drop_last = "false"` would otherwise be a true (non-empty) string."""

    cli: ClassVar[type] = bool

    def __call__(self, name: str, value: Any) -> Any:
        if not isinstance(value, bool):
            raise SettingsError(f"{flag(name)} must be true or false, got {value!r}", name)
        return value


@dataclass(frozen=True)
class Name(Check):
    """A non-empty string (a path, a Hub id, a split's name), or None."""

    def __call__(self, name: str, value: Any) -> Any:
        if value is not None and (not isinstance(value, str) or not value):
            raise SettingsError(f"{flag(name)} must be a non-empty string, got {value!r}", name)
        return value


@dataclass(frozen=True)
class Text(Check):
    """Any string; `what` says what it is for."""

    what: str

    def __call__(self, name: str, value: Any) -> Any:
        if not isinstance(value, str):
            raise SettingsError(f"{flag(name)} must be a string ({self.what}), got {value!r}", name)
        return value


@dataclass(frozen=True)
class Fraction(Check):
    """A share in [0, 1]."""

    cli: ClassVar[type] = float

    def __call__(self, name: str, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise SettingsError(f"{flag(name)} must be a fraction in [0, 1], got {value!r}", name)
        return value


@dataclass(frozen=True)
class Seed(Check):
    """A seed: a whole number in [0, 2**63)."""

    cli: ClassVar[type] = int

    def __call__(self, name: str, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
            raise SettingsError(f"{flag(name)} must be an integer in [0, 2**63), got {value!r}", name)
        return value


@dataclass(frozen=True)
class HoldOut(Check):
    """A count (int >= 1) or a fraction (float in (0, 1)) of samples held out, or 0 (none)."""

    cli: ClassVar[type] = float

    def __call__(self, name: str, value: Any) -> Any:
        ok = not isinstance(value, bool) and isinstance(value, int | float) and value >= 0
        if ok and (value == 0 or value >= 1):
            ok = float(value).is_integer()
            value = int(value) if ok else value
        if not ok:
            raise SettingsError(f"{flag(name)} must be a fraction in (0, 1) or a whole count >= 1 of samples to "
                                f"hold out for evaluation (0: none), got {value!r}", name)
        return value


@dataclass(frozen=True)
class Pairs(Check):
    """role=field pairs, each role one of `roles` (a string `a=x,b=y`, a mapping, or pairs), as sorted pairs; a role
    of `blank` may map to "" (none)."""

    roles: tuple[str, ...]
    example: str
    blank: tuple[str, ...] = ()
    what: str = "role=field"

    def __call__(self, name: str, value: Any) -> Any:
        pairs = self.parsed(name, value)
        for role, field in pairs:
            if role not in self.roles:
                raise SettingsError(f"{flag(name)}: unknown role {role!r}{did_you_mean(role, self.roles)}; roles are "
                                    f"{', '.join(self.roles)}", name)
            if not field and role not in self.blank:
                raise SettingsError(f"{flag(name)} {value!r}: {role} maps to no field", name)
        return pairs

    def parsed(self, name: str, value: Any) -> tuple[tuple[str, str], ...]:
        """`value` as sorted (left, right) pairs, each left name once."""
        if value is None or value == "" or value == ():
            return ()
        if isinstance(value, dict):
            pairs = [(str(k), str(v)) for k, v in value.items()]
        elif isinstance(value, str):
            pairs = [self._pair(name, value, part) for part in value.split(",")]
        elif isinstance(value, list | tuple) and all(isinstance(p, list | tuple) and len(p) == 2 for p in value):
            pairs = [(str(r), str(f)) for r, f in value]
        else:
            raise SettingsError(f"{flag(name)} must be {self.what} pairs (a string or a mapping), got {value!r}", name)
        mapped = [r for r, _ in pairs]
        if len(set(mapped)) != len(mapped):
            raise SettingsError(f"{flag(name)} {value!r}: a {self.what.partition('=')[0]} is mapped twice", name)
        return tuple(sorted(pairs))

    def _pair(self, name: str, value: str, part: str) -> tuple[str, str]:
        left, eq, right = part.partition("=")
        if not eq or not left.strip() or not (right.strip() or left.strip() in self.blank):
            raise SettingsError(f"{flag(name)} {value!r}: expected {self.what} pairs separated by commas, e.g. "
                                f"{flag(name)} {self.example}", name)
        return left.strip(), right.strip()


@dataclass(frozen=True)
class RoleMap(Pairs):
    """Chat role names as a source spells them, each mapped onto a role (`gpt=assistant,human=user`): any source
    name, a role of `ChatRole`; sorted (source, role) pairs."""

    roles: tuple[str, ...] = tuple(ChatRole)
    example: str = "gpt=assistant,human=user"
    what: str = "source=role"

    def __call__(self, name: str, value: Any) -> Any:
        pairs = self.parsed(name, value)
        for source, role in pairs:
            if role not in self.roles:
                raise SettingsError(f"{flag(name)}: {source}={role}: unknown role {role!r}"
                                    f"{did_you_mean(role, self.roles)}; roles are {', '.join(self.roles)}", name)
        return pairs


@dataclass(frozen=True)
class Tokens(Check):
    """Token strings (a list, or a comma-separated string from a flag), each non-empty, in the order given (the
    order new tokens get their ids in)."""

    def __call__(self, name: str, value: Any) -> Any:
        items = [t.strip() for t in value.split(",")] if isinstance(value, str) else value
        if value is None or value == "":
            return ()
        if not isinstance(items, list | tuple) or not all(isinstance(t, str) and t for t in items):
            raise SettingsError(f"{flag(name)} must be a list of non-empty token strings, got {value!r}", name)
        return tuple(dict.fromkeys(items))


@dataclass(frozen=True)
class NamedTokens(Check):
    """Tokens by the name of their part (`eos_token=<|eot_id|>`; names of `names`), in the order given (the order
    new tokens get their ids in)."""

    names: tuple[str, ...]

    def __call__(self, name: str, value: Any) -> Any:
        if value is None or value == "" or value == ():
            return ()
        if isinstance(value, dict):
            pairs = [(str(k), v) for k, v in value.items()]
        elif isinstance(value, list | tuple) and all(isinstance(p, list | tuple) and len(p) == 2 for p in value):
            pairs = [(str(k), v) for k, v in value]
        elif isinstance(value, str):
            pairs = [tuple(x.strip() for x in part.partition("=")[::2]) for part in value.split(",")]
        else:
            raise SettingsError(f"{flag(name)} must be name=token pairs ({', '.join(self.names)}), got {value!r}",
                                name)
        for key, token in pairs:
            if key not in self.names:
                raise SettingsError(f"{flag(name)}: unknown token name {key!r}{did_you_mean(key, self.names)}; names "
                                    f"are {', '.join(self.names)}", name)
            if not isinstance(token, str) or not token:
                raise SettingsError(f"{flag(name)}: {key} must be a non-empty token string, got {token!r}", name)
        if len({k for k, _ in pairs}) != len(pairs):
            raise SettingsError(f"{flag(name)} {value!r}: a name is given twice", name)
        return tuple(pairs)


@dataclass(frozen=True)
class Roles(Check):
    """Chat roles (a list, or a comma-separated string from a flag), as a tuple in `ChatRole` order."""

    def __call__(self, name: str, value: Any) -> Any:
        known = tuple(ChatRole)
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not items or not all(isinstance(r, str) for r in items):
            raise SettingsError(f"{flag(name)} must be a non-empty list of {', '.join(known)}; got {value!r}", name)
        roles = {r.strip() for r in items}
        for role in sorted(roles - set(known)):
            raise SettingsError(f"{flag(name)}: unknown role {role!r}{did_you_mean(role, known)}; roles are "
                                f"{', '.join(known)}", name)
        return tuple(r for r in known if r in roles)


@dataclass(frozen=True)
class Date(Check):
    """A date as YYYY-MM-DD (a TOML date value, or a string)."""

    def __call__(self, name: str, value: Any) -> Any:
        if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
            return value.isoformat()
        try:
            return dt.datetime.strptime(value, "%Y-%m-%d").date().isoformat()
        except (TypeError, ValueError):
            raise SettingsError(f"{flag(name)} must be a date YYYY-MM-DD (e.g. 2024-07-26), got {value!r}",
                                name) from None


@dataclass(frozen=True)
class PromptFormat(Check):
    """A prompt: a string whose named fields are exactly `fields`' ({instruction} required), or None."""

    fields: tuple[str, ...]

    def __call__(self, name: str, value: Any) -> Any:
        if value is None:
            return None
        expected = f"a string with {' and '.join('{' + a + '}' for a in self.fields)}"
        try:
            names = {n for _, n, _, _ in string.Formatter().parse(value) if n is not None} \
                if isinstance(value, str) else None
        except ValueError as exc:
            raise SettingsError(f"{flag(name)} {value!r}: {exc} (write a literal brace as {{{{ or }}}}); expected "
                                f"{expected}", name) from None
        if names is None or "instruction" not in names or not names <= set(self.fields):
            extra = sorted((names or set()) - set(self.fields))
            why = f"unknown field {{{extra[0]}}}; " if extra else ""
            raise SettingsError(f"{flag(name)} must be {expected}; {why}got {value!r}", name)
        return value


@dataclass(frozen=True)
class Mixture(Check):
    """A recipe's mixture: `entry` records (`MixEntry`, which checks each), or what a manifest's JSON gives (lists
    of name, role, kind, value); dataset names unique."""

    entry: type

    def __call__(self, name: str, value: Any) -> Any:
        if not isinstance(value, list | tuple):
            raise SettingsError(f"mixture must be a list of (name, role, kind, value), got {value!r}", name)
        out = [e if isinstance(e, self.entry) else self._entry(name, e) for e in value]
        names = [e.name for e in out]
        if len(set(names)) != len(names):
            raise SettingsError(f"mixture: dataset names must be unique, got {names}", name)
        return tuple(out)

    def _entry(self, name: str, entry: Any) -> Any:
        if not (isinstance(entry, list | tuple) and len(entry) == 4):
            raise SettingsError(f"mixture entry {entry!r}: expected (name, role, kind, value)", name)
        return self.entry(*entry)
