"""The daemons' ``--config`` TOML files and ``--log-format json``, on real processes.

The shipped examples (agent/deploy/*.toml) are loaded here so they never rot; the daemons
are then started from configs derived from them (paths and ports of the test), with a flag
that overrides a key; unknown keys and wrong types are refused with exit 3, naming the
file, the key and the check."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from agent_harness import Cluster, _ready, _spawn, assert_placed, job_spec

from relgate_agent.cli.config import (
    AgentFileConfig,
    ConfigError,
    CoordinatorFileConfig,
    load_config,
    model_keys,
    option_keys,
)
from relgate_agent.cli.daemons import agent_serve, coordinator_serve

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
LOG_FIELDS = {"ts", "level", "logger", "msg"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)


def _write_toml(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in doc.items()))
    return path


def _example(name: str, **changes: Any) -> dict[str, Any]:
    """The shipped example with the test's paths and ports."""
    doc = tomllib.loads((DEPLOY / name).read_text())
    return {**doc, **changes}


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relgate_agent", "--json", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _json_lines(log: Path) -> list[dict[str, Any]]:
    """Every stderr line of a --log-format json daemon, each parsed (a line that is not one
    JSON object fails the test)."""
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    parsed = [json.loads(line) for line in lines]
    for rec in parsed:
        assert set(rec) >= LOG_FIELDS, rec
    return parsed


# ------------------------------------------------------------------ the files themselves


@pytest.mark.parametrize(
    ("name", "model", "command"),
    [
        ("coordinator.toml", CoordinatorFileConfig, coordinator_serve),
        ("agent.toml", AgentFileConfig, agent_serve),
    ],
)
def test_every_option_has_a_key_and_the_shipped_example_loads(
    name: str, model: Any, command: Any
) -> None:
    assert model_keys(model) == option_keys(command)
    cfg = load_config(str(DEPLOY / name), model)
    written = set(tomllib.loads((DEPLOY / name).read_text()))
    assert written <= option_keys(command)
    assert cfg.model_dump(by_alias=True, exclude_unset=True).keys() == written


def test_a_wrong_type_in_a_list_or_a_table_names_the_top_level_key(tmp_path: Path) -> None:
    bad = tmp_path / "agent.toml"
    bad.write_text('trusted_keys = ["/etc/keys", 3]\n')
    with pytest.raises(ConfigError) as err:
        load_config(str(bad), AgentFileConfig)
    assert (err.value.key, err.value.check, err.value.path) == ("trusted_keys", "type", str(bad))
    bad.write_text("labels = { zone = 1 }\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(bad), AgentFileConfig)
    assert (err.value.key, err.value.check) == ("labels", "type")
    bad.write_text("stripes = 8\n[nested]\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(bad), CoordinatorFileConfig)
    assert (err.value.key, err.value.check) == ("nested", "unknown-key")
    bad.write_text("stripes = \n")
    with pytest.raises(ConfigError) as err:
        load_config(str(bad), CoordinatorFileConfig)
    assert (err.value.key, err.value.check) == ("", "toml")


# ------------------------------------------------------------------ refusals (processes)


@pytest.mark.parametrize(
    ("command", "body", "key", "check"),
    [
        (
            ["coordinator", "serve"],
            "stripes = 8\nlisten_address = '0.0.0.0:7470'\n",
            "listen_address",
            "unknown-key",
        ),
        (["coordinator", "serve"], 'stripes = "8"\n', "stripes", "type"),
        (["agent", "serve"], "bypass = 1\n", "bypass", "type"),
        (["agent", "serve"], 'max_rate = "fast"\n', "max_rate", "value"),
        (["agent", "serve"], "origin_parallel = 999\n", "origin_parallel", "value"),
        (["agent", "serve"], 'log_format = "xml"\n', "log_format", "value"),
    ],
)
def test_a_bad_config_is_refused_with_exit_3_naming_file_key_and_check(
    tmp_path: Path, command: list[str], body: str, key: str, check: str
) -> None:
    path = tmp_path / "daemon.toml"
    path.write_text(body)
    done = _run([*command, "--config", str(path)])
    assert done.returncode == 3, done.stderr
    out = json.loads(done.stdout)
    assert out["error"] == "rejected"
    assert (out["file"], out["key"], out["check"]) == (str(path), key, check)
    assert str(path) in out["message"] and key in out["message"]


def test_a_missing_config_file_is_refused(tmp_path: Path) -> None:
    done = _run(["agent", "serve", "--config", str(tmp_path / "nope.toml")])
    assert done.returncode == 3
    assert json.loads(done.stdout)["check"] == "readable"


# ------------------------------------------------------------------ the daemons come up


def _write_configs(
    tmp_path: Path,
    cluster: Cluster,
    checkpoint: dict[str, Any],
    coord_port: int,
    coord_metrics: int,
    agent_metrics: int,
) -> tuple[Path, Path]:
    """The shipped example configs with this test's ports, paths and PKI."""
    host, rack, pki = "h00", "r0", cluster.pki
    coord_toml = _write_toml(
        tmp_path / "coordinator.toml",
        _example(
            "coordinator.toml",
            listen=[f"127.0.0.1:{coord_port}"],
            metrics_listen=f"127.0.0.1:{coord_metrics}",
            db=str(cluster.base / "coordinator.sqlite"),
            trusted_keys=[str(checkpoint["trusted"])],
            pki=str(pki),
            report_interval=0.5,
        ),
    )
    agent_toml = _write_toml(
        tmp_path / "agent.toml",
        _example(
            "agent.toml",
            host_id=host,
            rack=rack,
            labels={"cluster": "inf-a"},
            coordinator=f"127.0.0.1:{coord_port}",
            models_root=str(cluster.models_root(host)),
            trusted_keys=[str(checkpoint["trusted"])],
            pki=str(pki),
            listen="127.0.0.1:0",
            metrics_listen=f"127.0.0.1:{agent_metrics}",
            journal_interval=0.3,
            report_interval=0.5,
            max_rate="1GiB",
        ),
    )
    return coord_toml, agent_toml


def _assert_json_logs(
    records: list[dict[str, Any]], coord: list[dict[str, Any]], host: str, job: str
) -> None:
    """Every agent line is JSON naming its host; the job's lines its topology version and
    stripe; the coordinator's stderr is JSON too."""
    for rec in records:
        assert rec["level"] in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}
        assert rec["ts"].endswith("Z") and "T" in rec["ts"]
        assert rec["host"] == host  # every agent record names its host
    of_job = [r for r in records if r.get("job") == job]
    assert of_job, "no record names the job"
    assert all(isinstance(r.get("topology_version"), int) for r in of_job)
    striped = [r for r in of_job if "stripe" in r]
    assert {r["stripe"] for r in striped} == {0, 1, 2, 3}  # 4 stripes, each worker says so
    assert all(r["msg"].startswith(f"stripe {r['stripe']} ") for r in striped)
    assert any(r["msg"].startswith(f"{host} job {job}: placed") for r in of_job)
    # the coordinator's stderr, too, is one JSON object per line
    assert any(r["logger"].startswith("relgate_agent.coordinator") for r in coord)


def test_daemons_run_from_their_config_files_flags_override_and_log_json(
    tmp_path: Path, checkpoint: dict[str, Any]
) -> None:
    cluster = Cluster(tmp_path / "cluster", checkpoint["trusted"], enroll=False)
    logs = cluster.base / "logs"
    logs.mkdir(parents=True)
    host, rack = "h00", "r0"
    cluster.enrolled[host] = (rack, "cluster=inf-a")
    coord_port, coord_metrics, coord_metrics_flag = _free_port(), _free_port(), _free_port()
    data_port, agent_metrics = _free_port(), _free_port()
    coord_toml, agent_toml = _write_configs(
        tmp_path, cluster, checkpoint, coord_port, coord_metrics, agent_metrics
    )
    try:
        # the agent first: no leader answers it yet, and it says so (JSON, with its host)
        agent_log = logs / f"{host}.log"
        proc = _spawn(
            ["agent", "serve", "--config", str(agent_toml), "--listen", f"127.0.0.1:{data_port}"],
            agent_log,
        )
        cluster.procs[host] = proc
        banner = _ready(proc, agent_log)
        # the file's metrics port; the flag's data port over the file's 127.0.0.1:0
        assert banner["metrics"] == f"127.0.0.1:{agent_metrics}"
        assert banner["dataAddress"] == f"127.0.0.1:{data_port}"
        assert banner["hostId"] == host
        cluster.wait_for(
            lambda: any(
                r["msg"].startswith("cannot reach a coordinator leader")
                and r["level"] == "WARNING"
                and r.get("host") == host
                for r in _json_lines(agent_log)
            ),
            30,
            "the agent to say no leader answers",
        )

        coord_log = logs / "coordinator.log"
        cproc = _spawn(
            [
                "coordinator",
                "serve",
                "--config",
                str(coord_toml),
                "--metrics-listen",
                f"127.0.0.1:{coord_metrics_flag}",
            ],
            coord_log,
        )
        cluster.procs["coordinator"] = cproc
        info = _ready(cproc, coord_log)
        assert info["listening"] == f"127.0.0.1:{coord_port}"  # the file's listen
        assert info["metrics"] == f"127.0.0.1:{coord_metrics_flag}"  # the flag over the file
        cluster.coordinator = info["listening"]
        cluster.enroll_host(host, rack)
        cluster.wait_registered(1)

        job = cluster.create_full_job(1, "cfg-job", **job_spec(checkpoint))
        cluster.wait_for(lambda: cluster.status(job)["state"] == "DONE", 90, "the job DONE")
        assert_placed(cluster, checkpoint, host)
        cluster.wait_for(
            lambda: any(
                r["msg"].startswith("coordinator leader reachable again")
                for r in _json_lines(agent_log)
            ),
            30,
            "the agent to log the leader back",
        )
        # read while both run: at SIGTERM grpc's aio server may print a GeneratorExit
        # traceback straight to stderr (Cython, not logging), the one non-JSON text seen
        records, coord = _json_lines(agent_log), _json_lines(coord_log)
    finally:
        cluster.stop_all()

    _assert_json_logs(records, coord, host, job)
