"""Chat templates written in each family's tool-calling format (after Qwen 2.5, Llama 3.1,
Mistral v0.3, Phi-4-mini, and one with no markers), and a stories260K copy whose vocabulary
has ``<tool_call>`` and ``</tool_call>`` as single user-defined tokens (as Qwen's has), so a
``logit_bias`` on one token opens a call."""

from __future__ import annotations

from pathlib import Path

HERMES = """{%- if tools %}<|im_start|>system
{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}

{% endif %}# Tools

You may call one or more functions to assist with the user query.

<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{% if message.content %}{{ message.content }}
{% endif %}{% for tc in message.tool_calls %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif not (message.role == 'system' and tools) %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

LLAMA3 = """{{- bos_token }}
{%- if tools %}<|start_header_id|>system<|end_header_id|>

Environment: ipython
Today Date: {{ strftime_now("%d %b %Y") }} ({{ date_string }})

<|eot_id|><|start_header_id|>user<|end_header_id|>

Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.

{% for t in tools %}{{ t | tojson }}

{% endfor %}<|eot_id|>{% endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}<|start_header_id|>assistant<|end_header_id|>

{% for tc in message.tool_calls %}<|python_tag|>{"name": "{{ tc.function.name }}", \
"parameters": {{ tc.function.arguments | tojson }}}{% endfor %}<|eom_id|>
{%- elif message.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- else %}<|start_header_id|>{{ message.role }}<|end_header_id|>

{{ message.content | trim }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

MISTRAL = """{{- bos_token }}
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages %}{% if message.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}
{%- for message in messages %}
{%- if message.role == 'user' %}
{%- if tools and loop.index0 == ns.last_user %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}\
[INST]{{ message.content }}[/INST]
{%- elif message.role == 'assistant' and message.tool_calls %}[TOOL_CALLS][\
{% for tc in message.tool_calls %}{"name": "{{ tc.function.name }}", "arguments": \
{{ tc.function.arguments | tojson }}, "id": "{{ tc.id }}"}{% if not loop.last %}, {% endif %}{% endfor %}]\
{{ eos_token }}
{%- elif message.role == 'tool' %}[TOOL_RESULTS]{"content": {{ message.content | tojson }}, \
"call_id": "{{ message.tool_call_id }}"}[/TOOL_RESULTS]
{%- elif message.role == 'assistant' %}{{ message.content }}{{ eos_token }}
{%- endif %}
{%- endfor %}"""

PHI4 = """{%- for message in messages %}
{%- if loop.first and (tools or message.role == 'system') %}<|system|>\
{{ message.content if message.role == 'system' else 'You are a helpful assistant.' }}\
{% if tools %}<|tool|>{{ tools | tojson }}<|/tool|>{% endif %}<|end|>{% endif %}
{%- if message.role == 'user' %}<|user|>{{ message.content }}<|end|>
{%- elif message.role == 'assistant' and message.tool_calls %}<|assistant|><|tool_call|>\
{{ message.tool_calls | map(attribute='function') | list | tojson }}<|/tool_call|><|end|>
{%- elif message.role == 'tool' %}<|tool_response|>{{ message.content }}<|end|>
{%- elif message.role == 'assistant' %}<|assistant|>{{ message.content }}<|end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>{% endif %}"""

GENERIC = """{%- if tools %}Tools: {{ tools | tojson }}
To call one, answer {"name": ..., "arguments": {...}} only.
{% endif %}
{%- for message in messages %}
{%- if message.tool_calls %}{{ message.role }}: {{ message.tool_calls[0].function | tojson }}
{% else %}{{ message.role }}: {{ message.content }}
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}assistant:{% endif %}"""

TEMPLATES = {"hermes": HERMES, "llama3": LLAMA3, "mistral": MISTRAL, "phi4": PHI4, "generic": GENERIC}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                   "required": ["city"], "additionalProperties": False}}}
ALARM = {"type": "function", "function": {
    "name": "set_alarm", "description": "Set an alarm",
    "parameters": {"type": "object", "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}},
                   "required": ["hour"], "additionalProperties": False}}}
TOOLS = [WEATHER, ALARM]

ROUND_TRIP = [
    {"role": "system", "content": "You are brief."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_abc123", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_abc123", "content": "18C and sunny"},
]
"""A prior tool round trip in OpenAI's shapes (arguments a JSON string, content null)."""

ROUND_TRIP_AS_TEMPLATES_READ_IT = [
    ROUND_TRIP[0], ROUND_TRIP[1],
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_abc123", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    ROUND_TRIP[3],
]
"""The same, as HF's and llama.cpp's template callers hand it over: arguments an object, content ""."""

TOOL_CALL_ID, END_TOOL_CALL_ID = 4, 5
"""The ids that become ``<tool_call>`` and ``</tool_call>`` in ``write_tool_gguf``."""


def write_tool_gguf(src: Path, dst: Path, template: str) -> Path:
    """stories260K with ``template`` and ``<tool_call>``/``</tool_call>`` as user-defined tokens
    (in place of two byte tokens the stories never need)."""
    import gguf

    from tests_shared import copy_gguf

    reader = gguf.GGUFReader(str(src))
    tokens = list(reader.fields["tokenizer.ggml.tokens"].contents())
    types = list(reader.fields["tokenizer.ggml.token_type"].contents())
    tokens[TOOL_CALL_ID], tokens[END_TOOL_CALL_ID] = "<tool_call>", "</tool_call>"
    types[TOOL_CALL_ID] = types[END_TOOL_CALL_ID] = 4  # user-defined
    array = gguf.GGUFValueType.ARRAY
    return copy_gguf(src, dst, {"tokenizer.ggml.tokens": (tokens, array), "tokenizer.ggml.token_type": (types, array),
                                "tokenizer.chat_template": (template, gguf.GGUFValueType.STRING)})
