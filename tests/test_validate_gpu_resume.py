"""benchmarks/validate_gpu.py --resume: a validation cut short goes on from its file, running only the cases it
lacks, and refuses a file of other kernels; each case's float64 reference is computed once for all the runs that share
it. `validate` is replaced by a stub that records each case it is asked for
(the real one is what the GPU runs; here only the bookkeeping is under test)."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("validate_gpu", ROOT / "benchmarks" / "validate_gpu.py")
validate_gpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(validate_gpu)


computed = []  # (the References object, the reference key) of each stubbed case


@pytest.fixture
def calls(monkeypatch):
    seen = []
    computed.clear()

    def stub(shape, dtype, gate, cu, device, options, phase1="auto", refs=None):
        seen.append((shape, str(dtype), gate, None if cu is None else list(cu), options["eta"], phase1))
        key = validate_gpu.reference_key(shape, dtype, gate, cu, options)
        assert refs.get(key, lambda: dict(key=key)) == dict(key=key)  # the reference of this case, not another's
        computed.append((refs, key))
        B, T, H, D = shape
        return [dict(B=B, T=T, H=H, D=D, varlen=cu is not None, cu_seqlens=None if cu is None else list(cu),
                     dtype=str(dtype).replace("torch.", ""), gate="gdn" if gate else "none", clip="d_min" in options,
                     eta=options["eta"], apf=options.get("apf", False), phase1=phase1, name="o", kind="output",
                     rel_rmse=float(len(seen)), threshold=1e9, ok=True)]

    monkeypatch.setattr(validate_gpu, "validate", stub)
    return seen


def test_resume_runs_only_the_missing_cases(tmp_path, calls):
    validate_gpu.main(["--smoke", "--no-timing", "--out", str(tmp_path / "full")])
    full = json.loads((tmp_path / "full" / "gpu_validation.json").read_text())
    n = len(calls)
    assert n == len(full["rows"]) > 10 and full["complete"]
    cut = dict(full, rows=full["rows"][: n - 7], complete=False)
    (tmp_path / "cut.json").write_text(json.dumps(cut))
    validate_gpu.main(["--smoke", "--no-timing", "--out", str(tmp_path / "resumed"), "--resume", str(tmp_path / "cut.json")])
    resumed = json.loads((tmp_path / "resumed" / "gpu_validation.json").read_text())
    assert calls[n:] == calls[n - 7:n]                      # exactly the seven cases the cut file lacked, in order
    strip = lambda rows: [{k: v for k, v in r.items() if k != "rel_rmse"} for r in rows]  # noqa: E731
    assert strip(resumed["rows"]) == strip(full["rows"]) and resumed["complete"]
    assert resumed["resumed_from"] == dict(date=full["date"], rows=n - 7)


def test_resume_refuses_other_kernels(tmp_path, calls):
    validate_gpu.main(["--smoke", "--no-timing", "--out", str(tmp_path)])
    cut = json.loads((tmp_path / "gpu_validation.json").read_text())
    (tmp_path / "other.json").write_text(json.dumps(dict(cut, kernel_digest="0" * 64)))
    with pytest.raises(SystemExit, match="other kernels"):
        validate_gpu.main(["--smoke", "--no-timing", "--out", str(tmp_path / "x"), "--resume", str(tmp_path / "other.json")])


def test_each_reference_is_computed_once(tmp_path, calls):
    """Runs that differ only in phase 1's form share their cases' references: computed once each, dropped after
    their last use, and fewer than the cases."""
    validate_gpu.main(["--smoke", "--no-timing", "--out", str(tmp_path)])
    refs = computed[0][0]
    keys = [key for _, key in computed]
    assert all(r is refs for r, _ in computed) and len(keys) == len(calls)
    assert refs.computed == len(set(keys)) == 3 * 12 < len(calls) == 3 * 15  # 3 of the 15 runs share another's cases
    assert refs.kept == {} and not +refs.left


def test_references_refuse_an_unplanned_use():
    refs = validate_gpu.References(["a", "a", "b"])
    made = []
    assert [refs.get(k, lambda k=k: made.append(k) or k.upper()) for k in ("a", "b", "a")] == ["A", "B", "A"]
    assert made == ["a", "b"] and refs.kept == {}
    with pytest.raises(KeyError, match="not planned"):
        refs.get("a", lambda: "A")
