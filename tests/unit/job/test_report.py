"""The failure report and the side-role warning (nomadtf/job/report.py), from real stderr."""

from __future__ import annotations

from nomadtf.job import report
from nomadtf.job.answers import Allocation
from nomadtf.job.report import (
    FailedTask,
    failing_alloc,
    failure_text,
    is_noise,
    meaningful_lines,
    side_role_warning,
)

# A TensorFlow 2.20 process on the dev stack whose code raised: absl's and oneDNN's notices
# (twice: TensorFlow initialises again in a dataset), then the traceback.
TF_CHILD_STDERR = """\
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1796345248.550720   25083 port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results due to floating-point round-off errors from different computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.
I0000 00:00:1796345248.668829   25083 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use available CPU instructions in performance-critical operations.
To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 AVX512_FP16 AVX_VNNI AMX_TILE AMX_INT8 AMX_BF16 FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1796345250.670724   25083 port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results due to floating-point round-off errors from different computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.
Traceback (most recent call last):
  File "<string>", line 7, in <module>
  File "<string>", line 6, in f
RuntimeError: evaluator could not open its checkpoint
"""

# An evaluator task's whole stderr from tests/stack/test_side_roles.py: nomadtf's log, the code's
# traceback under the warm start's bootstrap, one restart in place, then Nomad's restart.
EVALUATOR_STDERR = """\
00:51:20.325 nomadtf task evaluator: job side-9dceec (namespace default), alloc 7cab1635, multi_worker_mirrored strategy
00:51:20.325 nomadtf task evaluator: GPUs: none requested; CUDA_VISIBLE_DEVICES is empty for our code
00:51:20.338 nomadtf task evaluator: holding evaluator[0] (alloc 7cab1635, incarnation d934b8e574d1)
00:51:20.344 nomadtf task evaluator: child started ahead of the cluster (pid 28852): interpreter load while we wait
00:51:20.346 nomadtf task evaluator: waiting for worker[0]
00:51:20.548 nomadtf task evaluator: cluster complete after 0.2s: evaluator[0]=127.0.0.1:21104, worker[0]=127.0.0.1:23942
00:51:20.548 nomadtf task evaluator: generation 2: starting -u probe.py with TF_CONFIG {"cluster":{"worker":["127.0.0.1:23942"]},"task":{"index":0,"type":"evaluator"}}
00:51:20.548 nomadtf task evaluator: handed the cluster to the child started 0.2s ago (pid 28852)
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "<frozen runpy>", line 88, in _run_code
  File "/work/main/nomadtf/usercode/warmstart.py", line 108, in <module>
    main(sys.argv[1:])
  File "/work/main/nomadtf/usercode/warmstart.py", line 104, in main
    run(command)
  File "/work/main/nomadtf/usercode/warmstart.py", line 71, in run
    _run_script(os.path.abspath(command[0]))
  File "/work/main/nomadtf/usercode/warmstart.py", line 83, in _run_script
    exec(code, main.__dict__)
  File "/work/main/tests/jobs/probe.py", line 46, in <module>
    raise RuntimeError(f"{os.environ['NOMADTF_ROLE']} cannot start: boom from side-role code")
RuntimeError: evaluator cannot start: boom from side-role code
00:51:20.560 nomadtf task evaluator: recovering: crashed (exit 1)
00:51:20.564 nomadtf task evaluator: child started ahead of the cluster (pid 28872): interpreter load while we wait
00:51:20.565 nomadtf task evaluator: cluster complete after 0.0s: evaluator[0]=127.0.0.1:21104, worker[0]=127.0.0.1:23942
00:51:20.567 nomadtf task evaluator: generation 3: starting -u probe.py with TF_CONFIG {"cluster":{"worker":["127.0.0.1:23942"]},"task":{"index":0,"type":"evaluator"}}
00:51:20.567 nomadtf task evaluator: handed the cluster to the child started 0.0s ago (pid 28872)
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "<frozen runpy>", line 88, in _run_code
  File "/work/main/nomadtf/usercode/warmstart.py", line 108, in <module>
    main(sys.argv[1:])
  File "/work/main/nomadtf/usercode/warmstart.py", line 104, in main
    run(command)
  File "/work/main/nomadtf/usercode/warmstart.py", line 71, in run
    _run_script(os.path.abspath(command[0]))
  File "/work/main/nomadtf/usercode/warmstart.py", line 83, in _run_script
    exec(code, main.__dict__)
  File "/work/main/tests/jobs/probe.py", line 46, in <module>
    raise RuntimeError(f"{os.environ['NOMADTF_ROLE']} cannot start: boom from side-role code")
RuntimeError: evaluator cannot start: boom from side-role code
00:51:20.599 nomadtf task evaluator: giving up after 1 recoveries in 300s (crashed (exit 1))
00:51:22.289 nomadtf task evaluator: job side-9dceec (namespace default), alloc 7cab1635, multi_worker_mirrored strategy
00:51:22.289 nomadtf task evaluator: GPUs: none requested; CUDA_VISIBLE_DEVICES is empty for our code
00:51:22.292 nomadtf task evaluator: the restart budget of this allocation is spent (1 in 300s); not starting our code again
"""

# The older log format (TensorFlow 2.15 with CUDA libraries on a CPU-only node), and the
# chief's `kernel_and_device.cc` notices the report was full of.
OLD_FORMAT_NOISE = """\
2024-01-15 10:23:41.806302: E external/local_xla/xla/stream_executor/cuda/cuda_dnn.cc:9261] Unable to register cuDNN factory: Attempting to register factory for plugin cuDNN when one has already been registered
2024-01-15 10:23:41.806357: E external/local_xla/xla/stream_executor/cuda/cuda_fft.cc:607] Unable to register cuFFT factory: Attempting to register factory for plugin cuFFT when one has already been registered
2024-01-15 10:23:41.807528: E external/local_xla/xla/stream_executor/cuda/cuda_blas.cc:1515] Unable to register cuBLAS factory: Attempting to register factory for plugin cuBLAS when one has already been registered
2024-01-15 10:23:41.813745: I external/local_tsl/tsl/cuda/cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
2024-01-15 10:23:42.645871: W tensorflow/compiler/tf2tensorrt/utils/py_utils.cc:38] TF-TRT Warning: Could not find TensorRT
2024-01-15 10:23:43.792184: E external/local_xla/xla/stream_executor/cuda/cuda_driver.cc:274] failed call to cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected
2024-01-15 10:23:44.120955: I tensorflow/core/common_runtime/eager/kernel_and_device.cc:94] Ignoring error status after op completion
2024-01-15 10:23:44.121004: W tensorflow/core/kernels/data/cache_dataset_ops.cc:858] The calling iterator did not fully read the dataset being cached.
W0000 00:00:1796345260.112233   25101 gpu_device.cc:2344] Cannot dlopen some GPU libraries. Please make sure the missing libraries mentioned above are installed properly if you would like to use GPU.
WARNING:tensorflow:From /usr/lib/python3/dist-packages/keras/src/backend.py:873: The name tf.get_default_graph is deprecated. Please use tf.compat.v1.get_default_graph instead.
"""


def test_tensorflows_notices_are_noise_and_nomadtfs_and_pythons_lines_are_not():
    assert all(is_noise(line) for line in OLD_FORMAT_NOISE.splitlines())
    for line in TF_CHILD_STDERR.splitlines():
        assert is_noise(line) is not line.startswith(("Traceback", "  File", "RuntimeError")), line
    assert not any(is_noise(line) for line in EVALUATOR_STDERR.splitlines())
    assert not is_noise("/usr/bin/python3: can't open file '/srv/code/probe.py': [Errno 2] No such file or directory")
    # An error TensorFlow logs about the failure itself is kept.
    assert not is_noise("E0000 00:00:1796345262.000000   25101 master_session.cc:1234] Invalid argument: Expected shape [32,10]")


def test_the_report_keeps_the_traceback_without_tensorflows_notices():
    assert meaningful_lines(OLD_FORMAT_NOISE + TF_CHILD_STDERR) == [
        "Traceback (most recent call last):",
        '  File "<string>", line 7, in <module>',
        '  File "<string>", line 6, in f',
        "RuntimeError: evaluator could not open its checkpoint",
    ]


def test_the_last_traceback_keeps_the_users_frames_and_what_followed_it():
    assert meaningful_lines(EVALUATOR_STDERR) == [
        "Traceback (most recent call last):",
        '  File "/work/main/tests/jobs/probe.py", line 46, in <module>',
        """    raise RuntimeError(f"{os.environ['NOMADTF_ROLE']} cannot start: boom from side-role code")""",
        "RuntimeError: evaluator cannot start: boom from side-role code",
        "00:51:20.599 nomadtf task evaluator: giving up after 1 recoveries in 300s (crashed (exit 1))",
        "00:51:22.289 nomadtf task evaluator: job side-9dceec (namespace default), alloc 7cab1635, multi_worker_mirrored strategy",
        "00:51:22.289 nomadtf task evaluator: GPUs: none requested; CUDA_VISIBLE_DEVICES is empty for our code",
        "00:51:22.292 nomadtf task evaluator: the restart budget of this allocation is spent (1 in 300s); not starting our code again",
    ]


def test_without_a_traceback_the_last_meaningful_lines_are_kept():
    stderr = OLD_FORMAT_NOISE + "\n".join(f"line {n}" for n in range(30)) + "\n" + OLD_FORMAT_NOISE
    assert meaningful_lines(stderr, limit=5) == [f"line {n}" for n in range(25, 30)]
    assert meaningful_lines(OLD_FORMAT_NOISE) == []


def test_a_long_traceback_keeps_its_head_and_its_end_and_a_cut_first_line_goes():
    frames = [f'  File "/srv/model.py", line {n}, in step_{n}' for n in range(40)]
    stderr = "\n".join(["tail of an earlier line", "Traceback (most recent call last):", *frames, "ValueError: shapes differ"])
    lines = meaningful_lines(stderr, limit=8)
    assert lines[:2] == ["Traceback (most recent call last):", "  ..."]
    assert lines[-1] == "ValueError: shapes differ" and len(lines) == 8
    assert meaningful_lines("partial li\nRuntimeError: x\n", cut=True) == ["RuntimeError: x"]


def _alloc_json(name: str, status: str, create: int, code: int | None = None) -> dict:
    events = [{"Type": "Started", "Time": create}]
    if code is not None:
        events.append({"Type": "Terminated", "Time": create + 1, "ExitCode": code, "DisplayMessage": f"Exit Code: {code}"})
    role = name.split("[")[0]
    return {"ID": f"{create:08d}-aaaa", "Name": f"digits.{name}", "TaskGroup": role, "ClientStatus": status,
            "CreateIndex": create, "TaskStates": {role: {"Events": events}}}


def _alloc(name: str, status: str, create: int, code: int | None = None) -> Allocation:
    return Allocation.from_api(_alloc_json(name, status, create, code))


CHIEF = _alloc("chief[0]", "running", 10)
WORKER = _alloc("worker[1]", "failed", 11, code=1)
EVALUATOR = _alloc("evaluator[0]", "failed", 30, code=1)


def test_the_failing_task_is_the_one_the_record_names_even_while_it_still_runs():
    allocs = [CHIEF, WORKER, EVALUATOR]
    assert failing_alloc(allocs, "failed: chief[0] exited 3, a permanent exit code") is CHIEF


def test_without_a_record_the_newest_failed_training_task_never_a_side_role():
    older = _alloc("worker[1]", "failed", 5, code=2)
    assert failing_alloc([older, CHIEF, WORKER, EVALUATOR], None) is WORKER
    assert failing_alloc([CHIEF, EVALUATOR], "succeeded") is CHIEF  # the deciding task, last
    assert failing_alloc([EVALUATOR], None) is None


def test_the_exit_code_is_the_last_termination():
    alloc = _alloc_json("chief[0]", "failed", 10, code=137)
    alloc["TaskStates"]["chief"]["Events"].append({"Type": "Terminated", "Time": 99, "ExitCode": 3})
    assert report.exit_code_of(Allocation.from_api(alloc)) == 3
    assert report.exit_code_of(CHIEF) is None


def test_the_failure_text_names_the_task_its_exit_its_traceback_and_what_to_do():
    alloc = _alloc_json("evaluator[0]", "failed", 30, code=1)
    alloc["Name"], alloc["TaskGroup"] = "digits.chief[0]", "chief"
    alloc = Allocation.from_api(alloc)
    text = failure_text("digits", "chief[0] exited 1, a permanent exit code",
                        FailedTask.of(alloc, OLD_FORMAT_NOISE + TF_CHILD_STDERR, ["Terminated: Exit Code: 1 (exit 1)"]))
    lines = text.splitlines()
    assert lines[0] == "job digits failed: chief[0] exited 1, a permanent exit code"
    assert lines[1] == "failing task: chief[0] (allocation 00000030, failed, exit 1)"
    assert "    Terminated: Exit Code: 1 (exit 1)" in lines
    assert "  chief[0] stderr (traceback, TensorFlow's notices left out):" in lines
    assert "    RuntimeError: evaluator could not open its checkpoint" in lines
    assert lines[-1].startswith("what to do: ") and "nomadtf logs digits --role chief --index 0 --stderr" in lines[-1]
    for noise in ("kernel_and_device", "oneDNN", "cuda", "TensorRT", "To enable the following"):
        assert noise not in text, noise


def test_a_task_with_only_notices_on_stderr_says_so():
    text = failure_text("digits", "", FailedTask.of(CHIEF, OLD_FORMAT_NOISE))
    assert text.splitlines()[0] == "job digits failed"
    assert "chief[0] wrote nothing to stderr but TensorFlow's notices" in text
    assert "what to do:" in failure_text("digits", "every task ended", None)


def test_a_side_roles_warning_says_training_goes_on_with_its_traceback():
    lines = side_role_warning("evaluator", 0, 1, OLD_FORMAT_NOISE + EVALUATOR_STDERR)
    assert lines[0] == "evaluator[0] failed (exit 1); training goes on:"
    assert lines[1:5] == [f"    {line}" for line in meaningful_lines(EVALUATOR_STDERR)[:4]]
    assert not any("cuda" in line or "warmstart" in line for line in lines)
    assert side_role_warning("tensorboard", 0, None, "") == ["tensorboard[0] failed (no exit code); training goes on"]


def test_an_image_that_cannot_be_pulled_is_reported_on_its_task_with_the_image_s_fix_not_the_code_s():
    from nomadtf.job.outcome import PULL_FIX

    reason = f"worker[1]: driver.image nomadtf:no-such could not be pulled on client client-1: API error (404): not found; {PULL_FIX}"
    pending = _alloc("worker[1]", "pending", 40)
    assert failing_alloc([CHIEF, pending], None, reason) is pending  # the task the outcome names, never started
    text = failure_text("digits", reason, FailedTask.of(pending, "", ["Driver Failure: Failed to pull `nomadtf:no-such`: API error (404): not found"]))
    assert text.splitlines()[1] == "failing task: worker[1] (allocation 00000040, pending)"
    assert "wrote nothing to stderr" not in text
    assert text.splitlines()[-1] == (
        "what to do: make nomadtf:no-such pullable by every client (`nomadtf dev image build` on the local stack, "
        "`docker push` to your registry), or set driver.image in job.json (or --var driver.image=IMAGE) to one that is"
    )


def test_a_gpu_only_job_s_image_that_cannot_be_pulled_gets_the_image_s_fix_too():
    from nomadtf.job.outcome import PULL_FIX

    field = "driver.gpu_image (driver.image when gpu_image is not set)"  # outcome.image_field, every task with GPUs
    reason = f"worker[0]: {field} gpu:no-such could not be pulled on client client-3: manifest unknown; {PULL_FIX}"
    pending = _alloc("worker[0]", "pending", 41)
    text = failure_text("gpu", reason, FailedTask.of(pending, "", []))
    assert text.splitlines()[-1].startswith("what to do: make gpu:no-such pullable by every client")
    assert text.splitlines()[-1].endswith("or set driver.gpu_image in job.json (or --var driver.gpu_image=IMAGE) to one that is")
