"""``python -m bench cost``'s Markdown table and plot (bench/studies/cost.py measures)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.harness.output import figure

LABELS = {
    "compact": "compact JPEGs (256 px short side)",
    "uploads": "the client's uploads until now (224 px short side, 4:4:4)",
    "squares": "the client's uploads now (the 224 px centre square, 4:4:4)",
    "camera": "8-24 MP photos (half progressive)",
}


def markdown(results: dict[str, Any]) -> str:
    machine, imaging = results["machine"], results["imaging"]
    lines = [
        "# Gateway CPU cost per image (null model)",
        "",
        f"Machine: {machine.get('cpu')}, {machine.get('cores')} cores, shared with other work "
        "while measuring (hence CPU-seconds and ratios, not images/s). Image path: "
        f"resize {imaging['resize']}; decode {imaging['decode']}.",
        "",
        "Images per CPU-second: the gateway's serving process (its own /proc CPU accounting, "
        "one decode thread per worker), and in the same run, on the same files, one thread "
        "of this process doing decode-only (libjpeg-turbo at the gateway's DCT scale, every "
        "scan; timed right before and after each phase, the ratio to their mean) and the "
        "gateway's `preprocess()` alone (timed once, at the start). Images/s (wall clock) are "
        "in cost.json for reference only: other work shared the cores.",
        "",
        "| images | workers | batch x concurrency | requests ok | gateway img/CPU-s "
        "| decode-only img/CPU-s (before / after) | preprocess() img/CPU-s "
        "| gateway / decode-only | gateway CPU ÷ decode-only's |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in results["phases"]:
        local = results["local"][row["dataset"]]
        before, after = row["decode_only_bracket"]
        ratio = row["decode_only_ratio"]
        lines.append(
            f"| {LABELS[row['dataset']]} | {row['workers']} "
            f"| {row['batch']} x {row['concurrency']} | {row['ok']}/{row['requests']} "
            f"| {row['images_per_cpu_s']} | {before} / {after} | {local['preprocess']} "
            f"| {ratio} | {f'{1 / ratio:.2f}×' if ratio else '-'} |"
        )
    splits = [row["cpu_us_per_image_by_thread"] for row in results["phases"]]
    roles = sorted({role for split in splits for role in split})
    lines += [
        "",
        "## CPU per image by thread (µs; /proc/<pid>/task, the same phases)",
        "",
        "| images | workers | batch | " + " | ".join(roles) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in roles) + " |",
    ]
    for row in results["phases"]:
        split = row["cpu_us_per_image_by_thread"]
        lines.append(
            f"| {row['dataset']} | {row['workers']} | {row['batch']} | "
            + " | ".join(str(split.get(role, 0.0)) for role in roles)
            + " |"
        )
    uploads = results.get("uploads") or {}
    if uploads:
        lines += [
            "",
            "## What the client uploads (the camera photos above, one thread of this process)",
            "",
            "Pixels after the gateway's preprocessing against open_clip's own transform of the "
            "original (Pillow's full decode, EXIF orientation, Resize + CenterCrop, bicubic), "
            "in levels of 255.",
            "",
            "| sent | bytes (mean) | mean abs error | rms error | preprocess() img/CPU-s |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {name} | {row['bytes_mean']} | {row['mean_abs_error']} | {row['rms_error']} "
            f"| {row['preprocess']} |"
            for name, row in uploads.items()
        ]
    for key, dataset in (
        ("profile", "compact"),
        ("profile_uploads", "uploads"),
        ("profile_squares", "squares"),
    ):
        profile = results.get(key) or {}
        if "stages" not in profile:
            continue
        lines += [
            "",
            f"## Where the serving process's CPU goes ({LABELS[dataset]}, batch 32 x 4; "
            f"py-spy, {profile['samples']} samples of every running thread)",
            "",
            "| stage | share |",
            "| --- | --- |",
        ]
        lines += [f"| {name} | {share} % |" for name, share in profile["stages"].items()]
        lines += ["", f"Functions: `{profile['file']}`."]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], target: Path) -> None:
    rows = results["phases"]
    labels = [f"{row['dataset']}\nbatch {row['batch']}\n{row['workers']} worker(s)" for row in rows]
    series = {
        "gateway (serving process)": [row["images_per_cpu_s"] or 0 for row in rows],
        "decode-only": [sum(row["decode_only_bracket"]) / 2 for row in rows],
        "preprocess() alone": [results["local"][row["dataset"]]["preprocess"] for row in rows],
    }
    with figure(target, figsize=(8, 5)) as (_, ax):
        width = 0.8 / len(series)
        for i, (name, values) in enumerate(series.items()):
            ax.bar([x + i * width for x in range(len(rows))], values, width, label=name)
        ax.set_xticks([x + width for x in range(len(rows))], labels)
        ax.set_ylabel("images per CPU-second")
        ax.set_yscale("log")
        ax.set_title(f"Gateway CPU cost per image, null model ({results['imaging']['resize']})")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, frameon=False)
