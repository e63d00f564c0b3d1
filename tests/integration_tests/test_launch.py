"""`gguf-provider launch` on this machine's real models and a real gateway: the model it chooses or its refusal, the
shell lines of `--print-env` (run by bash), a gateway it finds or starts, and the tool's exit code passed on. The
live Codex run through launch is in tools/test_tools_live.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import psutil

from tests.support.gateway import ROOT, gateway

QWEN = "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M"


def models_dir(tmp_path: Path, *paths: Path) -> Path:
    d = tmp_path / "models"
    d.mkdir()
    for p in paths:
        (d / p.name).symlink_to(p)
    return d


def env_for(tmp_path: Path, models: Path, **extra: str) -> dict[str, str]:
    """This machine's tools and binaries, a private home, runtime dir and temporary dir (launch's key files), only
    ``models`` as models."""
    run_dir = Path(tempfile.mkdtemp(prefix="gpl-", dir="/tmp"))
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "GGUF_PROVIDER_HOME": str(tmp_path / "home"), "GGUF_PROVIDER_RUNTIME_DIR": str(run_dir),
           "GGUF_PROVIDER_MODELS": str(models), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1",
           "GGUF_PROVIDER_AUTO_INSTALL": "0", "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path / "tmp"), **extra}
    for var in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "CODEX_HOME", "OPENCODE_CONFIG_CONTENT"):
        env.pop(var, None)
    return env


def launch(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gguf_provider.cli", "launch", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def sourced(lines: str, env: dict[str, str], names: list[str]) -> dict[str, str | None]:
    """The variables ``names`` after bash runs the printed lines (all but the last: the tool's command)."""
    script = "\n".join(lines.strip().splitlines()[:-1])
    probe = f"{script}\npython3 -c 'import json, os, sys; print(json.dumps({{n: os.environ.get(n) for n in sys.argv[1:]}}))' {' '.join(names)}"
    out = subprocess.run(["bash", "-euc", probe], env=env, capture_output=True, text=True, timeout=30, check=True)
    got: dict[str, str | None] = json.loads(out.stdout)
    return got


def test_no_model_that_fits_is_a_refusal_that_says_why_for_each(tmp_path: Path, smollm2_path: Path,
                                                                minilm_path: Path, reranker_path: Path) -> None:
    env = env_for(tmp_path, models_dir(tmp_path, smollm2_path, minilm_path, reranker_path))
    for tool in ("claude", "codex", "opencode"):
        proc = launch(env, tool)
        assert proc.returncode == 1, (proc.stdout, proc.stderr)
        err = proc.stderr
        assert f"no local model fits {tool}" in err, err
        assert f"{smollm2_path.stem}: its chat template takes no tools" in err, err
        assert f"{minilm_path.stem}: an embedding or reranking model" in err, err
        assert f"{reranker_path.stem}: " in err, err
        assert proc.stdout == ""
    assert not list(Path(env["GGUF_PROVIDER_RUNTIME_DIR"]).glob("gateways/*.json"))  # nothing was started


def test_print_env_chooses_the_model_that_fits_and_its_lines_run(tmp_path: Path, smollm2_path: Path,
                                                                qwen_path: Path, minilm_path: Path) -> None:
    env = env_for(tmp_path, models_dir(tmp_path, smollm2_path, qwen_path, minilm_path),
                  ANTHROPIC_API_KEY="a-key-of-mine")
    claude = launch(env, "claude", "--print-env", "--", "-p", "hi")
    assert claude.returncode == 0, claude.stderr
    assert f"claude on {QWEN} (chosen: the one local model" in claude.stdout
    assert claude.stdout.strip().splitlines()[-1] == "claude -p hi"
    got = sourced(claude.stdout, env, ["ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                                       "ANTHROPIC_API_KEY"])
    assert got == {"ANTHROPIC_BASE_URL": "http://127.0.0.1:11480", "ANTHROPIC_MODEL": QWEN,
                   "ANTHROPIC_DEFAULT_HAIKU_MODEL": QWEN, "ANTHROPIC_API_KEY": None}
    codex = launch(env, "codex", "--print-env", "--small-model", smollm2_path.stem)
    assert codex.returncode == 0, codex.stderr
    last = codex.stdout.strip().splitlines()[-1]
    assert last.startswith("codex -c 'model_providers.gguf={") and f"model=\"{QWEN}\"" in last, last
    opencode = launch(env, "opencode", "--print-env", "--small-model", smollm2_path.stem)
    assert opencode.returncode == 0, opencode.stderr
    config = json.loads(sourced(opencode.stdout, env, ["OPENCODE_CONFIG_CONTENT"])["OPENCODE_CONFIG_CONTENT"] or "")
    assert config["model"] == f"gguf/{QWEN}" and config["small_model"] == f"gguf/{smollm2_path.stem}"
    assert config["provider"]["gguf"]["models"][QWEN]["limit"]["context"] == 17408  # the context it needs


def test_print_env_finds_the_running_gateway_and_reads_its_key_from_its_file(tmp_path: Path, qwen_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("s3cret-key\n")
    key_file.chmod(0o600)
    with gateway(qwen_path.parent, "--api-key-file", str(key_file), "--ctx", "20480") as gw:
        proc = launch(gw.env, "codex", QWEN, "--print-env")
        assert proc.returncode == 0, proc.stderr
        assert "s3cret-key" not in proc.stdout and f"the gateway at {gw.url}" in proc.stdout
        got = sourced(proc.stdout, gw.env, ["GGUF_PROVIDER_API_KEY"])
        assert got["GGUF_PROVIDER_API_KEY"] == "s3cret-key"
        assert "model_context_window=20480" in proc.stdout  # the gateway's own --ctx, from its record
        assert f'base_url = "{gw.url}/v1"' in proc.stdout


FAKE_TOOL = textwrap.dedent("""\
    #!{python}
    # A stand-in for opencode: asks the gateway launch gave it for its models with the key launch gave it
    import json, os, sys, urllib.request
    config = json.loads(os.environ["OPENCODE_CONFIG_CONTENT"])
    base = config["provider"]["gguf"]["options"]["baseURL"]
    req = urllib.request.Request(base + "/models",
                                 headers={{"Authorization": "Bearer " + os.environ["GGUF_PROVIDER_API_KEY"]}})
    with urllib.request.urlopen(req, timeout=30) as r:
        names = [m["id"] for m in json.load(r)["data"]]
    try:
        urllib.request.urlopen(base + "/models", timeout=30)
        keyless = "answered"
    except urllib.error.HTTPError as exc:
        keyless = exc.code
    print(json.dumps({{"args": sys.argv[1:], "models": names, "keyless": keyless, "base": base}}))
    sys.exit(3)
    """)


def test_launch_starts_a_gateway_with_a_key_for_the_run_passes_the_exit_code_on_and_stops_it(
        tmp_path: Path, qwen_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "opencode"
    tool.write_text(FAKE_TOOL.format(python=sys.executable))
    tool.chmod(0o755)
    env = env_for(tmp_path, models_dir(tmp_path, qwen_path), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    proc = launch(env, "opencode", "--", "run", "a b")
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    said = json.loads(proc.stdout.strip().splitlines()[-1])
    assert said["args"] == ["run", "a b"] and QWEN in said["models"]
    assert said["keyless"] == 401  # the gateway launch started takes its key only
    assert "started for this run" in proc.stderr
    port = int(said["base"].rsplit(":", 1)[1].split("/")[0])
    # gone with the run: nothing listens on its port, no record of it is left
    assert not [c for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port
                and c.status == psutil.CONN_LISTEN]
    assert not list(Path(env["GGUF_PROVIDER_RUNTIME_DIR"]).glob("gateways/*.json"))
    assert not list((tmp_path / "tmp").glob("gguf-provider-launch-*"))  # its key's dir is gone too


SLEEPY_TOOL = textwrap.dedent("""\
    #!{python}
    # A stand-in for claude that runs until told: says it is up, then waits; a SIGTERM ends it with 143
    import signal, sys, time
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print("up", flush=True)
    time.sleep(600)
    """)


def test_a_launch_told_to_stop_passes_it_to_the_tool_and_stops_its_gateway(tmp_path: Path, qwen_path: Path) -> None:
    """SIGTERM to launch alone (a process manager, `kill`): the tool gets it, its exit code is launch's, and the
    gateway started for the run is gone with it."""
    import signal
    import time

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "claude"
    tool.write_text(SLEEPY_TOOL.format(python=sys.executable))
    tool.chmod(0o755)
    env = env_for(tmp_path, models_dir(tmp_path, qwen_path), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.Popen([sys.executable, "-m", "gguf_provider.cli", "launch", "claude", QWEN], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == "up\n"  # the tool runs: the gateway is up
        gateways = list(Path(env["GGUF_PROVIDER_RUNTIME_DIR"]).glob("gateways/*.json"))
        assert len(gateways) == 1
        gw_pid = json.loads(gateways[0].read_text())["pid"]
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 143, proc.stderr.read() if proc.stderr else ""
        print(f"launch ended {time.monotonic() - t0:.1f} s after SIGTERM")
        assert not psutil.pid_exists(gw_pid) or psutil.Process(gw_pid).status() == psutil.STATUS_ZOMBIE
        assert not list(Path(env["GGUF_PROVIDER_RUNTIME_DIR"]).glob("gateways/*.json"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()


def test_a_launch_stopped_while_its_gateway_starts_leaves_no_gateway(tmp_path: Path, qwen_path: Path) -> None:
    """SIGTERM while launch waits for the gateway it started (or before it spawned one, or once the tool runs: each
    moment ends the same): launch ends, and no gateway of its own is left (it runs in a session of its own, so it
    would not get the signal itself)."""
    import signal
    import time

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "claude"
    tool.write_text(SLEEPY_TOOL.format(python=sys.executable))
    tool.chmod(0o755)
    env = env_for(tmp_path, models_dir(tmp_path, qwen_path), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    run_dir = Path(env["GGUF_PROVIDER_RUNTIME_DIR"])
    proc = subprocess.Popen([sys.executable, "-m", "gguf_provider.cli", "launch", "claude", QWEN], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        # the gateway's child process exists once launch has spawned it (its record comes later, once it listens)
        deadline = time.monotonic() + 60
        while not psutil.Process(proc.pid).children() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
        spawned = psutil.Process(proc.pid).children() if proc.poll() is None else []
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) in (143, -signal.SIGTERM), proc.returncode
        # stopped by launch, or (a signal before launch's handler was set) by the kernel's SIGTERM to an orphan
        _, alive = psutil.wait_procs(spawned, timeout=30)
        assert not alive, alive
        assert not list(run_dir.glob("gateways/*.json"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_launch_killed_takes_its_gateway_with_it(tmp_path: Path, qwen_path: Path) -> None:
    """kill -9 of launch while the tool runs: the gateway it started gets SIGTERM from the kernel (its parent died)
    and stops as told, its record removed; within 30 s (an idle gateway stops in ~1 s here; uvicorn's graceful 5 s and
    the prompt cache's save bound the rest). The tool, in launch's own process group, is the terminal's to stop."""
    import signal
    import time

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "claude"
    tool.write_text(SLEEPY_TOOL.format(python=sys.executable))
    tool.chmod(0o755)
    env = env_for(tmp_path, models_dir(tmp_path, qwen_path), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    run_dir = Path(env["GGUF_PROVIDER_RUNTIME_DIR"])
    proc = subprocess.Popen([sys.executable, "-m", "gguf_provider.cli", "launch", "claude", QWEN], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    children: list[psutil.Process] = []
    try:
        assert proc.stdout.readline() == "up\n"
        children = psutil.Process(proc.pid).children()
        gw_pid = json.loads(next(run_dir.glob("gateways/*.json")).read_text())["pid"]
        gateway_proc = psutil.Process(gw_pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        t0 = time.monotonic()
        try:
            gateway_proc.wait(30)
        except psutil.TimeoutExpired:
            raise AssertionError("the gateway outlived its launch by 30 s") from None
        print(f"the gateway ended {time.monotonic() - t0:.1f} s after its launch was killed")
        assert not list(run_dir.glob("gateways/*.json"))  # it stopped as told, not killed
    finally:
        for child in children:
            if child.is_running():
                child.kill()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
