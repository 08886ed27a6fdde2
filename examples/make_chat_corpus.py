#!/usr/bin/env python3
"""Writes a synthetic, learnable chat corpus in JSON Lines ({"messages": [...]}) for fine-tuning
tests and the issue #36 headline (docs/chat_data.md): multi-turn conversations whose answers are
determined by the questions — arithmetic, unit conversion, string reversal, capitals from a small
table, letter counting — so the loss on held-out conversations can fall.

    python3 examples/make_chat_corpus.py --out_dir=/tmp/chat --train=4000 --val=400 --seed=1
    bazel run //tools:prepare_data -- --input=/tmp/chat/train.jsonl \
        --tokenizer=MODEL_DIR --output=/tmp/chat/train.bin

Deterministic for a given seed (Python's random.Random; standard library only, no network).
Validation conversations are drawn from the same distribution with a different stream and are
disjoint from the training ones (no identical conversation in both). Written with Python 3.11.
"""
import argparse
import json
import os
import random

CAPITALS = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Portugal", "Lisbon"), ("Japan", "Tokyo"), ("China", "Beijing"), ("India", "New Delhi"),
    ("Canada", "Ottawa"), ("Brazil", "Brasília"), ("Argentina", "Buenos Aires"),
    ("Egypt", "Cairo"), ("Kenya", "Nairobi"), ("Australia", "Canberra"), ("Norway", "Oslo"),
    ("Sweden", "Stockholm"), ("Finland", "Helsinki"), ("Poland", "Warsaw"), ("Greece", "Athens"),
    ("Turkey", "Ankara"), ("Mexico", "Mexico City"), ("Peru", "Lima"), ("Chile", "Santiago"),
    ("Vietnam", "Hanoi"), ("Thailand", "Bangkok"), ("Ireland", "Dublin"), ("Austria", "Vienna"),
    ("Hungary", "Budapest"), ("Czechia", "Prague"), ("Morocco", "Rabat"),
]
WORDS = ["apple", "river", "planet", "garden", "silver", "window", "rocket", "pencil", "forest",
         "candle", "bridge", "dragon", "orange", "puzzle", "marble", "lantern", "violet", "harbor"]
SYSTEMS = [None, None, "You are a precise assistant. Answer briefly.",
           "You answer questions exactly, without extra words."]
UNITS = [("kilometers", "meters", 1000), ("meters", "centimeters", 100),
         ("kilograms", "grams", 1000), ("hours", "minutes", 60), ("minutes", "seconds", 60)]


def arithmetic(rng):
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    op = rng.choice(["+", "-", "*"])
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"What is {a} {op} {b}?", f"{a} {op} {b} = {value}."


def conversion(rng):
    big, small, factor = rng.choice(UNITS)
    n = rng.randint(1, 40)
    return f"How many {small} are in {n} {big}?", f"{n} {big} is {n * factor} {small}."


def reverse(rng):
    w = rng.choice(WORDS)
    return f"Reverse the word \"{w}\".", f"\"{w}\" reversed is \"{w[::-1]}\"."


def capital(rng):
    country, city = rng.choice(CAPITALS)
    return f"What is the capital of {country}?", f"The capital of {country} is {city}."


def count_letter(rng):
    w = rng.choice(WORDS)
    ch = rng.choice(sorted(set(w)))
    return (f"How many times does the letter '{ch}' appear in \"{w}\"?",
            f"The letter '{ch}' appears {w.count(ch)} time{'s' if w.count(ch) != 1 else ''} "
            f"in \"{w}\".")


TASKS = [arithmetic, conversion, reverse, capital, count_letter]


def conversation(rng):
    messages = []
    system = rng.choice(SYSTEMS)
    if system:
        messages.append({"role": "system", "content": system})
    for _ in range(rng.randint(1, 4)):
        q, a = rng.choice(TASKS)(rng)
        messages.append({"role": "user", "content": q})
        messages.append({"role": "assistant", "content": a})
    return {"messages": messages}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out_dir", required=True)
    ap.add_argument("--train", type=int, default=4000, help="training conversations")
    ap.add_argument("--val", type=int, default=400, help="held-out conversations")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.train <= 0 or args.val <= 0:
        ap.error("--train and --val must be positive")
    os.makedirs(args.out_dir, exist_ok=True)
    train_rng = random.Random(args.seed * 2)
    val_rng = random.Random(args.seed * 2 + 1)
    train = [conversation(train_rng) for _ in range(args.train)]
    seen = {json.dumps(c, sort_keys=True) for c in train}
    val = []
    while len(val) < args.val:
        c = conversation(val_rng)
        if json.dumps(c, sort_keys=True) not in seen:
            val.append(c)
    for name, rows in (("train.jsonl", train), ("val.jsonl", val)):
        with open(os.path.join(args.out_dir, name), "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(train)} training and {len(val)} held-out conversations to {args.out_dir}")


if __name__ == "__main__":
    main()
