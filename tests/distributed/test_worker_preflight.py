"""A worker or beat that cannot reach its broker says so in one line (exit 3) instead of Celery's endless
multi-line retries; a worker on a queue nobody sends to says so in one line at start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.cli.worker_cmd import BrokerUnavailableError, check_broker, queues_without_producer
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_unreachable_broker_is_one_error_line() -> None:
    with pytest.raises(BrokerUnavailableError) as err:
        check_broker("redis://:pw@127.0.0.1:1/0", timeout=2)
    assert err.value.exit_code == 3 and "\n" not in str(err.value)
    assert str(err.value).startswith("broker unavailable at redis://:***@127.0.0.1:1/0: ") and "pw" not in str(err.value)


@pytest.mark.parametrize("command", [["worker", "--queues", "cpu"], ["beat"]])
def test_worker_and_beat_exit_3_with_one_line(command: list[str], tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPCI_")}
    env.update(AMPCI_BROKER_URL="redis://127.0.0.1:1/0", AMPCI_DATA_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "service.cli.main", *command], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith("ampci: error: broker unavailable at redis://127.0.0.1:1/0")


def test_queues_without_producer() -> None:
    settings = Settings(broker_url="redis://127.0.0.1:6379/0", extra_queues="cuda-a100")
    assert queues_without_producer(["cpu", "cuda", "control", "cuda-a100", "cpu-typo"], settings) == ["cpu-typo"]
    assert queues_without_producer(["cuda-a100"], Settings(broker_url="redis://x:1/0")) == ["cuda-a100"]


def test_a_cuda_queue_needs_a_cuda_device() -> None:
    from service.cli.worker_cmd import refuse_device_queues_without_device
    from service.errors import UserError

    refuse_device_queues_without_device(["cpu", "control"], has_cuda=False)
    refuse_device_queues_without_device(["cuda", "cuda-a100"], has_cuda=True)
    for names in (["cuda"], ["cpu", "cuda-a100"]):
        with pytest.raises(UserError, match="needs a usable CUDA device and this machine has none"):
            refuse_device_queues_without_device(names, has_cuda=False)


def test_a_worker_without_cuda_refuses_the_cuda_queue_in_one_line(tmp_path: Path) -> None:
    from service.cli.worker_cmd import cuda_device_here

    if cuda_device_here():
        pytest.skip("this machine has a usable CUDA device")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPCI_")}
    env.update(AMPCI_BROKER_URL="redis://127.0.0.1:1/0", AMPCI_DATA_DIR=str(tmp_path), AMPCI_SANDBOX="best-effort")
    proc = subprocess.run([sys.executable, "-m", "service.cli.main", "worker", "--queues", "cpu,cuda"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert "queue 'cuda' needs a usable CUDA device" in proc.stderr
