"""Gates decide from the hardware and give one-line reasons; skips are recorded for the runner."""

import pytest

from labkit.workbench import gates
from labkit.workbench.hardware import GPU, Hardware

H200x2 = Hardware.fake(gpus=2)


def test_enough_hardware_is_ok():
    g = gates.requires(gpus=2, capability=(9, 0), peer_access=True, memory_gib=100, hw=H200x2)
    assert g.ok and bool(g) and g.reason == ""
    g.check()  # does not raise


@pytest.mark.parametrize(
    "needs,hw,reason",
    [
        ({"gpus": 2}, Hardware.fake(0), "needs 2 CUDA GPUs; this machine has 0"),
        ({"gpus": 1}, Hardware.fake(0), "needs 1 CUDA GPU; this machine has 0"),
        ({"gpus": 4}, H200x2, "needs 4 CUDA GPUs; this machine has 2"),
        (
            {"gpus": 1, "capability": (9, 0)},
            Hardware.fake(1, name="NVIDIA A100", capability=(8, 0)),
            "needs compute capability >= 9.0; GPU 0 (NVIDIA A100) is 8.0",
        ),
        (
            {"gpus": 2, "peer_access": True},
            Hardware.fake(2, peer=False),
            "needs peer access between GPUs; missing for 0->1, 1->0",
        ),
        (
            {"gpus": 1, "memory_gib": 100},
            Hardware.fake(1, memory_gib=79.2),
            "needs 100 GiB per GPU; GPU 0 has 79.2 GiB",
        ),
    ],
)
def test_first_unmet_need_is_the_reason(needs, hw, reason):
    g = gates.requires(hw=hw, **needs)
    assert not g.ok and g.reason == reason
    with pytest.raises(gates.HardwareUnavailable, match=reason.split(";")[0]):
        g.check()


def test_one_way_peer_access_is_reported_per_direction():
    hw = Hardware((GPU(0, "g", (9, 0), 80, 132), GPU(1, "g", (9, 0), 80, 132)), ((False, True), (False, False)))
    assert gates.requires(gpus=2, peer_access=True, hw=hw).reason.endswith("missing for 1->0")


@pytest.mark.parametrize("needs", [{"compiled": True}, {"capability": (9, 0)}, {"memory_gib": 1}])
def test_needs_that_imply_a_gpu_fail_without_one(needs):
    g = gates.requires(hw=Hardware.fake(0), **needs)
    assert not g.ok and g.reason == "needs 1 CUDA GPU; this machine has 0"


def test_announce_prints_one_line_and_records_the_skip(output_dir, capsys):
    g = gates.requires(gpus=8, hw=H200x2)
    assert g.announce("the 8-GPU sweep") is False
    assert capsys.readouterr().out == "SKIPPED the 8-GPU sweep: needs 8 CUDA GPUs; this machine has 2\n"
    assert gates.read_skips(output_dir) == [{"part": "the 8-GPU sweep", "reason": g.reason}]
    assert gates.requires(gpus=1, hw=H200x2).announce("fine") is True
    assert len(gates.read_skips(output_dir)) == 1


def test_mark_skips_with_the_reason():
    mark = gates.requires(gpus=3, hw=H200x2).mark
    assert mark.kwargs["reason"] == "needs 3 CUDA GPUs; this machine has 2" and mark.args == (True,)


@pytest.mark.parametrize(
    "name,count,tag",
    [
        ("NVIDIA H200", 2, "h200x2"),
        ("NVIDIA H100 80GB HBM3", 1, "h100x1"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 2, "rtxpro6000x2"),
        ("NVIDIA A100-SXM4-80GB", 8, "a100x8"),
    ],
)
def test_machine_tag(name, count, tag):
    from labkit.workbench.hardware import machine_tag

    assert machine_tag(Hardware.fake(count, name=name)) == tag


def test_machine_tag_cpu():
    from labkit.workbench.hardware import machine_tag

    assert machine_tag(Hardware.fake(0)) == "cpu"


def test_append_line_appends_to_a_plain_file(tmp_path):
    path = tmp_path / "records.jsonl"
    gates.append_line(path, "one\n")
    gates.append_line(path, "two\n")
    assert path.read_text() == "one\ntwo\n"


def test_append_line_refuses_a_symbolic_link_naming_the_path(tmp_path):
    """A link planted at a record's name (N86) would send the record into its target."""
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    link = tmp_path / "skips.jsonl"
    link.symlink_to(victim)
    with pytest.raises(gates.UnsafeFile, match=rf"^{link}: is a symbolic link; labkit appends only to a plain file"):
        gates.append_line(link, "x\n")
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(tmp_path / "would-be-created")
    with pytest.raises(gates.UnsafeFile, match="is a symbolic link"):
        gates.append_line(dangling, "x\n")
    assert victim.read_text() == "mine\n" and not (tmp_path / "would-be-created").exists()


def test_append_line_refuses_a_fifo_rather_than_waiting_on_it(tmp_path):
    import os

    fifo = tmp_path / "skips.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(gates.UnsafeFile, match=rf"^{fifo}: is a FIFO"):
        gates.append_line(fifo, "x\n")
    bad = []
    assert gates.read_jsonl(fifo, bool, "a record", bad) == [] and bad == ["skips.jsonl: not read (not a plain file)"]


def test_record_skip_refuses_a_symbolic_link(output_dir, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("")
    output_dir.mkdir()
    (output_dir / gates.SKIPS_FILE).symlink_to(victim)
    with pytest.raises(gates.UnsafeFile, match="skips.jsonl: is a symbolic link"):
        gates.record_skip("a part", "a reason")
    assert victim.read_text() == ""


def test_read_skips_leaves_bad_lines_out_and_names_them(tmp_path):
    (tmp_path / gates.SKIPS_FILE).write_bytes(
        b'{"part": "p", "reason": "r"}\n\n{"part": "p"}\n"text"\n\xff\xfe\n{"part": "q", "reason": "s"}\n'
    )
    bad = []
    assert gates.read_skips(tmp_path, bad) == [{"part": "p", "reason": "r"}, {"part": "q", "reason": "s"}]
    assert bad == [
        "skips.jsonl line 3: not a skipped part",
        "skips.jsonl line 4: not a skipped part",
        "skips.jsonl line 5: not JSON (Expecting value)",
    ]
    assert gates.read_skips(tmp_path / "none") == []
