"""A job and its run, in nomadtf's own words: pure, no server is asked anything here.

- `spec`: job.json → the validated, normalised document → the typed `JobSpec` (with `schema/`);
- `render`: `JobSpec` (+ the target Nomad) → Nomad job JSON (Jinja2, `templates/`), a run stamped on it;
- `target`: the Nomad version a job is rendered for and the rendering's decisions for it;
- `profile`: the cluster profile an operator sets once and what it fills into a job's options;
- `acl`: the least-privilege policies of a job and of the admission controller, as text;
- `dcos`: DC/OS options → job.json;
- `capacity`: what a job asks and the cluster holds (CPU, memory, devices);
- `plan`: placement failures in words, and never against not now;
- `outcome`: a run's one outcome and its exit code, shared by `run` and `status`;
- `report`: the failure report and side-role warnings (TensorFlow's notices filtered out).
"""
