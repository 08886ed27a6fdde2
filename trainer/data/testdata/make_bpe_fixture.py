#!/usr/bin/env python3
"""Writes the tiny GPT-2 BPE fixture and its expected encodings, computed by a Python
re-implementation that shares no code with the C++ tokenizer:

  - pre-tokenization with Python's `re` engine running GPT-2's pattern, where \\p{L} and \\p{N}
    are spelled out as character classes from unicodedata's general categories and \\s as the
    Unicode White_Space property (what trainer/data/tokenizer.h documents);
  - invalid UTF-8 decoded with "surrogateescape" (each bad byte one non-letter character);
  - bytes_to_unicode and bpe() following OpenAI's gpt-2/src/encoder.py.

Outputs (in this directory): tiny_vocab.json, tiny_merges.txt, bpe_cases.json. Regenerate with

    python3 trainer/data/testdata/make_bpe_fixture.py
"""
import json
import os
import random
import re
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2 ** 8):
        if b not in bs:
            bs.append(b)
            cs.append(2 ** 8 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs])), bs


def get_pairs(word):
    return set(zip(word, word[1:]))


def bpe(token, bpe_ranks):
    word = tuple(token)
    pairs = get_pairs(word)
    if not pairs:
        return list(word)
    while True:
        bigram = min(pairs, key=lambda pair: bpe_ranks.get(pair, float("inf")))
        if bigram not in bpe_ranks:
            break
        first, second = bigram
        new_word = []
        i = 0
        while i < len(word):
            try:
                j = word.index(first, i)
                new_word.extend(word[i:j])
                i = j
            except ValueError:
                new_word.extend(word[i:])
                break
            if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                new_word.append(first + second)
                i += 2
            else:
                new_word.append(word[i])
                i += 1
        word = tuple(new_word)
        if len(word) == 1:
            break
        pairs = get_pairs(word)
    return list(word)


def category_class(prefix):
    parts = []
    start = None
    for cp in range(0x110000):
        inside = unicodedata.category(chr(cp)).startswith(prefix)
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            parts.append((start, cp - 1))
            start = None
    if start is not None:
        parts.append((start, 0x10FFFF))
    return "".join(f"\\U{a:08X}-\\U{b:08X}" for a, b in parts)


WHITE_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680),
               (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F),
               (0x3000, 0x3000)]


def make_pattern():
    L = category_class("L")
    N = category_class("N")
    S = "".join(f"\\U{a:08X}-\\U{b:08X}" for a, b in WHITE_SPACE)
    return re.compile(
        f"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+|[{S}]+(?![^{S}])|[{S}]+")


# Merges in rank order. "ab a" deliberately comes before "a b", which creates its left part:
# encoder.py merges every "a b" of a word before looking at "ab a" (checked by "abab").
MERGES = [
    ("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"),
    ("Ġ", "w"), ("Ġw", "o"), ("r", "l"), ("Ġwo", "rl"), ("Ġworl", "d"),
    ("b", "c"), ("ab", "a"), ("a", "b"),
    ("Ġ", "Ġ"), ("ĠĠ", "ĠĠ"), ("Ċ", "Ċ"), ("Ã", "©"), ("'", "s"),
    ("Ġ", "t"), ("Ġt", "h"), ("Ġth", "e"), ("e", "r"), ("Ġthe", "r"), ("Ġther", "e"),
    ("1", "2"), ("12", "3"),
    # Multi-byte characters: "中" is E4 B8 AD, "😀" is F0 9F 98 80.
    ("ä", "¸"), ("ä¸", "Ń"), ("ð", "Ł"), ("ðŁ", "ĺ"), ("ðŁĺ", "Ģ"),
    ("Ġ", "ä¸Ń"), ("i", "n"), ("Ġ", "in"), ("o", "n"), ("in", "g"),
]


def main():
    byte_encoder, bs = bytes_to_unicode()
    vocab = {}
    for b in bs:  # GPT-2's order: the first 256 ids are the byte symbols in bs order
        vocab[byte_encoder[b]] = len(vocab)
    for left, right in MERGES:
        for token in (left, right, left + right):
            if token not in vocab:
                vocab[token] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    ranks = {pair: i for i, pair in enumerate(MERGES)}

    with open(os.path.join(HERE, "tiny_vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False, indent=0)
        f.write("\n")
    with open(os.path.join(HERE, "tiny_merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for left, right in MERGES:
            f.write(f"{left} {right}\n")

    pattern = make_pattern()

    def encode(data):
        text = data.decode("utf-8", errors="surrogateescape")
        pieces, ids = [], []
        for m in pattern.finditer(text):
            piece = m.group(0).encode("utf-8", errors="surrogateescape")
            pieces.append(piece)
            for symbol in bpe("".join(byte_encoder[b] for b in piece), ranks):
                ids.append(vocab[symbol])
        assert b"".join(pieces) == data
        return pieces, ids

    hand = [
        "hello world", "abab", "aba", "abc", " there", "hello's", "123456", "café",
        "a\n\n\nb", "    x", "      ", "Hello World", "don't we'll I'M 'S", "中 中中",
        "😀😀!", "x\u00a0y", "a\u3000\u3000b", "½Ⅻ٣4", "e\u0301", "\x1c\x1d",
        "ǅemo ʰx", "  \t\n hello\r\n", "'", "''s", " '", "?!... ok", "in going ing",
    ]
    alphabet = (["hello", "world", "the", "there", "ab", "abc", "in", "ing", "on", "123", "'s",
                 "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'x", "é", "中", "😀", "Ж", "ǅ",
                 "ʰ", "٣", "Ⅻ", "½", "\u0301", "!", "?", ".", ",", "-", "_", "$", "(", ")"] +
                [" "] * 12 + ["\t", "\n", "\r", "\u00a0", "\u2003", "\u3000", "\u0085",
                              "\u2028", "\x1c", "\x0b"] + list("abcdehlnorstwxyz0123456789"))
    invalid = [b"\xff", b"\xc0", b"\xc0\xaf", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
               b"\x80", b"\xf0\x9f\x98"]
    rng = random.Random(20240520)
    cases = []
    for text in hand:
        data = text.encode("utf-8")
        pieces, ids = encode(data)
        cases.append({"text_hex": data.hex(), "pieces_hex": [p.hex() for p in pieces],
                      "ids": ids})
    for _ in range(300):
        parts = []
        for _ in range(rng.randint(0, 25)):
            if rng.random() < 0.05:
                parts.append(rng.choice(invalid))
            else:
                parts.append(rng.choice(alphabet).encode("utf-8"))
        data = b"".join(parts)
        pieces, ids = encode(data)
        cases.append({"text_hex": data.hex(), "pieces_hex": [p.hex() for p in pieces],
                      "ids": ids})
    with open(os.path.join(HERE, "bpe_cases.json"), "w") as f:
        json.dump({"unicode_version": unicodedata.unidata_version, "cases": cases}, f, indent=0)
        f.write("\n")
    print(f"{len(vocab)} tokens, {len(MERGES)} merges, {len(cases)} cases")


if __name__ == "__main__":
    main()
