"""The harness's CPU accounting (bench/harness/cpu.py: a process tree's CPU seconds) and the
profile's stages (bench/harness/profiling.py), which ``python -m bench cost`` reads."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bench.harness import cpu, profiling


def test_cpu_seconds_counts_the_children_of_the_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        while (theirs := cpu.cpu_seconds(child.pid)) < 0.3:  # part of its loop is done
            time.sleep(0.01)
        own = time.process_time()  # this process alone, children excluded
        # 0.05 s: two counts rounded to clock ticks
        assert cpu.cpu_seconds(os.getpid()) + 0.05 >= own + theirs
    finally:
        child.kill()
        child.wait()


def test_a_rate_timed_for_some_cpu_seconds_runs_whole_passes_until_they_are_spent() -> None:
    calls: list[bytes] = []

    def work(data: bytes) -> None:
        calls.append(data)
        sum(range(2000))  # some CPU time

    images = [b"a", b"b", b"c"]
    started = time.thread_time()
    rate = cpu.per_cpu_second_for(work, images, 0.05)
    assert time.thread_time() - started >= 0.05
    timed = calls[2:]  # after the two warm-up calls
    assert len(timed) % len(images) == 0 and timed[:3] == images
    assert 0 < rate < len(timed) / 0.05 * 1.001


def test_each_sample_goes_to_the_innermost_stage_it_names() -> None:
    root = "run (/x/threading.py:1)"
    decode = "_decode (/w/clip_gateway/imaging/jpeg.py:321)"
    walk = "walk (/w/clip_gateway/imaging/jpeg.py:118)"
    pre = "preprocess (/w/clip_gateway/imaging/preprocess.py:120)"
    assert profiling.stage([root, pre, walk, decode]) == "JPEG decode (libjpeg-turbo)"
    assert profiling.stage([root, pre, walk]) == "JPEG header walk"
    assert profiling.stage([root, pre]) == "preprocess: the rest (copy into the batch)"
    assert profiling.stage([root]) == "event loop + threads"
    assert profiling.stage(["main (/x/app.py:1)"]) == "other"
