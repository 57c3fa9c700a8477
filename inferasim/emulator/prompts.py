"""Token counting of the emulator's OpenAI request bodies: a string prompt has one token per
whitespace-separated word; a prompt given as a list of token ids has that many tokens; chat
messages count their words plus a few template tokens per message. A body the API refuses
raises :class:`~inferasim.emulator.api.ApiError` (400) naming the field.
"""

from __future__ import annotations

from typing import Any

from inferasim.emulator.api import ApiError

# Chat template overhead (Llama-3 style: a header of role markers per message, a BOS, and the
# assistant header that opens the reply).
CHAT_TOKENS_PER_MESSAGE = 5
CHAT_TOKENS_FIXED = 1 + 4


# ------------------------------------------------------------------------------------------------
# request parsing helpers
# ------------------------------------------------------------------------------------------------

def _count_words(text: str) -> int:
    return len(text.split())


def _is_token_list(value: Any) -> bool:
    # set(map(type, ...)) runs in C: a 100k-token prompt is checked in about a millisecond.
    return isinstance(value, list) and bool(value) and set(map(type, value)) == {int}


def prompt_lengths(prompt: Any) -> list[int]:
    """Token counts of a /v1/completions `prompt`: a string, a list of token ids, or a batch of either."""
    if isinstance(prompt, str):
        n = _count_words(prompt)
        if n == 0:
            raise ApiError(400, "The prompt is empty: give at least one word or one token id", "prompt")
        return [n]
    if _is_token_list(prompt):
        return [len(prompt)]
    if isinstance(prompt, list) and prompt:
        out: list[int] = []
        for item in prompt:
            out.extend(prompt_lengths(item))
        return out
    raise ApiError(400, "prompt must be a string, a list of token ids, or a non-empty list of either", "prompt")


def chat_prompt_length(messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list of {role, content} objects", "messages")
    total = CHAT_TOKENS_FIXED
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise ApiError(400, "every message needs a role (and usually a content)", "messages")
        content = m.get("content")
        if isinstance(content, str):
            total += _count_words(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    total += _count_words(part["text"])
        elif content is not None:
            raise ApiError(400, "message content must be a string, a list of parts, or null", "messages")
        total += CHAT_TOKENS_PER_MESSAGE
    return total


def int_field(body: dict[str, Any], name: str, low: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ApiError(400, f"{name} must be an integer >= {low}, got {value!r}", name)
    return value
