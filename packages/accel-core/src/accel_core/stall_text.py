"""The stall report's text: composed from the stalled rank's position and every rank's answer (no torch, no I/O).

Two reports: a rank waiting too long in one of accel's collectives (``compose_report``), and a rank that has made
no progress for the threshold anywhere else, DDP's gradient all-reduce inside ``backward`` included, while some
rank is behind it or does not answer (``compose_progress_report``). A rank that did not answer is described by
its fate from ``stall_probe.probe`` (stopped, gone, unreachable) where one was found.
"""

from __future__ import annotations

from typing import Any

# Checkpoint calls every process makes, whose report says so (a save under `if accelerator.is_main_process:`).
EVERY_PROCESS_SAVES = ("save_state", "load_state", "save_model")

SILENT = "did not answer (its process was killed, or it is blocked without releasing Python)"


def _collective(p: dict[str, Any]) -> str:
    via = f", called through {p['via']}" if p.get("via") and p["via"] != p["op"] else ""
    return f"{p['op']} #{p['seq']} at {p['site']}{via}"


def compose_report(
    reporter: dict[str, Any],
    positions: dict[int, dict[str, Any] | None],
    world_size: int,
    timeout: float | None,
    asked: bool = True,
    fates: dict[int, str] | None = None,
) -> str:
    """The report's text, from the stalled rank's position and every rank's answer (None: no answer).

    asked: False when there was no store to ask the others through (their positions are unknown).
    fates: for ranks that did not answer, what a direct look found (``stall_probe.probe``), with who they are.
    """
    head = (
        f"accel: stall report from rank {reporter['rank']}: it has waited {reporter['since']:.0f} s in "
        f"{_collective(reporter)}."
    )
    same: list[int] = []
    lines: list[str] = []
    for rank in range(world_size):
        p = positions.get(rank)
        if p is not None and p["state"] == "in" and p["seq"] == reporter["seq"] and p["op"] == reporter["op"]:
            same.append(rank)
            continue
        if p is None and not asked:
            lines.append(f"  - rank {rank}: position unknown (no rendezvous store at MASTER_ADDR:MASTER_PORT to ask)")
            continue
        if p is None:
            lines.append(f"  - {(fates or {}).get(rank) or f'rank {rank}: {SILENT}'}")
            continue
        who = f"  - rank {rank} (pid {p['pid']} on {p['host']})"
        if p["state"] == "exited":
            last = f"; its last collective was {_collective(p)}" if p["seq"] else ""
            lines.append(f"{who}: its script has ended{last}")
            continue
        if p["state"] == "in":
            where = f"waits in {_collective(p)} for {p['since']:.0f} s"
        elif p["seq"]:
            where = f"is not in a collective; its last was {_collective(p)}, {p['since']:.0f} s ago"
        else:
            where = "has not called a collective yet"
        lines.append(f"{who}: {where}{_now(p)}")
    missing = world_size - len(same)
    body = [head]
    if lines:
        body.append(f"{missing} rank(s) have not reached it:")
        body.extend(lines)
    else:
        body.append("Every rank is in it: the collective itself is slow (a large transfer, a slow network).")
    body.append(f"In it: rank(s) {_ranges(same)}.")
    if reporter["op"] in EVERY_PROCESS_SAVES and lines:
        body.append(
            f"{reporter['op']} is called on every process: each writes or reads its part and they agree on the "
            "outcome (as in Accelerate); under `if accelerator.is_main_process:` the others never reach it."
        )
    body.append(
        f"The job goes on; this collective fails when it has waited {_limit(timeout)} "
        "(accel launch --collective-timeout). "
        "A collective every rank must call sits under a condition on the rank, or a rank is stuck before it."
    )
    return "\n".join(body)


def _now(p: dict[str, Any]) -> str:
    now = "".join(f"\n      {line}" for line in p.get("now") or [])
    return f"; now at:{now}" if now else ""


def _limit(timeout: float | None) -> str:
    return f"{timeout:.0f} s" if timeout is not None else "the collective timeout"


def _step(p: dict[str, Any]) -> str:
    """Where a rank is in the training loop: its count of ``accelerator.backward`` calls, and its last collective."""
    return f"backward #{p.get('step', 0)}" + (f" (its last collective: {_collective(p)})" if p.get("seq") else "")


def compose_progress_report(
    reporter: dict[str, Any],
    since: float,
    positions: dict[int, dict[str, Any] | None],
    world_size: int,
    timeout: float | None,
    fates: dict[int, str],
) -> str | None:
    """The report of a rank that made no progress for ``since`` seconds outside accel's collectives (in DDP's
    gradient all-reduce, say), or None when every rank answered and none is behind it (a slow step, not a stall).

    positions: every rank's answer (None: none came); fates: what a direct look found for those.
    """
    mark = (reporter.get("step", 0), reporter["seq"])
    lines: list[str] = []
    for rank in range(world_size):
        p = positions.get(rank)
        if rank == reporter["rank"]:
            continue
        if p is None:
            lines.append(f"  - {fates.get(rank) or f'rank {rank}: {SILENT}'}")
        elif p["state"] == "exited":
            lines.append(f"  - rank {rank} (pid {p['pid']} on {p['host']}): its script has ended, at {_step(p)}")
        elif (p.get("step", 0), p["seq"]) < mark:
            where = f"is behind, at {_step(p)}"
            if p["state"] == "in":
                where += f" (waiting in it for {p['since']:.0f} s)"
            lines.append(f"  - rank {rank} (pid {p['pid']} on {p['host']}): {where}{_now(p)}")
    if not lines:
        return None
    body = [
        f"accel: stall report from rank {reporter['rank']}: it has made no progress for {since:.0f} s, in "
        f"{_step(reporter)}{_now(reporter)}",
        f"{len(lines)} rank(s) hold it up:",
        *lines,
        f"The job goes on; the collective it waits in (DDP's gradient all-reduce in backward, say) fails when it has "
        f"waited {_limit(timeout)} (accel launch --collective-timeout).",
    ]
    return "\n".join(body)


def compose_lost_store_report(reporter: dict[str, Any], since: float, fate: str, world_size: int) -> str:
    """The report of a rank that made no progress and cannot reach the job's store: the others are unknown."""
    return "\n".join(
        [
            f"accel: stall report from rank {reporter['rank']}: it has made no progress for {since:.0f} s, in "
            f"{_step(reporter)}{_now(reporter)}",
            f"It cannot ask the other {world_size - 1} rank(s): {fate}.",
            "The job goes on; the collective it waits in fails at the collective timeout "
            "(accel launch --collective-timeout).",
        ]
    )


def _ranges(ranks: list[int]) -> str:
    if not ranks:
        return "none"
    spans: list[str] = []
    start = previous = ranks[0]
    for rank in [*ranks[1:], None]:
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        spans.append(str(start) if start == previous else f"{start}-{previous}")
        if rank is not None:
            start = previous = rank
    return ", ".join(spans)
