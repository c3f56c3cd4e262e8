"""Training code that a preemption interrupts: steps of "step_s" seconds up to "steps"; it
resumes from the step saved in its model dir; the chief saves every "checkpoint_every" steps
and when nomadtf asks it to (nomadtf.progress.on_checkpoint_request), and reports progress.
Each start and each request it hears is appended to `<model dir>/log`, for the test to read
(each step too with "log_steps"). With "on_request": false it ignores the request, as code
written before nomadtf.progress had the helper would.
"""

import json
import os
import time

from nomadtf import progress

context = json.loads(os.environ["NOMADTF_CONTEXT"])
model_dir = os.environ["NOMADTF_MODEL_DIR"]
os.makedirs(model_dir, exist_ok=True)
saved = os.path.join(model_dir, "step")
role = os.environ["NOMADTF_ROLE"]
chief = role == "chief"


def log(line: str) -> None:
    with open(os.path.join(model_dir, "log"), "a") as fh:
        fh.write(f"{role} {line}\n")


start = int(open(saved).read()) if os.path.exists(saved) else 0
log(f"started at step {start}")
if context.get("on_request", True):
    progress.on_checkpoint_request(lambda: log("asked to checkpoint"))
step = start
while step < context["steps"]:
    time.sleep(context.get("step_s", 0.1))
    step += 1
    if not chief:
        continue
    progress.report(step=step)
    if context.get("log_steps"):
        log(f"step {step}")
    if step % context.get("checkpoint_every", 1000) == 0 or progress.checkpoint_requested():
        with open(saved + ".tmp", "w") as fh:
            fh.write(str(step))
        os.replace(saved + ".tmp", saved)
        progress.checkpointed(step)
        log(f"checkpoint at step {step}")
log("finished")
