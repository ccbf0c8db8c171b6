"""``batos doctor`` on a healthy setup and on broken ones: a damaged image copy, a dangling
reference, a missing model, a model file that fails its checksum, adapters that are missing or
altered, a broken job record and a stale lease, backends out of reach, a server answering."""

from __future__ import annotations

import http.server
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import transaction
from persistent.mapping import PersistentMapping

from batos.shell import doctor
from batos.shell.cli import main
from store.core import layout, model_files
from store.core.image import LivingImage
from store.core.jobstore import acquire_lease
from store.core.zeo import free_port

REPO = Path(__file__).resolve().parents[1]


def run_doctor(capsys, uri: str, *extra: str) -> tuple[int, list[dict[str, str]]]:
    capsys.readouterr()
    code = main(["--image", uri, "doctor", "--json", *extra])
    out = capsys.readouterr().out
    return code, [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def statuses(checks: list[dict[str, str]] | list[doctor.Check], area: str) -> set[str]:
    rows = [c.as_dict() if isinstance(c, doctor.Check) else c for c in checks]
    return {row["status"] for row in rows if row["area"] == area}


@pytest.fixture
def image(capsys, file_uri: str) -> str:
    assert main(["--image", file_uri, "init"]) == 0
    return file_uri


@pytest.mark.parametrize("port", ["0", "99999", "-1"])
def test_a_port_out_of_range_is_refused_before_any_check(capsys, image, port) -> None:
    capsys.readouterr()
    code = main(["--image", image, "doctor", "--port", port])
    out, err = capsys.readouterr()
    assert code == 2 and "--port" in err and out == ""


def test_a_healthy_image_passes_with_the_storage_checks(capsys, image) -> None:
    code, checks = run_doctor(capsys, image, "--port", str(free_port()))
    assert code == 0, checks
    details = [c["detail"] for c in checks if c["area"] == "image"]
    assert "fstest and fsrefs found no damage" in details
    assert statuses(checks, "image") == {"ok"}
    assert statuses(checks, "model") == {"ok"} and statuses(checks, "adapters") == {"ok"}
    assert any("no LangGraph server" in c["detail"] for c in checks)
    # the heartbeat never ran here: said, not failed
    assert any(c["status"] == "warn" and "no heartbeat jobs" in c["detail"] for c in checks)


def test_a_damaged_copy_of_the_image_fails_and_is_left_as_it_was(capsys, image, tmp_path) -> None:
    original = Path(image.removeprefix("file://"))
    copy = tmp_path / "copy" / "live_image.fs"
    copy.parent.mkdir()
    shutil.copyfile(original, copy)
    data = bytearray(copy.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = b"\xff" * 64  # inside a committed transaction
    copy.write_bytes(bytes(data))
    code, checks = run_doctor(capsys, f"file://{copy}")
    assert code == 1
    failed = [c for c in checks if c["area"] == "image" and c["status"] == "fail"]
    assert failed and "batos repair" in failed[0]["fix"], checks
    assert copy.read_bytes() == bytes(data)  # doctor reads; it never repairs on its own
    assert run_doctor(capsys, image)[0] == 0  # the original is untouched


def test_a_dangling_reference_is_found_by_fsrefs(capsys, image) -> None:
    with LivingImage.open(image) as living:
        living.transact(lambda root: root.__setitem__("holder", PersistentMapping()))
        inner = PersistentMapping(value=1)
        living.transact(lambda root: root["holder"].__setitem__("inner", inner))
        living.transact(lambda root: root.__setitem__("user", PersistentMapping(ref=inner)))
        # Undoing the transaction that created 'inner' leaves 'user' pointing at nothing.
        newest_first = living.db.undoLog(0, 2)
        living.db.undo(newest_first[1]["id"])
        transaction.commit()
    code, checks = run_doctor(capsys, image)
    assert code == 1
    failed = [c["detail"] for c in checks if c["status"] == "fail"]
    assert any(detail.startswith("fsrefs:") for detail in failed), checks


def test_a_missing_model_file_fails(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("BATOS_MODEL", str(tmp_path / "gone.gguf"))
    checks = doctor.check_model()
    assert statuses(checks, "model") == {"fail"}
    assert "neither a known model" in checks[0].detail and "BATOS_MODEL" in checks[0].fix


def test_an_assembled_model_that_fails_its_checksum_fails(monkeypatch, tmp_path) -> None:
    spec = model_files.catalog()["test"]
    monkeypatch.setenv("BATOS_MODEL_CACHE", str(tmp_path))
    with (tmp_path / spec.filename).open("wb") as handle:
        handle.truncate(spec.size)  # the right size, the wrong bytes
    checks = doctor.check_model()
    failed = [c for c in checks if c.status == "fail"]
    assert failed and "does not match its pinned sha256" in failed[0].detail
    assert "delete" in failed[0].fix


def test_a_missing_and_an_altered_adapter(monkeypatch, tmp_path) -> None:
    folder = tmp_path / "modelfiles"
    shutil.copytree(REPO / "modelfiles", folder, ignore=shutil.ignore_patterns("data"))
    (folder / "adapters" / "test" / "robin.gguf").unlink()
    with (folder / "adapters" / "test" / "brick.gguf").open("ab") as handle:
        handle.write(b"\0")
    monkeypatch.setenv("BATOS_MODELFILES", str(folder))
    checks = {c.detail.split(":")[0]: c for c in doctor.check_adapters()}
    assert checks["robin"].status == "warn" and "system prompt" in checks["robin"].detail
    assert checks["brick"].status == "fail" and "sha256" in checks["brick"].detail
    assert checks["babs"].status == "ok" and checks["alfred"].status == "ok"


def test_a_broken_job_record_and_a_stale_lease(image) -> None:
    with LivingImage.open(image) as living:
        acquire_lease(living, "heartbeat-on-a-dead-host", -60)  # expired a minute ago

        def corrupt(root) -> None:
            root[layout.HEARTBEAT]["jobs"]["audit"] = {"next": 0.0, "state": b"not a pickle"}

        living.transact(corrupt)
    checks = doctor.check_scheduler(image)
    assert statuses(checks, "scheduler") == {"fail", "warn"}
    failed = [c for c in checks if c.status == "fail"][0]
    assert "job 'audit' cannot be restored" in failed.detail
    stale = [c for c in checks if c.status == "warn"][0]
    assert "heartbeat-on-a-dead-host" in stale.detail and "expired" in stale.detail


def test_backends_out_of_reach_fail_with_what_to_do(monkeypatch) -> None:
    monkeypatch.setenv("OLLAMA_HOST", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("BATOS_OPENAI_BASE_URL", f"http://127.0.0.1:{free_port()}/v1")
    checks = doctor.check_backends()
    assert statuses(checks, "backends") == {"fail", "warn"}
    openai = [c for c in checks if c.detail.startswith("openai")][0]
    assert openai.status == "fail" and "out of reach" in openai.detail
    assert "BATOS_OPENAI_BASE_URL" in openai.fix
    ollama = [c for c in checks if c.detail.startswith("ollama")][0]
    assert "does not answer" in ollama.detail and "ollama serve" in ollama.fix


@pytest.fixture
def answering_server() -> Iterator[int]:
    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/ok" else 404)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_running_server_is_seen(answering_server) -> None:
    (check,) = doctor.check_server(answering_server)
    assert check.status == "ok" and "answers" in check.detail


def test_an_image_on_another_storage_is_walked_record_by_record() -> None:
    checks = doctor.check_image("memory://")  # a fresh one: nothing laid out yet
    walk = [c for c in checks if c.detail.endswith("reachable records load")]
    assert walk and walk[0].status == "ok"
    pending = [c for c in checks if c.status == "warn"]
    assert pending and "not yet applied: root-1" in pending[0].detail
    assert "batos init" in pending[0].fix
