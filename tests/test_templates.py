"""Chat templates render like transformers renders them, but only in the sandbox and within bounds."""

from __future__ import annotations

import sys
import time

import pytest

from localspec.errors import TemplateError
from localspec.gguf.templates import render_chat, template_security_findings
from tests.tiny_models import CHAT_TEMPLATE

USER = [{"role": "user", "content": "<b>hi</b> & 'bye'"}]
# CVE-2024-34359 ("Llama Drama") payload shape: reach os through a builtin's __globals__ and run a command.
CVE_TEMPLATE = (
    "{% for x in ().__class__.__base__.__subclasses__() %}"
    "{% if 'warning' in x.__name__ %}"
    "{{ x()._module.__builtins__['__import__']('os').system('touch {marker}') }}"
    "{% endif %}{% endfor %}"
)
GLOBALS_TEMPLATE = "{{ cycler.__init__.__globals__.os.popen('touch {marker}').read() }}"


def test_renders_a_plain_chat_template():
    assert render_chat(CHAT_TEMPLATE, USER) == "<|user|>\n<b>hi</b> & 'bye'</s>\n<|assistant|>\n"
    assert render_chat(CHAT_TEMPLATE, USER, add_generation_prompt=False).endswith("</s>\n")


def test_helpers_match_transformers():
    # tojson must not HTML-escape (jinja2's own does), or tool prompts would differ from the model's training.
    assert render_chat("{{ messages[0] | tojson }}", USER) == '{"role": "user", "content": "<b>hi</b> & \'bye\'"}'
    assert render_chat("{{ strftime_now('%Y') }}", USER).isdigit()
    assert render_chat("{{ bos_token }}{{ eos_token }}{{ extra_var }}", USER, bos_token="<s>", eos_token="</s>", extra_var=7) == "<s></s>7"
    assert render_chat("{% for t in tools %}{{ t.name }}{% endfor %}", USER, tools=[{"name": "f"}]) == "f"


def test_trim_blocks_like_transformers():
    assert render_chat("{% if true %}\n  a\n{% endif %}\n", USER) == "  a\n"


def test_raise_exception_is_a_template_error():
    with pytest.raises(TemplateError, match="refused the conversation: roles must alternate"):
        render_chat("{{ raise_exception('roles must alternate') }}", USER)


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{{ undefined_thing.attr }}", "UndefinedError"),
        ("{% for m in messages %}", "does not parse"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursed too deeply"),
        ("{{ 'x' * 10**9 }}", "larger than the output limit"),
        ("{{ 2 ** 100000000 }}", "power with exponent"),
        ("{{ messages.append(1) }}", "SecurityError"),
        ("{{ ''.__class__.__mro__ }}", "SecurityError"),
    ],
)
def test_failures_are_one_template_error(template, message):
    with pytest.raises(TemplateError, match=message) as caught:
        render_chat(template, USER)
    assert "\n" not in str(caught.value)


def test_a_template_that_loops_for_ever_is_stopped():
    nested = "{% set r = range(100000) | list %}{% for a in r %}{% for b in r %}{% endfor %}{% endfor %}"
    started = time.monotonic()
    with pytest.raises(TemplateError, match="did not finish within 0.3 s"):
        render_chat(nested, USER, timeout=0.3)
    assert time.monotonic() - started < 2


def test_output_is_capped():
    with pytest.raises(TemplateError, match="exceeds 1000 characters"):
        render_chat("{% for i in range(100) %}{{ 'x' * 50 }}{% endfor %}", USER, max_chars=1000)


def test_an_existing_tracer_is_restored():
    def tracer(frame, event, arg):
        return None

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        render_chat(CHAT_TEMPLATE, USER)
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(previous)


@pytest.mark.parametrize("payload", [CVE_TEMPLATE, GLOBALS_TEMPLATE], ids=["cve-2024-34359", "cycler-globals"])
def test_sandbox_escape_payloads_create_nothing_and_are_flagged(payload, tmp_path):
    marker = tmp_path / "pwned"
    template = payload.replace("{marker}", str(marker))
    with pytest.raises(TemplateError):
        render_chat(template, USER)
    assert not marker.exists()
    findings = template_security_findings(template)
    assert any("__globals__" in f or "__subclasses__" in f for f in findings), findings


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ self._TemplateReference__context }}", "'self'"),
        ("{{ lipsum.__globals__ }}", "'__globals__'"),
        ("{{ messages | attr('__class__') }}", "'__class__'"),
        ("{{ x['__builtins__'] }}", "'__builtins__'"),
        ("{% import 'os' as os %}", "loads another template"),
        ("{% include 'other' %}", "loads another template"),
    ],
)
def test_security_scan_flags_ways_out(template, expected):
    assert any(expected in finding for finding in template_security_findings(template))


def test_security_scan_passes_ordinary_templates():
    assert template_security_findings(CHAT_TEMPLATE) == []


@pytest.mark.real
def test_real_qwen_template_is_clean_and_renders(qwen_pair):
    from localspec.gguf.header import read_header

    template = read_header(qwen_pair[0])["tokenizer.chat_template"]
    assert template_security_findings(template) == []
    prompt = render_chat(template, USER)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
