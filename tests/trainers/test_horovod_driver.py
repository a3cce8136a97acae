"""The Horovod driver's host discovery: the hosts file read in process, parsed by Horovod."""

from __future__ import annotations

from pathlib import Path

import pytest

from bftrainer.trainers import channel
from tests.trainers.elastic_harness import horovod_missing

pytestmark = pytest.mark.skipif(horovod_missing() is not None, reason=str(horovod_missing()))


def test_discovery_reads_the_supervisor_s_hosts_without_running_the_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from horovod.runner.elastic.discovery import HostDiscoveryScript

    from bftrainer.trainers.launch import horovod_driver

    original = HostDiscoveryScript._execute_discovery_script
    monkeypatch.setattr(HostDiscoveryScript, "_execute_discovery_script", original)
    hosts = tmp_path / channel.DISCOVERY_HOSTS
    channel.write_text_atomic(hosts, channel.format_hosts([("n1", 2), ("n2", 1)]))
    # A script that cannot run: the hosts can only come from the file.
    discovery = HostDiscoveryScript(str(tmp_path / "no-such-script.sh"), 1)

    monkeypatch.delenv(channel.DISCOVERY_HOSTS_VARIABLE, raising=False)
    assert not horovod_driver.read_hosts_in_process()  # no file named: Horovod as it is
    with pytest.raises(RuntimeError, match="discovery script"):
        discovery.find_available_hosts_and_slots()

    monkeypatch.setenv(channel.DISCOVERY_HOSTS_VARIABLE, str(hosts))
    assert horovod_driver.read_hosts_in_process()
    assert discovery.find_available_hosts_and_slots() == {"n1": 2, "n2": 1}
    # The supervisor rewrites the file at a rescale: the next look sees it.
    channel.write_text_atomic(hosts, channel.format_hosts([("n2", 1)]))
    assert discovery.find_available_hosts_and_slots() == {"n2": 1}
