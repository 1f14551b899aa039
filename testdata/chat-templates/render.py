"""Renders every template here for the conversations of `expected.json` with
transformers' own chat-template renderer (`apply_chat_template`'s:
jinja2, trim_blocks and lstrip_blocks, its `raise_exception`), and writes
the texts there: the reference colo-model's `Tokenizer::render_chat` is
tested against (`crates/model/tests/chat_template.rs`).

The templates are the chat templates of Qwen2.5-Instruct, Qwen3 and
Llama-3.1-Instruct as their tokenizer files ship them.

Usage (transformers and jinja2 in any environment; not colo dependencies):
    python3 render.py   # in testdata/chat-templates
"""
import glob
import json
import os

from transformers.utils.chat_template_utils import render_jinja_template

CONVERSATIONS = [
    [{"role": "user", "content": "What is 3 + 4?"}],
    [
        {"role": "system", "content": "  Be brief.  "},
        {"role": "user", "content": "Ann has 3 boxes of 12 pencils. How many?\nThink first."},
    ],
    [
        {"role": "user", "content": "2 + 2?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
        {"role": "user", "content": "and 3 + 3?"},
    ],
]
BOS = {"qwen2.5-instruct": None, "qwen3": None, "llama-3.1-instruct": "<|begin_of_text|>"}
EOS = {"qwen2.5-instruct": "<|im_end|>", "qwen3": "<|im_end|>", "llama-3.1-instruct": "<|eot_id|>"}

here = os.path.dirname(os.path.abspath(__file__))
cases = []
for path in sorted(glob.glob(os.path.join(here, "*.jinja"))):
    name = os.path.basename(path)[: -len(".jinja")]
    with open(path) as f:
        template = f.read()
    for i, messages in enumerate(CONVERSATIONS):
        for gen in (True, False):
            text = render_jinja_template(
                [messages],
                chat_template=template,
                add_generation_prompt=gen,
                bos_token=BOS[name],
                eos_token=EOS[name],
            )[0][0]
            cases.append(
                {
                    "template": name,
                    "bos_token": BOS[name],
                    "eos_token": EOS[name],
                    "messages": messages,
                    "add_generation_prompt": gen,
                    "text": text,
                }
            )
with open(os.path.join(here, "expected.json"), "w") as f:
    json.dump(cases, f, indent=1, ensure_ascii=False)
    f.write("\n")
print(len(cases), "cases")
