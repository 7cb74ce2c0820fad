"""The committed GPU validation of osdn_fast (book/data/gpu_validation.json, written by
benchmarks/validate_gpu.py) must show every row under its threshold, with full coverage: a regression on the
GPU cannot hide behind a CPU-only CI. The file is required: a missing file fails, it does not skip."""
import importlib.util
import json
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "book" / "data" / "gpu_validation.json"
NAMES = {"o", "S", "d", "dq", "dk", "dv", "dbeta", "dS0", "dd0", "deta"}


def load() -> dict:
    assert DATA.exists(), f"{DATA} is missing: run benchmarks/validate_gpu.py --out DIR on the GPU and commit it"
    return json.loads(DATA.read_text())


def on_the_h200s_build(result: dict) -> bool:
    """Run where the kernels build and launch as on the H200: the H200 itself, or a card that records the H200's
    target and multiprocessor count (an H100 SXM: sm_90, 132 SMs). Triton compiles for the capability, and the
    launch rules read only the SM count (common.chain_stage), so such a card runs the same machine
    code with the same grids, and its rows say what the H200's would."""
    return "H200" in result["gpu"] or (result.get("capability"), result.get("sm_count")) == ("9.0", 132)


def test_provenance():
    """A real GPU run (not the CPU smoke run) of the H200's build, with the date and the versions recorded."""
    result = load()
    assert not result["smoke"] and not result["interpreter"] and result["complete"]
    assert on_the_h200s_build(result), (result["gpu"], result.get("capability"), result.get("sm_count"))
    for key in ("date", "torch", "triton", "cuda"):
        assert result[key], key
    assert result["thresholds"] == {"output": 0.006, "gradient": 0.008, "gate_gradient": 0.02}


def test_validates_the_current_kernels():
    """The file was made by the kernels in this tree: any change to osdn_fast/ops (kernels, launch table, glue)
    needs a new GPU validation run."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "validate_gpu.py"
    spec = importlib.util.spec_from_file_location("validate_gpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert load().get("kernel_digest") == module.kernel_digest(), "osdn_fast/ops changed since the GPU validation"
    from osdn_fast.ops.tuning import TUNING

    assert load().get("tuning") == TUNING, "osdn_fast/ops/tuning.py differs from the validated launch settings"


def test_every_row_under_threshold():
    result = load()
    bad = [r for r in result["rows"] if not r["rel_rmse"] <= r["threshold"]]
    assert not bad, "\n".join(f"{r['B'], r['T'], r['H'], r['D']} {r['dtype']} gate={r['gate']} varlen={r['varlen']} "
                              f"{r['name']}: {r['rel_rmse']:.2e} > {r['threshold']}" for r in bad)
    for r in result["rows"]:
        expected = 0.006 if r["name"] in ("o", "S", "d") else 0.02 if r["name"] in ("dr", "deta") else 0.008
        assert r["threshold"] == expected, r
        if r["kind"] == "output":  # a forward without gradients gave the same outputs, bit for bit
            assert r["same_without_grad"], r


def test_coverage():
    """bfloat16 and float16, no gate and GDN, with the clip (and in bfloat16 without), fla's four shapes and packed
    sequences, forward and every gradient."""
    rows = load()["rows"]
    shapes = {(r["B"], r["T"], r["H"], r["D"]) for r in rows if not r["varlen"]}
    assert {(1, 63, 1, 64), (2, 1000, 3, 128), (3, 2000, 4, 128), (4, 2048, 8, 64)} <= shapes
    # the three launch tiers of the state chain (common.chain_stage): few, some and many sequence-heads
    assert {r["state_tier"] for r in rows} == {"few", "some", "standard"}
    runs = [(dtype, True) for dtype in ("bfloat16", "float16")] + [("bfloat16", False)]  # (dtype, clip)
    for dtype, clip in runs:
        for gate in ("none", "gdn"):
            for varlen in (False, True):
                names = {r["name"] for r in rows
                         if (r["dtype"], r["gate"], r["clip"], r["varlen"]) == (dtype, gate, clip, varlen)}
                assert NAMES <= names, (dtype, gate, clip, varlen, NAMES - names)
                if gate == "gdn":
                    assert "dg" in names, (dtype, clip, varlen)


def test_apf_coverage():
    """OSDN-APF with the clip (the floor binds): with the scan forced (phase1 "sequential", since version 36; "auto"
    before, when chunk_osdn picked it at these shapes), and with the quasi-Newton form across chunks forced (phase1
    "chunked"); and without the clip, the chunk form with r forced, its chains walked chunk by chunk and in groups
    (since version 27); every gradient r's included."""
    rows = [r for r in load()["rows"] if r.get("apf")]
    for clip, gate, phase1 in ((True, "none", "sequential"), (True, "gdn", "chunked"), (False, "none", "chunked"),
                               (False, "gdn", "grouped")):
        for varlen in (False, True):
            names = {r["name"] for r in rows
                     if (r["clip"], r["gate"], r["phase1"], r["varlen"]) == (clip, gate, phase1, varlen)}
            assert NAMES | {"dr"} <= names, (clip, gate, phase1, varlen, NAMES | {"dr"} - names)


def test_timings_recorded():
    """First forward and forward+backward timings at (4, 4096, 16, 128) bfloat16."""
    t = [r for r in load()["timings"] if (r["B"], r["T"], r["H"], r["D"]) == (4, 4096, 16, 128)]
    assert t and all(r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0 for r in t)


def test_grouped_chains_coverage():
    """The chunk form with phase 1's chains walked in groups of chunks (validate_gpu.py's "grouped" run): every
    case of the validation, forward and every gradient."""
    rows = load()["rows"]
    case = lambda r: (r["B"], r["T"], r["H"], r["D"], r["varlen"])  # noqa: E731
    grouped = [r for r in rows if r["phase1"] == "grouped"]
    assert {case(r) for r in grouped} == {case(r) for r in rows}
    for c in {case(r) for r in grouped}:
        assert NAMES <= {r["name"] for r in grouped if case(r) == c}, c


def test_every_phase1_form_validated():
    """Each row records the phase-1 form its run took (before a redo; since version 36): the scan, the chunk form
    (unclipped, and speculating on a clip, idle and acting), the quasi-Newton form, each forward and every gradient,
    and the forced runs took the form they force."""
    rows = load()["rows"]
    forms = {(r["form"], r["clip"], r["eta"] > 0.1) for r in rows}
    for form, clip, big_eta in (("sequential", True, True), ("sequential", False, True), ("chunked", False, True),
                                ("chunked", True, False), ("chunked", True, True), ("newton", True, True)):
        assert (form, clip, big_eta) in forms, (form, clip, big_eta)
        assert NAMES <= {r["name"] for r in rows if (r["form"], r["clip"], r["eta"] > 0.1) == (form, clip, big_eta)}
    assert all(r["form"] == "sequential" for r in rows if r["phase1"] == "sequential")
    assert all(r["form"] in ("chunked", "newton") for r in rows if r["phase1"] in ("chunked", "grouped"))


def test_another_hopper_card_counts_only_with_the_h200s_target_and_sms():
    """An H100 SXM's run stands for the H200's; an H100 PCIe's (114 SMs) or an older card's does not."""
    assert on_the_h200s_build(dict(gpu="NVIDIA H200"))
    assert on_the_h200s_build(dict(gpu="NVIDIA H100 80GB HBM3", capability="9.0", sm_count=132))
    assert not on_the_h200s_build(dict(gpu="NVIDIA H100 PCIe", capability="9.0", sm_count=114))
    assert not on_the_h200s_build(dict(gpu="NVIDIA A100-SXM4-80GB", capability="8.0", sm_count=108))
    assert not on_the_h200s_build(dict(gpu="NVIDIA H100 80GB HBM3"))  # a file that did not record them
