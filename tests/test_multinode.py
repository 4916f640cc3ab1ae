"""Two "nodes" on loopback: two `torchrun --nnodes 2` launchers, one CPU process each (gloo), through
scripts/train.py. Training checkpoints from rank 0 only; SIGTERM to one rank's worker stops both ranks with one
complete checkpoint (each worker exits 75, each launcher 1, as torchrun turns any failed worker into 1); a second
2-node launch of the same command resumes from that checkpoint and finishes."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO_ROOT, subprocess_env, word_for_word, write_corpus, write_run_config

from modeling.checkpoints import COMPLETE_MARKER, checkpoint_problems, list_checkpoints, staging_directories

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds workers through /proc (Linux)")

TIMEOUT = 150  # seconds for each launch: both nodes import torch and the project on 2 shared cores


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(node_rank: int, port: int, config: Path, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1"]
    command += ["--node_rank", str(node_rank), "--master_addr", "127.0.0.1", "--master_port", str(port)]
    command += [str(REPO_ROOT / "scripts" / "train.py"), str(config), "--resume_from_checkpoint", "last"]
    env = subprocess_env(PYTHONUNBUFFERED="1", HF_DATASETS_CACHE=str(config.parent / "datasets_cache"))
    with open(log, "w") as handle:  # files, not pipes: a full pipe would block a worker
        return subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)


def children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def finish(launchers: list[subprocess.Popen], timeout: float) -> list[int]:
    try:
        return [launcher.wait(timeout=timeout) for launcher in launchers]
    finally:
        for launcher in launchers:  # on a failure, stop what this test started, and only that
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait()


def test_two_nodes_checkpoint_once_stop_together_on_sigterm_and_resume(tmp_path):
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    run = tmp_path / "run"
    config = tmp_path / "run.yaml"
    write_run_config(config, data_dir, run, max_steps=30, save_steps=2, save_total_limit=2, ddp_backend="gloo")

    port, logs = free_port(), [tmp_path / "node0.log", tmp_path / "node1.log"]
    launchers = [launch(rank, port, config, logs[rank]) for rank in (0, 1)]
    try:
        # Rank 0 prints the losses; once 3 updates are logged (one checkpoint made), SIGTERM rank 1's worker only.
        wait_for(lambda: logs[0].read_text().count("'loss'") >= 3 or launchers[0].poll() is not None, TIMEOUT, "3")
        [worker] = wait_for(lambda: children(launchers[1].pid), 10, "node 1's worker")
        os.kill(worker, signal.SIGTERM)
    finally:
        codes = finish(launchers, TIMEOUT)
    text = [log.read_text() for log in logs]
    assert codes == [1, 1], text[0][-3000:] + text[1][-3000:]  # torchrun: 1 for any failed worker
    for node in (0, 1):
        assert "Exiting with code 75 (preempted)" in text[node], text[node][-3000:]
        assert "exitcode  : 75" in text[node], "torchrun's summary gives the worker's own code"
    assert "Got SIGTERM" in text[1] and "Got SIGTERM" not in text[0], "one rank got it, both stopped"

    record = json.loads((run / "preempted.json").read_text())
    step = record["step"]
    checkpoint = run / f"checkpoint-{step}"
    assert record["checkpoint"] == str(checkpoint) and record["signal"] == "SIGTERM", "rank 0 agreed to rank 1's"
    assert not checkpoint_problems(checkpoint) and list_checkpoints(run)[-1] == checkpoint
    assert staging_directories(run) == []
    listed = json.loads((checkpoint / COMPLETE_MARKER).read_text())["files"]
    assert {"rng_state_0.pth", "rng_state_1.pth", "optimizer.pt", "model.safetensors"} <= set(listed)
    assert not list(tmp_path.glob("**/checkpoint-*/checkpoint-*")), "one checkpoint directory per save, by rank 0"

    port = free_port()
    launchers = [launch(rank, port, config, tmp_path / f"resume{rank}.log") for rank in (0, 1)]
    codes = finish(launchers, TIMEOUT)
    text = [(tmp_path / f"resume{rank}.log").read_text() for rank in (0, 1)]
    assert codes == [0, 0], text[0][-3000:] + text[1][-3000:]
    assert f"Resuming from {checkpoint}" in text[0]
    state = json.loads((run / "trainer_state.json").read_text())
    assert state["global_step"] == 30 and not (run / "preempted.json").exists()
    assert [path.name for path in list_checkpoints(run)] == ["checkpoint-28", "checkpoint-30"], "save_total_limit 2"


def test_the_two_machine_accelerate_config_loads_with_its_placeholders():
    from accelerate.commands.config.config_args import ClusterConfig

    config = ClusterConfig.from_yaml_file(str(REPO_ROOT / "configs" / "accelerate" / "2node_8gpu_bf16.yaml"))
    assert (config.num_machines, config.num_processes, config.machine_rank) == (2, 16, 0)
    assert config.main_process_ip and config.main_process_port and config.mixed_precision == "bf16"
