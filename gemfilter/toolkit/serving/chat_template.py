"""The chat template the proxy applies when the selector's tokenizer has none: Gemma 3's, for the embedded model.

The embedded Gemma 3 270M is rebuilt from a GGUF file whose tokenizer carries no chat template, so
``/v1/chat/completions`` would have nothing to format messages with. :data:`GEMMA3` is Gemma 3's own
turn format (``<start_of_turn>user\\n...<end_of_turn>\\n<start_of_turn>model\\n``; a system message is
prepended to the first user turn, as Gemma 3's published template does). The proxy then sends every chat
on that model, passed through or filtered, to the engine's ``/v1/completions`` as token ids, so that the
engine, which has no template either, needs none.
"""

from __future__ import annotations

#: Gemma 3's chat template (the format of google/gemma-3-*-it's tokenizer_config.json), text parts only.
GEMMA3 = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<start_of_turn>model\n' }}"
    "{%- endif -%}"
)


def fallback_template(name, tokenizer) -> str | None:
    """The template the proxy supplies for model ``name`` (None: the embedded model): :data:`GEMMA3` for the
    embedded model when its tokenizer has no template, else None (the tokenizer's own template is used)."""
    from gemfilter.models import is_embedded

    if getattr(tokenizer, "chat_template", None) is None and is_embedded(name):
        return GEMMA3
    return None
