"""A generator's own prompt format: the Jinja chat template its tokenizer ships, declared in its config.

The build writes each LLM's and VLM's `chat_template` (Hugging Face's `tokenizer.chat_template`) and the special
tokens it reads (`bos_token`, `eos_token`, ...) into the model's config parameters; the orchestrator renders every
prompt with them, as transformers' `apply_chat_template(..., add_generation_prompt=True)` does (the same sandboxed
Jinja environment, filters and globals). A Qwen model gets ChatML, a Llama model its headers, and a model that
declares no template is refused by name instead of being sent another model's format.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Mapping, Sequence

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import TritonUnavailableError
from . import contracts
from .protocol import GeneratorFacts


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class ChatTemplate:
    """`template(system, user, turns)` -> the prompt, ending where the assistant's answer starts."""

    def __init__(self, template: str, variables: Mapping[str, str] | None = None):
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
        self.source = template
        self.template = environment.from_string(template)
        self.variables = dict(variables or {})

    def __call__(self, system: str, user: str, turns: Sequence[tuple[str, str]] = ()) -> str:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": role, "content": text} for role, text in turns
        ] + [{"role": "user", "content": user}]
        return self.template.render(messages=messages, add_generation_prompt=True, **self.variables)


@functools.lru_cache(maxsize=16)
def _compiled(template: str, variables: str) -> ChatTemplate:
    return ChatTemplate(template, json.loads(variables))


def chat_template_of(facts: GeneratorFacts, model: str) -> ChatTemplate:
    """The model's declared template, compiled once per distinct template."""
    if not facts.chat_template:
        raise TritonUnavailableError(
            f"model {model} declares no chat template (config parameter {contracts.CHAT_TEMPLATE_PARAMETER!r}), so its "
            "prompt format is unknown: rebuild the model repository (a checkpoint without one needs GeneratorSpec.chat_template)"
        )
    return _compiled(facts.chat_template, json.dumps(dict(facts.chat_template_variables), sort_keys=True))
