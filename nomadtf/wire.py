"""Every name that crosses the wire, built in one place (documented in docs/design/names.md).

Consul services (registered by Nomad from each group's service block):
    <job>-<role>                     in Nomad's `default` namespace
    <namespace>--<job>-<role>        in any other namespace
    names longer than a DNS label (63) keep their head and end in a digest of the whole
    tags: nomadtf, role=<role>, alloc=<alloc id>, alloc_index=<n>

Consul KV, one prefix per namespace, job and run (`<run>/` is left out for a job rendered
without a run, e.g. by `nomadtf render`):
    nomadtf/<namespace>/<job>/<run>/cluster/slots/<role>/<i>   which allocation holds index i
    nomadtf/<namespace>/<job>/<run>/cluster/generation         {"generation": n, "fingerprint": ...}; 0 (no
                                                               fingerprint) while the cluster forms
    nomadtf/<namespace>/<job>/<run>/cluster/state              "succeeded" or "failed: <why>"
    nomadtf/<namespace>/<job>/<run>/cluster/counts             {"worker": n} after `nomadtf scale`
    nomadtf/<namespace>/<job>/<run>/cluster/done/<role>/<i>    success = all_workers: who finished
    nomadtf/<namespace>/<job>/<run>/progress                   {"step": n, "metrics": {...}}
    nomadtf/<namespace>/<job>/<run>/environment/<role>/<i>     job.json `environment`: {"state":
                                                               "waiting"|"building"|"ready"|"failed", ...};
                                                               then (any job) {"state": "started", "runs":
                                                               "<its child's Python and TensorFlow>"}
The admission controller's keys (`_` is never in a Nomad namespace's name, so no job's
prefix can reach them); only the controller's token writes them, submitters read them:
    nomadtf/_admission/leader     held (session, lock-delay) by the controller's leader; its name
    nomadtf/_admission/board      the queue as the leader publishes it: every waiting run by ticket
                                  (a digest of namespace/job/run), its place, needs and shortfall
    nomadtf/_admission/admitted/<namespace>/<job>   the run the controller admitted (its intent,
                                  written before its first admitting call); submitters cannot read it
The queue itself is in Nomad: runs registered suspended (nomadtf/admission/suspension.py).
Tasks watch only .../cluster/ (what decides); progress and environment live beside it, so
their writes wake nobody. A task of an older run that is still stopping can never touch the
current run's keys.

ACL objects of one job (`nomadtf acl apply`): Consul policy, Vault policy, Consul engine role
    nomadtf-<namespace>-<job>-<digest>   the digest (8 hex of sha256("<namespace>/<job>"))
                                         keeps `ml/team-x` and `ml-team/x` apart
    description / first line "nomadtf <namespace>/<job> tasks": whose the object is

Nomad job Meta: nomadtf.version, nomadtf.spec_sha256, nomadtf.strategy, nomadtf.run,
nomadtf.model_run (only on a run started with --resume); on a run registered suspended,
nomadtf.admission ("suspended"), nomadtf.counts, nomadtf.gang_timeout (suspension.py);
task Meta: nomadtf.role.
Environment of the training process: the ENV_* names below, plus the secrets' own names.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

DEFAULT_NAMESPACE = "default"
# Nomad's own rule for a namespace name (nomad/structs: validNamespaceName).
NAMESPACE_PATTERN = "^[a-zA-Z0-9-]{1,128}$"
ENV_NOMAD_NAMESPACE = "NOMAD_NAMESPACE"
DNS_LABEL_MAX = 63

# The Nomad host volumes a docker task mounts (declared by the operator in each client's
# config, gated by Nomad's `host_volume` ACL): one checkpoint folder per namespace, and the
# directory of the CA files the tasks trust, read-only.
CHECKPOINT_VOLUME_PREFIX = "nomadtf-"
CA_VOLUME = "nomadtf-ca"


def checkpoint_volume(namespace: str) -> str:
    """The host volume of `namespace`'s checkpoints: `nomadtf-<namespace>`."""
    return CHECKPOINT_VOLUME_PREFIX + namespace


# A task's Consul session (its slot lock) lapses this long after its last renewal.
TASK_SESSION_TTL_S = 15

SERVICE_TAG = "nomadtf"
TAG_ROLE = "role"
TAG_ALLOC = "alloc"

META_VERSION = "nomadtf.version"
META_SPEC_SHA256 = "nomadtf.spec_sha256"
META_STRATEGY = "nomadtf.strategy"
META_STEPS = "nomadtf.steps"  # context.steps, when a whole number: the queue's start estimates
META_DURATION = "nomadtf.duration"  # admission.duration in seconds: the queue's start estimates
META_ROLE = "nomadtf.role"
META_RUN = "nomadtf.run"
META_MODEL_RUN = "nomadtf.model_run"  # the run whose model_dir a resumed run continues
META_NOMAD_VERSION = "nomadtf.nomad_version"  # the Nomad the job was rendered for (target.py)
META_SERVICE = "nomadtf.service"  # nomadtf's own service jobs (the admission service): not runs

# Files Nomad writes into the task directory (templates) and nomadtf writes there itself.
SPEC_FILE = "nomadtf-spec.json"
CLUSTER_FILE = "nomadtf-cluster.json"
PROGRESS_FILE = "nomadtf-progress.json"
RECOVERIES_FILE = "nomadtf-recoveries.json"  # the allocation's spent restart budget (survives a task restart)

# What `nomadtf task` reads from the task's environment (set by the rendered job).
ENV_TASK_ROLE = "NOMADTF_ROLE"
ENV_SPEC_FILE = "NOMADTF_SPEC_FILE"
# How long a task retries a Consul or Vault it cannot reach before it fails (seconds; set
# in job.json `env`; tests use a few seconds).
ENV_SERVER_RETRY_S = "NOMADTF_SERVER_RETRY_S"
DEFAULT_SERVER_RETRY_S = 120.0

# What the training process is given.
ENV_TF_CONFIG = "TF_CONFIG"
ENV_ROLE = "NOMADTF_ROLE"
ENV_INDEX = "NOMADTF_INDEX"
ENV_JOB_ID = "NOMADTF_JOB_ID"
ENV_NAMESPACE = "NOMADTF_NAMESPACE"
ENV_RUN_ID = "NOMADTF_RUN_ID"
ENV_MODEL_DIR = "NOMADTF_MODEL_DIR"
ENV_CONTEXT = "NOMADTF_CONTEXT"
ENV_GENERATION = "NOMADTF_GENERATION"
ENV_PROGRESS_FILE = "NOMADTF_PROGRESS_FILE"
# The tf.data service (roles data_dispatcher, data_worker): the dispatcher's address,
# grpc://host:port, for `tf.data.experimental.service.distribute(service=...)` in the
# training code and for the data workers' registration.
ENV_DATA_SERVICE = "NOMADTF_DATA_SERVICE"
# The dispatcher's journal (fault-tolerant mode), under the run's model_dir: a restarted
# dispatcher reads back its workers and jobs from there.
DATA_SERVICE_DIR = "data_service"
# strategy "jax" (Keras 3 on JAX, instead of TF_CONFIG; jaxenv.py): what Keras 3's
# keras.distribution.initialize() reads (every process's address in process-id order; the
# first is JAX's coordinator), what jax.distributed.initialize() reads itself
# (JAX_COORDINATOR_ADDRESS; the count and id are ours, for code that passes them on), the
# backend, and JAX's CPU collectives (gloo: the default from jax 0.5, none before it).
ENV_KERAS_BACKEND = "KERAS_BACKEND"
ENV_KERAS_JOB_ADDRESSES = "KERAS_DISTRIBUTION_JOB_ADDRESSES"
ENV_KERAS_NUM_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"
ENV_KERAS_PROCESS_ID = "KERAS_DISTRIBUTION_PROCESS_ID"
ENV_JAX_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_JAX_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_JAX_PROCESS_ID = "JAX_PROCESS_ID"
ENV_JAX_CPU_COLLECTIVES = "JAX_CPU_COLLECTIVES_IMPLEMENTATION"
# GPUs: what Nomad's device plugin hands the task, what CUDA and TensorFlow read.
ENV_NVIDIA_VISIBLE = "NVIDIA_VISIBLE_DEVICES"
ENV_CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"
ENV_TF_GPU_GROWTH = "TF_FORCE_GPU_ALLOW_GROWTH"
ENV_GPU_MEMORY_LIMIT_MIB = "NOMADTF_GPU_MEMORY_LIMIT_MIB"

# A random mark per child start: how the supervisor tells the child's daemonised
# descendants (re-parented to it) from any other process it may have started.
ENV_CHILD_MARK = "NOMADTF_CHILD_MARK"

# AppRole credentials the supervisor logs in with (vault.auth = approle).
ENV_VAULT_ROLE_ID = "NOMADTF_VAULT_ROLE_ID"
ENV_VAULT_SECRET_ID = "NOMADTF_VAULT_SECRET_ID"
# vault.auth approle without the ids in the job's env: Nomad renders them from the job's own
# Nomad variable (which its workload identity may read) into this file of the task's secrets
# directory; the supervisor reads and removes it before any code starts.
APPROLE_FILE = "vault_approle"
APPROLE_ROLE_KEY = "vault_role_id"
APPROLE_SECRET_KEY = "vault_secret_id"


def approle_variable(job_id: str) -> str:
    """The job's Nomad variable that holds its AppRole ids (Nomad lets a job's tasks read
    nomad/jobs/<job> without any policy)."""
    return f"nomad/jobs/{job_id}"


# job.json `notify`: the URL (or its credentials) from the same Nomad variable, key
# NOTIFY_URL_KEY, rendered into this file of the secrets directory (runtime/notify.py).
NOTIFY_URL_KEY = "notify_url"
NOTIFY_FILE = "notify_url"

# A run's archive (runtime/archive.py; read back by client/archive.py): under the store's
# root, <root>/<job>/<run>/ARCHIVE_DIR/ holds OUTCOME_FILE and <role>-<index>/<attempt>.stdout|.stderr.
ARCHIVE_DIR = ".nomadtf-archive"
ARCHIVE_OUTCOME_FILE = "outcome.json"
ENV_ARCHIVE_ROOT = "NOMADTF_ARCHIVE"  # the client's store root, when not the default one

# The supervisor's credentials: never in the child's or an environment build's environment
# (unless the job asks, vault.token_for_code), never in the spec file.
CREDENTIAL_ENV = ("VAULT_TOKEN", "NOMAD_TOKEN", "CONSUL_HTTP_TOKEN", ENV_VAULT_ROLE_ID, ENV_VAULT_SECRET_ID)
# Never handed to user code: credentials of the supervisor, and its own plumbing.
CHILD_ENV_DROPPED = (*CREDENTIAL_ENV, ENV_SPEC_FILE)

STATE_SUCCEEDED = "succeeded"
STATE_FAILED = "failed"


def resolve_namespace(given: str | None, environ: Mapping[str, str]) -> str:
    """The one precedence rule of every command: what the job (job.json, `--namespace`)
    says, then NOMAD_NAMESPACE, then `default`."""
    return given or environ.get(ENV_NOMAD_NAMESPACE) or DEFAULT_NAMESPACE


def _label(text: str) -> str:
    """Fit a DNS label: long names keep their head and end in a digest of the whole."""
    if len(text) <= DNS_LABEL_MAX:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{text[: DNS_LABEL_MAX - 9].rstrip('-')}-{digest}"


def service_name(namespace: str, job_id: str, role: str) -> str:
    # Nomad takes only letters, digits and dashes in a service name (RFC 1123): data_worker
    # is registered as <job>-data-worker.
    role = role.replace("_", "-")
    base = f"{job_id}-{role}" if namespace == DEFAULT_NAMESPACE else f"{namespace}--{job_id}-{role}"
    return _label(base)


def service_tags(role: str) -> list[str]:
    # ${...} is interpolated by Nomad when it registers the service.
    return [SERVICE_TAG, f"{TAG_ROLE}={role}", f"{TAG_ALLOC}=${{NOMAD_ALLOC_ID}}", "alloc_index=${NOMAD_ALLOC_INDEX}"]


def parse_tags(tags: list[str]) -> dict[str, str]:
    return dict(t.split("=", 1) for t in tags if "=" in t)


# The cluster profile (profile.py): `_` cannot begin a Nomad namespace, so no job's keys
# (nomadtf/<namespace>/...) are ever here.
KV_CLUSTER_PROFILE = "nomadtf/_cluster/profile"


def kv_job_prefix(namespace: str, job_id: str) -> str:
    """Every run of a job (what a new run or `stop --purge` deletes)."""
    return f"nomadtf/{namespace}/{job_id}/"


def kv_prefix(namespace: str, job_id: str, run_id: str = "") -> str:
    return kv_job_prefix(namespace, job_id) + (f"{run_id}/" if run_id else "")


def kv_cluster_prefix(namespace: str, job_id: str, run_id: str = "") -> str:
    """What the tasks watch: slots, generation, state."""
    return kv_prefix(namespace, job_id, run_id) + "cluster/"


def kv_slots_prefix(namespace: str, job_id: str, run_id: str = "") -> str:
    return kv_cluster_prefix(namespace, job_id, run_id) + "slots/"


def kv_slot(namespace: str, job_id: str, role: str, index: int, run_id: str = "") -> str:
    return f"{kv_slots_prefix(namespace, job_id, run_id)}{role}/{index}"


def kv_generation(namespace: str, job_id: str, run_id: str = "") -> str:
    return kv_cluster_prefix(namespace, job_id, run_id) + "generation"


def kv_state(namespace: str, job_id: str, run_id: str = "") -> str:
    return kv_cluster_prefix(namespace, job_id, run_id) + "state"


def kv_counts(namespace: str, job_id: str, run_id: str = "") -> str:
    """Role counts changed by `nomadtf scale` (they override the spec file's)."""
    return kv_cluster_prefix(namespace, job_id, run_id) + "counts"


def kv_done_prefix(namespace: str, job_id: str, run_id: str = "") -> str:
    """success = all_workers: one key per worker whose code exited 0."""
    return kv_cluster_prefix(namespace, job_id, run_id) + "done/"


def kv_admitted_at(namespace: str, job_id: str, run_id: str = "") -> str:
    """When the admission controller admitted this run (unix time): recovery.deadline counts
    from here rather than from the submission, time in the queue not counted. Written by the
    controller before its first admitting call; cleared with the run's keys on a give-back."""
    return kv_prefix(namespace, job_id, run_id) + "admitted_at"


def kv_progress(namespace: str, job_id: str, run_id: str = "") -> str:
    return kv_prefix(namespace, job_id, run_id) + "progress"


def kv_environment_prefix(namespace: str, job_id: str, run_id: str = "") -> str:
    """How each task's Python environment is coming along (what `nomadtf run` shows)."""
    return kv_prefix(namespace, job_id, run_id) + "environment/"


def kv_environment(namespace: str, job_id: str, role: str, index: int, run_id: str = "") -> str:
    return f"{kv_environment_prefix(namespace, job_id, run_id)}{role}/{index}"


KV_ADMISSION = "nomadtf/_admission/"
KV_ADMISSION_LEADER = KV_ADMISSION + "leader"
KV_ADMISSION_BOARD = KV_ADMISSION + "board"
KV_ADMISSION_ADMITTED = KV_ADMISSION + "admitted/"
KV_ADMISSION_POLICY = KV_ADMISSION + "policy"  # the operator's sharing policy (admission/policy.py)
KV_ADMISSION_USAGE = KV_ADMISSION + "usage"  # each namespace's remembered usage (admission/usage.py)
KV_ADMISSION_LEDGER = KV_ADMISSION + "ledger/"  # <YYYY-MM>: each namespace's use and runs by day (admission/ledger.py)


def kv_admitted(namespace: str, job_id: str) -> str:
    """The run of a job the controller admitted (written before its first admitting call):
    a run resumed by anyone else is suspended again."""
    return f"{KV_ADMISSION_ADMITTED}{namespace}/{job_id}"


def queue_ticket(namespace: str, job_id: str, run_id: str) -> str:
    """A queued run's name on the board: nobody who does not know the job learns it."""
    return hashlib.sha256(f"{namespace}/{job_id}/{run_id}".encode()).hexdigest()[:20]


ADMISSION_SERVICE_JOB = "nomadtf-admission"  # the controller's Nomad service job (`nomadtf admission deploy`)


ACL_NAME_MAX = 128  # Consul's limit on a policy name
_ACL_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def acl_name(namespace: str, job_id: str) -> str:
    """The name of one job's Consul policy, Vault policy and Consul engine role. The
    readable part alone would collide (`ml`/`team-x` and `ml-team`/`x` both read
    `ml-team-x`); the digest of namespace/job cannot."""
    digest = hashlib.sha256(f"{namespace}/{job_id}".encode()).hexdigest()[:8]
    readable = _ACL_UNSAFE.sub("-", f"nomadtf-{namespace}-{job_id}")[: ACL_NAME_MAX - 9]
    return f"{readable}-{digest}"


def acl_owner(namespace: str, job_id: str) -> str:
    """What marks an ACL object as this job's: a Consul policy's description, the first
    line of a Vault policy."""
    return f"nomadtf {namespace}/{job_id} tasks"


def session_name(job_id: str, role: str, alloc_id: str) -> str:
    return f"nomadtf {job_id} {role} {alloc_id[:8]}"
