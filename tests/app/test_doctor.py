"""The doctor reports this machine truthfully, as text, JSON (CLI) and a widget."""

import json
import subprocess
import sys

import pytest
import torch

from labkit.app import catalogue, doctor


def test_report_matches_this_machine():
    rep = doctor.collect()
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert rep["gpu_count"] == n == len(rep["gpus"])
    assert len(rep["peer_access"]) == n and all(len(row) == n for row in rep["peer_access"])
    assert all(rep["peer_access"][i][i] is False for i in range(n))
    assert torch.__version__.startswith(rep["versions"]["torch"].split("+")[0])
    assert rep["multicast_env"] == {
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }
    assert [c["lab"] for c in rep["labs"]] == [lab.name for lab in catalogue.LABS]
    if n == 0:
        assert rep["machine"] == "cpu" and rep["tier"] == "interpreter"


def test_text_report_names_every_lab_and_gpu():
    rep = doctor.collect()
    text = doctor.format_text(rep)
    assert text.startswith(f"labkit doctor: {rep['machine']}")
    for lab in catalogue.LABS:
        assert lab.name in text
    for g in rep["gpus"]:
        assert g["name"] in text


def test_cli_json_is_valid_and_complete():
    p = subprocess.run(
        [sys.executable, "-m", "labkit", "doctor", "--json"], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert {"machine", "versions", "gpu_count", "gpus", "peer_access", "nvlink_topology", "labs", "tier"} <= set(rep)


def test_widget_renders_on_demand():
    panel = doctor.widget(render_now=False)
    button, html = panel.children
    assert html.value == ""
    button.click()
    assert "labkit doctor" in html.value


def test_peer_matrix_text_for_two_gpus():
    rep = doctor.collect()
    rep.update(
        gpu_count=2,
        gpus=[{"name": "NVIDIA H200", "capability": [9, 0], "memory_gib": 140.0, "multiprocessors": 132}] * 2,
        peer_access=[[False, True], [True, False]],
    )
    text = doctor.format_text(rep)
    assert "peer access (row can reach column):" in text and "yes" in text


def test_l2_size_comes_from_the_device_properties():
    """The L2 size is read, never typed (an H200's is not 60 MB): the doctor prints what the
    device reports, and says nothing for reports recorded before it read it."""
    from labkit.workbench.hardware import Hardware

    assert Hardware.fake(1, l2_mb=52.4).gpus[0].l2_mb == 52.4
    rep = doctor.collect()
    rep.update(
        gpu_count=1,
        gpus=[
            {"name": "NVIDIA H200", "capability": [9, 0], "memory_gib": 140.0, "multiprocessors": 132, "l2_mb": 52.4}
        ],
        peer_access=[[False]],
    )
    assert "132 SMs, 52.4 MB L2" in doctor.format_text(rep)
    del rep["gpus"][0]["l2_mb"]
    assert "MB L2" not in doctor.format_text(rep)


def test_the_interpreter_check_passes_here_and_the_report_says_so():
    """CI's interpreter runs labkit's grid-stride loop (were it broken, conftest would have
    stopped the run with the reason); the report carries the answer, the text says it."""
    from labkit.workbench import interpreter, tier

    assert interpreter.problem() is None
    rep = doctor.collect()
    assert rep["interpreter_problem"] is None
    assert ("interpreter: runs labkit's grid-stride kernels" in doctor.format_text(rep)) == tier.interpreted()


def test_a_broken_interpreter_is_named_with_its_fix(monkeypatch):
    """What triton 3.6 with NumPy 2.4 raised on the CPU: the check names the versions, the
    upstream issue and what to install."""
    from labkit.workbench import interpreter, tier

    class Broken:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise TypeError("only 0-dimensional arrays can be converted to Python scalars")

            return launch

    monkeypatch.setattr(interpreter, "_grid_stride_probe", Broken())
    monkeypatch.setattr(tier, "interpreted", lambda: True)
    interpreter.problem.cache_clear()
    try:
        found = interpreter.problem()
    finally:
        interpreter.problem.cache_clear()
    assert found is not None and "only 0-dimensional arrays" in found
    assert "triton-lang/triton#9171" in found and "pip install 'numpy<2.4'" in found


def test_the_index_fix_runs_a_grid_stride_loop_under_triton_36s_index(monkeypatch):
    """Triton 3.4-3.6 patch ``tl.tensor.__index__`` to ``int(self.handle.data)``, which NumPy 2.4
    refuses for the one-element array of a program id (triton-lang/triton#9171). With that patch
    planted in this Triton's interpreter, labkit's index fix still runs the grid-stride probe
    right, and the launch's scope undoes both patches afterwards."""
    import numpy
    import triton.language as tl

    from labkit.workbench import interpreter, tier

    if not tier.interpreted() or not interpreter.fast_device_calls():
        pytest.skip("the index fix is installed on the interpreter tier only")
    if not interpreter._numpy_refuses_one_element_int():
        pytest.skip(f"numpy {numpy.__version__} still converts a one-element array with int()")
    with pytest.raises(TypeError, match="only 0-dimensional arrays"):
        int(numpy.ones(1, dtype=numpy.int32))
    from triton.runtime import interpreter as ti

    patch_tensor = ti._patch_lang_tensor

    def as_in_triton_36(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))

    monkeypatch.setattr(ti, "_patch_lang_tensor", as_in_triton_36)
    before = vars(tl.tensor).get("__index__")
    x = torch.zeros(100)
    interpreter._grid_stride_probe[(2,)](x, 100, BLOCK=16)
    assert bool((x == 1).all()), x
    assert vars(tl.tensor).get("__index__") is before
