#!/usr/bin/env python
"""Memory and speed of the pretraining data pipeline: build the token cache, then train from it.

    python benchmarks/data_memory.py                              # 40 MB and 400 MB of text
    python benchmarks/data_memory.py --sizes 40,400,2000          # + 2 GB (about 10 min more on 2 cores)
    python benchmarks/data_memory.py --sizes 40 --skip-ddp        # quick
    python benchmarks/data_memory.py --sizes 40,2000 --assemble-above 400 --check-assembly   # training at 2 GB

The corpora are the shipped texts (``outlierlab/datamodules/data/corpus``, 5.6 MB) repeated line by line up to
each size -- fine for memory and throughput, which depend on the amount of text, not on its novelty.  The
tokenizer is the byte-level BPE-8192 trained once on the shipped texts and passed as a pretrained tokenizer
(``tokenizer.name_or_path``), as a user with their own tokenizer would; BPE training is not measured here.

Every measurement runs in its own process, watched from here through ``/proc`` (no psutil): per process the
kernel's high-water mark ``VmHWM`` (peak RSS) and the largest ``RssAnon`` / ``RssFile`` / ``Pss`` seen, sampled
every 0.2 s, plus ``os.wait4``'s ``ru_maxrss`` of the direct child.  Measured:

1. build: ``MLMDataModule.prepare_data()`` into an empty cache -- peak RSS of the main process and of the
   largest tokenizer worker, wall time, tokens/s; ``num_proc`` 1 and 2 on the smallest size, 2 on the others;
2. train: ``python train.py data=files ...`` (tiny model, 2 steps) with the warm cache, twice (the first run also
   checks the corpus file, once per file version) -- peak RSS, seconds from
   launch to the first ``[train] step`` line, and the data part alone (``prepare_data + setup + first batch``
   in a fresh process);
3. DDP: the same with ``trainer=ddp trainer.accelerator=cpu trainer.devices=2`` (gloo) on the smallest and the
   largest size -- peak RSS and PSS of each rank.

Results: one JSON per run in ``--out`` (default ``benchmarks/results/data_memory.json``) and a table on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


# ----------------------------------------------------------------------------------------------- /proc
def _status(pid: int) -> dict[str, int]:
    """kB fields of /proc/<pid>/status (VmHWM, VmRSS, RssAnon, RssFile) and Pss of smaps_rollup."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(rest.split()[0])
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                out["Pss"] = int(line.split()[1])
    except (OSError, ValueError, IndexError):  # the process ended between two reads
        pass
    return out


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _label(pid: int) -> str:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        rank = next((e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"LOCAL_RANK=")), None)
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    name = Path(cmd[1].decode()).name if len(cmd) > 1 and cmd[1] else cmd[0].decode()
    return f"{name}" + (f" rank {rank}" if rank is not None else "")


def watch(cmd: list[str], env: dict | None = None, marker: str | None = None, timeout: float = 3600) -> dict:
    """Run ``cmd``; per descendant process the peaks of VmHWM/RssAnon/RssFile/Pss (MiB); seconds to ``marker``."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, **(env or {})})
    lines, marks = [], {}

    def read() -> None:
        for line in p.stdout:
            lines.append(line)
            if marker and marker in line and "marker" not in marks:
                marks["marker"] = time.perf_counter() - t0

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    peaks: dict[int, dict] = {}
    rusage = None
    while True:
        for pid in _descendants(p.pid):
            st = _status(pid)
            if not st:
                continue
            rec = peaks.setdefault(pid, {"label": _label(pid)})
            for k, v in st.items():
                rec[k] = max(rec.get(k, 0), v)
        done_pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if done_pid:
            rusage, rc = ru, os.waitstatus_to_exitcode(status)
            break
        if time.perf_counter() - t0 > timeout:
            p.kill()
            raise TimeoutError(f"{cmd} ran over {timeout} s")
        time.sleep(0.2)
    reader.join(timeout=10)
    wall = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {rc}):\n" + "".join(lines[-40:]))
    procs = [{"pid": pid, "label": r["label"], **{k: round(r[k] / 1024, 1) for k in r if k != "label"}}
             for pid, r in peaks.items() if "VmHWM" in r]
    return {"wall_s": round(wall, 2), "ru_maxrss_mb": round(rusage.ru_maxrss / 1024, 1), "procs": procs,
            "marker_s": round(marks["marker"], 2) if "marker" in marks else None, "stdout": "".join(lines)}


# ---------------------------------------------------------------------------------------------- inputs
def make_corpus(path: Path, mb: int) -> Path:
    """The shipped texts repeated, line by line, to at least ``mb`` MB (written once, streamed)."""
    if path.is_file() and path.stat().st_size >= mb * 1e6:
        return path
    from outlierlab.datamodules.corpus import iter_text_file, embedded_files

    lines = [line for f in embedded_files() for line in iter_text_file(f)]
    tmp, size = path.with_suffix(".tmp"), 0
    with open(tmp, "w", encoding="utf-8") as fh:
        while size < mb * 1e6:
            for line in lines:
                fh.write(line + "\n")
                size += len(line.encode()) + 1
                if size >= mb * 1e6:
                    break
    tmp.rename(path)
    return path


def make_tokenizer(work: Path) -> Path:
    """The default BPE-8192 of the shipped texts, saved as a pretrained tokenizer folder."""
    out = work / "bpe8192"
    if not (out / "tokenizer_config.json").is_file():
        from outlierlab.datamodules.corpus import corpus_identity, load_embedded_texts
        from outlierlab.datamodules.tokenizer import load_or_train_bpe

        tok, _, _ = load_or_train_bpe(load_embedded_texts, corpus_identity("embedded"), 8192, work / "cache0")
        tok.save_pretrained(str(out))
    return out


# ------------------------------------------------------------------------------------------- children
def _datamodule(corpus: str, tokenizer: str, cache: str, num_proc: int):
    from outlierlab.datamodules.mlm_datamodule import MLMDataModule

    return MLMDataModule(source="files", files=[corpus], tokenizer={"name_or_path": tokenizer}, block_size=128,
                         batch_size=32, cache_dir=cache, num_proc=num_proc)


def child_build(a) -> dict:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    dm = _datamodule(a.corpus, a.tokenizer, a.cache, a.num_proc)
    t0 = time.perf_counter()
    dm.prepare_data()
    wall = time.perf_counter() - t0
    assert dm.cache_hits["blocks"] is False, "the cache was warm: not a build"
    meta = dm.token_meta
    return {"tokens": meta["tokens"], "documents": meta["documents"], "text_mb": round(meta["bytes"] / 1e6, 1),
            "token_file_mb": round((dm.blocks_path / "tokens.bin").stat().st_size / 1e6, 1),
            "build_s": round(wall, 2), "tokens_per_s": round(meta["tokens"] / wall),
            "main_peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "worker_peak_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)}


def child_warm(a) -> dict:
    t_import = time.perf_counter()
    import outlierlab.datamodules.mlm_datamodule  # noqa: F401  (lightning + transformers: not data work)

    from types import SimpleNamespace

    rss0 = _rss_mb()
    t0 = time.perf_counter()
    dm = _datamodule(a.corpus, a.tokenizer, a.cache, a.num_proc)
    dm.prepare_data()
    dm.setup("fit")
    dm.trainer = SimpleNamespace(global_rank=1, world_size=2, max_steps=2)  # rank 1 of 2, as under DDP
    batch = next(iter(dm.train_dataloader()))
    wall = time.perf_counter() - t0
    assert dm.cache_hits["blocks"] is True and batch["input_ids"].shape == (32, 128)
    for _ in range(9):  # ten batches in all, to page in some of the map
        batch = next(iter(dm.train_dataloader()))
    mapped = _mapping_kb("tokens.bin")
    return {"data_ready_s": round(wall, 3), "imports_s": round(t0 - t_import, 2),
            "data_rss_mb": round(_rss_mb() - rss0, 1), "token_map_rss_mb": round(mapped.get("Rss", 0) / 1024, 2),
            "token_map_pss_mb": round(mapped.get("Pss", 0) / 1024, 2), "prepare_s": round(dm.timings["prepare_s"], 3),
            "setup_s": round(dm.timings["setup_s"], 3), "train_blocks": dm.stats["train_blocks"],
            "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _mapping_kb(name: str) -> dict[str, int]:
    """Rss/Pss (kB) of this process' mappings of files called ``name`` (/proc/self/smaps)."""
    out: dict[str, int] = {}
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            inside = line.rstrip().endswith("/" + name)
        elif inside and head and head[0] in ("Rss:", "Pss:"):
            out[head[0][:-1]] = out.get(head[0][:-1], 0) + int(head[1])
    return out


def assemble_cache(corpus: Path, mb: int, tokenizer_dir: Path, cache: Path) -> dict:
    """The token file of a corpus of the shipped lines cycled to ``mb`` MB, without tokenizing it all.

    :func:`make_corpus` repeats the shipped lines, and every line is tokenized on its own, so the token stream
    of the big corpus is exactly the lines' ids cycled the same way: tokenize one cycle, repeat.  The file is
    written where ``MLMDataModule`` looks for it, with the meta ``write_token_file`` writes; checked byte for
    byte against a real build on the smallest size (``--check-assembly``).
    """
    from outlierlab.datamodules import token_cache
    from outlierlab.datamodules.corpus import corpus_identity, embedded_files, iter_text_file
    from outlierlab.datamodules.tokenizer import load_tokenizer, mlm_special_ids, tokenizer_fingerprint

    tok = load_tokenizer(str(tokenizer_dir))
    ids = mlm_special_ids(tok)
    dtype = token_cache.token_dtype(len(tok))
    lines = [line for f in embedded_files() for line in iter_text_file(f)]
    encoded = [np.asarray([*x, ids["eos"]], dtype=dtype).tobytes()
               for x in tok(lines, add_special_tokens=False, verbose=False)["input_ids"]]
    corpus_id = corpus_identity("files", [str(corpus)], None, None, memo_dir=cache / "file_hashes")
    path = token_cache.token_cache_path(cache, corpus_id, tok)
    tmp = path.with_name(f".{path.name}.assembling")
    tmp.mkdir(parents=True, exist_ok=True)
    size = n_docs = n_bytes = 0
    with open(tmp / token_cache.TOKENS, "wb") as fh:
        while size < mb * 1e6:
            for line, enc in zip(lines, encoded):
                fh.write(enc)
                size += len(line.encode()) + 1
                n_docs, n_bytes = n_docs + 1, n_bytes + len(line.encode())
                if size >= mb * 1e6:
                    break
    n_tokens = (tmp / token_cache.TOKENS).stat().st_size // dtype.itemsize
    meta = {"corpus_id": corpus_id, "source": "files", "tokenizer": str(tokenizer_dir), "special_ids": ids,
            "format": token_cache.FORMAT_VERSION, "dtype": dtype.str, "tokens": n_tokens, "documents": n_docs,
            "bytes": n_bytes, "vocab_size": len(tok), "tokenizer_fingerprint": tokenizer_fingerprint(tok),
            "assembled": True}
    (tmp / token_cache.META).write_text(json.dumps(meta, indent=2))
    os.replace(tmp, path)
    return {"path": str(path), "tokens": n_tokens, "documents": n_docs}


def _json_of(stdout: str) -> dict:
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


# ---------------------------------------------------------------------------------------------- phases
def train_cmd(corpus: Path, tokenizer: Path, cache: Path, run_dir: Path, ddp: bool) -> list[str]:
    """A fresh 2-step run (an existing run directory would be resumed from its last.ckpt: no step at all)."""
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    cmd = [sys.executable, "train.py", "data=files", f"data.files=[{corpus}]", f"tokenizer.name_or_path={tokenizer}",
           f"data.cache_dir={cache}", "trainer.max_steps=2", "trainer.limit_val_batches=0", "export=false",
           "callbacks.progress.every_n_steps=1", "trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}"]
    if ddp:
        cmd += ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]
    return cmd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="40,400", help="MB of text, comma-separated")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "outlierlab_data_bench"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "data_memory.json"))
    ap.add_argument("--skip-ddp", action="store_true")
    ap.add_argument("--assemble-above", type=int, default=None, metavar="MB",
                    help="for sizes above MB, assemble the token file from one tokenized cycle of the shipped lines "
                         "(exact, see assemble_cache) instead of building it: training is measured, the build not")
    ap.add_argument("--skip-build", action="store_true", help="reuse the caches of an earlier run of this script")
    ap.add_argument("--check-assembly", action="store_true",
                    help="assemble the smallest size too and compare it byte for byte with its real build")
    ap.add_argument("--child", choices=["build", "warm"], help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--tokenizer", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    ap.add_argument("--num-proc", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps({"build": child_build, "warm": child_warm}[a.child](a)), flush=True)
        return

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in a.sizes.split(",")]
    tokenizer = make_tokenizer(work)
    results: dict = {"sizes_mb": sizes, "cpus": os.cpu_count(), "runs": []}

    def record(kind: str, size: int, **fields) -> None:
        fields = {"kind": kind, "size_mb": size, "loadavg_1m": round(os.getloadavg()[0], 2), **fields}
        fields.pop("stdout", None)
        results["runs"].append(fields)
        print(json.dumps(fields), flush=True)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(results, indent=1))

    me = [sys.executable, str(Path(__file__).resolve())]
    for size in sizes:
        corpus = make_corpus(work / f"corpus_{size}mb.txt", size)
        if a.skip_build:
            pass
        elif a.assemble_above is not None and size > a.assemble_above:
            cache = work / f"cache_{size}mb_np2"
            subprocess.run(["rm", "-rf", str(cache)], check=True)
            t0 = time.perf_counter()
            record("assemble", size, **assemble_cache(corpus, size, tokenizer, cache),
                   wall_s=round(time.perf_counter() - t0, 1))
        for num_proc in [] if a.skip_build or (a.assemble_above is not None and size > a.assemble_above) else \
                [1, 2] if size == sizes[0] else [2]:
            cache = work / f"cache_{size}mb_np{num_proc}"
            subprocess.run(["rm", "-rf", str(cache)], check=True)
            r = watch(me + ["--child", "build", "--corpus", str(corpus), "--tokenizer", str(tokenizer),
                            "--cache", str(cache), "--num-proc", str(num_proc)])
            record("build", size, num_proc=num_proc, **_json_of(r["stdout"]), wall_s=r["wall_s"], procs=r["procs"])
        cache = work / f"cache_{size}mb_np2"
        if a.check_assembly and size == sizes[0] and not a.skip_build:
            check = work / "cache_check"
            subprocess.run(["rm", "-rf", str(check)], check=True)
            got = Path(assemble_cache(corpus, size, tokenizer, check)["path"]) / "tokens.bin"
            built = next(cache.glob("tokens/*/tokens.bin"))
            same = got.read_bytes() == built.read_bytes()
            record("assembly_check", size, identical_to_build=same)
            assert same, f"assembled {got} differs from built {built}"
        warm = ["--child", "warm", "--corpus", str(corpus), "--tokenizer", str(tokenizer), "--cache", str(cache),
                "--num-proc", "2"]
        watch(me + warm)  # the first warm process memoizes the corpus file's digest (file_hashes/)
        r = watch(me + warm)
        record("warm_data", size, **_json_of(r["stdout"]))
        # twice: the first run also checks the corpus file line by line (once per file version, remembered)
        r = watch(train_cmd(corpus, tokenizer, cache, work / f"run_{size}", ddp=False), marker="[train] step 1/")
        record("train_first", size, wall_s=r["wall_s"], first_step_s=r["marker_s"], peak_mb=r["ru_maxrss_mb"],
               procs=r["procs"])
        r = watch(train_cmd(corpus, tokenizer, cache, work / f"run_{size}", ddp=False), marker="[train] step 1/")
        record("train", size, wall_s=r["wall_s"], first_step_s=r["marker_s"], peak_mb=r["ru_maxrss_mb"],
               procs=r["procs"])
        if not a.skip_ddp and size in (sizes[0], sizes[-1]):
            r = watch(train_cmd(corpus, tokenizer, cache, work / f"run_ddp_{size}", ddp=True),
                      marker="[train] step 1/")
            record("train_ddp2", size, wall_s=r["wall_s"], first_step_s=r["marker_s"], procs=r["procs"])
    print(f"results: {a.out}")


if __name__ == "__main__":
    main()
