"""The fleet dataset in object storage: ``publish``, ``dashboard --fleet`` and ``diff --fleet`` on an
``s3://`` prefix, against a real S3-API server the tests start on the loopback.

The server is moto's (``moto[server]`` from PyPI): a process that speaks S3's REST API over HTTP,
installable with pip, so CI needs nothing beyond the package registry (MinIO, the other common
choice, is a Go binary that PyPI does not carry). The client is pyarrow's own S3 filesystem (the
AWS C++ SDK), unpatched: what a fleet of runners would use against S3, GCS's S3 API or MinIO.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.apps.cli import main
from harness.storage import fleet

pytest.importorskip("moto.server", reason="moto[server] is not installed: the dev extra installs it")

from test_fleet import _run  # the same four runs the local-directory tests publish

BUCKET = "fleet"
#: credentials the server accepts: they must never show in a report, a dashboard or a message
KEY_ID, SECRET = "AKIAFLEETTESTKEY", "fleet-test-secret-do-not-print-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint():
    """A moto S3 server process on 127.0.0.1 for this module; its ``host:port``."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"the S3 test server (moto) did not start on 127.0.0.1:{port}")
            time.sleep(0.1)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def store(s3_endpoint, monkeypatch, request):
    """A fresh ``s3://`` prefix on the test server, credentials in the standard environment."""
    import pyarrow.fs as pf

    for name, value in (("AWS_ACCESS_KEY_ID", KEY_ID), ("AWS_SECRET_ACCESS_KEY", SECRET)):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    host, port = s3_endpoint.split(":")
    fs = pf.S3FileSystem(endpoint_override=s3_endpoint, scheme="http", allow_bucket_creation=True)
    fs.create_dir(BUCKET)
    prefix = request.node.name.replace("[", "_").replace("]", "")
    return f"s3://{BUCKET}/{prefix}?endpoint_override={host}:{port}&scheme=http"


@pytest.fixture
def reports(tmp_path: Path) -> Path:
    out = tmp_path / "reports"
    _run(out, "20261101T000000Z-000001", "2.13.0+cpu", "cpu-a-t2", 0.5, "2026-11-01T00:00:00+00:00")
    _run(out, "20261102T000000Z-000002", "2.13.0+cpu", "cpu-a-t2", 0.5, "2026-11-02T00:00:00+00:00")
    _run(out, "20261103T000000Z-000003", "2.14.1+cu130", "cpu-a-t2", 1.5, "2026-11-03T00:00:00+00:00")
    _run(out, "20261103T000000Z-000004", "2.13.0+cpu", "cpu-b-t2", 0.5, "2026-11-03T00:00:00+00:00")
    return out


def _cli(*args: str) -> subprocess.Popen[str]:
    """``amp-harness ARGS`` in a process of its own (a runner of the fleet), environment inherited."""
    code = "import sys; from harness.apps.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ
    )


def test_three_runners_publish_at_once_and_every_view_equals_the_local_directorys(store, reports, tmp_path, capsys):
    runs = sorted(p for p in reports.iterdir() if p.is_dir())
    shares = [runs[:2], runs[2:3], runs[3:]]
    procs = [_cli("publish", *map(str, share), "--fleet", store) for share in shares]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    local = tmp_path / "fleet"
    assert main(["publish", str(reports), "--fleet", str(local)]) == 0
    capsys.readouterr()

    remote_index, local_index = fleet.index(store), fleet.index(local)
    assert [(r.hardware_class, r.stack, r.date, r.run_id) for r in remote_index] == [
        (r.hardware_class, r.stack, r.date, r.run_id) for r in local_index
    ]
    diff_args = ["stack=torch-2.13,hardware_class=cpu-a", "stack=torch-2.14"]
    assert main(["diff", "--fleet", store, *diff_args]) == 1
    remote_diff = capsys.readouterr().out
    assert main(["diff", "--fleet", str(local), *diff_args]) == 1
    assert remote_diff == capsys.readouterr().out and "regressed  check" in remote_diff

    from harness.apps import dashboard as db

    remote_view, local_view = db.load_fleet(store), db.load_fleet(local)
    assert remote_view.fleet_runs == local_view.fleet_runs == 4
    assert (
        remote_view.rows.sort_values(["run_id"])
        .reset_index(drop=True)
        .equals(local_view.rows.sort_values(["run_id"]).reset_index(drop=True))
    )
    html = tmp_path / "fleet.html"
    assert main(["dashboard", "--fleet", store, "-o", str(html)]) == 0
    assert "Drawn from a fleet dataset of 4 runs" in html.read_text()
    everything = "".join(o + e for o, e in outputs) + capsys.readouterr().out + html.read_text()
    assert SECRET not in everything and KEY_ID not in everything


def test_an_interrupted_upload_leaves_no_run_and_a_complete_one_appears_whole(store, reports):
    """A runner killed while writing a run's object (its upload never completed) leaves nothing a
    reader lists; the run published afterwards is the only one there."""
    loc = fleet.locate(store)
    key = f"{loc.base}/hardware_class=cpu-a-t2/stack=torch-2.13/date=2026-11-05/20261105T000000Z-000009.parquet"
    code = (
        "import os, sys, pyarrow.fs as pf\n"
        "fs, _ = pf.FileSystem.from_uri(sys.argv[1])\n"
        "out = fs.open_output_stream(sys.argv[2])\n"
        "out.write(b'PAR1' + b'x' * (12 << 20))  # past the first multipart part\n"
        "os._exit(9)  # killed mid-upload: never closed\n"
    )
    killed = subprocess.run([sys.executable, "-c", code, store, key], capture_output=True, timeout=120, check=False)
    assert killed.returncode == 9, killed.stderr
    with pytest.raises(FileNotFoundError, match="no fleet dataset here"):
        fleet.index(store)
    assert main(["publish", str(sorted(reports.iterdir())[0]), "--fleet", store]) == 0
    assert [r.run_id for r in fleet.index(store)] == ["20261101T000000Z-000001"]


def test_a_location_is_shown_without_its_credentials_and_a_bad_one_is_a_clear_error(store, reports, capsys):
    url = f"s3://{KEY_ID}:{SECRET}@{BUCKET}/p?endpoint_override=h:1&secret_key={SECRET}&session_token={SECRET}"
    assert SECRET not in fleet.shown(url) and KEY_ID not in fleet.shown(url)
    assert fleet.shown(url).startswith(f"s3://{BUCKET}/p?endpoint_override=h:1&secret_key=***")
    assert main(["publish", str(reports), "--fleet", f"nosuchscheme://x/{SECRET}?token={SECRET}"]) == 2
    err = capsys.readouterr().err
    assert "not a fleet location" in err and "s3://bucket/prefix" in err and SECRET not in err.split("?")[-1]
    assert main(["dashboard", "--fleet", store.replace("/test_", "/empty_"), "-o", "x.html"]) == 2
    assert "no fleet dataset here" in capsys.readouterr().err
