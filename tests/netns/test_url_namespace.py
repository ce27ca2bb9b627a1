"""Runs the tests that reach the network (tests/netns: URL items, Immich's upstream proxy) in
a network namespace of their own, with only loopback and a hosts file of their own:
``unshare -n -m`` (root, or a user namespace)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Names the namespace resolves (``multi on``: a name on two lines resolves to both addresses).
HOSTS = """127.0.0.1 localhost images.test
127.0.0.2 loopname.test
10.1.2.3 internal.test
169.254.169.254 metadata.test
fd00::5 ula6.test
::ffff:127.0.0.9 mapped6.test
127.0.0.1 mixed.test
10.0.0.7 mixed.test
"""


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run(["unshare", "-n", "-m", "--", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs unshare -n -m (root) and ip")
def test_url_items_in_a_namespace_with_only_loopback(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(HOSTS)
    command = ["unshare", "-n", "-m", "--", "sh", str(ROOT / "tests/netns/run.sh"),
               str(hosts), sys.executable, "-q", "-x"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and " skipped" not in done.stdout
