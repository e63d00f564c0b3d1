"""`gguf-provider launch`: the model rule, what each tool is given, the user's config written only when asked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomllib

from gguf_provider import cli, launch
from gguf_provider.launch import Candidate, LaunchError

CLAUDE, CODEX, OPENCODE = launch.TOOLS["claude"], launch.TOOLS["codex"], launch.TOOLS["opencode"]
TOOLS_TEMPLATE = "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"


def facts(**kw: Any) -> dict[str, Any]:
    return {"pooling": None, "chat_template": TOOLS_TEMPLATE, "context_length": 32768, **kw}


def test_the_context_holds_the_measured_first_request_with_its_margin_and_a_reply() -> None:
    for tool in launch.TOOLS.values():
        need = launch.context_for(tool)
        assert need % 1024 == 0
        assert tool.first_request * launch.TOKENIZER_MARGIN + launch.REPLY_TOKENS <= need
        assert need - 1024 < tool.first_request * launch.TOKENIZER_MARGIN + launch.REPLY_TOKENS
    assert launch.context_for(CLAUDE) > launch.context_for(CODEX) > launch.context_for(OPENCODE)


@pytest.mark.parametrize(("given", "reason"), [
    (None, "cannot be read"),
    (facts(pooling=1), "embedding or reranking"),
    (facts(chat_template=None), "no chat template"),
    (facts(chat_template="{% for m in messages %}{{ m.content }}{% endfor %}"), "takes no tools"),
    (facts(context_length=8192), "trained for 8,192 tokens of context; claude needs 31,744"),
])
def test_each_reason_a_model_is_passed_over(given: dict[str, Any] | None, reason: str) -> None:
    planned = []
    why = launch.judge("m", given, 31744, CLAUDE, lambda: planned.append(1) or "planned")  # type: ignore[func-returns-value]
    assert why is not None and reason in why
    assert planned == []  # the plan, the costly check, only for a model that passed the others


def test_the_plan_decides_last() -> None:
    assert launch.judge("m", facts(), 31744, CLAUDE, lambda: None) is None
    assert launch.judge("m", facts(context_length=None), 31744, CLAUDE, lambda: "too big") == "too big"


def test_the_largest_qualifying_model_is_chosen_ties_by_name() -> None:
    judged = [Candidate("small", "/s", 100, None), Candidate("huge", "/h", 900, "too big"),
              Candidate("b-big", "/b", 500, None), Candidate("a-big", "/a", 500, None)]
    assert launch.choose(judged) == judged[3]
    assert launch.choose([Candidate("x", "/x", 1, "no")]) is None


def test_a_refusal_says_why_each_model_was_passed_over() -> None:
    text = launch.refusal(CODEX, 19456, [Candidate("emb", "/e", 1, "an embedding or reranking model"),
                                         Candidate("tiny", "/t", 1, "its chat template takes no tools")])
    assert "emb: an embedding or reranking model" in text and "tiny: its chat template takes no tools" in text
    assert "19,456" in text and "gguf-provider launch codex MODEL" in text
    assert "pull" in launch.refusal(CODEX, 19456, [])


def test_claude_gets_the_gateway_and_the_same_model_for_its_small_one() -> None:
    made = launch.setup(CLAUDE, "http://127.0.0.1:1", "big", "big", key="k", n_ctx=None)
    assert made.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:1" and made.env["ANTHROPIC_AUTH_TOKEN"] == "k"
    assert made.env["ANTHROPIC_MODEL"] == made.env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "big"
    assert "ANTHROPIC_API_KEY" in made.unset and made.args == []
    other = launch.setup(CLAUDE, "http://h", "big", "small", key=None, n_ctx=None)
    assert other.env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == other.env["ANTHROPIC_SMALL_FAST_MODEL"] == "small"
    assert other.env["ANTHROPIC_AUTH_TOKEN"] == "gguf-provider"


def test_codex_gets_config_overrides_that_parse_as_toml_and_its_key_in_the_environment() -> None:
    made = launch.setup(CODEX, "http://127.0.0.1:2", "m \"q\"", "m", key="secret", n_ctx=19456)
    pairs = [made.args[i + 1] for i in range(0, len(made.args), 2)]
    assert made.args[::2] == ["-c"] * len(pairs)
    parsed: dict[str, Any] = {}
    for pair in pairs:  # as Codex reads `-c key=value`: a dotted key, a TOML value
        key, value = pair.split("=", 1)
        parsed[key] = tomllib.loads(f"v = {value}")["v"]
    assert parsed["model_provider"] == "gguf" and parsed["model"] == 'm "q"'
    assert parsed["model_providers.gguf"] == {"name": "gguf-provider", "base_url": "http://127.0.0.1:2/v1",
                                              "env_key": launch.KEY_ENV, "wire_api": "responses"}
    assert parsed["model_context_window"] == 19456
    assert "secret" not in " ".join(made.args) and made.env[launch.KEY_ENV] == "secret"


def test_opencode_gets_its_config_inline_with_the_key_by_reference() -> None:
    made = launch.setup(OPENCODE, "http://h:3", "big", "small", key="secret", n_ctx=17408)
    config = json.loads(made.env["OPENCODE_CONFIG_CONTENT"])
    assert config["model"] == "gguf/big" and config["small_model"] == "gguf/small"
    provider = config["provider"]["gguf"]
    assert provider["options"] == {"baseURL": "http://h:3/v1", "apiKey": "{env:GGUF_PROVIDER_API_KEY}"}
    assert set(provider["models"]) == {"big", "small"}
    assert provider["models"]["big"]["limit"] == {"context": 17408, "output": launch.REPLY_TOKENS}
    assert "secret" not in made.env["OPENCODE_CONFIG_CONTENT"] and made.env[launch.KEY_ENV] == "secret"
    one = json.loads(launch.setup(OPENCODE, "http://h", "m", "m", key=None, n_ctx=None).env["OPENCODE_CONFIG_CONTENT"])
    assert list(one["provider"]["gguf"]["models"]) == ["m"] and "limit" not in one["provider"]["gguf"]["models"]["m"]


def test_print_env_reads_the_key_from_its_file_and_never_shows_it(tmp_path: Path) -> None:
    key_file = tmp_path / "my key"
    gw = launch.Gateway("http://127.0.0.1:4", str(key_file))
    made = launch.setup(CLAUDE, gw.url, "m", "m", key=None, n_ctx=None)
    text = launch.render(CLAUDE, made, gw, ["-p", "hi there"], note="n")
    assert f"export ANTHROPIC_AUTH_TOKEN=\"$(head -n1 '{key_file}')\"" in text
    assert "unset ANTHROPIC_API_KEY" in text and text.endswith("claude -p 'hi there'")


def test_write_config_merges_into_claude_settings_and_names_the_key_file(tmp_path: Path) -> None:
    settings = tmp_path / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(json.dumps({"theme": "dark", "env": {"MINE": "1"}}))
    path, usage = launch.write_config(CLAUDE, "http://h:5", "m", "m", key_file="/k", n_ctx=None, home=tmp_path)
    data = json.loads(path.read_text())
    assert path == settings and usage == "claude" and data["theme"] == "dark" and data["env"]["MINE"] == "1"
    assert data["env"]["ANTHROPIC_BASE_URL"] == "http://h:5" and "ANTHROPIC_AUTH_TOKEN" not in data["env"]
    assert data["apiKeyHelper"] == "head -n1 /k"
    settings.write_text("{not json")
    with pytest.raises(LaunchError, match="not JSON"):
        launch.write_config(CLAUDE, "http://h:5", "m", "m", key_file="", n_ctx=None, home=tmp_path)


def test_write_config_adds_a_codex_profile_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CODEX_HOME", raising=False)
    config = tmp_path / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text('model = "gpt-5"\n\n[mcp_servers.x]\ncommand = "x"\n')
    for url in ("http://h:6", "http://h:7"):  # written again: replaced, not added twice
        path, usage = launch.write_config(CODEX, url, "m", "m", key_file="", n_ctx=19456, home=tmp_path)
    data = tomllib.loads(path.read_text())
    assert data["model"] == "gpt-5" and data["mcp_servers"]["x"]["command"] == "x"  # the user's own stays theirs
    assert data["model_providers"]["gguf"]["base_url"] == "http://h:7/v1" and "env_key" not in data["model_providers"]["gguf"]
    assert data["profiles"]["gguf"] == {"model": "m", "model_provider": "gguf", "model_context_window": 19456}
    assert path.read_text().count(launch.BEGIN) == 1 and usage == "codex --profile gguf"


def test_write_config_merges_opencode_providers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    path = tmp_path / "cfg" / "opencode" / "opencode.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"provider": {"other": {"npm": "x"}}, "theme": "t"}))
    launch.write_config(OPENCODE, "http://h:8", "m", "s", key_file="/k", n_ctx=None, home=tmp_path)
    data = json.loads(path.read_text())
    assert set(data["provider"]) == {"other", "gguf"} and data["theme"] == "t" and data["model"] == "gguf/m"
    assert data["provider"]["gguf"]["options"]["apiKey"] == "{env:GGUF_PROVIDER_API_KEY}"


def test_the_arguments_after_a_double_dash_are_the_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[launch.Request] = []
    monkeypatch.setattr(launch, "run", lambda req: seen.append(req) or 7)
    assert cli.main(["launch", "codex", "m", "--print-env", "--", "exec", "--model", "x", "--", "y"]) == 7
    assert seen[0].tool == "codex" and seen[0].model == "m" and seen[0].print_env
    assert list(seen[0].args) == ["exec", "--model", "x", "--", "y"]
    assert cli.main(["launch", "claude"]) == 7 and list(seen[1].args) == [] and seen[1].model is None
    with pytest.raises(SystemExit) as exc:
        cli.main(["launch", "cursor"])
    assert exc.value.code == 2


def test_a_gateway_that_does_not_start_is_an_error_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    log.write_text("line one\nTraceback: boom\n")
    proc = subprocess.Popen([sys.executable, "-c", "import sys; print('starting'); sys.exit(3)"],
                            stdout=subprocess.PIPE)
    with pytest.raises(LaunchError, match=r"(?s)did not start \(exit code 3\).*Traceback: boom"):
        launch._await_url(proc, 60, log)


def test_a_missing_tool_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "pick_model", lambda tool, need, named: ("m", "named"))
    monkeypatch.setattr(launch.shutil, "which", lambda exe: None)
    with pytest.raises(LaunchError, match="npm install -g @openai/codex"):
        launch.run(launch.Request("codex", model="m", url="http://127.0.0.1:9"))
