#!/usr/bin/env python3
"""Trains four small tokenizers offline and records the token ids that the reference libraries
(Hugging Face `tokenizers`, Google `sentencepiece`) give for hard test texts, for
trainer/data/hf_tokenizer_test.cc and sentencepiece_tokenizer_test.cc.

Recorded with tokenizers 0.23.3 and sentencepiece 0.2.3 from PyPI:

    python3 -m venv /tmp/venv-tok
    /tmp/venv-tok/bin/pip install tokenizers==0.23.3 sentencepiece==0.2.3 unicodedata2==16.0.0
    /tmp/venv-tok/bin/python3 trainer/data/testdata/make_tokenizer_fixtures.py

Nothing is downloaded: the training corpus (multilingual, emoji- and whitespace-heavy) is written by
this script from the fragments below with a fixed seed.

Outputs (in trainer/data/testdata/tokenizers/):
  gpt2_tokenizer.json    byte-level BPE, GPT-2 style: ByteLevel(use_regex) pre-tokenizer, merges
                         as "a b" strings (as GPT-2's own tokenizer.json), <|endoftext|>.
  llama3_tokenizer.json  Llama-3 style: Split(Llama-3 regex) + ByteLevel, ignore_merges, merges as
                         [a, b] pairs, special tokens after the vocabulary (as Llama-3's 128000..),
                         a vocabulary entry no merge reaches (to exercise ignore_merges), and
                         TemplateProcessing adding <|begin_of_text|>.
  qwen2_tokenizer.json   Qwen2 style: NFC normalizer, Split(Qwen2 regex: single digits) +
                         ByteLevel, special tokens and one non-special added token.
  llama2_tokenizer.model SentencePiece BPE in Llama-2's configuration (byte fallback, split digits,
                         dummy prefix, identity normalization, <unk>=0 <s>=1 </s>=2).
  cases.json             for each tokenizer and each test text (hex bytes): the reference ids
                         (special tokens in the text not recognized: `encode_special_tokens=True`,
                         as llm.c's data scripts encode), and for the tokenizer.json files also
                         the ids with special tokens recognized. Hand-written hard cases first,
                         then random strings drawn from the corpus's characters.
"""
import json
import os
import random
import shutil
import tempfile
import unicodedata

import sentencepiece as spm
import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "tokenizers")

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"
                  r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                 r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

FRAGMENTS = [
    # English with contractions in every case.
    "The quick brown fox jumps over the lazy dog.", "I'm sure they'll say it's fine, don't you?",
    "WE'RE HERE, YOU'VE SEEN IT, HE'D KNOW, SHE'LL GO, IT'S MINE, I'M DONE, DON'T!",
    "We've been there. You'd think so. They're not. I'll see.",
    # Numbers.
    "In 2024 there were 1234567 tokens and 3.14159 pies, costing $1,000,000.00 or 42%.",
    "Call 555-0199 or +44 20 7946 0958; ISBN 978-3-16-148410-0; 1st 2nd 3rd 4th.",
    "١٢٣٤٥ ۱۲۳ ½ ¾ Ⅻ ²³ 一二三 ０１２３",
    # Latin scripts with diacritics, precomposed and decomposed.
    "Größe, Straße, Übermut, Ärger, Öl. Café crème brûlée à la française; naïve façade.",
    "Cafe\u0301 cre\u0300me, n\u0303, a\u0308, o\u0302\u0323, Å vs A\u030a, ǅemo, ŉ.",
    "Zażółć gęślą jaźń. Příliš žluťoučký kůň úpěl ďábelské ódy. Ça va? Ñandú.",
    # Other scripts.
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Αβγό, ωραίο!",
    "مرحبا بالعالم! هذا نص عربي للاختبار، مع أرقام ١٢٣ وكلمات.",
    "שלום עולם, זה טקסט בעברית.",
    "नमस्ते दुनिया, यह हिन्दी का पाठ है। क्षत्रिय ज्ञान",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "你好，世界！这是中文文本，没有空格。北京欢迎你。",
    "こんにちは世界。カタカナとひらがな、漢字を混ぜた文です。",
    "안녕하세요 세계! 한국어 텍스트입니다.",
    # Emoji: ZWJ sequences, skin tones, flags, keycaps, variation selectors.
    "I ❤️ emoji 😀😃😄 👍🏽 👩‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 🇩🇪🇯🇵 1️⃣ ✌🏿 🧑🏻‍🤝‍🧑🏾",
    "Party 🎉🎉🎉 time! 🤖 says: beep-boop. 👋🏼👋🏼",
    # Whitespace of every kind, CRLF, tabs, indentation.
    "line one\r\nline two\r\n\r\nline four\r\n", "col1\tcol2\t\tcol3\t \t end",
    "    def f(x):\n        return x  # four spaces\n\tif y:\n\t\tpass\n",
    "a  b   c    d     e      f", "trailing spaces   \nand tabs\t\t\n\n\n",
    "non\u00a0breaking\u00a0space, ideographic\u3000space, em\u2003space, NEL\u0085end",
    "line\u2028separator\u2029paragraph", "\x0bvertical\x0ctab\x1cfile\x1dsep",
    # Code and punctuation.
    "if (a != b && c <= d) { return x->y[0] ?: \"str\"; } // comment",
    "<html><body class=\"x\">Hello &amp; bye</body></html>",
    "https://example.com/path?q=1&r=two#frag ... --- ___ *** !!! ???",
    "'quoted' \"double\" «guillemets» „German“ ‘curly’ — dash – en",
]

HARD_CASES = [
    "", " ", "  ", "\n", "\r\n", "hello world", "Hello World", "HELLO WORLD",
    "I'M HERE, YOU'RE THERE, WE'VE GONE, HE'LL COME, SHE'D SAY, IT'S, DON'T",
    "'s 'S 'sup 'Sup 'LL 'll 're 'Re ''s ' 'x", "it\u017fs 'ſ 'K",
    "1 12 123 1234 12345 123456789 1234567890123",
    "x1234y 3.14159 1,000,000 ١٢٣٤٥٦ ۱۲۳۴",
    "a\r\nb\r\n\r\nc\n\n\nd\r\r\re", "  \r\n  x", "x  \n  ", "\t\tindented\n\t\t\tmore",
    "word    word\t\tword \t \tword", "   leading", "trailing   ", "     ",
    "tab\there", "\ttab", " \t x", "a\u00a0b\u3000c\u2003d\u0085e\u2028f\u2029g",
    "\x0b\x0c\x1c\x1d\x1e\x1f", "!!!\n\n\nx", "??? \r\n\r\nabc", " !!x", "!x", " !",
    "Cafe\u0301 café n\u0303 ñ A\u030a Å e\u0301\u0301", "\u0301start", "x\u0308\u0308\u0308",
    "👩‍💻 👨‍👩‍👧‍👦 👍🏽👍🏿 🏳️‍🌈 🇩🇪🇯🇵 1️⃣ 🧑🏻‍🤝‍🧑🏾",
    "emoji😀inside😀words and😀 spaces", "😀😀😀😀😀😀😀😀",
    "你好，世界！中文没有空格。", "こんにちは世界カタカナ", "안녕하세요 세계",
    "مرحبا بالعالم ١٢٣", "שלום עולם", "नमस्ते दुनिया क्षत्रिय", "สวัสดีชาวโลก",
    "Größe Straße ǅemo ŉ Ǆ ǆ", "ﬁ ﬂ ﬆ ẞ ß",
    "mixed中文and English和数字123", "αβγ ΑΒΓ Ωmega", "Съешь ещё",
    "<|endoftext|>", "a<|endoftext|>b <|endoftext|> c", "<|im_start|>user\nhi<|im_end|>",
    "<|begin_of_text|>Hello<|end_of_text|>", "<tool_call>x</tool_call> <tool_call>",
    "<|endoftext", "<|<|endoftext|>|>", " XYZZY", "XYZZY XYZZYXYZZY",
    "def f(x):\r\n    return x ** 2  # square\r\n", "<a href=\"x\">y</a>",
    "$1,000.00 (50%) & more... -- [ok] {x} ~`|\\",
]

# Characters the random strings are drawn from: the corpus's and the hard cases' characters, with
# whitespace, apostrophes and digits over-represented.
RANDOM_EXTRA = ([" "] * 16 + ["\t", "\n", "\r", "\r\n", "\u00a0", "\u3000", "\u2003", "\u0085",
                              "\u2028", "\x0b", "\x1c"] * 3 + ["'"] * 8 + list("sStTdDmMlLrReEvV") +
                list("0123456789") * 2 + ["\u0301", "\u0308", "\u200d", "\ufe0f", "\U0001f3fd"] * 2)


def byte_decoder():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


BYTE_DECODER = byte_decoder()


def write_corpus(path):
    rng = random.Random(1234)
    lines = []
    for _ in range(4000):
        k = rng.randint(1, 4)
        parts = [rng.choice(FRAGMENTS) for _ in range(k)]
        sep = rng.choice([" ", "  ", "\t", " \t ", "\u3000", ""])
        lines.append(sep.join(parts))
    text = "\n".join(lines) + "\n"
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return text


def train_hf(corpus_path, pre_tokenizer, vocab_size, special, model_kwargs=None,
             normalizer=None):
    tok = Tokenizer(models.BPE(**(model_kwargs or {})))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([corpus_path], trainer)
    return tok


def save_json(obj, path):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


def make_gpt2(corpus_path):
    tok = train_hf(corpus_path, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                   700, ["<|endoftext|>"])
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    obj = json.loads(tok.to_str())
    # GPT-2's own tokenizer.json spells merges as "left right" strings.
    obj["model"]["merges"] = [m if isinstance(m, str) else f"{m[0]} {m[1]}"
                              for m in obj["model"]["merges"]]
    path = os.path.join(OUT, "gpt2_tokenizer.json")
    save_json(obj, path)
    return path


def make_llama3(corpus_path):
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok = train_hf(corpus_path, pre, 900, [], model_kwargs={"ignore_merges": True})
    obj = json.loads(tok.to_str())
    assert obj["model"]["ignore_merges"] is True
    vocab = obj["model"]["vocab"]
    # A vocabulary entry that no merge produces: only ignore_merges gives it as one token.
    vocab["ĠXYZZY"] = len(vocab)
    # Llama-3's special tokens follow its 128000 BPE tokens. (The library gives an added token that
    # is not in model.vocab the next id after the vocabulary, whatever the file says.)
    first = len(vocab)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                "<|eot_id|>"]
    obj["added_tokens"] = [
        {"id": first + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True} for i, s in enumerate(specials)]
    obj["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [first],
                                                  "tokens": ["<|begin_of_text|>"]}}}
    path = os.path.join(OUT, "llama3_tokenizer.json")
    save_json(obj, path)
    return path


def make_qwen2(corpus_path):
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok = train_hf(corpus_path, pre, 800, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                   normalizer=normalizers.NFC())
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # Qwen2.5 has added tokens that are not special (e.g. <tool_call>).
    tok.add_tokens([tokenizers.AddedToken("<tool_call>", special=False, normalized=False),
                    tokenizers.AddedToken("</tool_call>", special=False, normalized=False)])
    obj = json.loads(tok.to_str())
    path = os.path.join(OUT, "qwen2_tokenizer.json")
    save_json(obj, path)
    return path


def make_llama2(corpus_path, workdir):
    prefix = os.path.join(workdir, "llama2")
    spm.SentencePieceTrainer.train(
        input=corpus_path, model_prefix=prefix, model_type="bpe", vocab_size=800,
        character_coverage=0.98, byte_fallback=True, split_digits=True,
        split_by_unicode_script=True, split_by_number=True, allow_whitespace_only_pieces=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, max_sentence_length=100000,
        minloglevel=2)
    path = os.path.join(OUT, "llama2_tokenizer.model")
    shutil.copyfile(prefix + ".model", path)
    return path


def random_texts(corpus, rng, count):
    chars = sorted(set(corpus) | set("".join(HARD_CASES)))
    pool = chars + RANDOM_EXTRA
    texts = []
    for _ in range(count):
        texts.append("".join(rng.choice(pool) for _ in range(rng.randint(0, 24))))
    return texts


def check_unicode_classes(path):
    """Asserts that the library's pre-tokenizer classifies every code point as
    trainer/data/internal/unicode_tables.inc (generated from unicodedata2) and unicode_classes.cc's
    White_Space list do: "!" + c + "!" is one piece for "other", two ("!c", "!") for a letter,
    three for a number or whitespace."""
    import unicodedata2
    white_space = {0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000}
    white_space |= set(range(0x09, 0x0E)) | set(range(0x2000, 0x200B)) | {0x20}
    tok = Tokenizer.from_file(path)
    for cp in range(0x21, 0x110000):
        if 0xD800 <= cp <= 0xDFFF or cp in (0x0A, 0x0D):
            continue
        cat = unicodedata2.category(chr(cp))[0]
        want = 2 if cat == "L" else 3 if cat == "N" or cp in white_space else 1
        got = len(tok.pre_tokenizer.pre_tokenize_str("!" + chr(cp) + "!"))
        assert got == want, (hex(cp), cat, got, want)


def main():
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as workdir:
        corpus_path = os.path.join(workdir, "corpus.txt")
        corpus = write_corpus(corpus_path)
        paths = {
            "gpt2": make_gpt2(corpus_path),
            "llama3": make_llama3(corpus_path),
            "qwen2": make_qwen2(corpus_path),
        }
        sp_path = make_llama2(corpus_path, workdir)
    check_unicode_classes(paths["llama3"])

    rng = random.Random(20240801)
    texts = [(t, "hard") for t in HARD_CASES] + [(t, "random")
                                                 for t in random_texts(corpus, rng, 150)]
    result = {"tokenizers_version": tokenizers.__version__,
              "sentencepiece_version": spm.__version__,
              "python_unicode_version": unicodedata.unidata_version, "tokenizers": {}}
    for name, path in paths.items():
        tok = Tokenizer.from_file(path)
        special = Tokenizer.from_file(path)
        tok.encode_special_tokens = True  # "<|endoftext|>" in the text is ordinary text
        cases = []
        for text, kind in texts:
            ids = tok.encode(text, add_special_tokens=False).ids
            ids_special = special.encode(text, add_special_tokens=False).ids
            case = {"kind": kind, "hex": text.encode("utf-8").hex(), "ids": ids}
            if kind == "hard":  # the pre-tokenizer's pieces, as bytes (ByteLevel chars undone)
                normalized = tok.normalizer.normalize_str(text) if tok.normalizer else text
                pieces = tok.pre_tokenizer.pre_tokenize_str(normalized)
                case["pieces_hex"] = [bytes(BYTE_DECODER[c] for c in piece).hex()
                                      for piece, _ in pieces]
            if ids_special != ids:
                case["ids_special"] = ids_special
            # The decode round trip holds for these tokenizers except where NFC changed the text.
            decoded = tok.decode(ids, skip_special_tokens=False)
            normalized = tok.normalizer.normalize_str(text) if tok.normalizer else text
            assert decoded == normalized, (name, text, decoded)
            cases.append(case)
        bos = Tokenizer.from_file(path).encode("x", add_special_tokens=True).ids
        result["tokenizers"][os.path.basename(path)] = {
            "vocab_size": tok.get_vocab_size(with_added_tokens=True),
            "with_special_tokens_x": bos, "cases": cases}

    sp = spm.SentencePieceProcessor(model_file=sp_path)
    cases = []
    for text, kind in texts:
        ids = sp.encode(text, out_type=int)
        assert sp.decode(ids) == text or text.startswith(" ") or not text.strip(" ") == text, text
        cases.append({"kind": kind, "hex": text.encode("utf-8").hex(), "ids": ids,
                      "decoded_hex": sp.decode(ids).encode("utf-8").hex()})
    # Bytes that are not UTF-8: the library's own handling, through its bytes interface.
    for data in [b"ab\xffcd", b"\xc0\xaf", b"x\xe2\x82", b"\xed\xa0\x80y", b"\xf0\x9f\x98 z"]:
        try:
            ids = sp.encode(data, out_type=int)
        except Exception as e:  # noqa: BLE001 -- record that the library refuses it
            print(f"sentencepiece refuses {data!r}: {e}")
            continue
        cases.append({"kind": "invalid_utf8", "hex": data.hex(), "ids": ids})
    result["tokenizers"]["llama2_tokenizer.model"] = {
        "vocab_size": sp.get_piece_size(), "bos_id": sp.bos_id(), "eos_id": sp.eos_id(),
        "unk_id": sp.unk_id(), "cases": cases}

    with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, separators=(",", ":"))
        f.write("\n")
    for name in sorted(os.listdir(OUT)):
        print(f"{name}: {os.path.getsize(os.path.join(OUT, name))} bytes")


if __name__ == "__main__":
    main()
