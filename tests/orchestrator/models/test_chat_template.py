"""Prompts rendered with a model's own chat template exactly as transformers' apply_chat_template renders them."""

from __future__ import annotations

import jinja2
import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from orchestrator.errors import TritonUnavailableError
from orchestrator.models.chat_template import ChatTemplate, chat_template_of
from orchestrator.models.protocol import GeneratorFacts
from tests.model_double import CHATML_TEMPLATE
from tests.orchestrator.pipeline.test_query_control_flow import LLAMA3_TEMPLATE

# Mistral's v0.1 format: no system role (it raises), bos_token read from the variables.
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)
VARIABLES = {"bos_token": "<s>", "eos_token": "</s>"}


@pytest.mark.parametrize("template", [CHATML_TEMPLATE, LLAMA3_TEMPLATE], ids=["chatml", "llama3"])
def test_rendering_equals_transformers_apply_chat_template(template):
    turns = (("user", "Earlier question?"), ("assistant", "Earlier answer [1]."))
    ours = ChatTemplate(template, VARIABLES)("Answer from the evidence.", "Evidence:\n[1] (a.pdf, page 2)\nText\n\nQuestion: Q?", turns)
    messages = [{"role": "system", "content": "Answer from the evidence."}, {"role": "user", "content": "Earlier question?"},
                {"role": "assistant", "content": "Earlier answer [1]."},
                {"role": "user", "content": "Evidence:\n[1] (a.pdf, page 2)\nText\n\nQuestion: Q?"}]
    (theirs,), _ = render_jinja_template([messages], chat_template=template, add_generation_prompt=True, **VARIABLES)
    assert ours == theirs and ours.count("Earlier answer [1].") == 1


def test_a_template_that_refuses_a_conversation_says_why():
    chat = ChatTemplate(MISTRAL_TEMPLATE, VARIABLES)
    assert chat("", "What?") == "<s>[INST] What? [/INST]"
    with pytest.raises(jinja2.exceptions.TemplateError, match="roles must alternate"):
        chat("A system prompt", "What?")


def test_the_template_runs_sandboxed():
    chat = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        chat("s", "u")


def test_a_model_that_declares_no_template_is_named():
    with pytest.raises(TritonUnavailableError, match="model llm declares no chat template"):
        chat_template_of(GeneratorFacts(2048), "llm")
    facts = GeneratorFacts(2048, chat_template=CHATML_TEMPLATE)
    assert chat_template_of(facts, "llm") is chat_template_of(facts, "llm")  # compiled once
