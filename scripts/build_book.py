"""Build the book: execute every book/*.ipynb on the CPU into build/book/ and render each to HTML there.

    python scripts/build_book.py [--out build/book] [--timeout 900] [notebook ...]

The committed notebooks are never modified: each is read, executed in memory (working directory book/,
so relative paths such as book/data/ resolve) and written as an executed copy plus its HTML page.
Every notebook is attempted; the script exits non-zero, naming each failed notebook and its error,
if any cell raised.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_only_environment() -> None:
    """Kernels inherit this process's environment: hide GPUs and run Triton kernels in its interpreter."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")


def build_one(path: Path, out: Path, timeout: int) -> str | None:
    """Execute one notebook into `out` and render it to HTML; return the error text, or None on success."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    from nbconvert import HTMLExporter

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    error = None
    try:
        client.execute()
    except CellExecutionError as exc:  # keep the partial notebook: its error output is the diagnosis
        error = str(exc)
    nbformat.write(nb, out / path.name)
    html, _ = HTMLExporter().from_notebook_node(nb)
    (out / path.with_suffix(".html").name).write_text(html, encoding="utf-8")
    return error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every book/*.ipynb")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "book")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    args = parser.parse_args(argv)

    notebooks = [p.resolve() for p in args.notebooks] or sorted((ROOT / "book").glob("*.ipynb"))
    if not notebooks:
        print("error: no notebooks found in book/", file=sys.stderr)
        return 1
    cpu_only_environment()
    args.out.mkdir(parents=True, exist_ok=True)

    from tqdm import tqdm

    failures, start = {}, time.perf_counter()
    bar = tqdm(notebooks, unit="notebook", file=sys.stdout, dynamic_ncols=True, disable=None)  # no bar off a TTY
    for path in bar:
        bar.set_description(path.stem)
        t0 = time.perf_counter()
        error = build_one(path, args.out, args.timeout)
        verdict = "ok    " if error is None else "FAILED"
        bar.write(f"{verdict} {path.name:<28} {time.perf_counter() - t0:7.1f} s")
        if error is not None:
            failures[path.name] = error
    bar.close()

    print(f"{len(notebooks) - len(failures)}/{len(notebooks)} notebooks built into "
          f"{args.out} in {time.perf_counter() - start:.0f} s")
    for name, error in failures.items():
        print(f"\n===== {name} failed =====\n{error}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
