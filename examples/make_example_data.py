"""Write the bundled examples: `examples/data/chat.jsonl`, 800 synthetic multi-turn chats,
`examples/data/instructions.jsonl`, 300 alpaca-style records (instruction, optional input, output) for the
two-dataset recipe `examples/recipe.toml`, and `examples/data/pairs.jsonl`, 400 preference pairs (a question, its
right answer chosen, a wrong one rejected: `examples/train_dpo.py`); each from its own seed.

The mix mimics what makes batching hard in SFT: prompts and answers of very different lengths (one-word answers
next to long step-by-step ones), a system prompt on some conversations, and one to three assistant turns.
Run `python examples/make_example_data.py` to regenerate both byte for byte.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

NAMES = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Leslie", "Margaret"]
ITEMS = ["apples", "books", "cables", "drills", "engines", "folders", "gears", "hammers", "inks", "jars"]


def arithmetic(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(2, 999), rng.randint(2, 999)
    if rng.random() < 0.5:
        return f"What is {a} + {b}?", str(a + b)
    steps = [f"Start with {a}.", f"Add {b}: {a} + {b} = {a + b}."]
    total = a + b
    for _ in range(rng.randint(1, 12)):
        c = rng.randint(2, 99)
        steps.append(f"Then add {c}: {total} + {c} = {total + c}.")
        total += c
    return (f"Please add {a} and {b}, then keep adding the numbers I would pick, and show every step.",
            " ".join(steps) + f" The final total is {total}.")


def inventory(rng: random.Random) -> tuple[str, str]:
    who = rng.choice(NAMES)
    counts = {item: rng.randint(0, 40) for item in rng.sample(ITEMS, rng.randint(1, len(ITEMS)))}
    listing = ", ".join(f"{n} {item}" for item, n in counts.items())
    if rng.random() < 0.4:
        return f"{who} has {listing}. Does {who} have any {next(iter(counts))}?", "Yes." if next(
            iter(counts.values())) else "No."
    lines = [f"- {item}: {n} ({'restock' if n < 10 else 'fine'})" for item, n in sorted(counts.items())]
    return (f"{who} keeps a store room with {listing}. List each item with its count, sorted by name, and mark "
            f"anything under ten for restocking.", "\n".join(lines))


def conversation(rng: random.Random) -> dict:
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": "You are a careful assistant. Answer exactly."})
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        user, assistant = (arithmetic if rng.random() < 0.5 else inventory)(rng)
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return {"messages": messages}


def instruction(rng: random.Random) -> dict:
    """One alpaca-style record: the task in `instruction`, its data (when it has any) in `input`."""
    if rng.random() < 0.5:
        words = [rng.choice(ITEMS) for _ in range(rng.randint(2, 30))]
        return {"instruction": "Sort these words alphabetically and remove duplicates.", "input": " ".join(words),
                "output": ", ".join(sorted(set(words)))}
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    return {"instruction": f"Multiply {a} by {b}.", "input": "", "output": str(a * b)}


def preference(rng: random.Random) -> dict:
    """One preference pair: a question, its right answer chosen, a wrong answer of another length rejected."""
    user, right = (arithmetic if rng.random() < 0.5 else inventory)(rng)
    while True:
        _, wrong = (arithmetic if rng.random() < 0.5 else inventory)(rng)
        if len(wrong) != len(right):
            return {"prompt": [{"role": "user", "content": user}], "chosen": [{"role": "assistant", "content": right}],
                    "rejected": [{"role": "assistant", "content": wrong}]}


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def main() -> None:
    data = Path(__file__).parent / "data"
    rng = random.Random(20261129)
    write(data / "chat.jsonl", [conversation(rng) for _ in range(800)])
    rng = random.Random(20261201)
    write(data / "instructions.jsonl", [instruction(rng) for _ in range(300)])
    rng = random.Random(20261203)
    write(data / "pairs.jsonl", [preference(rng) for _ in range(400)])


if __name__ == "__main__":
    main()
