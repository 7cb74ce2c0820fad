"""Version 42's book edits, run once when its validation lands (on an H200, or on a card with its build: an H100 SXM,
sm_90 with 132 SMs; tests/test_gpu_validation_data.py's on_the_h200s_build) (after the new file is book/data/gpu_validation.json
and version 41's is gpu_validation_v41.json): notebook 06c compares the two files row by row against the prediction,
and 08b's part 49 reads version 41's file by its new name. Execute 06c and 08b afterwards."""
import json
import uuid
from pathlib import Path

BOOK = Path(__file__).resolve().parents[2] / "book"


def load(name):
    return json.loads((BOOK / name).read_text())


def save(name, nb):
    (BOOK / name).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def cell(kind, text):
    c = dict(cell_type=kind, id=uuid.uuid4().hex[:8], metadata={}, source=text.splitlines(True))
    if kind == "code":
        c.update(execution_count=None, outputs=[])
    return c


def replace(c, old, new):
    s = "".join(c["source"])
    assert old in s, old
    c["source"] = s.replace(old, new).splitlines(True)


MD42 = r"""### Version 42: the backward's running-sum out kernel at two warps

Version 42 changes one launch setting: `phase1_bwd_out_sum`, the out kernel of phase 1's backward where its chunk form
runs without $r$ (λ by the reverse running sum, version 41), at 2 warps instead of 4 (version 41's H200 sweep: 0.5388 ms
against 0.5644 at $(4, 4096, 16, 128)$). No kernel's code changes (the digest stays version 41's). **Prediction**: the
warps split the same sums over the key block in another order, so only the gradients that this kernel feeds can move:
$\partial k$, $\partial\beta$, $\partial d_0$ and $\partial\eta$ of the chunk form's runs without $r$ whose backward
runs it (no clip, or the clip idle; where the clip acts the guarded scan redoes the call). Every other row, outputs and
$d$ included, bitwise version 41's. Where the run was not on an H200 but on a card that builds and launches the same
(an H100 SXM: sm_90, 132 SMs), those bitwise rows test that claim as well: the same machine code with the same grids
gives the H200's bits.
"""

CODE42 = r"""# NBVAL_CHECK_OUTPUT
val42 = val                                                               # version 42's file, the gate's
rows42 = {key6(r): r for r in val42["rows"]}
changed42 = sorted(s for s in set(val42["tuning"]) | set(val41["tuning"]) if val42["tuning"].get(s) != val41["tuning"].get(s))
print(f"version 42, validated on the {val42['gpu']} (sm_{val42['capability'].replace('.', '')}, {val42['sm_count']} SMs) "
      f"on {val42['date'][:10]}")
print(f"version 42: {len(rows42)} rows, {sum(r['ok'] for r in val42['rows'])} within their thresholds; version 41's "
      f"cases: {set(rows42) == set(rows41)}; launch settings changed: {', '.join(changed42)} "
      f"({val41['tuning']['phase1_bwd_out_sum']} -> {val42['tuning']['phase1_bwd_out_sum']})")


def moves42(c, r):
    # may move: phase 1's gradients of the chunk form without r where its backward runs (not where the clip acts)
    return (r["form"] == "chunked" and not c[5] and not (c[3] == "clip" and c[4] == 0.5)
            and c[7] in ("dk", "dbeta", "dd0", "deta"))


tally42 = {}
for c, r in rows42.items():
    same = r["rel_rmse"] == rows41[c]["rel_rmse"]
    tally42.setdefault((moves42(c, r), same), []).append(c)
for (pred, same), cs in sorted(tally42.items()):
    print(f"  predicted {'to move' if pred else 'bitwise':<8} {len(cs):>4} rows {'bitwise' if same else 'moved'}")
moved42 = [c for c in rows42 if rows42[c]["rel_rmse"] != rows41[c]["rel_rmse"]]
if moved42:
    ratio42 = {c: rows42[c]["rel_rmse"] / rows41[c]["rel_rmse"] for c in moved42}
    print(f"moved: {len(moved42)} rows ({', '.join(sorted({c[7] for c in moved42}))}); error / version 41's: median "
          f"{statistics.median(ratio42.values()):.4f}, {min(ratio42.values()):.4f} to {max(ratio42.values()):.4f}, "
          f"at most {max(ratio_thr(rows42[c]) for c in moved42):.2f} of a threshold")
worst42 = max(val42["rows"], key=ratio_thr)
print(f"the worst row: {worst42['name']} {ratio_thr(worst42):.4f} of its threshold (version 41's worst: "
      f"{ratio_thr(worst41):.4f})")
print(f"kernel_digest {val42['kernel_digest'][:8]} = version 41's: {val42['kernel_digest'] == val41['kernel_digest']}; "
      f"tuning = TUNING: {val42['tuning'] == TUNING}")

assert val42["complete"] and not val42["interpreter"] and all(r["ok"] for r in val42["rows"]) and len(rows42) == 1127
assert set(rows42) == set(rows41) and all(rows42[c]["form"] == rows41[c]["form"] for c in rows42)
assert all(same for (pred, same) in tally42 if not pred), "a row predicted bitwise moved"
assert val42["kernel_digest"] == val41["kernel_digest"] == validate_gpu.kernel_digest() and val42["tuning"] == TUNING
assert changed42 == ["phase1_bwd_out_sum"] and (val42["capability"], val42["sm_count"]) == ("9.0", 132)
"""

nb = load("06c_kernels_h200.ipynb")
cells = nb["cells"]
i41 = next(i for i, c in enumerate(cells) if "val41 = val " in "".join(c["source"]))
replace(cells[i41], "val41 = val                                                               # version 41's file, the gate's",
        'val41 = json.loads(data_file("gpu_validation_v41.json").read_text())    # version 41\'s file (gpu_validation.json until v42)\n'
        'TUNING_V41 = dict(TUNING, phase1_bwd_out_sum=val41["tuning"]["phase1_bwd_out_sum"])  # version 42 changed one entry')
replace(cells[i41], "tuning = TUNING: {val41['tuning'] == TUNING}", "tuning = TUNING but version 42's entry: {val41['tuning'] == TUNING_V41}")
replace(cells[i41], 'and val41["tuning"] == TUNING\n', 'and val41["tuning"] == TUNING_V41\n')
cells[i41 + 1:i41 + 1] = [cell("markdown", MD42), cell("code", CODE42)]
save("06c_kernels_h200.ipynb", nb)

nb = load("08b_performance.ipynb")
c = next(c for c in nb["cells"] if 'VALID49 = load("book/data/gpu_validation.json")' in "".join(c["source"]))
replace(c, 'VALID49 = load("book/data/gpu_validation.json")                 # call 4: version 41, the kernels in this tree',
        'VALID49 = load("book/data/gpu_validation_v41.json")             # call 4: version 41 (gpu_validation.json until v42)')
replace(c, '(("gpu_validation.json", VALID49)', '(("gpu_validation_v41.json", VALID49)')
save("08b_performance.ipynb", nb)
print("06c: version 42's cells after cell", i41, "; 08b part 49 reads gpu_validation_v41.json")
