#!/usr/bin/env python3
"""Reference renderings, tokens and trained flags for trainer/data/chat_template_test.cc.

Renders a fixed set of conversations with the real Jinja chat templates committed beside this
script (SOURCES.md), the way transformers' apply_chat_template does (an ImmutableSandboxedEnvironment
with trim_blocks and lstrip_blocks, `raise_exception`, `tojson`, add_generation_prompt=False, the
model's bos/eos tokens; `date_string` passed explicitly so Llama-3.2's template does not read the
clock), then tokenizes each rendering with the Python `tokenizers` library the way
`tokenizer(text, add_special_tokens=False)` does (special tokens recognized).

Trained flags are computed here independently of the C++ renderer, from the rendering's structure:
the bytes after each assistant header through the next end-of-turn token (llama3:
"<|start_header_id|>assistant<|end_header_id|>\\n\\n" .. "<|eot_id|>"; ChatML: "<|im_start|>assistant\\n"
.. "<|im_end|>"; gpt2: each assistant content + eos located in order); a token is trained iff
its character offsets overlap such a span (TRL's char_to_token rule), never token 0.

Tokenizers: small byte-level BPE files derived from the committed test tokenizers
(../tokenizers/llama3_tokenizer.json, qwen2_tokenizer.json, gpt2_tokenizer.json) by appending
the added tokens the chat templates use (Llama-3: <|start_header_id|>, <|end_header_id|>;
Qwen3: <think>, </think> as non-special added tokens, as Qwen3's tokenizer.json has them). Mistral
is tested on the rendering only: no Mistral v0.3 tokenizer is available offline.

Recorded with Python 3.11, jinja2 3.1.6, tokenizers 0.22.2 (/work/venv-peftnew):
    /work/venv-peftnew/bin/python trainer/data/testdata/chat/make_chat_vectors.py
Outputs (beside this script): llama3_chat_tokenizer.json, qwen_chat_tokenizer.json, vectors.json.
"""
import json
import os

import jinja2
import jinja2.ext
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
TOK = os.path.join(HERE, "..", "tokenizers")

TEMPLATES = {
    # family: (template file, bos, eos, tokenizer file or None)
    "llama3": ("llama3.1-8b-instruct.jinja", "<|begin_of_text|>", "<|eot_id|>",
               "llama3_chat_tokenizer.json"),
    "llama3-3.2": ("llama3.2-3b-instruct.jinja", "<|begin_of_text|>", "<|eot_id|>",
                   "llama3_chat_tokenizer.json"),
    "qwen2": ("qwen2-0.5b-instruct.jinja", None, "<|im_end|>", "qwen_chat_tokenizer.json"),
    "qwen2.5": ("qwen2.5-7b-instruct.jinja", None, "<|im_end|>", "qwen_chat_tokenizer.json"),
    "qwen3": ("qwen3-0.6b.jinja", None, "<|im_end|>", "qwen_chat_tokenizer.json"),
    "mistral": ("mistral-7b-instruct-v0.3.jinja", "<s>", "</s>", None),
    "gpt2": ("gpt2-default.jinja", None, "<|endoftext|>", "../tokenizers/gpt2_tokenizer.json"),
}


def sys_(c):
    return {"role": "system", "content": c}


def user(c):
    return {"role": "user", "content": c}


def asst(c):
    return {"role": "assistant", "content": c}


CONVERSATIONS = [
    ("system_one_turn", [sys_("You are a terse assistant."), user("What is 2+2?"), asst("4")]),
    ("no_system_three_turns", [user("Hi!"), asst("Hello. How can I help?"),
                               user("Name a prime."), asst("Seven."),
                               user("Another one?"), asst("Eleven, and 13 too.")]),
    ("empty_contents", [user(""), asst(""), user("x"), asst("")]),
    ("unicode", [sys_("Réponds en français. 日本語も OK."),
                 user("Café? 😀👩‍💻 naïve e\u0301 مرحبا"), asst("Oui — ¡claro! 你好，世界。\u00a0ok")]),
    ("whitespace", [sys_("  padded system \n"), user("\n\n  lead and trail  \t"),
                    asst("  spaced answer\n\n"), user("\u3000wide\u2028"), asst("\u0085x\u00a0")]),
    ("multiline", [user("Line 1\nLine 2\r\n\nLine 4"), asst("def f(x):\n    return x ** 2\n")]),
    ("later_system", [sys_("First."), user("a"), asst("b"), sys_("Second system."), user("c"),
                      asst("d")]),
    ("think_history", [user("q1"), asst("<think>\nr1\n</think>\n\nanswer one"), user("q2"),
                       asst("<think>\n\nreason two\n\n</think>\n\n\nanswer two"),
                       ]),
    ("think_after_last_query", [user("q"), asst("<think>plan</think>step one"),
                                asst("no think here"), asst("<think>\nlast reasoning\n</think>final")]),
    ("assistant_first", [asst("I speak first."), user("ok"), asst("fine")]),
    ("special_strings_in_text", [user("what is <think> and </think>?"), asst("tags: <b>x</b>")]),
]

# Which conversations each family can render (mistral's template drops system messages, which
# the C++ renderer refuses: those cases are expected errors).
NO_SYSTEM = {"mistral"}


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def render(template_text, messages, bos, eos, date_string):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False,
                                                                    indent=indent)
    env.globals["raise_exception"] = raise_exception
    t = env.from_string(template_text)
    kwargs = {"messages": messages, "add_generation_prompt": False, "date_string": date_string}
    if bos is not None:
        kwargs["bos_token"] = bos
    if eos is not None:
        kwargs["eos_token"] = eos
    return t.render(**kwargs)


def trained_spans(family, text, messages, eos):
    """Character spans [b, e) that are trained, from the rendering's structure."""
    spans = []
    if family.startswith("llama3"):
        head, end = "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"
    elif family.startswith("qwen"):
        head, end = "<|im_start|>assistant\n", "<|im_end|>"
    else:
        head = end = None
    if head is not None:
        pos = 0
        while True:
            b = text.find(head, pos)
            if b < 0:
                break
            b += len(head)
            e = text.index(end, b) + len(end)
            spans.append((b, e))
            pos = e
        return spans
    # gpt2 / mistral: locate each message in order.
    pos = 0
    for m in messages:
        if family == "mistral" and m["role"] == "user":
            pos = text.index(" [/INST]", text.index(" [INST] " + m["content"], pos)) + 8
            continue
        b = text.index(m["content"] + (" " + eos if family == "mistral" else eos), pos)
        e = b + len(m["content"]) + len(eos) + (1 if family == "mistral" else 0)
        if m["role"] == "assistant":
            spans.append((b, e))
        pos = e
    return spans


def derive_tokenizers():
    def add(src, dst, tokens):
        obj = json.load(open(os.path.join(TOK, src), encoding="utf-8"))
        next_id = max([*obj["model"]["vocab"].values(), *[a["id"] for a in obj["added_tokens"]]])
        for content, special in tokens:
            next_id += 1
            obj["added_tokens"].append({"id": next_id, "content": content, "single_word": False,
                                        "lstrip": False, "rstrip": False, "normalized": False,
                                        "special": special})
        with open(os.path.join(HERE, dst), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
    add("llama3_tokenizer.json", "llama3_chat_tokenizer.json",
        [("<|start_header_id|>", True), ("<|end_header_id|>", True)])
    add("qwen2_tokenizer.json", "qwen_chat_tokenizer.json", [("<think>", False), ("</think>", False)])


def main():
    derive_tokenizers()
    cases = []
    for family, (tfile, bos, eos, tokfile) in TEMPLATES.items():
        template_text = open(os.path.join(HERE, tfile), encoding="utf-8").read()
        tok = tokenizers.Tokenizer.from_file(os.path.join(HERE, tokfile)) if tokfile else None
        for name, messages in CONVERSATIONS:
            for date in (["26 Jul 2024", "01 Jan 2025"] if family.startswith("llama3")
                         else ["26 Jul 2024"]):
                case = {"family": family, "name": name, "messages": messages, "date": date}
                if family in NO_SYSTEM and any(m["role"] == "system" for m in messages):
                    case["error"] = True
                    cases.append(case)
                    continue
                text = render(template_text, messages, bos, eos, date)
                case["text"] = text
                if tok is not None:
                    enc = tok.encode(text, add_special_tokens=False)
                    spans = trained_spans(family, text, messages, eos)
                    last = spans[-1:] if spans else []
                    flags, flags_last = [], []
                    for i, (b, e) in enumerate(enc.offsets):
                        def hit(ss):
                            return int(i > 0 and any(b < se and sb < e for sb, se in ss))
                        flags.append(hit(spans))
                        flags_last.append(hit(last))
                    case["tokenizer"] = tokfile
                    case["ids"] = enc.ids
                    case["trained"] = flags
                    case["trained_last"] = flags_last
                cases.append(case)
    with open(os.path.join(HERE, "vectors.json"), "w", encoding="utf-8") as f:
        json.dump({"jinja2": jinja2.__version__, "tokenizers": tokenizers.__version__,
                   "cases": cases}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(len(cases), "cases")


if __name__ == "__main__":
    main()
