"""Crash safety: SIGKILL while a checkpoint is being overwritten, then resume from the same path.

`phase=kill` (one launch per trial): saves checkpoint v1 to `dir/ckpt`, takes an optimizer step (v2), arms a timer
that SIGKILLs this process `frac` x (v1's save time) into the save of v2 over the same path, and saves.
`phase=verify` (one launch for all trials): loads each trial's path into fresh objects and reports "old" (v1
intact), "new" (v2 complete), "mixed" (parts of both), or the error. A framework is crash-safe when every trial
resumes from v1 or v2.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import torch


def _objects(harness, quick: bool):
    layers, width = (2, 1024) if quick else (6, 2048)  # 25 / 300 MB with the Adam moments
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer, _ = harness.prepare(model, optimizer)
    return model, optimizer, width


def _step(model, optimizer, width: int) -> None:
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def _fingerprint(harness, model, optimizer) -> list[float]:
    weights = [p.double().sum().item() for p in harness.unwrap(model).state_dict().values()]
    moments = [s["exp_avg"].double().sum().item() for s in optimizer.state_dict()["state"].values()]
    return weights + moments


def run(harness, quick: bool = False, phase: str = "kill", dir: str = ".", frac: str = "0.5", **_: str) -> dict:
    model, optimizer, width = _objects(harness, quick)
    if phase == "kill":
        path = os.path.join(dir, "ckpt")
        _step(model, optimizer, width)
        harness.save(os.path.join(dir, "warm-up"), model, optimizer, None)  # first-call costs out of v1's time
        start = time.perf_counter()
        harness.save(path, model, optimizer, None)
        save_s = time.perf_counter() - start
        v1 = _fingerprint(harness, model, optimizer)
        _step(model, optimizer, width)
        v2 = _fingerprint(harness, model, optimizer)
        with open(os.path.join(dir, "versions.json"), "w") as f:
            json.dump({"v1": v1, "v2": v2, "save_s": save_s}, f)
        timer = threading.Timer(float(frac) * save_s, lambda: os.kill(os.getpid(), signal.SIGKILL))
        timer.start()
        harness.save(path, model, optimizer, None)
        timer.cancel()
        return {"killed": False}  # the save finished before the timer: this trial tested nothing
    outcomes = []
    for trial in sorted(os.listdir(dir)):
        folder = os.path.join(dir, trial)
        with open(os.path.join(folder, "versions.json")) as f:
            versions = json.load(f)
        _step(model, optimizer, width)  # so that a load that leaves things alone is not taken for v1
        try:
            harness.load(os.path.join(folder, "ckpt"), model, optimizer, None)
        except Exception as exc:  # noqa: BLE001 - whatever the framework raises is the outcome measured
            outcomes.append(f"error: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        got = _fingerprint(harness, model, optimizer)
        outcomes.append("old" if got == versions["v1"] else "new" if got == versions["v2"] else "mixed")
    return {"outcomes": outcomes, "safe": all(o in ("old", "new") for o in outcomes)}
