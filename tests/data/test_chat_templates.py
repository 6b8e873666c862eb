#!/usr/bin/python3
"""Proves that `strata chat render` renders REAL chat templates (tests/data/chat_templates/, their
sources in README.md there) byte for byte as transformers does: python3-jinja2 configured exactly
as transformers' _compile_jinja_template (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, its tojson, raise_exception, strftime_now and a `generation`
extension that renders its body) renders each template over several conversations (system / no
system / multi-turn / add_generation_prompt / unicode / braces and newlines / tools), and strata
must give the same bytes; where jinja2 raises, strata must refuse with one FILE:LINE error.
`corpus` does the same for the 47 other templates llama.cpp carries (chat_templates/llama.cpp/).
Then `--segments` is checked: the pieces join to the full render, and the trained pieces are the
assistant contents each followed by the template's end-of-turn text, as located by an independent
prefix computation in Python.

usage: test_chat_templates.py STRATA_EXE [render|segments|errors|constructs|corpus]
"""
import json
import os
import re
import subprocess
import sys
import tempfile
from datetime import datetime

try:
    import jinja2
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("python3-jinja2 is missing (scripts/setup.sh installs it): skipped")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "chat_templates")


# ---- transformers' environment (transformers/utils/chat_template_utils.py) ------------------
class GenerationBlocks(Extension):
    """{% generation %}...{% endgeneration %}: transformers' AssistantTracker renders the body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


GEN_BEGIN, GEN_END = "\x00gen[", "]gen\x00"


class MarkedGenerationBlocks(GenerationBlocks):
    """The same, but the body comes back between markers: where the trained spans lie."""

    def _render(self, caller):
        return GEN_BEGIN + caller() + GEN_END


def compile_like_transformers(source, generation=GenerationBlocks):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def render_reference(template, record, special, add_generation_prompt):
    variables = dict(record)
    variables.setdefault("tools", None)
    variables.setdefault("documents", None)
    variables.update(special)
    variables["add_generation_prompt"] = add_generation_prompt
    return template.render(**variables)


# ---- the templates and their special tokens ---------------------------------------------------
LLAMA3 = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
GEMMA = {"bos_token": "<bos>", "eos_token": "<eos>"}
DEEPSEEK = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}
MISTRAL = {"bos_token": "<s>", "eos_token": "</s>"}
# file -> (special tokens, the text that ends an assistant turn in the full render)
CASES = {
    "meta-llama-Llama-3.1-8B-Instruct.jinja": (LLAMA3, "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": (LLAMA3, "<|eot_id|>"),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": (LLAMA3, "<|eot_id|>"),
    "Qwen-Qwen2.5-7B-Instruct.jinja": ({"bos_token": "", "eos_token": "<|im_end|>"}, "<|im_end|>\n"),
    "mistralai-Mistral-7B-Instruct-v0.2.jinja": (MISTRAL, "</s>"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": (MISTRAL, "</s>"),
    "google-gemma-7b-it.jinja": (GEMMA, "<end_of_turn>\n"),
    "google-gemma-2-2b-it.jinja": (GEMMA, "<end_of_turn>\n"),
    "google-gemma-3-it.jinja": (GEMMA, "<end_of_turn>\n"),
    "microsoft-Phi-3-mini.jinja": ({"bos_token": "<s>", "eos_token": "<|endoftext|>"}, "<|end|>\n"),
    "microsoft-Phi-3.5-mini-instruct.jinja": ({"bos_token": "<s>", "eos_token": "<|endoftext|>"}, "<|end|>\n"),
    "deepseek-ai-DeepSeek-V2.jinja": (DEEPSEEK, "<｜end▁of▁sentence｜>"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": (DEEPSEEK, "<｜end▁of▁sentence｜>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": (DEEPSEEK, "<｜end▁of▁sentence｜>"),
    "teknium-OpenHermes-2.5-Mistral-7B-chatml.jinja": ({"bos_token": "<s>", "eos_token": "<|im_end|>"}, "<|im_end|>\n"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ({"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"}, "<|im_end|>\n"),
    "HuggingFaceH4-zephyr-7b-beta.jinja": (MISTRAL, "</s>\n"),
}

# What the prefix rule puts before an assistant's content: DeepSeek V2's generation prompt is
# "Assistant:" while its turns read "Assistant: " + content, so the space is the model's to learn.
TURN_LEAD = {"deepseek-ai-DeepSeek-V2.jinja": " "}
# Text a template appends after the whole conversation (Phi-3.5 ends with eos_token when no
# generation prompt follows): it belongs to the last assistant turn when that turn ends the chat.
FINAL_SUFFIX = {"microsoft-Phi-3.5-mini-instruct.jinja": "<|endoftext|>"}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather in a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "description": "The city, e.g. Oslo"},
                                      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                       "required": ["city"]},
    },
}

CONVERSATIONS = [
    {"messages": [{"role": "system", "content": "You are a terse assistant."},
                  {"role": "user", "content": "What is 2+2?"},
                  {"role": "assistant", "content": "4."},
                  {"role": "user", "content": "And 3+3?"},
                  {"role": "assistant", "content": "6."}]},
    {"messages": [{"role": "user", "content": "Hello there"},
                  {"role": "assistant", "content": "Hi! How can I help?"}]},
    {"messages": [{"role": "user", "content": "Name a prime."}]},
    {"messages": [{"role": "user", "content": "Grüß dich — 你好, ça va? 🌍"},
                  {"role": "assistant", "content": "Très bien, danke! 👍 ありがとう"}]},
    {"messages": [{"role": "system", "content": "Quote templates literally."},
                  {"role": "user", "content": "Show {{ x }} and {% if y %}z{% endif %} and {# c #}\n\nthen\ttabs\n"},
                  {"role": "assistant", "content": "Here: {{ x }}}} {%- raw -%} '\"\\ end\nline two"}]},
    {"messages": [{"role": "user", "content": "Weather in Oslo?"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [{"type": "function",
                                   "function": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}}]},
                  {"role": "tool", "name": "get_weather", "content": "{\"temperature\": -3}"},
                  {"role": "assistant", "content": "It is -3 °C in Oslo."}],
     "tools": [WEATHER_TOOL]},
    {"messages": [{"role": "system", "content": "Use tools when needed."},
                  {"role": "user", "content": "Weather in Bergen?"}],
     "tools": [WEATHER_TOOL]},
    # Content as a list of parts (the multimodal message shape) and a tool call with null content.
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "image"},
                                               {"type": "text", "text": "this."}]},
                  {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}]},
    {"messages": [{"role": "user", "content": "Weather?"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [{"id": "call_1", "type": "function",
                                   "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                  {"role": "assistant", "content": "Sunny."}],
     "tools": [WEATHER_TOOL]},
]


# Constructs one by one, beyond the model templates: each is rendered by jinja2 and by strata
# (--template); the bytes must match, or both must refuse.
EDGE_CASES = [
    ("{{ messages|length }}|{{ messages[0]['content'] is string }}", {"messages": [{"role": "user", "content": "x"}]}),
    ("{%- set x = 'a' -%}\n  {{ x }}", {}),
    ("  {# c #}\nA\n\t{% if true %}x{% endif %}", {}),
    ("a {% if true %}b{% endif %}\n   {% if true %}c{% endif %}", {}),
    ("   {% if true %}x{% endif %}", {}),
    ("  {{ 'x' }}\n  {% set y = 1 %}\n", {}),
    ("{{ \"a\" 'b' }}|{{ 1.0 }}|{{ 1e20 }}|{{ 0.1 + 0.2 }}|{{ 3 / 1 }}|{{ 1e-5 }}|{{ 10000000000000000.0 }}|{{ 123456789.123 }}|{{ 1.5e300 * 1.5e300 }}", {}),
    ("{{ [1,2] ~ 'x' }}|{{ {'a': 1}|tojson(indent=4) }}|{{ 'abc'|first }}", {}),
    ("{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }}{% endfor %}", {}),
    ("[{{ x.y }}]|{{ none|string }}|{{ none ~ '' }}|{{ true + 1 }}", {"x": None}),
    ("{% if x is defined and x %}d{% else %}u{% endif %}{{ range(3)|list }}{{ range(1, 10, 3)|list }}{{ 'a' == 'a' == 'a' }}", {}),
    ("{% if a %}  \n{% endif %}x{{- '\n' -}}  y", {"a": True}),
    ("a { b } {x} }} %}", {}),
    ("{%- if true %}\n\n  x{% endif %}", {}),
    ("{% set a, b = 1, 2 %}{{ a }}{{ b }}|{{ (1, 2)|list }}|{{ messages|map(attribute='role')|join(',') }}", {"messages": [{"role": "user"}, {"role": "assistant"}]}),
    ("[{{ loop }}]|{{ [3, 1, 2]|sort }}|{{ 'Hello World x'|wordcount }}|{{ ['b', 'A', 'a']|sort }}", {}),
    ("{{ -1 // 2 }}|{{ 7 % -3 }}|{{ 2 ** -1 }}|{{ 7.5 // 2 }}|{{ -7.5 % 2 }}|{{ 2 * 3.0 }}|{{ 10 - 0.5 }}", {}),
    ("{{ 'é'|upper }}|{{ 'ÉCOLE'|lower }}|{{ 'ßa'|upper }}|{{ 'émile zola'|title }}|{{ 'éA'|capitalize }}", {}),
    ("{% macro m(a, b=2) %}{{ a }}-{{ b }}{% endmacro %}{{ m(1) }}|{{ m(b=3, a=4) }}|{{ m('x')|upper }}", {}),
    ("{% for m in messages %}{% if not loop.first %}, {% endif %}{{ m.role }}:{{ m.content|default('none', true) }}{% endfor %}", {"messages": [{"role": "a", "content": ""}, {"role": "b", "content": None}]}),
    ("{{ tools|tojson }}", {"tools": [{"name": "f", "weights": [0.5, 1e-7, 2.0, 100.0], "ok": True, "nested": {"z": None, "a": "\u2028 \x7f \x01"}}]}),
    ("{{ d|tojson(indent=2) }}", {"d": {"list": [], "obj": {}, "s": "a/b"}}),
    ("{% set ns = namespace(items=[]) %}{% for i in range(3) %}{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.items }}", {}),
    ("{{ messages[1:]|length }}|{{ messages[::2]|map(attribute='content')|list }}|{{ 'abcdef'[1:-1:2] }}|{{ 'abc'[5:] }}|{{ [1,2,3][-2:] }}", {"messages": [{"content": "a"}, {"content": "b"}, {"content": "c"}]}),
    ("{% for x in d %}{{ x }}{% endfor %}|{% for x in d|dictsort %}{{ x }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("{{ 'a\\nb'.split('\\n') }}|{{ 'a b'.split(none, 1) }}|{{ 'x'.join(['1', '2']) }}|{{ ' a '.strip() ~ '|' }}|{{ 'aXbXc'.split('X', 1) }}", {}),
    ("{{ content.split('</think>')[-1].lstrip('\\n') }}", {"content": "<think>hm</think>\n\nanswer"}),
    ("{% for x in [1, 2, 3] if x > 1 %}{{ loop.index }}{{ x }}{% else %}none{% endfor %}", {}),
    ("{{ x if x is not none else 'dflt' }}|{{ (y or 'z')|upper }}", {"x": None, "y": ""}),
    ("{{ 1 if true else 2 if false else 3 }}|{{ [] or {} or 0 or 'last' }}|{{ 'a' and '' }}", {}),
    ("{{ '{{' }} {{ '}}' }} {{ '{%' }}", {}),
    ("{% raw %}  {% if %}{{ x }}\n{% endraw %}\nafter", {}),
    ("{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}{{ 1 == 1.0 }}{{ true == 1 }}{{ none == none }}{{ 'a' != 'b' }}", {}),
    ("{{ x|int + 1 }}|{{ '3.7'|int }}|{{ 3.7|int }}|{{ true|int }}|{{ 'abc'|float }}|{{ 5|float }}", {"x": "41"}),
    ("{{ [1, 2, 3]|sum }}|{{ [4, 2, 9]|min }}|{{ [4, 2, 9]|max }}|{{ ['a', 'b']|reverse|join }}|{{ 'abc'|reverse }}", {}),
    ("{{ messages|selectattr('content', 'defined')|list|length }}|{{ messages|rejectattr('content')|list|length }}|{{ messages|selectattr('role', 'in', ['user', 'tool'])|list|length }}", {"messages": [{"role": "user", "content": "x"}, {"role": "tool"}, {"role": "a", "content": ""}]}),
    ("{{ 'x' is lower }}{{ 'X' is upper }}{{ {} is sequence }}{{ 'a' is iterable }}{{ 3 is gt 2 }}{{ 3 is ge 3 }}{{ 2 is lt 3 }}{{ 2 is ne 3 }}{{ none is sameas none }}", {}),
    ("{{ d.items()|list }}|{{ d|list }}|{{ d.get('a', 'x') }}", {"d": {"k": [1]}}),
    ("{{ {'role': 'a'} == {'role': 'a'} }}|{{ [{'a': 1}] == [{'a': 1}] }}|{{ 'ab' in ['ab'] }}|{{ 'a' in {'a': 1} }}", {}),
    ("x\n{%- for i in range(2) %}\n  {{ i }}\n{%- endfor %}\ny", {}),
    ("{% for i in range(2) -%}\n  {{ i }}\n{% endfor -%}\n  z", {}),
    ("{%- macro tool_line(t) -%}\n- {{ t.name }}\n{%- endmacro -%}\n{% for t in tools %}\n{{ tool_line(t) }}\n{% endfor %}", {"tools": [{"name": "a"}, {"name": "b"}]}),
    ("{{ \"it's\" }}|{{ 'say \"hi\"' }}|{{ 'tab\\there' }}|{{ 'uni\\u00e9\\U0001F600' }}|{{ 'oct\\101' }}|{{ 'keep\\q' }}", {}),
    ("{{ [1, 'a', none, true, 1.5, [2], {'k': 'v'}] }}|{{ ('a',) }}|{{ {'a': (1, 2)} }}|{{ \"it's\"|list }}", {}),
    ("{{ '%d items'|replace('%d', '3') }}|{{ 'aaa'|replace('a', 'b', 1) }}|{{ 'abc'|replace('', '-') }}", {}),
    ("{% set t %}\n  block {{ 1 }}\n{% endset %}[{{ t }}]", {}),
    ("{{ 'Hello'|indent(4, true) }}|{{ 'a\n\nb'|indent(2, blank=true) }}|{{ 'x\ny\n'|indent }}", {}),
    ("{{ 5|round }}|{{ 2.675|round(2) }}|{{ 3.5|round }}|{{ 4.5|round }}|{{ -2.5|round }}|{{ 2.4|round(0, 'ceil') }}|{{ 2.6|round(0, 'floor') }}", {}),
    ("{{ strftime_now('%Y') | length }}", {}),
    ("{{ [1, 2]|first }}{{ []|first }}{{ ''|length }}{{ none is defined }}{{ x|length }}", {}),
    ("{{ 'A-B_c d'|title }}|{{ \"they're bill's\"|title }}|{{ 'x1y'.title() }}", {}),
    ("{{ 'a,b,,c'.split(',') }}|{{ '  '.split() }}|{{ ''.split(',') }}|{{ 'abc'.count('') }}|{{ 'aaa'.count('a') }}|{{ 'héllo'.find('l') }}", {}),
    ("{{ 'abc'.startswith(('x', 'a')) }}|{{ 'abc'.endswith('bc') }}|{{ 'AbC'.isupper() }}|{{ '12'.isdigit() }}|{{ 'a\\nb\\r\\nc'.splitlines() }}", {}),
    ("{{ x }}{{ x.y is defined }}", {"x": {"y": None}}),
    ("{% for k, v in {'a': 1, 'b': [1, 2]}.items() %}{{ k }}:{{ v|tojson }};{% endfor %}", {}),
    ("{% filter upper %}abc {{ 'x' }}{% endfilter %}|{% filter replace('a', 'b')|trim %}  aaa  {% endfilter %}", {}),
    ("{{ ('\"'|safe + '<b>') ~ ('x' + '&'|e) }}|{{ ''|safe + none|string }}", {}),
    ("{% set m = {0: 'zero', 1.0: 'one', none: 'n', 'k': 'v'} %}{{ m[0] }}{{ m[1] }}{{ m[none] }}{{ m }}{{ m|tojson }}{{ 1 in m }}", {}),
    ("{% if messages|selectattr('role', 'eq', 'nobody') %}truthy{% endif %}|{{ messages|map(attribute='role')|first }}|{{ d.items() }}|{{ d.keys() }}", {"messages": [{"role": "user"}], "d": {"a": 1}}),
    ("{% set g = [1, 2, 3]|select('odd') %}{% for x in g %}{{ x }}{% endfor %}[{% for x in g %}{{ x }}{% endfor %}]", {}),
    ("{{ none|map('upper')|list }}{{ none|selectattr('x')|list }}{{ range(2) is sequence }}{{ [1]|select is sequence }}", {}),
    # The lexer: delimiters inside strings, CRLF, whitespace control around tags, raw blocks,
    # multi-line tags, float printing.
    ("{% set x = '%}' %}{{ x }}|{{ \"}}\" }}|{{ '{#' }}|{{ 'it\\'s' }}", {}),
    ("a\r\nb{% if true %}\r\nc{% endif %}\r\n", {}),
    ("{{- 'x' }}  \n  {#- c #}\n  y", {}),
    ("é {% if true %}\n  ü{% endif %}\t{{ 'ß' }}", {}),
    ("{{ 1.10 }}|{{ 0.1 * 3 }}|{{ 1e100 }}|{{ -0.0 }}|{{ 100000000000000000000.0 }}|{{ 1/3 }}|{{ 2.5e-7 }}|{{ 123456789012345680.0 }}", {}),
    ("{{ x }}|{{ y }}|{{ z }}", {"x": 1.5, "y": 1e-7, "z": 12345678.9}),
    ("{{ d|tojson }}", {"d": {"f": 0.1, "g": 1e21, "h": -2.5e-10, "i": 3.0}}),
    ("{% if true -%}\n\n   x\n{%- endif %}", {}),
    ("line1\n{{\n  'multi'\n}}\n{%\n if true\n%}ok{% endif %}", {}),
    ("{% for x in [1, 2] -%}\n{{ x }}\n{%- endfor %}", {}),
    ("  {%- if true %}a{% endif %}\n  {%+ if true %}b{% endif %}", {}),
    ("{% raw -%}   raw  {%- endraw %}|", {}),
    ("  {% raw %}\n  x\n  {% endraw %}\n", {}),
    ("{# comment only #}", {}),
    ("\n\n", {}),
    ("{{ '\\n' }}\n", {}),
    ("text\n\n", {}),
    ("{{ messages[0]['content']|trim ~ '\\n\\n' }}x", {"messages": [{"content": "  hi \n"}]}),
    # Scopes: each loop iteration is fresh; macros see the template's variables when called.
    ("{% for i in range(3) %}{% if i == 0 %}{% set x = 5 %}{% endif %}[{{ x }}]{% endfor %}", {}),
    ("{% set x = 1 %}{% for i in range(2) %}{{ x }}{% set x = x + 10 %}{{ x }};{% endfor %}{{ x }}", {}),
    ("{% macro m() %}{{ y }}{% endmacro %}{% set y = 2 %}{{ m() }}", {}),
    ("{% set y = 1 %}{% macro m() %}{{ y }}{% endmacro %}{% set y = 2 %}{{ m() }}", {}),
    ("{% for a in [1] %}{% macro m() %}{{ a }}{% endmacro %}{{ m() }}{% endfor %}", {}),
    ("{% macro m(x) %}{% set x = x + 1 %}{{ x }}{% endmacro %}{{ m(1) }}", {}),
    ("{% if true %}{% set z = 3 %}{% endif %}{{ z }}", {}),
    ("{% for i in [1,2] %}{% for j in [3] %}{% set k = i * j %}{% endfor %}{{ k }}{% endfor %}", {}),
    ("{% set ns = namespace(v=0) %}{% macro inc() %}{% set ns.v = ns.v + 1 %}{% endmacro %}{{ inc() }}{{ inc() }}{{ ns.v }}", {}),
    ("{{ loop is defined }}{% for i in [1] %}{% for j in [1, 2] %}{{ loop.length }}{% endfor %}{{ loop.length }}{% endfor %}", {}),
    ("{% for i in [1, 2] %}{{ i }}{% set i = 9 %}{{ i }}{% endfor %}", {}),
    ("{% set messages = messages[1:] %}{{ messages|length }}", {"messages": [1, 2, 3]}),
    ("{% for m in messages %}{% set messages = [] %}{{ m }}{% endfor %}{{ messages|length }}", {"messages": [1, 2]}),
    ("{% for x in [1,2,3] %}{% if loop.first %}{% set first = x %}{% endif %}{{ first }}{% endfor %}", {}),
    # jinja2 raises on these; strata must refuse too (one line, the template line).
    ("{{ [1, 2]|map('string')|tojson }}", {}),
    ("{{ ([1, 2]|select)|length }}", {}),
    ("{{ ([1, 2]|select)|last }}", {}),
    ("{{ {'a': 1}.items()|tojson }}", {}),
    ("{{ x.y.z }}", {}),
    ("{{ 'a' + 1 }}", {}),
    ("{{ none + 1 }}", {}),
    ("{% set l = [] %}{{ l.append(1) }}", {}),
    ("{{ messages[0].content + 1 }}", {"messages": [{"content": "a"}]}),
    ("{{ undefined_fn() }}", {}),
    ("{{ 1 / 0 }}", {}),
    ("{{ raise_exception('stop here') }}", {}),
]


def check_constructs(strata, tmp):
    failures = 0
    refusals = 0
    for i, (source, variables) in enumerate(EDGE_CASES):
        try:
            want = render_reference(compile_like_transformers(source), variables, {}, False)
        except Exception as e:  # noqa: BLE001 - any jinja2 error means strata must refuse
            want = None
            refusals += 1
        template_path = os.path.join(tmp, "t.jinja")
        with open(template_path, "w", encoding="utf-8") as f:
            f.write(source)
        in_path = os.path.join(tmp, "in.jsonl")
        with open(in_path, "w", encoding="utf-8") as f:
            f.write(json.dumps(dict(variables, messages=variables.get("messages", [])), ensure_ascii=False) + "\n")
        out_path = os.path.join(tmp, "out.jsonl")
        result = run_strata(strata, ["--template", template_path, "--in", in_path, "--out", out_path])
        if want is None:
            lines = result.stderr.strip().splitlines()
            if result.returncode != 2 or len(lines) != 1 or "t.jinja:" not in lines[0]:
                failures += 1
                print(f"FAIL case {i} {source!r}: jinja2 raised, strata rc={result.returncode} {result.stderr!r}")
            continue
        if result.returncode != 0:
            failures += 1
            print(f"FAIL case {i} {source!r}: strata refused: {result.stderr.strip()}")
            continue
        with open(out_path, encoding="utf-8") as f:
            have = json.loads(f.readline())["text"]
        if have != want:
            failures += 1
            print(f"FAIL case {i} {source!r}:\n  jinja2: {want!r}\n  strata: {have!r}")
    print(f"constructs: {len(EDGE_CASES)} cases, {len(EDGE_CASES) - refusals} byte-identical, {refusals} refusals matched")
    return failures


def run_strata(strata, args):
    return subprocess.run([strata, "chat", "render"] + args, capture_output=True, text=True)


def make_folder(tmp, name, special, object_tokens, directory=TEMPLATES):
    folder = os.path.join(tmp, name.replace(".jinja", ""))
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(directory, name), encoding="utf-8") as f:
        source = f.read()
    config = {"chat_template": source}
    for key, value in special.items():
        # Some configs hold AddedToken objects; strata must read both forms.
        config[key] = {"content": value, "lstrip": False, "special": True} if object_tokens else value
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False)
    return folder, source


def check_render(strata, tmp, cases=None, directory=TEMPLATES):
    cases = CASES if cases is None else cases
    failures = 0
    compared = refused = 0
    for index, (name, (special, _)) in enumerate(sorted(cases.items())):
        folder, source = make_folder(tmp, name, special, object_tokens=index % 2 == 1, directory=directory)
        template = compile_like_transformers(source)
        for agp in (False, True):
            good, expected, bad = [], [], []
            for record in CONVERSATIONS:
                try:
                    expected.append(render_reference(template, record, special, agp))
                    good.append(record)
                except Exception as e:  # jinja2 refused: strata must refuse too
                    bad.append((record, e))
            in_path = os.path.join(folder, f"in_{agp}.jsonl")
            out_path = os.path.join(folder, f"out_{agp}.jsonl")
            with open(in_path, "w", encoding="utf-8") as f:
                for record in good:
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
            args = ["--tokenizer", folder, "--in", in_path, "--out", out_path] + (["--add-generation-prompt"] if agp else [])
            result = run_strata(strata, args)
            if result.returncode != 0:
                print(f"FAIL {name} agp={agp}: strata exited {result.returncode}: {result.stderr.strip()}")
                failures += 1
                continue
            with open(out_path, encoding="utf-8") as f:
                got = [json.loads(line)["text"] for line in f]
            for i, (want, have) in enumerate(zip(expected, got)):
                compared += 1
                if want != have:
                    failures += 1
                    print(f"FAIL {name} agp={agp} conversation {i}:\n  jinja2: {want!r}\n  strata: {have!r}")
            if len(got) != len(expected):
                failures += 1
                print(f"FAIL {name}: {len(got)} lines out, {len(expected)} expected")
            for record, error in bad:
                with open(in_path, "w", encoding="utf-8") as f:
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
                result = run_strata(strata, args)
                lines = [l for l in result.stderr.strip().splitlines() if l]
                if result.returncode not in (1, 2) or len(lines) != 1 or f"{in_path}:1:" not in lines[0]:
                    failures += 1
                    print(f"FAIL {name}: jinja2 raised {error!r}, strata gave rc={result.returncode} {result.stderr!r}")
                refused += 1
    print(f"render: {compared} renders compared with jinja2 over {len(cases)} templates ({failures} differ), "
          f"{refused} refusals matched")
    return failures


CORPUS = os.path.join(TEMPLATES, "llama.cpp")


def check_corpus(strata, tmp):
    """Every other template llama.cpp carries (chat_templates/llama.cpp/): the same renders."""
    names = sorted(n for n in os.listdir(CORPUS) if n.endswith(".jinja"))
    cases = {name: ({"bos_token": "<s>", "eos_token": "</s>"}, None) for name in names}
    return check_render(strata, tmp, cases, CORPUS)


def prefix_segments(template, messages, special, extra):
    """The trained spans by the prefix rule, computed here with jinja2 alone."""
    full = render_reference(template, dict(extra, messages=messages), special, False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        p = render_reference(template, dict(extra, messages=messages[:i]), special, True)
        q = render_reference(template, dict(extra, messages=messages[: i + 1]), special, False)
        if not (full.startswith(p) and full.startswith(q) and len(q) >= len(p)):
            return full, None
        spans.append(full[len(p):len(q)])
    return full, spans


def check_segments(strata, tmp):
    failures = 0
    checked = unstable = 0
    unstable_names = set()
    for name, (special, end_of_turn) in sorted(CASES.items()):
        folder, source = make_folder(tmp, name, special, object_tokens=False)
        template = compile_like_transformers(source)
        for c, record in enumerate(CONVERSATIONS):
            messages = record["messages"]
            if not any(m["role"] == "assistant" for m in messages):
                continue
            extra = {k: v for k, v in record.items() if k != "messages"}
            try:
                full, spans = prefix_segments(template, messages, special, extra)
            except Exception:
                continue  # the template refuses this conversation (checked by `render`)
            in_path = os.path.join(folder, "seg_in.jsonl")
            out_path = os.path.join(folder, "seg_out.jsonl")
            with open(in_path, "w", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
            result = run_strata(strata, ["--tokenizer", folder, "--in", in_path, "--out", out_path, "--segments"])
            if spans is None:
                unstable += 1
                unstable_names.add(name)
                if result.returncode != 2 or "not prefix-stable" not in result.stderr:
                    failures += 1
                    print(f"FAIL {name} conversation {c}: not prefix-stable in jinja2, strata rc={result.returncode} {result.stderr!r}")
                continue
            if result.returncode != 0:
                failures += 1
                print(f"FAIL {name} conversation {c}: strata exited {result.returncode}: {result.stderr.strip()}")
                continue
            with open(out_path, encoding="utf-8") as f:
                out = json.loads(f.readline())
            joined = "".join(s["text"] for s in out["segments"])
            trained = [s["text"] for s in out["segments"] if s["trained"]]
            checked += 1
            if joined != full or out["text"] != full:
                failures += 1
                print(f"FAIL {name} conversation {c}: segments do not join to the render")
            if "".join(trained) != "".join(spans):
                failures += 1
                print(f"FAIL {name} conversation {c}: trained {trained!r}, prefix rule says {spans!r}")
            # Independent of any rendering: each assistant turn's content then the end-of-turn text.
            plain = all(m["role"] in ("system", "user", "assistant") and "tool_calls" not in m
                        and isinstance(m["content"], str) for m in messages)
            if plain:
                lead = TURN_LEAD.get(name, "")
                want = "".join(lead + m["content"] + end_of_turn for m in messages if m["role"] == "assistant")
                if messages[-1]["role"] == "assistant":
                    want += FINAL_SUFFIX.get(name, "")
                if "".join(trained) != want:
                    failures += 1
                    print(f"FAIL {name} conversation {c}: trained {''.join(trained)!r}, expected {want!r}")
    print(f"segments: {checked} conversations checked, {unstable} not prefix-stable refusals matched "
          f"({', '.join(sorted(unstable_names))})")
    return failures + check_generation_segments(strata, tmp)


def check_generation_segments(strata, tmp):
    """Templates with {% generation %} blocks: the trained pieces are exactly the blocks' output."""
    failures = checked = 0
    for name in sorted(os.listdir(CORPUS)):
        with open(os.path.join(CORPUS, name), encoding="utf-8") as f:
            if not re.search(r"\{%-?\s*generation\s*-?%\}", f.read()):
                continue
        special = {"bos_token": "<s>", "eos_token": "</s>"}
        folder, source = make_folder(tmp, name, special, object_tokens=False, directory=CORPUS)
        template = compile_like_transformers(source, MarkedGenerationBlocks)
        for c, record in enumerate(CONVERSATIONS):
            if not any(m["role"] == "assistant" for m in record["messages"]):
                continue
            try:
                marked = render_reference(template, record, special, False)
            except Exception:
                continue
            if GEN_BEGIN not in marked:
                continue
            want_trained = [piece.split(GEN_END)[0] for piece in marked.split(GEN_BEGIN)[1:]]
            want_full = marked.replace(GEN_BEGIN, "").replace(GEN_END, "")
            in_path = os.path.join(folder, "gen_in.jsonl")
            out_path = os.path.join(folder, "gen_out.jsonl")
            with open(in_path, "w", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
            result = run_strata(strata, ["--tokenizer", folder, "--in", in_path, "--out", out_path, "--segments"])
            if result.returncode != 0:
                failures += 1
                print(f"FAIL {name} conversation {c}: strata exited {result.returncode}: {result.stderr.strip()}")
                continue
            with open(out_path, encoding="utf-8") as f:
                out = json.loads(f.readline())
            trained = [seg["text"] for seg in out["segments"] if seg["trained"]]
            checked += 1
            if out["text"] != want_full or "".join(trained) != "".join(want_trained):
                failures += 1
                print(f"FAIL {name} conversation {c}: trained {trained!r}, generation blocks gave {want_trained!r}")
    print(f"generation segments: {checked} conversations checked against the {{% generation %}} blocks' output")
    if checked == 0:
        failures += 1
        print("FAIL no template with {% generation %} blocks was checked")
    return failures


def check_errors(strata, tmp):
    """Bad input: one line naming FILE:LINE, exit 2."""
    failures = 0
    folder, _ = make_folder(tmp, "Qwen-Qwen2.5-7B-Instruct.jinja", {"bos_token": "", "eos_token": "<|im_end|>"}, False)
    cases = {
        "bad json": ('{"messages": [}\n', ":1: not valid JSON"),
        "no messages": ('{"text": "x"}\n', ":1: expected an object with a 'messages' list"),
        "second line": (json.dumps(CONVERSATIONS[1]) + "\n[1, 2]\n", ":2: expected an object"),
    }
    for what, (content, needle) in cases.items():
        in_path = os.path.join(tmp, "bad.jsonl")
        with open(in_path, "w") as f:
            f.write(content)
        result = run_strata(strata, ["--tokenizer", folder, "--in", in_path, "--out", os.path.join(tmp, "bad_out.jsonl")])
        lines = result.stderr.strip().splitlines()
        if result.returncode != 2 or len(lines) != 1 or (in_path + needle) not in lines[0]:
            failures += 1
            print(f"FAIL {what}: rc={result.returncode} {result.stderr!r}")
    # A template construct strata does not implement: refused with the template line.
    tpl = os.path.join(tmp, "unsupported.jinja")
    with open(tpl, "w") as f:
        f.write("{% for m in messages %}\n{{ m.content | wordwrap(10) }}\n{% endfor %}")
    in_path = os.path.join(tmp, "ok.jsonl")
    with open(in_path, "w") as f:
        f.write(json.dumps(CONVERSATIONS[1]) + "\n")
    result = run_strata(strata, ["--template", tpl, "--in", in_path, "--out", os.path.join(tmp, "o.jsonl")])
    if result.returncode != 2 or f"{tpl}:2: unsupported filter 'wordwrap'" not in result.stderr:
        failures += 1
        print(f"FAIL unsupported filter: rc={result.returncode} {result.stderr!r}")
    # raise_exception carries the template's message.
    folder, _ = make_folder(tmp, "google-gemma-2-2b-it.jinja", GEMMA, False)
    with open(in_path, "w") as f:
        f.write(json.dumps(CONVERSATIONS[0]) + "\n")
    result = run_strata(strata, ["--tokenizer", folder, "--in", in_path, "--out", os.path.join(tmp, "o.jsonl")])
    if result.returncode != 2 or "System role not supported" not in result.stderr or f"{in_path}:1:" not in result.stderr:
        failures += 1
        print(f"FAIL raise_exception: rc={result.returncode} {result.stderr!r}")
    # A conversation without an assistant turn has nothing to train on.
    with open(in_path, "w") as f:
        f.write(json.dumps(CONVERSATIONS[2]) + "\n")
    folder, _ = make_folder(tmp, "Qwen-Qwen2.5-7B-Instruct.jinja", {"bos_token": "", "eos_token": "<|im_end|>"}, False)
    result = run_strata(strata, ["--tokenizer", folder, "--in", in_path, "--out", os.path.join(tmp, "o.jsonl"), "--segments"])
    if result.returncode != 2 or "no assistant turn" not in result.stderr:
        failures += 1
        print(f"FAIL no assistant: rc={result.returncode} {result.stderr!r}")
    print(f"errors: {len(cases) + 3} bad inputs checked")
    return failures


def main():
    strata, mode = sys.argv[1], sys.argv[2]
    base = os.environ.get("STRATA_TEST_TMPDIR")
    if base:
        os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        failures = {"render": check_render, "segments": check_segments, "errors": check_errors,
                    "constructs": check_constructs, "corpus": check_corpus}[mode](strata, tmp)
    if failures:
        print(f"{failures} failure(s)")
        sys.exit(1)


if __name__ == "__main__":
    main()
