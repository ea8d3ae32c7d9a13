"""``--device`` of ``qdq quantize`` / ``qdq qat`` and ``device=`` of :func:`qdq.quantize` on the
CPU: the job end to end on ``cpu``, a clear exit 2 for CUDA where there is none or an unknown
device, the default (CUDA when available, checked with ``torch.cuda`` monkeypatched), the process
group plan under ``torchrun``, and ``qdq qat`` itself under ``torchrun --nproc_per_node=2`` (gloo)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from qdq.cli.main import main
from qdq.pipeline import PtqOptions
from qdq.pipeline.device import module_device, module_on, resolve_device, to_device
from qdq.qat.distributed import launch_plan, process_group

pytest.importorskip("onnxruntime")

SRC = Path(__file__).resolve().parents[1] / "src"
MODEL_PY = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
            self.bn1 = nn.BatchNorm2d(16)
            self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
            self.fc = nn.Linear(16, 8)

        def forward(self, x):
            y = F.relu(self.bn1(self.conv1(x)))
            y = F.relu(self.conv2(y)) + y
            return self.fc(y.mean((2, 3)))


    def build():
        torch.manual_seed(0)
        return Net().eval()
    """
)
FAST = ("--exporter", "torchscript", "--recipe", "none", "--no-progress", "--batch-size", "8")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("device")
    (root / "tiny_model.py").write_text(MODEL_PY)
    x = torch.randn(48, 3, 8, 8, generator=torch.Generator().manual_seed(0)).numpy()
    np.savez(root / "data.npz", x=x, y=np.arange(48) % 8)
    return {"py": root / "tiny_model.py", "npz": root / "data.npz", "root": root}


def _base(files: dict[str, Path]) -> list[str]:
    return ["--model", f"{files['py']}:build", "--data", str(files["npz"]), *FAST]


@pytest.mark.parametrize("verb", ["quantize", "qat"])
def test_device_cpu_runs_end_to_end_and_is_recorded(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str
) -> None:
    out = tmp_path / "out"
    assert main([verb, *_base(files), "--out", str(out), "--device", "cpu"]) == 0
    assert "(cpu) →" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["device"] == "cpu" and report["settings"]["world_size"] == 1
    assert (report["qat"] is not None) == (verb == "qat")


def test_cuda_without_cuda_is_exit_2_naming_the_device(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    assert main(["qat", *_base(files), "--out", str(out), "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "device 'cuda' asked for, but CUDA is not available" in err
    assert "--device cpu" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("bad", ["tpu", "xpu", "cuda:x", "mps"])
def test_unknown_device_is_exit_2(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    out = tmp_path / "out"
    assert main(["quantize", *_base(files), "--out", str(out), "--device", bad]) == 2
    err = capsys.readouterr().err
    assert f"unknown device {bad!r}: use cpu, cuda or cuda:N" in err
    assert not out.exists()


def test_python_entry_takes_device_and_keeps_the_users_model(tmp_path: Path) -> None:
    import qdq
    from qdq.pipeline import QuantData

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.randn(32, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    data = QuantData(
        calibration=x[:16], evaluation=x[16:], labels=None, source="test", split="16 / 16"
    )
    res = qdq.quantize(net, data, out=tmp_path / "o", device="cpu", exporter="torchscript",
                       batch_size=8, show_progress=False, ptq=PtqOptions())  # fmt: skip
    assert res.report["settings"]["device"] == "cpu"
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k
    with pytest.raises(ValueError, match="unknown device 'npu'"):
        qdq.quantize(net, data, out=tmp_path / "p", device="npu", ptq=PtqOptions())
    with pytest.raises(TypeError, match="device must be a string or a torch.device"):
        qdq.quantize(net, data, out=tmp_path / "p", device=0, ptq=PtqOptions())  # type: ignore[arg-type]
    assert not (tmp_path / "p").exists()


def _fake_gpus(monkeypatch: pytest.MonkeyPatch, count: int, current: int = 0) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)


def test_default_is_cuda_when_available_else_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    _fake_gpus(monkeypatch, 0)
    assert resolve_device(None) == torch.device("cpu")
    _fake_gpus(monkeypatch, 2, current=1)
    assert resolve_device(None) == torch.device("cuda", 1)  # the current device
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert resolve_device(" cpu ") == torch.device("cpu")
    monkeypatch.setenv("LOCAL_RANK", "1")  # under torchrun: this rank's GPU
    _fake_gpus(monkeypatch, 2, current=0)
    assert resolve_device(None) == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"'cuda:2' is GPU 2, but 2 GPU\(s\) are visible"):
        resolve_device("cuda:2")


def test_launch_plan_picks_nccl_per_local_rank_and_gloo_on_cpu() -> None:
    assert launch_plan(torch.device("cuda", 0), {}) is None
    assert launch_plan(torch.device("cuda", 0), {"WORLD_SIZE": "1", "LOCAL_RANK": "0"}) is None
    env = {"WORLD_SIZE": "4", "LOCAL_RANK": "3"}
    assert launch_plan(torch.device("cuda"), env) == ("nccl", torch.device("cuda", 3))
    assert launch_plan(torch.device("cuda", 3), env) == ("nccl", torch.device("cuda", 3))
    assert launch_plan(torch.device("cpu"), env) == ("gloo", torch.device("cpu"))
    with pytest.raises(ValueError, match=r"LOCAL_RANK 3\) was given cuda:0; pass --device cuda"):
        launch_plan(torch.device("cuda", 0), env)
    with pytest.raises(ValueError, match="WORLD_SIZE='two' is not a number"):
        launch_plan(torch.device("cpu"), {"WORLD_SIZE": "two"})


def test_process_group_is_left_alone_in_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with process_group(torch.device("cpu")) as dev:
        assert dev == torch.device("cpu") and not torch.distributed.is_initialized()
    assert not torch.distributed.is_initialized()


def test_module_on_copies_instead_of_moving_the_users_model() -> None:
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    assert module_on(net, torch.device("cpu")) is net  # already there: no copy
    moved = module_on(net, torch.device("meta"))
    assert moved is not net and module_device(moved).type == "meta"
    assert all(t.device.type == "cpu" for t in (*net.parameters(), *net.buffers()))
    assert module_device(nn.ReLU()) == torch.device("cpu")
    batch = {"x": torch.zeros(2), "n": 3, "pair": (torch.ones(1), "s")}
    on = to_device(batch, torch.device("meta"))
    assert on["x"].is_meta and on["pair"][0].is_meta and on["n"] == 3 and on["pair"][1] == "s"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _activation_amax(out: Path) -> dict[str, object]:
    manifest = json.loads((out / "manifest.json").read_text())
    return {q["name"]: q["amax"] for q in manifest["quantizers"] if q["kind"] != "weight"}


@pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="torch.distributed with gloo is needed",
)
def test_qdq_qat_under_torchrun_initialises_gloo_and_rank0_writes(
    files: dict[str, Path], tmp_path: Path
) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)}  # fmt: skip
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cli = "import sys; from qdq.cli.main import main; sys.exit(main())"
    (tmp_path / "cli.py").write_text(cli)
    args = ["qat", *_base(files), "--device", "cpu", "--calib", "entropy"]
    single = subprocess.run([sys.executable, "-c", cli, *args, "--out", str(tmp_path / "one")],
                            env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert single.returncode == 0, single.stderr[-3000:]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(tmp_path / "cli.py"),
           *args, "--out", str(tmp_path / "two")]  # fmt: skip
    double = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert double.returncode == 0, double.stderr[-3000:]
    assert double.stdout.count("wrote ") == 1  # rank 0 alone prints and writes
    report = json.loads((tmp_path / "two" / "report.json").read_text())
    assert report["settings"]["world_size"] == 2 and report["settings"]["device"] == "cpu"
    # each rank calibrated on its share; the synchronised histograms give one process's amax
    assert _activation_amax(tmp_path / "two") == _activation_amax(tmp_path / "one")
    one = json.loads((tmp_path / "one" / "report.json").read_text())
    assert report["qat"]["steps"] == one["qat"]["steps"]  # the same global batches, sharded
    np.testing.assert_allclose(report["qat"]["losses"], one["qat"]["losses"], rtol=1e-4)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in ("one", "two", "cli.py")]
    assert not leftovers  # no rank left a staging directory behind
