#!/usr/bin/env bash
# Runs //tools:prepare_data on small inputs (good and bad) and checks what it prints and writes.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD/..}/patrickstar_cc"
TOOL="$RUNFILES/tools/prepare_data"
CHAT="$RUNFILES/trainer/data/testdata/chat"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*" >&2; exit 1; }

# A Qwen2.5-style model directory: the test tokenizer and the real Qwen2.5 template.
QWEN="$TMP/qwen"; mkdir -p "$QWEN"
cp "$CHAT/qwen_chat_tokenizer.json" "$QWEN/tokenizer.json"
python3 - "$CHAT/qwen2.5-7b-instruct.jinja" "$QWEN/tokenizer_config.json" <<'EOF'
import json, sys
json.dump({"chat_template": open(sys.argv[1]).read(), "eos_token": "<|im_end|>",
           "bos_token": None}, open(sys.argv[2], "w"))
EOF
# A directory without a chat template.
BARE="$TMP/bare"; mkdir -p "$BARE"
cp "$CHAT/qwen_chat_tokenizer.json" "$BARE/tokenizer.json"

GOOD="$TMP/good.jsonl"
cat > "$GOOD" <<'EOF'
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
{"prompt": "Capital of France?", "completion": "Paris"}

{"instruction": "Reverse", "input": "abc", "output": "cba"}
{"text": "plain text"}
EOF

OUT="$TMP/good.bin"
"$TOOL" --input="$GOOD" --tokenizer="$QWEN" --output="$OUT" --print_examples=2 > "$TMP/stdout" \
  || fail "good input refused: $(cat "$TMP/stdout")"
grep -q "prepare_data: 4 examples" "$TMP/stdout" || fail "summary: $(cat "$TMP/stdout")"
grep -q "chat template: qwen2.5 (from $QWEN/tokenizer_config.json)" "$TMP/stdout" \
  || fail "template: $(cat "$TMP/stdout")"
grep -q "skipped lines: 0" "$TMP/stdout" || fail "skips: $(cat "$TMP/stdout")"
[ "$(grep -c '"input_ids"' "$TMP/stdout")" = 2 ] || fail "print_examples: $(cat "$TMP/stdout")"
# The printed labels: -100 first, and the trained ids decode to the answer (checked in Python
# with the tokenizers-free rule: labels equal input_ids where not -100).
python3 - "$TMP/stdout" "$OUT" <<'EOF'
import json, struct, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for ex in lines:
    ids, labels = ex["input_ids"], ex["labels"]
    assert len(ids) == len(labels) and labels[0] == -100, ex
    assert all(l in (-100, i) for i, l in zip(ids, labels)), ex
    assert any(l != -100 for l in labels) and any(l == -100 for l in labels[1:]), ex
# The file: header, tokens, starts, trained flags agree with the printed examples.
data = open(sys.argv[2], "rb").read()
h = struct.unpack("<256i", data[:1024])
assert h[0] == 20261207 and h[1] == 1, h[:4]
width, n, e = h[2], h[4] | (h[5] << 32), h[6] | (h[7] << 32)
assert e == 4, e
tok = struct.unpack("<%d%s" % (n, "H" if width == 2 else "I"), data[1024:1024 + n * width])
off = 1024 + (n * width + 7) // 8 * 8
starts = struct.unpack("<%dq" % (e + 1), data[off:off + 8 * (e + 1)])
trained = data[off + 8 * (e + 1):]
assert len(trained) == n
for k, ex in enumerate(lines):
    a, b = starts[k], starts[k + 1]
    assert list(tok[a:b]) == ex["input_ids"], k
    assert [t if f else -100 for t, f in zip(tok[a:b], trained[a:b])] == ex["labels"], k
# The text example trains everything but its first token.
a, b = starts[3], starts[4]
assert trained[a] == 0 and all(trained[a + 1:b]), trained[a:b]
EOF

# --train_on_prompt trains more tokens than the default.
"$TOOL" --input="$GOOD" --tokenizer="$QWEN" --output="$TMP/p.bin" --train_on_prompt > "$TMP/p.out"
default_trained=$(sed -n 's/.* tokens, \([0-9]*\) trained.*/\1/p' "$TMP/stdout")
prompt_trained=$(sed -n 's/.* tokens, \([0-9]*\) trained.*/\1/p' "$TMP/p.out")
[ "$prompt_trained" -gt "$default_trained" ] || fail "train_on_prompt $prompt_trained <= $default_trained"

# Bad lines: refused naming FILE:LINE, nothing written; or skipped and counted by reason.
BAD="$TMP/bad.jsonl"
{
  echo '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}'
  echo 'not json'
  echo '{"foo": 1}'
  echo '{"messages": [{"role": "robot", "content": "x"}]}'
  echo '{"messages": []}'
  echo '{"messages": [{"role": "user", "content": "no answer"}]}'
  printf '{"text": "\xff"}\n'
} > "$BAD"
if "$TOOL" --input="$BAD" --tokenizer="$QWEN" --output="$TMP/bad.bin" 2> "$TMP/err"; then
  fail "bad input accepted"
fi
grep -q "bad.jsonl:2: .*\[not_json\]" "$TMP/err" || fail "error: $(cat "$TMP/err")"
[ ! -e "$TMP/bad.bin" ] || fail "a file was written for refused input"
"$TOOL" --input="$BAD" --tokenizer="$QWEN" --output="$TMP/bad.bin" --skip_bad_lines > "$TMP/skip" \
  || fail "skip_bad_lines failed"
grep -q "prepare_data: 1 examples" "$TMP/skip" || fail "skip summary: $(cat "$TMP/skip")"
grep -q "skipped lines: 6, empty_conversation 1, no_assistant 1, no_known_shape 1, not_json 1, not_utf8 1, unknown_role 1" \
  "$TMP/skip" || fail "skip counts: $(cat "$TMP/skip")"

# No chat template: conversations refused with the names known; text alone is fine;
# --chat_template supplies one.
if "$TOOL" --input="$GOOD" --tokenizer="$BARE" --output="$TMP/x.bin" 2> "$TMP/err"; then
  fail "conversation without a template accepted"
fi
grep -q "needs a chat template.*--chat_template=NAME (known: llama3, qwen2, qwen2.5, qwen3, mistral, gpt2)" \
  "$TMP/err" || fail "no-template error: $(cat "$TMP/err")"
echo '{"text": "only text"}' > "$TMP/text.jsonl"
"$TOOL" --input="$TMP/text.jsonl" --tokenizer="$BARE" --output="$TMP/t.bin" > /dev/null \
  || fail "text without template refused"
"$TOOL" --input="$GOOD" --tokenizer="$BARE" --output="$TMP/x.bin" --chat_template=qwen3 \
  > "$TMP/o" || fail "--chat_template refused"
grep -q "chat template: qwen3 (from --chat_template)" "$TMP/o" || fail "override: $(cat "$TMP/o")"

# An unrecognized template is refused naming the file and the known names.
UNK="$TMP/unk"; mkdir -p "$UNK"; cp "$BARE/tokenizer.json" "$UNK/"
echo '{% for m in messages %}{{ m.content }}{% endfor %}' > "$UNK/chat_template.jinja"
if "$TOOL" --input="$GOOD" --tokenizer="$UNK" --output="$TMP/x.bin" 2> "$TMP/err"; then
  fail "unknown template accepted"
fi
grep -q "chat_template.jinja' is an unrecognized template.*known templates: llama3" "$TMP/err" \
  || fail "unknown template error: $(cat "$TMP/err")"

# Empty flag values are refused, naming the flag.
if "$TOOL" --input="$GOOD" --tokenizer="$QWEN" --output="$TMP/x.bin" --chat_template= 2> "$TMP/err"; then
  fail "empty --chat_template accepted"
fi
grep -q "chat_template" "$TMP/err" || fail "empty flag error: $(cat "$TMP/err")"
if "$TOOL" --input="$GOOD" --tokenizer="$QWEN" --output="$TMP/x.bin" --train_on=first 2> "$TMP/err"; then
  fail "bad --train_on accepted"
fi
echo PASS
