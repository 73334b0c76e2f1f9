"""`sharpscale data fetch` against a real HTTP server on 127.0.0.1 serving archives the tests build; nothing else is reached."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import socket
import tarfile
import threading
from pathlib import Path

import pytest

from studies.cli import main
from trainables.data import load_dataset, staging
from trainables.data.fetch import ARCHIVES, FetchError, fetch_dataset, layout_problem


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server(tmp_path):
    """(base URL, served directory): a real HTTP server bound to loopback on a free port, in a thread."""
    served = tmp_path / "served"
    served.mkdir()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(served)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", served
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@pytest.fixture
def cifar_archive(tmp_path, server, write_fake_cifar):
    """A tiny CIFAR-10 in the official layout, packed like cifar-10-python.tar.gz: (url, md5, arrays written)."""
    base, served = server
    written = write_fake_cifar(tmp_path / "src", "cifar10")
    path = served / "cifar-10-python.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(written["folder"], arcname="cifar-10-batches-py")
    return f"{base}/{path.name}", hashlib.md5(path.read_bytes()).hexdigest(), written


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    """The `sharpscale` entry point in this process (a subprocess would spend its time importing torch)."""
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_fetch_checks_md5_unpacks_and_the_result_loads(cifar_archive, tmp_path, capsys):
    url, md5, written = cifar_archive
    dest = tmp_path / "data" / "cifar10"
    code, out, err = _cli(capsys, "data", "fetch", "cifar10", "--to", str(dest), "--url", url, "--md5", md5)
    assert code == 0, err
    assert f"md5 {md5} matches" in out and f"--set data.root={dest}" in out
    assert sorted(p.name for p in dest.iterdir()) == ["cifar-10-batches-py"]  # no scratch left beside it
    assert layout_problem("cifar10", dest) is None
    bundle = load_dataset("cifar10", root=str(dest), augment="none")
    assert bundle.num_train_full == len(written["train_labels"])
    assert [bundle.val[k][1] for k in range(len(bundle.val))] == written["test_labels"].tolist()
    # Fetching again replaces the folder whole.
    (dest / "cifar-10-batches-py" / "stale").write_bytes(b"x")
    fetch_dataset("cifar10", dest, url=url, md5=md5)
    assert not (dest / "cifar-10-batches-py" / "stale").exists()


def test_wrong_md5_is_an_error_and_nothing_is_left(cifar_archive, tmp_path, capsys):
    url, md5, _ = cifar_archive
    dest = tmp_path / "data"
    # The official md5 applies when --md5 is not given: the test's archive is not the official one.
    code, _, message = _cli(capsys, "data", "fetch", "cifar10", "--to", str(dest), "--url", url)
    assert code == 2 and message.startswith("sharpscale: error: md5:")
    assert "md5" in message and md5 in message and ARCHIVES["cifar10"].md5 in message and "Fix:" in message
    assert list(dest.iterdir()) == []


def test_unreachable_url_and_unknown_dataset_are_clear_errors(cifar_archive, tmp_path, capsys):
    url, md5, _ = cifar_archive
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/cifar-10-python.tar.gz"
    with pytest.raises(FetchError, match=r"could not be downloaded.*Fix: .*--url") as info:
        fetch_dataset("cifar10", tmp_path / "a", url=closed, md5=md5)
    assert closed in str(info.value)
    with pytest.raises(FetchError, match="HTTP 404"):
        fetch_dataset("cifar10", tmp_path / "a", url=url.replace("cifar-10", "cifar-11"), md5=md5)
    code, _, err = _cli(capsys, "data", "fetch", "cifar11", "--to", str(tmp_path / "b"), "--url", url)
    assert code == 2 and "'cifar11'" in err and "did you mean 'cifar10'" in err and "['cifar10', 'cifar100']" in err
    with pytest.raises(FetchError, match="--md5: must be 32 hexadecimal digits"):
        fetch_dataset("cifar10", tmp_path / "c", url=url, md5="abc")


def _malicious(served: Path, kind: str) -> str:
    path = served / f"{kind}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        if kind == "symlink":
            link = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
            link.type, link.linkname = tarfile.SYMTYPE, "../../../../etc/passwd"
            tar.addfile(link)
        else:
            name = {"dotdot": "cifar-10-batches-py/../../../../escaped", "absolute": "/tmp/sharpscale-escaped"}[kind]
            info = tarfile.TarInfo(name)
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
    return path.name


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_a_member_escaping_the_target_is_refused(server, tmp_path, kind):
    base, served = server
    name = _malicious(served, kind)
    dest = tmp_path / "out" / "data"
    md5 = hashlib.md5((served / name).read_bytes()).hexdigest()
    with pytest.raises(FetchError, match="refusing to unpack") as info:
        fetch_dataset("cifar10", dest, url=f"{base}/{name}", md5=md5)
    assert "Fix:" in str(info.value)
    assert not (tmp_path / "out" / "escaped").exists() and not (tmp_path / "escaped").exists()
    assert list(dest.iterdir()) == []


def test_upload_to_a_uri_then_every_node_stages_it(cifar_archive, tmp_path, monkeypatch):
    url, md5, written = cifar_archive
    bucket = (tmp_path / "bucket").as_uri() + "/cifar10"
    where = fetch_dataset("cifar10", bucket, url=url, md5=md5)
    assert where == bucket
    uploaded = tmp_path / "bucket" / "cifar10" / "cifar-10-batches-py"
    assert sorted(p.name for p in uploaded.iterdir()) == sorted(ARCHIVES["cifar10"].files)
    assert layout_problem("cifar10", bucket) is None
    monkeypatch.setenv(staging.CACHE_ENV, str(tmp_path / "node-cache"))
    bundle = load_dataset("cifar10", root=bucket, augment="none")
    assert bundle.num_train_full == len(written["train_labels"])
    assert staging.is_staged(bucket)
    with pytest.raises(FetchError, match="--to: .*pyarrow cannot open it"):
        fetch_dataset("cifar10", "nosuchscheme://bucket/cifar10", url=url, md5=md5)
