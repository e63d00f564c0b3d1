"""The %gguf / %%gguf magics in a real IPython shell against a real llama-server, and the quickstart notebook
executed headlessly with nbclient."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import nbformat
import pytest
from IPython.core.error import UsageError
from IPython.testing import globalipapp

from gguf_provider import chat as chat_module
from gguf_provider import events, tools
from gguf_provider.chat import MAX_TIME_GRACE
from gguf_provider.errors import GenerationTimeWarning
from gguf_provider.jupyter import commands, display
from tests.support import make_notebook, slots, speed
from tests.support.pause import CUT_SLACK, Pauser, watch_arming
from tests.support.runtime import pid_alive

# The heaviest test's work (tests/support/speed.py): the quickstart notebook, a kernel and a server started, three
# replies of 60, 60 and 120 tokens and their prompts; the tests on Gemma 270M and Qwen3 (slower, a few tokens each)
# fit in it too.
pytestmark = pytest.mark.speed_timeout("smollm2", tokens=2000, starts=4)


@pytest.fixture(scope="module")
def ip(smollm2_path: Path) -> Iterator[Any]:
    shell = globalipapp.start_ipython() or globalipapp.get_ipython()  # None: started by an earlier test
    shell.run_line_magic("load_ext", "gguf_provider")
    summary = shell.run_line_magic("gguf", f"load {smollm2_path} --ctx 2048 --as smol")
    assert summary.n_ctx == 2048
    yield shell
    try:
        shell.run_line_magic("gguf", "unload --all")
    except UsageError:
        pass


@pytest.fixture
def payloads(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Record the request payloads the magics send (the real server still answers)."""
    sent: list[dict[str, Any]] = []
    real = chat_module.Engine.stream

    def spy(self: Any, payload: dict[str, Any], **kwargs: Any) -> Iterator[Any]:
        sent.append(copy.deepcopy(payload))
        return real(self, payload, **kwargs)

    monkeypatch.setattr(chat_module.Engine, "stream", spy)
    return sent


def _magics(ip: Any) -> commands.GGUFMagics:
    m = ip.magics_manager.registry["GGUFMagics"]
    assert isinstance(m, commands.GGUFMagics)
    return m


def test_load_summary_reads_the_server(ip: Any) -> None:
    m = _magics(ip)
    engine = m.models["smol"].engine
    props = engine.client.get_json("/props")
    # The context asked for; the server may be a shared one with a larger context (the runtime reuses it).
    assert engine.n_ctx == 2048 <= props["default_generation_settings"]["n_ctx"]
    summary = display.ModelSummary("smol", engine.info.model, engine.n_ctx, "x", engine.capabilities())
    assert "context 2048 tokens" in repr(summary) and "| context | 2048 tokens |" in summary._repr_markdown_()


def test_cell_streams_stores_output_and_history(ip: Any, payloads: list[dict[str, Any]]) -> None:
    ip.run_line_magic("gguf", "reset")
    ip.user_ns["city"] = "Paris"
    ip.run_cell_magic("gguf", "-o first -t 0 -n 20", "Name one landmark in {city}. {{braces}} stay.")
    assert isinstance(ip.user_ns["first"], str) and ip.user_ns["first"]
    assert payloads[-1]["messages"][-1]["content"] == "Name one landmark in Paris. {braces} stay."
    last = ip.user_ns["_gguf_last"]
    assert last.text == ip.user_ns["first"] and last.done and last.usage["output_tokens"] > 0
    ip.run_cell_magic("gguf", "-t 0 -n 10", "And another one?")
    history = payloads[-1]["messages"]
    assert [m["role"] for m in history] == ["user", "assistant", "user"]
    assert history[1]["content"] == ip.user_ns["first"]
    assert len(_magics(ip).models["smol"].history) == 2


def test_rerunning_a_cell_replaces_its_turn(ip: Any, payloads: list[dict[str, Any]]) -> None:
    ip.run_line_magic("gguf", "reset")
    ip.run_cell_magic("gguf", "-t 0 -n 8", "Say A.")
    ip.run_cell_magic("gguf", "-t 0 -n 8", "Say B.")
    ip.run_cell_magic("gguf", "-t 0 -n 8", "Say A.")  # the same cell again
    turns = _magics(ip).models["smol"].history
    assert [t.user for t in turns] == ["Say A.", "Say B."]
    assert [m["content"] for m in payloads[-1]["messages"] if m["role"] == "user"] == ["Say A."]


def test_no_history_system_and_config(ip: Any, payloads: list[dict[str, Any]]) -> None:
    ip.run_line_magic("gguf", "reset")
    table = ip.run_line_magic("gguf", "config --system 'Be terse.' --max-tokens 12 --temperature 0")
    assert "Be terse." in repr(table)
    ip.run_cell_magic("gguf", "--no-history -s 'Answer in French.'", "Hello")
    sent = payloads[-1]
    assert sent["messages"][0] == {"role": "system", "content": "Answer in French."}
    assert sent["max_tokens"] <= 12 and sent["temperature"] == 0
    assert _magics(ip).models["smol"].history == []
    assert ip.run_line_magic("gguf", "What is 2+2?") is None  # streamed already: no second copy as Out[n]
    reply = ip.user_ns["_gguf_last"]
    assert reply.text and payloads[-1]["messages"][0]["content"] == "Be terse."
    ip.run_line_magic("gguf", "config --system '' --max-tokens 64")


def test_no_interpolate_and_unknown_name(ip: Any, payloads: list[dict[str, Any]]) -> None:
    with pytest.raises(UsageError, match=r"\{missing_var\} is not defined"):
        ip.run_cell_magic("gguf", "-n 5", "Use {missing_var} here")
    ip.user_ns["obj"] = object()
    with pytest.raises(UsageError, match=r"\{obj\.missing\}: obj has no attribute 'missing'"):
        ip.run_cell_magic("gguf", "-n 5", "Use {obj.missing} here")
    ip.run_cell_magic("gguf", "--no-interpolate --no-history -n 5 -t 0", "Keep {missing_var} as is")
    assert payloads[-1]["messages"][-1]["content"] == "Keep {missing_var} as is"


def test_format_code_puts_code_in_next_cell(ip: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    captured: list[str] = []
    monkeypatch.setattr(ip, "set_next_input", lambda text, replace=False: captured.append(text))
    ip.run_cell_magic("gguf", "-f code --no-history -t 0 -n 80",
                      "Write a Python function add(a, b) returning a + b, in a ```python code block.")
    # What -f code promises, whatever this CPU's reply is: the first fenced block's code without its fences, or,
    # if the reply has no complete block, the reply as it is.
    reply = ip.user_ns["_gguf_last"].text
    assert reply.strip()
    blocks = re.findall(r"```[\w+-]*\n(.*?)```", reply, re.S)
    assert captured == [(blocks[0] if blocks else reply).rstrip("\n")], reply
    if blocks:
        assert "```" not in captured[0]


def test_format_json_returns_parsed_json(ip: Any, payloads: list[dict[str, Any]]) -> None:
    """-f json asks for JSON mode (a JSON object, by grammar) and returns it parsed; its keys and values are the
    model's, which differ between CPUs. Cut by -n, the reply is incomplete JSON: a UsageError says so."""
    try:
        value = ip.run_cell_magic("gguf", "-f json --no-history -t 0 -n 120",
                                  'Return a JSON object with a key "city" whose value is "Paris".')
    except UsageError as exc:
        assert "not complete JSON" in str(exc)
        with pytest.raises(ValueError):
            json.loads(ip.user_ns["_gguf_last"].text)
    else:
        assert isinstance(value, dict) and value == json.loads(ip.user_ns["_gguf_last"].text)
    assert payloads[-1]["response_format"] == {"type": "json_object"}


def test_use_history_ps_list_and_errors(ip: Any, smollm2_path: Path) -> None:
    ps = ip.run_line_magic("gguf", "ps")
    assert "SmolLM2" in repr(ps) and "memory budget:" in repr(ps) and "MiB used" in ps._repr_markdown_()
    assert "last used" in repr(ps) and "memory" in repr(ps).splitlines()[0]
    assert "live" in repr(ps).splitlines()[0]  # the server's /metrics numbers, or "–"
    assert "SmolLM2-135M-Instruct" in repr(ip.run_line_magic("gguf", "list"))
    ip.run_line_magic("gguf", "use smol")
    ip.run_line_magic("gguf", "reset")
    assert "no history for smol" in repr(ip.run_line_magic("gguf", "history"))
    ip.run_cell_magic("gguf", "-t 0 -n 6", "Say yes.")
    rows = ip.run_line_magic("gguf", "history").rows
    assert [(r["#"], r["you"]) for r in rows] == [(1, "Say yes.")] and rows[0]["model"]
    with pytest.raises(UsageError, match="no model named 'nope'"):
        ip.run_line_magic("gguf", "use nope")
    with pytest.raises(UsageError, match="invalid choice"):
        ip.run_cell_magic("gguf", "-f yaml", "hi")
    with pytest.raises(UsageError, match="argument -n/--max-tokens: give a whole number >= 1, not 'lots'"):
        ip.run_cell_magic("gguf", "-n lots", "hi")
    with pytest.raises(UsageError, match="cell is empty"):
        ip.run_cell_magic("gguf", "", "   ")
    with pytest.raises(UsageError, match=r"%gguf load: .*(not found|No model|no model)"):
        ip.run_line_magic("gguf", "load /no/such/model.gguf")


def test_a_prompt_as_typed_help_and_a_near_name_on_a_loaded_model(ip: Any, payloads: list[dict[str, Any]],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """An apostrophe and quotes in a one-shot prompt reach the model as typed; help and a misspelled name leave
    the loaded model alone."""
    m = _magics(ip)
    saved = dict(m.settings)
    prompt = 'What\'s the capital of France? Say "Paris".'
    try:
        ip.run_line_magic("gguf", "config --max-tokens 8 --temperature 0")
        ip.run_line_magic("gguf", prompt)
    finally:
        m.settings.update(saved)
    assert payloads[-1]["messages"][-1] == {"role": "user", "content": prompt}
    assert ip.user_ns["_gguf_last"].done
    capsys.readouterr()
    assert ip.run_line_magic("gguf", "load --help") is None and ip.run_line_magic("gguf", "--help") is None
    out = capsys.readouterr().out
    assert "usage: %gguf load" in out and "--kv-cache-type" in out and "%gguf PROMPT" in out
    with pytest.raises(UsageError, match=r"^%gguf use: no model named 'smoll' is loaded .*; did you mean 'smol'\?$"):
        ip.run_line_magic("gguf", "use smoll")
    assert "smol" in m.models and m.models["smol"].engine.info.alive()


def test_server_failure_is_one_line_with_log_path(ip: Any, tmp_path: Path, smollm2_path: Path) -> None:
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% this is not jinja")
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("gguf", f"load {smollm2_path} --ctx 1024 --as broken --chat-template-file {bad}")
    msg = str(info.value)
    assert "\n" not in msg and "server log:" in msg and msg.endswith(".log")
    assert "broken" not in _magics(ip).models


@pytest.mark.speed_timeout("smollm2", tokens=200)
def test_interrupt_keeps_partial_reply_and_frees_the_slot(ip: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    real = commands.chat.stream

    def interrupted(engine: Any, request: Any) -> Iterator[Any]:
        request.params["ignore_eos"] = True  # it would run to -n if the server did not stop
        n = 0
        for ev in real(engine, request):
            yield ev
            n += 1
            if n == 5:
                raise KeyboardInterrupt  # what Ctrl-C / "interrupt kernel" raises in the consuming loop

    monkeypatch.setattr(commands.chat, "stream", interrupted)
    ip.run_line_magic("gguf", "reset")
    client = _magics(ip).models["smol"].engine.client
    before = slots.generated(client)
    ip.run_cell_magic("gguf", "-t 0 -n 200", "Count from 1 to 100, one number per line.")
    last = ip.user_ns["_gguf_last"]
    assert last.interrupted and last.text
    assert _magics(ip).models["smol"].history[-1].reply == last.text
    slots.assert_stopped_early(client, before, 200)  # fewer than -n: the server stopped when the client left


def test_unload(ip: Any, gemma_path: Path) -> None:
    # A model no other test holds now: a SmolLM2 load would share the running SmolLM2 server of `smol`.
    ip.run_line_magic("gguf", f"load {gemma_path} --ctx 1024 --as second")
    engine = _magics(ip).models["second"].engine
    info = engine.info
    ip.run_line_magic("gguf", "unload second")
    assert "second" not in _magics(ip).models
    # keep_alive is 0 in the tests: the last lease's release stopped it before returning (SIGKILL past the grace).
    assert not info.alive()
    with httpx.Client(transport=httpx.HTTPTransport(uds=info.address.socket)) as probe, \
            pytest.raises(httpx.TransportError):
        probe.get("http://x/health")


def test_quickstart_notebook_executes(tmp_path: Path) -> None:
    fresh = make_notebook.checked_fresh(make_notebook.NOTEBOOK, make_notebook.build(), "tests/support/make_notebook.py")
    nb = make_notebook.execute(fresh, tmp_path)
    outputs = {c.source.splitlines()[0]: c.outputs for c in nb.cells if c.cell_type == "code"}

    def text(key: str) -> str:
        return "\n".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
                         for o in outputs[key])

    def reply(key: str) -> str:
        """A reply cell's text, checked to end with the footer (the words are the model's: they differ by CPU)."""
        shown = [o for o in outputs[key] if o.get("data", {}).get("text/markdown")]
        assert len(shown) == 1, outputs[key]
        body, footer = str(shown[0]["data"]["text/plain"]).rsplit("\n", 1)
        assert re.fullmatch(r"\[SmolLM2-135M-Instruct · \d+ tokens( · .+)?\]", footer), footer
        assert body.strip()
        return body

    assert "context 2048 tokens" in text("%gguf load SmolLM2-135M-Instruct --ctx 2048")
    reply("%%gguf -t 0 -n 60")
    printed = text("print(len(answer) > 0, answer[:200])")
    assert printed.startswith("True ") and printed[5:].strip() in reply("%%gguf -o answer -t 0 -n 60")
    assert "Explain rainbows in one sentence." in text("%gguf history")  # {topic} filled in
    reply("%%gguf -f code -t 0 -n 120 --no-history")
    assert "unloaded SmolLM2-135M-Instruct" in text("%gguf unload")


def test_image_cell_in_an_executed_notebook(tmp_path: Path, smollm2_path: Path, projector_path: Path) -> None:
    """`%gguf load ... --vision` and `%%gguf --image PATH` (repeatable) in a real kernel: the prompt the server counts
    grows by the image's tokens per image (the projector's weights are random: the words are not checked), the
    image stays in the history, and a model loaded without --vision refuses the image in one line."""
    from PIL import Image

    Image.new("RGB", (64, 64), (200, 30, 30)).save(tmp_path / "red.png")
    Image.new("RGB", (80, 60), (20, 120, 220)).save(tmp_path / "blue.jpg")
    cells = [
        "%load_ext gguf_provider",
        f"%gguf load {smollm2_path} --vision --ctx 2048 --as eye",
        "%%gguf --no-history -t 0 -n 1\nDescribe this image.",
        "print('usage', _gguf_last.usage['input_tokens'])",
        "%%gguf --no-history -t 0 -n 1 --image red.png\nDescribe this image.",
        "print('usage', _gguf_last.usage['input_tokens'])",
        "%%gguf --no-history -t 0 -n 1 --image red.png -i blue.jpg\nDescribe this image.",
        "print('usage', _gguf_last.usage['input_tokens'])",
        "%%gguf -t 0 -n 1 --image red.png\nDescribe this image.",
        "%%gguf -t 0 -n 1\nAnd again?",
        "print('history', [len(t.images) for t in get_ipython().magics_manager.registry['GGUFMagics'].models['eye']"
        ".history], _gguf_last.usage['input_tokens'])",
        "%gguf unload eye",
        f"%gguf load {smollm2_path} --ctx 2048 --as blind",
        "%%gguf --no-history -t 0 -n 1 --image red.png\nDescribe this image.",
        "%gguf unload blind",
    ]
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    from nbclient import NotebookClient

    cell_bound = round(speed.measure("smollm2").bound(tokens=200, starts=2))  # a kernel's first cell, or a load
    NotebookClient(nb, kernel_name="python3", timeout=cell_bound, allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()

    def text(i: int) -> str:
        return "\n".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", "")) + str(o.get("evalue", ""))
                         for o in nb.cells[i].outputs)

    assert "inputs: text, images" in text(1)
    no_image, one, two = (int(text(i).split("usage")[1].split()[0]) for i in (3, 5, 7))
    per_image = one - no_image
    assert per_image > 0 and two - no_image == 2 * per_image
    history = text(10).split("history")[1].split()
    assert history[:2] == ["[1,", "0]"] and int(history[2]) > per_image  # the second turn resends the image
    assert "inputs: text ·" in text(12)
    refused = text(13)
    assert "UsageError" in str(nb.cells[13].outputs) and "500" not in refused
    assert "`--vision`" in refused and "vision=True" not in refused  # the magics' flag, not the keyword


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_terminal_reply_is_printed_once(ip: Any, fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    """In terminal IPython the reply streams as it comes and is not printed again (``-f text`` neither)."""
    capsys.readouterr()
    assert ip.run_cell_magic("gguf", f"-f {fmt} --no-history -t 0 -n 24", "Name three colours.") is None
    out = capsys.readouterr().out
    reply = ip.user_ns["_gguf_last"]
    assert reply.text.strip() and out.count(reply.text.strip()) == 1, out
    assert (reply._repr_markdown_() is None) == (fmt == "text")


def test_terminal_shows_reasoning_apart(capsys: pytest.CaptureFixture[str]) -> None:
    """Terminal IPython: reasoning streams between [thinking] marks, then the answer, then the footer."""
    from gguf_provider.jupyter.display import GGUFReply, _LiveOutput

    reply = GGUFReply(model="m")
    out = _LiveOutput(object(), reply)  # no kernel: plain prints
    out.delta("Let me ", "", "Let me ", reasoning=True)
    out.delta("think.", "", "Let me think.", reasoning=True)
    out.delta("Blue", "Blue", "Let me think.")
    out.delta(".", "Blue.", "Let me think.")
    reply.text, reply.reasoning, reply.done = "Blue.", "Let me think.", True
    out.finish()
    assert capsys.readouterr().out == "[thinking]\nLet me think.\n[/thinking]\nBlue.\n[m]\n"


def test_editing_and_rerunning_a_notebook_cell_replaces_its_turn(ip: Any) -> None:
    """Jupyter passes a cell id with each run: an edited cell run again replaces its own turn, not appends one."""
    ip.run_line_magic("gguf", "reset")
    ip.run_cell("%%gguf -t 0 -n 6\nSay A.", cell_id="cell-a")
    ip.run_cell("%%gguf -t 0 -n 6\nSay B.", cell_id="cell-b")
    ip.run_cell("%%gguf -t 0 -n 6\nSay C instead.", cell_id="cell-a")  # cell-a edited and re-run
    assert [t.user for t in _magics(ip).models["smol"].history] == ["Say C instead.", "Say B."]


# --- tool calls ---------------------------------------------------------------------------------------------------
# SmolLM2 will not call a tool by itself. Under Qwen3's chat template (`<tool_call>` JSON), llama-server's own parser
# makes a tool call of what the reply holds; the reply is made the call for real: the assistant turn is prefilled
# with it (llama-server continues a last assistant message and returns it whole) and ``logit_bias`` on ``<|im_end|>``
# makes the one token generated after it the end (as in test_healing_real.py). The magics take no prefill, so
# ``force`` adds it to the request their own code path builds; what comes back goes through that path unchanged.

ASK = "What is the weather in Paris?"
PARIS = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ROME = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'


def get_weather(city: str) -> str:
    """Current weather of a city.

    Args:
        city: The city's name.
    """
    return "18 °C"


@pytest.fixture(scope="module")
def tool_model(ip: Any, smollm2_path: Path, llama_src: Path) -> Iterator[str]:
    """SmolLM2 loaded under Qwen3's chat template as ``qwen3t`` (``smol`` stays current)."""
    template = llama_src / "models" / "templates" / "Qwen-Qwen3-0.6B.jinja"
    ip.run_line_magic("gguf", f"load {smollm2_path} --ctx 2048 --as qwen3t --chat-template-file {template}")
    ip.run_line_magic("gguf", "use smol")
    yield "qwen3t"
    try:
        ip.run_line_magic("gguf", "unload qwen3t")
    except UsageError:  # unloaded already (unload --all)
        pass


@pytest.fixture
def force(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """``force(text)``: the next %%gguf request's reply is ``text``, made by the server (see above)."""
    real = commands.chat.stream
    pending: list[str] = []

    def forced(engine: Any, request: Any) -> Iterator[Any]:
        if pending:
            (end,) = engine.tokenize("<|im_end|>")
            request = dataclasses.replace(
                request, messages=[*request.messages, {"role": "assistant", "content": pending.pop()}],
                params={**request.params, "logit_bias": [[end, 100.0]], "max_tokens": 1, "temperature": 0})
        return real(engine, request)

    monkeypatch.setattr(commands.chat, "stream", forced)
    return pending.append


def test_tool_call_streams_is_shown_and_kept_then_its_result_goes_back(
        ip: Any, tool_model: str, force: Callable[[str], None], payloads: list[dict[str, Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    """Terminal IPython: `--tools NAME` sends the function's schema; the server's tool call is printed as it ends,
    is `_gguf_last.tool_calls` and stays in the history; `--tool-result` (no ID: the one waiting call) sends the cell
    as the call's result, which the server renders in Qwen3's `<tool_response>` and answers."""
    ip.user_ns["get_weather"] = get_weather
    ip.run_line_magic("gguf", f"reset {tool_model}")
    force(PARIS)
    capsys.readouterr()
    assert ip.run_cell_magic("gguf", f"{tool_model} --tools get_weather", ASK) is None
    out = capsys.readouterr().out
    reply = ip.user_ns["_gguf_last"]
    assert [(c["name"], c["arguments"]) for c in reply.tool_calls] == [("get_weather", {"city": "Paris"})]
    call_id = reply.tool_calls[0]["id"]
    assert call_id and reply.text == "" and reply.done
    line = f'[tool call] get_weather({{"city": "Paris"}})  # id: {call_id}'
    assert out.count("[tool call]") == 1 and line in out and line in repr(reply), out
    sent = payloads[-1]
    assert sent["tools"] == [tools.function_tool(get_weather)] and sent["tool_choice"] == "auto"
    assert sent["tools"][0]["function"]["parameters"]["properties"]["city"] == {
        "type": "string", "description": "The city's name."}
    engine = _magics(ip).models[tool_model].engine
    raw = [ev for ev in engine.stream(sent) if isinstance(ev, events.ToolCallDelta)]
    assert [ev.name for ev in raw] == ["get_weather"]  # llama-server's parser made the call, not our healing
    turn = _magics(ip).models[tool_model].history[-1]
    assert turn.user == ASK and turn.reply == "" and turn.tool_calls == reply.tool_calls
    row = ip.run_line_magic("gguf", f"history {tool_model}").rows[-1]
    assert row["model"] == '[tool call] get_weather({"city": "Paris"})'

    ip.run_cell_magic("gguf", f"{tool_model} --tool-result -t 0 -n 8", "18 °C and sunny")
    sent = payloads[-1]
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "tool"]
    assistant, result = sent["messages"][1:]
    assert assistant["content"] == "" and assistant["tool_calls"] == [
        {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    assert result == {"role": "tool", "tool_call_id": call_id, "name": "get_weather", "content": "18 °C and sunny"}
    assert sent["tools"] == [tools.function_tool(get_weather)]  # the calling cell's tools, sent again
    prompt = engine.client.apply_template({"messages": sent["messages"], "tools": sent["tools"]})
    assert PARIS in prompt and "<tool_response>\n18 °C and sunny\n</tool_response>" in prompt
    answer = ip.user_ns["_gguf_last"]
    assert answer.done and answer.usage["input_tokens"] == engine.count_prompt_tokens(sent)
    assert answer.tool_calls == [] and "[tool call]" not in repr(answer)
    turn = _magics(ip).models[tool_model].history[-1]
    assert (turn.tool_call_id, turn.user, turn.reply) == (call_id, "18 °C and sunny", answer.text)
    row = ip.run_line_magic("gguf", f"history {tool_model}").rows[-1]
    assert row["you"] == f"[tool result {call_id}] 18 °C and sunny"


def test_parallel_calls_in_a_notebook_each_get_a_result(
        ip: Any, tool_model: str, force: Callable[[str], None], payloads: list[dict[str, Any]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel (display updates): two calls are shown as Markdown; the first `--tool-result ID` is recorded
    without asking the model, the second sends both results; re-running the calling cell drops results of calls it
    no longer makes. A list of OpenAI tool dicts is a `--tools` value too."""
    import IPython.display

    shown: list[Any] = []

    class Handle:
        def update(self, obj: Any) -> None:
            shown.append(obj._repr_markdown_())

    monkeypatch.setattr(display, "_is_kernel", lambda shell: True)
    monkeypatch.setattr(IPython.display, "display", lambda obj, display_id=False: Handle())
    ip.user_ns["weather_tools"] = [tools.function_tool(get_weather)]
    ip.run_line_magic("gguf", f"reset {tool_model}")
    force(f"{PARIS}\n{ROME}")
    ip.run_cell("%%gguf qwen3t --tools weather_tools\nWeather in Paris and Rome?", cell_id="calls")
    reply = ip.user_ns["_gguf_last"]
    assert [c["arguments"] for c in reply.tool_calls] == [{"city": "Paris"}, {"city": "Rome"}]
    paris, rome = (c["id"] for c in reply.tool_calls)
    assert f'**tool call** `get_weather({{"city": "Rome"}})` · id `{rome}`' in shown[-1]
    with pytest.raises(UsageError, match="which call"):
        ip.run_cell_magic("gguf", "qwen3t --tool-result", "18 °C")
    with pytest.raises(UsageError, match="no call 'nope'"):
        ip.run_cell_magic("gguf", "qwen3t --tool-result nope", "18 °C")
    sent_before = len(payloads)
    ip.run_cell(f"%%gguf qwen3t --tool-result {rome}\n25 °C", cell_id="rome")
    assert len(payloads) == sent_before  # recorded, not asked: Paris has no result yet
    assert _magics(ip).models[tool_model].history[-1].reply is None
    ip.run_cell(f"%%gguf qwen3t --tool-result {paris} -t 0 -n 4\n18 °C", cell_id="paris")
    sent = payloads[-1]["messages"]
    assert [(m["role"], m.get("tool_call_id")) for m in sent] == [
        ("user", None), ("assistant", None), ("tool", rome), ("tool", paris)]
    prompt = _magics(ip).models[tool_model].engine.client.apply_template(
        {"messages": sent, "tools": payloads[-1]["tools"]})
    assert prompt.count("<tool_response>") == 2 and ip.user_ns["_gguf_last"].done
    with pytest.raises(UsageError, match="the last reply of qwen3t made no tool call"):  # it answered
        ip.run_cell_magic("gguf", "qwen3t --tool-result", "again")

    force(PARIS)  # the calling cell re-run: one call, with a new id
    ip.run_cell("%%gguf qwen3t --tools weather_tools\nWeather in Paris and Rome?", cell_id="calls")
    history = _magics(ip).models[tool_model].history
    assert [t.key for t in history] == ["calls"] and len(history[0].tool_calls) == 1


def test_tool_flags_errors_and_tool_choice(ip: Any, tool_model: str, payloads: list[dict[str, Any]]) -> None:
    ip.user_ns["not_a_tool"] = 42
    ip.user_ns["get_weather"] = get_weather
    ip.run_line_magic("gguf", f"reset {tool_model}")
    with pytest.raises(UsageError, match="missing_tool is not defined"):
        ip.run_cell_magic("gguf", "qwen3t --tools missing_tool", ASK)
    with pytest.raises(UsageError, match="not_a_tool is a int, not a function"):
        ip.run_cell_magic("gguf", "qwen3t --tools not_a_tool", ASK)
    with pytest.raises(UsageError, match="give the tools with --tools"):
        ip.run_cell_magic("gguf", "qwen3t --tool-choice required", ASK)
    with pytest.raises(UsageError, match="'get_time' is not auto, none, required or a tool"):
        ip.run_cell_magic("gguf", "qwen3t --tools get_weather --tool-choice get_time", ASK)
    with pytest.raises(UsageError, match="-f json does not go with --tools"):
        ip.run_cell_magic("gguf", "qwen3t --tools get_weather -f json", ASK)
    with pytest.raises(UsageError, match="made no tool call"):
        ip.run_cell_magic("gguf", "qwen3t --tool-result", "18 °C")
    with pytest.raises(UsageError, match="drop --no-history"):
        ip.run_cell_magic("gguf", "qwen3t --tool-result --no-history", "18 °C")
    # A named choice is enforced by grammar (the chat layer's response_format); -n 1 only checks what is sent.
    ip.run_cell_magic("gguf", "qwen3t --tools get_weather --tool-choice get_weather --no-history -n 1", ASK)
    schema = payloads[-1]["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["name"] == {"const": "get_weather"}


def test_second_model_quant_reset_by_name_and_unload_all(ip: Any, smollm2_path: Path) -> None:
    """Runs last: `load NAME --quant Q --as`, `reset NAME` touches only that model, `unload --all` stops both."""
    summary = ip.run_line_magic("gguf", "load SmolLM2-135M-Instruct --quant Q4_1 --ctx 1024 --as q")
    assert Path(summary.path).name == smollm2_path.name and summary.n_ctx == 1024
    m = _magics(ip)
    ip.run_cell_magic("gguf", "smol -t 0 -n 4", "Hi.")
    ip.run_cell_magic("gguf", "q -t 0 -n 4", "Hi.")
    assert m.models["q"].history and m.models["smol"].history
    ip.run_line_magic("gguf", "reset q")
    assert not m.models["q"].history and m.models["smol"].history
    pids = [m.models[n].engine.info.pid for n in ("smol", "q")]
    ip.run_line_magic("gguf", "unload --all")
    assert m.models == {} and m.current is None
    # keep_alive=0 in the test session: each release stopped its server before returning.
    assert not [p for p in pids if pid_alive(p)]


@pytest.mark.parametrize("kernel", [False, True])
def test_load_progress_in_terminal_and_notebook(kernel: bool, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Download bytes as a bar, then a "loading" counter that ends as a final line (display updates in a kernel,
    carriage-return prints in a terminal)."""
    import IPython.display

    shown: list[Any] = []

    class Handle:
        def update(self, obj: Any, raw: bool = False) -> None:
            shown.append(obj)

    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False, display_id=False: shown.append(obj)
                        or Handle())
    shell = type("Shell", (), {"kernel": object() if kernel else None})()
    progress = display._Progress(shell)
    progress("download", 0, 1000)
    progress("download", 1000, 1000)
    progress("loading", 0, 0)
    progress.close()
    assert progress.bar is not None and progress.bar.n == 1000
    out = capsys.readouterr()
    if kernel:
        assert [o["text/plain"].split(" ")[0] for o in shown] == ["loading", "loaded"], shown
    else:
        assert "\rloading model … " in out.out and not shown


@pytest.mark.timeout(300)  # a cut at 3.5 s; a reply that is not cut hangs on the paused server until this
def test_max_time_cuts_a_paused_server(ip: Any, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--max-time`` holds even when no token comes: the server is held still after its first token, and the
    cell still ends at ``MAX_TIME_GRACE`` x 2 + 1 s, with what was written so far (test_max_time.py: the adapters)."""
    real = commands.chat.stream

    def endless(engine: Any, request: Any) -> Iterator[Any]:
        request.params["ignore_eos"] = True  # it would write to the end of the context
        return real(engine, request)

    monkeypatch.setattr(commands.chat, "stream", endless)
    ip.run_line_magic("gguf", f"load {smollm2_path} --ctx 1536 --as paused")  # a server no other test uses
    armed = watch_arming(monkeypatch)
    pauser = Pauser(_magics(ip).models["paused"].engine, None, armed)
    pauser.start()
    try:
        with pytest.warns(GenerationTimeWarning, match="`--max-time 2` s"):  # in the magics' words
            ip.run_cell_magic("gguf", "--max-time 2 -t 0.8 -n 1400 --no-history",  # -n: test_no_history_... set 64
                              "Write a long story about a lighthouse keeper.")
        ended = time.monotonic()
    finally:
        pauser.stop()
        ip.run_line_magic("gguf", "unload paused")
    assert armed.at is not None and pauser.paused_at is not None
    assert ended - armed.at < 2 * MAX_TIME_GRACE + 1 + CUT_SLACK
    assert ip.user_ns["_gguf_last"].text
