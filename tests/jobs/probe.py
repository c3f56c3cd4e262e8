"""A stand-in for training code in integration tests: shows what nomadtf handed it.

Context keys: "sleep" (seconds, -1 = forever), "until_file" (wait until that path exists),
"raise" (raise an error), "raise_in_roles" (["evaluator"]: only those roles raise,
RuntimeError), "exit" (exit code), "checkpoint_step" (write a TensorFlow-style
`checkpoint` index naming that step into the model dir), "sleep_by_index" ({"1": 5}: that
task index sleeps this long instead), "report_sigterm" (print the time a SIGTERM arrives,
then exit 0, as code that saves a checkpoint on SIGTERM would), "allocate_mb" (hold that
many MiB, touched, 32 MiB at a time: past the task's memory limit the kernel kills it),
"report_step" (report that training step through nomadtf.progress, arming hang detection),
"done" (then call nomadtf.progress.done(): the sleep after it is no hang).
"""

import hashlib
import json
import os
import signal
import sys
import time

context = json.loads(os.environ["NOMADTF_CONTEXT"])
if context.get("report_sigterm"):
    def _on_sigterm(_signum, _frame):
        print(f"probe got SIGTERM at {time.time():.3f}", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, _on_sigterm)
print("TF_CONFIG=" + os.environ["TF_CONFIG"], flush=True)
print(f"role={os.environ['NOMADTF_ROLE']} index={os.environ['NOMADTF_INDEX']} job={os.environ['NOMADTF_JOB_ID']}", flush=True)
print("context=" + json.dumps(context, sort_keys=True), flush=True)
print("model_dir=" + os.environ["NOMADTF_MODEL_DIR"], flush=True)
print("vault_token_visible=" + str("VAULT_TOKEN" in os.environ), flush=True)
print("vault_token_file=" + str(os.path.exists(os.path.join(os.environ.get("NOMAD_SECRETS_DIR", "/secrets"), "vault_token"))), flush=True)
print("vault_approle_file=" + str(os.path.exists(os.path.join(os.environ.get("NOMAD_SECRETS_DIR", "/secrets"), "vault_approle"))), flush=True)
try:
    with open("/proc/1/environ", "rb") as _fh:
        print("pid1_vault_token=" + str(b"VAULT_TOKEN=" in _fh.read()), flush=True)
except OSError as _exc:
    print(f"pid1_vault_token=unreadable ({_exc.__class__.__name__})", flush=True)
print(f"uid={os.getuid()} gid={os.getgid()}", flush=True)
try:
    with open(f"/proc/{os.getppid()}/environ", "rb") as _fh:
        print("supervisor_environ=readable", flush=True)
except OSError as _exc:
    print(f"supervisor_environ=unreadable ({_exc.__class__.__name__})", flush=True)
for _path in context.get("try_read", []):  # another team's files, folders, process environments
    _path = os.path.expandvars(_path)
    try:
        if os.path.isdir(_path):
            os.listdir(_path)
        else:
            with open(_path, "rb") as _fh:
                _fh.read(1)
        print(f"try_read {_path}=allowed", flush=True)
    except OSError as _exc:
        print(f"try_read {_path}=denied ({_exc.__class__.__name__})", flush=True)
for name in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "TF_FORCE_GPU_ALLOW_GROWTH"):
    print(f"env {name}={os.environ.get(name, '<unset>')}", flush=True)
if "PROBE_SECRET" in os.environ:
    print("secret_env_sha256=" + hashlib.sha256(os.environ["PROBE_SECRET"].encode()).hexdigest(), flush=True)
secret_file = os.path.join(os.environ.get("NOMAD_SECRETS_DIR", "."), "probe.key")
if os.path.exists(secret_file):
    mode = oct(os.stat(secret_file).st_mode & 0o777)
    digest = hashlib.sha256(open(secret_file).read().encode()).hexdigest()
    print(f"secret_file_sha256={digest} mode={mode}", flush=True)
if "checkpoint_step" in context:
    os.makedirs(os.environ["NOMADTF_MODEL_DIR"], exist_ok=True)
    with open(os.path.join(os.environ["NOMADTF_MODEL_DIR"], "checkpoint"), "w") as f:
        f.write(f'model_checkpoint_path: "ckpt-{context["checkpoint_step"]}"\n')
if context.get("raise"):
    raise ValueError("boom from user code")
if os.environ["NOMADTF_ROLE"] in context.get("raise_in_roles", []):
    raise RuntimeError(f"{os.environ['NOMADTF_ROLE']} cannot start: boom from side-role code")
held = []
for _ in range(context.get("allocate_mb", 0) // 32):
    held.append(bytearray(32 * 2**20))  # zero-filled: every page is touched
    time.sleep(0.02)
if held:
    print(f"probe holds {len(held) * 32} MiB", flush=True)
if "report_step" in context:
    from nomadtf import progress

    progress.report(step=context["report_step"])
    if context.get("done"):
        progress.done()
    print(f"probe reported step {context['report_step']}{' and done' if context.get('done') else ''}", flush=True)
while context.get("until_file") and not os.path.exists(context["until_file"]):
    time.sleep(0.2)
sleep = context.get("sleep", 0)
sleep = context.get("sleep_by_index", {}).get(os.environ["NOMADTF_INDEX"], sleep)
if sleep < 0:
    while True:
        time.sleep(1)
time.sleep(sleep)
print("probe finished", flush=True)
sys.exit(context.get("exit", 0))
