"""A job and its run, in nomadtf's own words: pure, no server is asked anything here.

- `options`: job.json read (JSON or YAML), its `--var` overrides, the namespace filled in;
- `validate`: the schema (`schema/`) and the checks across fields, every problem at once; defaults filled;
- `spec`: the typed `JobSpec` every command and every task works from (`load_spec`, `parse_spec`);
- `taskfile`: the spec file every task reads, written with its run, read back and expanded;
- `render`: `JobSpec` (+ the target Nomad) → Nomad job JSON (Jinja2, `templates/`), a run stamped on it;
- `target`: the Nomad version a job is rendered for and the rendering's decisions for it;
- `profile`: the cluster profile an operator sets once and what it fills into a job's options;
- `acl`: the least-privilege policies of a job and of the admission controller, as text;
- `dcos`: DC/OS options → job.json;
- `capacity`: what a job asks and the cluster holds (CPU, memory, devices);
- `answers`: Nomad's answers as read-only views (an allocation, its tasks' states and events, an
  evaluation), built by the Nomad adapter: nothing above it reads Nomad's key names;
- `plan`: placement failures in words, and never against not now;
- `outcome`: a run's one outcome and its exit code, shared by `run` and `status`;
- `report`: the failure report and side-role warnings (TensorFlow's notices filtered out).
"""
