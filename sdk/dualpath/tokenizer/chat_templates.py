"""Built-in chat templates, for model files that carry none (``--chat-template NAME``).

Each is the common form of that family's prompt format, written for the same sandboxed
Jinja environment as a model's own template (``LLM.apply_chat_template``); a name given
on the command line or in ``runtime.chat_template`` overrides the file's template, as
llama.cpp's ``--chat-template`` does.
"""

from __future__ import annotations

BUILTIN = {
    # ChatML (Qwen, SmolLM, many fine-tunes)
    "chatml": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
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
    # Phi-3 / Phi-3.5
    "phi3": (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% else %}{{ eos_token }}{% endif %}"),
}
"""Name -> Jinja source: one per name of ``config.CHAT_TEMPLATES``, in its order (a test
checks), so every list of the names reads that one."""
