"""Built-in chat templates, for model files that carry none (``--chat-template NAME``).

Each is the common form of that family's prompt format, written for the same sandboxed
Jinja environment as a model's own template (``LLM.apply_chat_template``); a name given
on the command line or in ``runtime.chat_template`` overrides the file's template, as
llama.cpp's ``--chat-template`` does.
"""

from __future__ import annotations

BUILTIN = {
    # ChatML (Qwen, SmolLM, many fine-tunes); with tools, Hermes's tool calls as Qwen 2.5 writes
    # them, so that a model whose own template has no tools can still be given some
    "chatml": (
        "{% if tools %}<|im_start|>system\n"
        "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{{ '\n\n' }}{% endif %}"
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
        "{% for t in tools %}{{ '\n' }}{{ t | tojson }}{% endfor %}{{ '\n' }}</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n{% endif %}"
        "{% for m in messages %}{% if m['role'] == 'system' and tools and loop.first %}"
        "{% elif m['role'] == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
        "{% if m['content'] %}{{ m['content'] }}{{ '\n' }}{% endif %}"
        "{% for tc in m.tool_calls %}{% if not loop.first %}{{ '\n' }}{% endif %}<tool_call>\n"
        "{\"name\": \"{{ tc.function.name }}\", \"arguments\": {{ tc.function.arguments | tojson }}}\n"
        "</tool_call>{% endfor %}<|im_end|>\n"
        "{% elif m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n"
        "</tool_response><|im_end|>\n"
        "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
    # Llama 3 / 3.1 / 3.2
    "llama3": (
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"),
    # Gemma 2 / 3: no system role (a system message opens the first user turn), "model" for the assistant
    "gemma": (
        "{{ bos_token }}{% set ns = namespace(system='') %}{% for m in messages %}"
        "{% if m['role'] == 'system' %}{% set ns.system = m['content'] | trim + '\n\n' %}"
        "{% else %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
        "{% if m['role'] == 'user' %}{{ ns.system }}{% set ns.system = '' %}{% endif %}"
        "{{ m['content'] | trim }}<end_of_turn>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"),
    # Vicuna 1.1 (LLaVA 1.5's text models, whose files carry no template), as llama.cpp's "vicuna"
    "vicuna": (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
        "{% elif m['role'] == 'user' %}USER: {{ m['content'] }}\n"
        "{% elif m['role'] == 'assistant' %}ASSISTANT: {{ m['content'] }}</s>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}ASSISTANT:{% endif %}"),
    # Phi-3 / Phi-3.5
    "phi3": (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% else %}{{ eos_token }}{% endif %}"),
}
"""Name -> Jinja source: one per name of ``config.CHAT_TEMPLATES``, in its order (a test
checks), so every list of the names reads that one."""
