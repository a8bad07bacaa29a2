"""Chat templates from untrusted model files: rendered in a worker process with a deadline,
an output cap and a memory limit (tokenizer/render.py), every failure a ChatTemplateError,
and Ctrl-C in ``dualpath chat`` stops a render that would not end."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from dualpath.errors import ChatTemplateError
from dualpath.tokenizer.chat_templates import BUILTIN
from dualpath.tokenizer.render import KILL_GRACE_S, TemplateRenderer
from tests_shared import write_gguf_with_chat_template

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Tell me a story."}]
VARIABLES = {"messages": MESSAGES, "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>"}
LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.fixture(scope="module")
def renderer():
    r = TemplateRenderer(0.5, 200_000)
    yield r
    r.close()


def test_builtin_templates_render_as_jinja_sandbox_renders_them(renderer):
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    for name, source in BUILTIN.items():
        assert renderer.render(source, VARIABLES) == plain.from_string(source).render(**VARIABLES), name


@pytest.mark.parametrize("source, needle", [
    (LOOP, "runtime.chat_template_timeout_s"),
    ("{% set s = 'ab' * 8000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
     "runtime.chat_template_timeout_s"),  # a loop over a string: only the deadline sees it
    ("{{ 'a' * 10**10 }}", "runtime.chat_template_max_chars"),
    ("{{ [0] * 10**10 }}", "runtime.chat_template_max_chars"),
    ("{{ 10 ** 100000000 }}", "runtime.chat_template_max_chars"),
    ("{% for i in range(1000) %}{{ 'x' * 1000 }}{% endfor %}", "runtime.chat_template_max_chars"),
    ("{% set s = 'a' * 100000 %}{{ s + s + s }}", "runtime.chat_template_max_chars"),
    ("{{ 'a'|center(10**10) }}", "MiB its worker may take"),  # inside C: the memory limit
    ("{% include 'x.j2' %}", "includes or imports"),
    ("{% import 'x.j2' as x %}", "includes or imports"),
    ("{% from 'x.j2' import y %}", "includes or imports"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursed too deeply"),
    ("{{ range(10**12)|length }}", "runtime.chat_template_max_chars"),
    ("{{ 1 // 0 }}", "ZeroDivisionError"),
    ("{% for %}", "syntax error"),
    ("{{ messages.__class__.__mro__ }}", "SecurityError"),
    ("{{ ''.__class__.__subclasses__() }}", "SecurityError"),
    ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
])
def test_every_hostile_template_is_a_template_error_within_its_deadline(renderer, source, needle):
    t0 = time.perf_counter()
    try:
        out = renderer.render(source, VARIABLES)
    except ChatTemplateError as e:
        assert needle in str(e), str(e)
    else:
        raise AssertionError(f"rendered {len(out)} characters")
    assert time.perf_counter() - t0 < renderer.timeout_s + KILL_GRACE_S + 2
    assert renderer.render("{{ messages[1]['content'] }}", VARIABLES) == "Hi there"  # and the next one works


def test_a_worker_killed_at_the_deadline_is_replaced(renderer):
    started = renderer.num_started
    with pytest.raises(ChatTemplateError, match="timeout"):
        renderer.render("{% set s = 'ab' * 8000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
                        VARIABLES)
    assert renderer.render("ok", VARIABLES) == "ok"
    assert renderer.num_started == started + 1


@pytest.mark.parametrize("source", [None, 42, ["{{ 1 }}"], {"default": "x"}])
def test_a_template_that_is_not_a_string_is_a_template_error(renderer, source):
    with pytest.raises(ChatTemplateError, match="not a string"):
        renderer.render(source, VARIABLES)


def test_fuzzed_templates_end_in_time_with_bounded_output():
    """Random compositions of loops, repetitions, joins and filters: each ends within its
    deadline (plus the kill grace) with text under the cap, or a ChatTemplateError."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    atoms = st.sampled_from(["'ab'", "messages[0]['content']", "'x' * 3000", "range(50000)|join(',')",
                             "messages|tojson", "(messages|tojson) * 99", "'%s%s'|format(1, 2)",
                             "'y'|center(900000)", "'q'|indent(70000)", "10 ** 9999", "'z' * (10 ** 7)"])
    loops = st.sampled_from(["range(100000)", "'abcdefghij' * 400", "messages", "range(3)"])

    def nest(children):
        return st.one_of(
            st.tuples(loops, children).map(lambda t: f"{{% for v in {t[0]} %}}{t[1]}{{% endfor %}}"),
            st.tuples(children, children).map(lambda t: t[0] + t[1]),
            children.map(lambda c: f"{{% macro m() %}}{c}{c}{{% endmacro %}}{{{{ m() }}}}{{{{ m() }}}}"))

    templates = st.recursive(atoms.map(lambda a: f"{{{{ {a} }}}}"), nest, max_leaves=6)
    r = TemplateRenderer(0.3, 20_000)

    @hypothesis.settings(max_examples=40, deadline=None, database=None)
    @hypothesis.given(templates)
    def check(source):
        t0 = time.perf_counter()
        try:
            out = r.render(source, VARIABLES)
        except ChatTemplateError:
            pass
        else:
            assert len(out) <= r.max_chars
        assert time.perf_counter() - t0 < r.timeout_s + KILL_GRACE_S + 2, source

    try:
        check()
    finally:
        r.close()


# -- through the LLM and the command line -----------------------------------------------

def test_an_llm_names_its_file_and_the_limit(gguf_path, tmp_path):
    import dualpath

    path = write_gguf_with_chat_template(gguf_path, tmp_path / "loop.gguf", LOOP)
    llm = dualpath.LLM(path, dualpath.load_config(None, {"runtime.max_context_tokens": 64,
                                                         "runtime.chat_template_timeout_s": 0.5}))
    with pytest.raises(ChatTemplateError, match=r"loop\.gguf: the chat template took over 0\.5 s to render "
                                                r"\(runtime\.chat_template_timeout_s\)"):
        llm.chat_prompt_ids([{"role": "user", "content": "Hi"}])


def test_dualpath_chat_reports_a_hostile_template_as_an_error_not_a_traceback(gguf_path, tmp_path):
    path = write_gguf_with_chat_template(gguf_path, tmp_path / "big.gguf", "{{ 'a' * 10**10 }}")
    r = subprocess.run([sys.executable, "-m", "dualpath.cli", "chat", "-m", str(path), "-n", "4"],
                       input="Hi\n", capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("dualpath: error: ") and "runtime.chat_template_max_chars" in r.stderr
    assert "Traceback" not in r.stderr


def _children_cpu_ticks(pid: int) -> int:
    """User + system CPU time (clock ticks) of the processes whose parent is ``pid``."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # fields after the name: state, ppid, ..., utime (12), stime (13)
            total += int(fields[11]) + int(fields[12])
    return total


def test_ctrl_c_in_dualpath_chat_stops_a_template_that_would_run_for_hours(gguf_path, tmp_path):
    from .test_chat import Terminal

    # The probe at start-up renders "x" quickly; a real turn loops.
    source = ("{% if messages[-1]['content'] != 'x' %}" + LOOP + "{% endif %}"
              "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    path = write_gguf_with_chat_template(gguf_path, tmp_path / "slow.gguf", source)
    term = Terminal([sys.executable, "-m", "dualpath.cli", "chat", "-m", str(path), "-n", "4",
                     "--set", "runtime.chat_template_timeout_s=600"])
    try:
        at = term.expect(">>> ", timeout_s=120)
        before = _children_cpu_ticks(term.pid)
        term.send("Hi\r")
        # Ctrl-C once the template worker is looping (its CPU time grows), not after a fixed
        # sleep: on a loaded machine a second was not always enough to reach the render.
        deadline = time.monotonic() + 60
        while _children_cpu_ticks(term.pid) - before < 30 and time.monotonic() < deadline:
            term.read(0.1)
        t0 = time.monotonic()
        term.send("\x03")
        at = term.expect("(stopped)", timeout_s=10, start=at)
        assert time.monotonic() - t0 < 5
        term.expect(">>> ", timeout_s=10, start=at)
        term.send("\x04")
        _, status = os.waitpid(term.pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert "Traceback" not in term.out
    finally:
        term.close()
