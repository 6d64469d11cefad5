"""Issue 65's abort, reproduced on purpose (opt-in: FLAXLM_STRESS=1, a few minutes on two cores): run_clm_flax.py's
training with an evaluation every step, the host's main thread alone on core 0 and every other thread of the
process (XLA's) on core 1 beside three busy loops, so the host outpaces the 8 simulated devices. Before the fix
(docs/developers.md#the-test-suite) XLA aborted the process in the first evaluations: "Termination timeout for
`all reduce ...`: only 7 of them arrived on time"."""
import os
import subprocess
import sys
import threading
import time

import pytest

import run_clm_flax
import run_helpers

pytestmark = pytest.mark.skipif(not os.environ.get("FLAXLM_STRESS") or len(os.sched_getaffinity(0)) < 2,
                                reason="a stress test: FLAXLM_STRESS=1 on a machine of 2 cores or more")


def pin(threads_core, main_core, stop):
    """Every thread of this process but the main one to `threads_core`, the main one to `main_core`, until `stop`
    (XLA starts its threads lazily: again and again); then every thread back on all the cores it had."""
    everywhere = os.sched_getaffinity(0)
    main = threading.main_thread().native_id
    while True:
        done = stop.is_set()
        for tid in map(int, os.listdir("/proc/self/task")):
            try:
                os.sched_setaffinity(tid, everywhere if done else {main_core} if tid == main else {threads_core})
            except OSError:  # a thread that ended meanwhile
                pass
        if done:
            return
        time.sleep(0.2)


def test_evaluation_outpaced_by_the_host_completes(tiny_gpt2_dir, corpus, tmp_path):
    busy = [subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    stop = threading.Event()
    pinning = threading.Thread(target=pin, args=(1, 0, stop))
    pinning.start()
    try:
        for i in range(3):
            run_clm_flax.main(run_helpers.run_args(tiny_gpt2_dir, corpus, tmp_path / f"run{i}", "--block_size", "32",
                                                   "--max_steps", "4", "--do_train", "--do_eval", "--eval_steps", "1"))
    finally:
        stop.set()
        pinning.join()
        for process in busy:
            process.kill()
    assert (tmp_path / "run2" / "metrics.jsonl").read_text().count('"split": "eval"') == 4
