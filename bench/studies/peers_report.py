"""bench peers' results.json → peers.md (every cell, the goals, the ceilings) and peers.png."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.harness.output import figure, write_results

LABELS = {
    "infinity": "Infinity (torch CPU)",
    "gateway-cpu": "gateway cpu (FP32)",
    "gateway-cpu-int8": "gateway cpu-int8",
    "gateway-cpu-bf16": "gateway cpu-bf16 (OpenVINO)",
    "gateway-cpu-int8-openvino": "gateway cpu-int8-openvino (OpenVINO, NNCF)",
    "gateway-auto": "gateway default (auto)",
}
#: The systems that are one fixed profile (``auto`` is whichever of them it chose).
AUTO = "gateway-auto"


def label(results: dict[str, Any], system: str) -> str:
    """The system's name in tables; the default says which profile and plan it chose, a fixed
    plan (``gateway-PROFILE@IxT``) its instances x threads."""
    if system == AUTO:
        chosen = results["systems"].get(AUTO, {}).get("profile_choice", {}).get("chosen")
        planned = results["systems"].get(AUTO, {}).get("core_plan") or {}
        plan = f", {planned['instances']}x{planned['threads']}" if planned else ""
        return f"gateway default (auto → {chosen}{plan})" if chosen else LABELS[AUTO]
    profile, _, plan = system.partition("@")
    if plan:
        return f"{LABELS.get(profile, profile)}, fixed plan {plan} (instances x threads)"
    return LABELS.get(system, system)


def _profiles(results: dict[str, Any]) -> list[str]:
    return [s for s in results["systems"] if s.startswith("gateway-") and s != AUTO]


def _cell(results: dict[str, Any], system: str, cell: str) -> dict[str, Any]:
    found: dict[str, Any] = results["systems"].get(system, {}).get("cells", {}).get(cell, {})
    return found


def _img_s(results: dict[str, Any], system: str, cell: str) -> float:
    return float(_cell(results, system, cell).get("images_per_s", 0.0))


def _p50(results: dict[str, Any], system: str, cell: str) -> float:
    return float(_cell(results, system, cell).get("latency_ms", {}).get("p50", 0.0))


def goals(results: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(goal, target, measured, met) for issue 18's goals, from one run."""
    rows = []
    peer32 = _img_s(results, "infinity", "b32xc4")
    for system, target in (("gateway-cpu-int8", 1.8), ("gateway-cpu", 1.0)):
        if system not in results["systems"]:  # a run of some systems only
            continue
        ours = _img_s(results, system, "b32xc4")
        ratio = ours / peer32 if peer32 else 0.0
        rows.append((f"{LABELS[system]}: batch 32 x 4 img/s vs Infinity's", f"≥ {target}×",
                     f"{ratio:.2f}× ({ours:.1f} vs {peer32:.1f})", ratio >= target))  # fmt: skip
    best = max(_profiles(results), key=lambda s: _img_s(results, s, "b32xc4"), default=None)
    if best is not None and len(_profiles(results)) > 2:  # issue 25's: the best quantized one
        ours = _img_s(results, best, "b32xc4")
        ratio = ours / peer32 if peer32 else 0.0
        rows.append((f"best CPU profile ({label(results, best)}): batch 32 x 4 img/s vs Infinity's",
                     "≥ 5×", f"{ratio:.2f}× ({ours:.1f} vs {peer32:.1f})", ratio >= 5))  # fmt: skip
    if AUTO in results["systems"]:  # issue 33's goals: the default is the best, and fast
        rows += _default_goals(results, best, peer32)
    peer1 = _p50(results, "infinity", "b1xc1")
    if "gateway-cpu-int8" in results["systems"]:
        ours1 = _p50(results, "gateway-cpu-int8", "b1xc1")
        ratio = ours1 / peer1 if peer1 else 0.0
        rows.append(("gateway cpu-int8: single-image p50 vs Infinity's", "≤ 0.6×",
                     f"{ratio:.2f}× ({ours1:.1f} vs {peer1:.1f} ms)",
                     0 < ratio <= 0.6))  # fmt: skip
    alone = results["model_alone"]["int8"]["batch32_img_s"]
    ceiling = results["ceilings"]["int8_gops"]
    share = alone * results["gop_per_image"] / ceiling if ceiling else 0.0
    rows.append(("INT8 model alone (ORT, batch 32) vs the INT8 GEMM ceiling", "≥ 0.5×",
                 f"{share:.2f}× ({alone:.1f} img/s x {results['gop_per_image']:.2f} GOP "
                 f"of {ceiling:.0f} GOP/s)", share >= 0.5))  # fmt: skip
    return rows


def _default_goals(
    results: dict[str, Any], best: str | None, peer32: float
) -> list[tuple[str, str, str, bool]]:
    name = label(results, AUTO)
    ours = _img_s(results, AUTO, "b32xc4")
    rows = []
    chosen = results["systems"][AUTO].get("profile_choice", {}).get("chosen")
    fixed = [s for s in results["systems"] if s.startswith(f"gateway-{chosen}@")]
    if fixed:  # issue 41's: the measured plan against every fixed one of the same profile
        top_plan = max(fixed, key=lambda s: _img_s(results, s, "b32xc4"))
        top = _img_s(results, top_plan, "b32xc4")
        of_best = ours / top if top else 0.0
        rows.append((f"{name}: batch 32 x 4 img/s vs the best fixed plan's "
                     f"({label(results, top_plan)})", "≥ 0.95×",
                     f"{of_best:.2f}× ({ours:.1f} vs {top:.1f})", of_best >= 0.95))  # fmt: skip
    if best is not None:
        top = _img_s(results, best, "b32xc4")
        of_best = ours / top if top else 0.0
        rows.append((f"{name}: batch 32 x 4 img/s vs the best profile's ({label(results, best)})",
                     "≥ 0.95×", f"{of_best:.2f}× ({ours:.1f} vs {top:.1f})",
                     of_best >= 0.95))  # fmt: skip
    of_peer = ours / peer32 if peer32 else 0.0
    peer1, ours1 = _p50(results, "infinity", "b1xc1"), _p50(results, AUTO, "b1xc1")
    latency = ours1 / peer1 if peer1 else 0.0
    return [
        *rows,
        (f"{name}: batch 32 x 4 img/s vs Infinity's", "≥ 5×",
         f"{of_peer:.2f}× ({ours:.1f} vs {peer32:.1f})", of_peer >= 5),
        (f"{name}: single-image p50 vs Infinity's", "≤ 0.35×",
         f"{latency:.2f}× ({ours1:.1f} vs {peer1:.1f} ms)", 0 < latency <= 0.35),
    ]  # fmt: skip


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# Peers: Infinity vs the gateway's CPU profiles",
        "",
        f"Machine: {m['cpu_model']}, nproc {m['nproc']}; load average at the start "
        f"{', '.join(f'{v:.2f}' for v in m['load_avg'])}. Command: `{results['command']}`.",
        f"Each cell: at most {results['limits']['requests']} requests and "
        f"{results['limits']['seconds']:g} s after {results['limits']['warmup']} warm-up "
        "requests, compact JPEGs, loopback.",
        "",
        "| goal | target | measured | met |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {g} | {t} | {v} | {'yes' if ok else 'no'} |" for g, t, v, ok in goals(results)]
    c, gop = results["ceilings"], results["gop_per_image"]
    fp32, int8 = results["model_alone"]["fp32"], results["model_alone"]["int8"]
    lines += [
        "",
        f"Ceilings ({c['n']}² GEMM, {c['threads']} threads, ONNX Runtime; load "
        f"{results['ceilings_before']['load_1m']}): FP32 {c['fp32_gflops']:.0f} GFLOP/s, INT8 "
        f"{c['int8_gops']:.0f} GOP/s, i.e. at most {c['fp32_gflops'] / gop:.0f} and "
        f"{c['int8_gops'] / gop:.0f} img/s of ViT-B/32 ({gop:.2f} GOP per image). "
        "Model alone (ORT session, 2 threads): "
        f"FP32 {fp32['batch32_img_s']} img/s at batch 32, {fp32['batch1_ms']} ms at batch 1; "
        f"INT8 {int8['batch32_img_s']} img/s, {int8['batch1_ms']} ms.",
        "",
        "| system | load before | " + " | ".join(_cells(results)) + " |",
        "| --- | --- | " + " | ".join("---" for _ in _cells(results)) + " |",
    ]
    for system, measured in results["systems"].items():
        row = [label(results, system), f"{measured['before']['load_1m']}"]
        for cell in _cells(results):
            found = measured["cells"].get(cell, {})
            latency = found.get("latency_ms", {})
            row.append(f"{found.get('images_per_s', 0):.1f} img/s, p50 {latency.get('p50', 0):.0f}"
                       f" / p95 {latency.get('p95', 0):.0f} ms")  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Cells: bBATCH x cCONCURRENT CLIENTS; img/s, then request latency."]
    planned = results["systems"].get(AUTO, {}).get("core_plan")
    if planned:
        measured = "; ".join(f"{p}: {f['images_per_s']:g} img/s at batch 32 x 4, single image "
                             f"p50 {f['single_p50_ms']:g} ms"
                             for p, f in planned.get("measured", {}).items())  # fmt: skip
        lines += ["", f"The default's core plan: {planned['instances']} instance(s) x "
                  f"{planned['threads']} thread(s) per tower ({planned['by']}; "
                  f"{planned.get('rule', '')}), from what it timed through Triton: "
                  f"{measured or 'nothing'} ({planned.get('measured_s', 0):g} s)."]  # fmt: skip
    chose = results["systems"].get(AUTO, {}).get("profile_choice")
    if chose:
        figures = ", ".join(f"{p} {v:g}" for p, v in chose.get("images_per_s", {}).items())
        refused = "; ".join(f"{p}: {why}" for p, why in chose.get("refused", {}).items())
        lines += ["", f"The default (`auto`) chose {chose['chosen']} ({chose['by']}) from what it "
                  f"timed at its first start through Triton, images/s: {figures or 'none'} "
                  f"({chose.get('measured_s', 0):g} s)" + (f"; refused: {refused}" if refused
                                                           else "") + "."]  # fmt: skip
    return "\n".join(lines) + "\n"


def _cells(results: dict[str, Any]) -> list[str]:
    first: dict[str, Any] = next(iter(results["systems"].values()), {"cells": {}})
    return list(first["cells"])


def plot(results: dict[str, Any], path: Path) -> None:
    cells = _cells(results)
    systems = list(results["systems"])
    with figure(path, ncols=2, figsize=(12, 4.5)) as (fig, (rate, latency)):
        width = 0.8 / max(1, len(systems))
        for i, system in enumerate(systems):
            xs = [j + i * width for j in range(len(cells))]
            rate.bar(xs, [_img_s(results, system, c) for c in cells], width,
                     label=label(results, system))  # fmt: skip
            latency.bar(xs, [_p50(results, system, c) for c in cells], width,
                        label=label(results, system))  # fmt: skip
        for axis, title in ((rate, "images / s"), (latency, "p50 latency (ms, log)")):
            axis.set_xticks([j + 0.4 - width / 2 for j in range(len(cells))], cells)
            axis.set_title(title)
        latency.set_yscale("log")
        rate.legend()
        machine = results["machine"]
        fig.suptitle(f"ViT-B/32 on {machine['cpu_model']} ({machine['nproc']} CPUs), compact JPEGs")


def write(results: dict[str, Any], out_dir: Path) -> None:
    write_results(out_dir, "peers", results, markdown=markdown(results), plot=plot)
